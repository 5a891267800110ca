// The one exported function of libchunkserve_cuda.so (see cuda_plugin.h): its build identity and
// the CUDA backend's factory, for libchunkserve.so to load.
#include "runtime/backend/cuda_backend.h"
#include "runtime/backend/cuda_plugin.h"

extern "C" __attribute__((visibility("default"))) const chunkserve::backend::CudaPlugin*
chunkserve_cuda_plugin() {
  static const chunkserve::backend::CudaPlugin plugin{
      chunkserve::backend::CudaPluginBuildId(), &chunkserve::backend::CreateCudaBackendFromSpec};
  return &plugin;
}
