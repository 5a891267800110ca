#include "runtime/backend/cuda_plugin.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <string>

namespace chunkserve::backend {
namespace {

struct Registry {
  std::mutex mu;
  CudaBackendFactory factory = nullptr;  // guarded by mu
  bool tried_plugin = false;             // guarded by mu
  std::string plugin_error;              // guarded by mu: why the plugin could not be used
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();  // never destroyed: used until the process ends
  return *registry;
}

#if CHUNKSERVE_BUILT_WITH_CUDA
// Loads the plugin and returns its factory, or null with `error` set. The library stays loaded
// for the life of the process (its backends may outlive any one caller).
CudaBackendFactory LoadPlugin(std::string* error) {
  void* handle = ::dlopen(kCudaPluginSoname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    *error = std::string("cannot load ") + kCudaPluginSoname + " (" +
             (why != nullptr ? why : "unknown reason") +
             "); install it next to libchunkserve.so (cmake --install puts it there), with the "
             "CUDA runtime and cuBLAS it needs, or use the CPU backend";
    return nullptr;
  }
  using Entry = const CudaPlugin* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, kCudaPluginEntry));
  const CudaPlugin* plugin = entry != nullptr ? entry() : nullptr;
  if (plugin == nullptr || plugin->create == nullptr) {
    *error = std::string(kCudaPluginSoname) + " has no usable " + kCudaPluginEntry;
    ::dlclose(handle);
    return nullptr;
  }
  if (plugin->build_id == nullptr || std::strcmp(plugin->build_id, CudaPluginBuildId()) != 0) {
    *error = std::string(kCudaPluginSoname) + " was built as " +
             (plugin->build_id != nullptr ? plugin->build_id : "(unknown)") +
             ", this library as " + CudaPluginBuildId() + ": install the matching plugin";
    ::dlclose(handle);
    return nullptr;
  }
  return plugin->create;
}
#endif  // CHUNKSERVE_BUILT_WITH_CUDA

}  // namespace

const char* CudaPluginBuildId() { return CHUNKSERVE_BUILD_ID; }

void RegisterCudaBackendFactory(CudaBackendFactory factory) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factory = factory;
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendSpec& spec) {
#if !CHUNKSERVE_BUILT_WITH_CUDA
  (void)spec;
  return Status::Unimplemented("this build has no CUDA backend (configure with CUDA)");
#else
  Registry& r = TheRegistry();
  CudaBackendFactory factory;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.factory == nullptr && !r.tried_plugin) {
      r.tried_plugin = true;
      r.factory = LoadPlugin(&r.plugin_error);
    }
    factory = r.factory;
    error = r.plugin_error;
  }
  if (factory == nullptr) return Status::Unavailable("the CUDA backend is not available: " + error);
  return factory(spec);
#endif
}

}  // namespace chunkserve::backend
