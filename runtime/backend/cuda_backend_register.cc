// Linked into programs that run CUDA directly (chunkserve::cuda_backend is an object library, so
// the linker keeps this file): registers the CUDA backend's factory before main, so that
// CreateCudaBackend never loads the plugin in them.
#include "runtime/backend/cuda_backend.h"
#include "runtime/backend/cuda_plugin.h"

namespace chunkserve::backend {
namespace {

const bool registered = [] {
  RegisterCudaBackendFactory(&CreateCudaBackendFromSpec);
  return true;
}();

}  // namespace
}  // namespace chunkserve::backend
