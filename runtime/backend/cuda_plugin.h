// The CUDA backend seen from code that does not link CUDA.
//
// libchunkserve.so (the C ABI that Go and Rust programs embed) must load on a machine without
// CUDA, so it does not link the CUDA backend: when an engine asks for one, CreateCudaBackend loads
// it from the plugin library libchunkserve_cuda.so.0 (dlopen by soname, found next to
// libchunkserve.so through its $ORIGIN run path or wherever the loader looks; never a relative
// path), which links the CUDA runtime and cuBLAS. chunkserve-worker and chunkserve-demo load it
// the same way (from ../lib next to their bin/): a CPU-only worker then never maps cuBLAS, which
// alone adds ~150 MB of resident memory. The benchmarks and the GPU tests link
// chunkserve::cuda_backend instead, which registers the factory at start-up.
//
// The plugin is built from the same sources as the library that loads it and is accepted only
// when its build identity (release, compiler) equals the loader's: Backend is a C++ interface.
//
// Errors of CreateCudaBackend: Unimplemented in a build without CUDA; Unavailable when the plugin
// cannot be loaded (the message names the file, the loader's reason and how to fix it), else the
// backend's own (InvalidArgument / Unimplemented for shapes the kernels refuse, Unavailable when
// there is no device).
//
// Thread safety: both functions are thread-safe; the plugin is loaded at most once per process.
#ifndef CHUNKSERVE_RUNTIME_BACKEND_CUDA_PLUGIN_H_
#define CHUNKSERVE_RUNTIME_BACKEND_CUDA_PLUGIN_H_

#include <cstdint>
#include <memory>

#include "runtime/backend/backend.h"
#include "runtime/base/status.h"

namespace chunkserve::backend {

// What a model asks of a CUDA backend: the device, the compute dtype, and the KV arena it will
// allocate (shapes the kernels refuse are refused before any device is looked at).
struct CudaBackendSpec {
  int32_t device = 0;
  kernels::DType dtype = kernels::DType::kF16;
  KvArenaShape arena;
};

using CudaBackendFactory = Result<std::unique_ptr<Backend>> (*)(const CudaBackendSpec& spec);

// The plugin's soname and the one symbol it exports (extern "C"), which returns a CudaPlugin.
inline constexpr char kCudaPluginSoname[] = "libchunkserve_cuda.so.0";
inline constexpr char kCudaPluginEntry[] = "chunkserve_cuda_plugin";

struct CudaPlugin {
  const char* build_id;  // must equal the loader's CudaPluginBuildId()
  CudaBackendFactory create;
};

// The build identity plugin and loader must share.
const char* CudaPluginBuildId();

// Makes CreateCudaBackend use `factory` (programs that link the CUDA backend; see above).
void RegisterCudaBackendFactory(CudaBackendFactory factory);

Result<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendSpec& spec);

}  // namespace chunkserve::backend

#endif  // CHUNKSERVE_RUNTIME_BACKEND_CUDA_PLUGIN_H_
