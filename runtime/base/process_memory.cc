#include "runtime/base/process_memory.h"

#include <unistd.h>

#include <fstream>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace chunkserve {

uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  return resident_pages * static_cast<uint64_t>(page > 0 ? page : 4096);
}

void ReturnFreeHeapToOs() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace chunkserve
