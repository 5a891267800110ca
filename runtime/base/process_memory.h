// This process's memory, for the engine's stats and /metrics: how much is resident, and a way to
// hand freed heap pages back to the OS after a model load.
//
// Thread safety: both are safe to call from any thread.
#ifndef CHUNKSERVE_RUNTIME_BASE_PROCESS_MEMORY_H_
#define CHUNKSERVE_RUNTIME_BASE_PROCESS_MEMORY_H_

#include <cstdint>

namespace chunkserve {

// Resident set size in bytes (/proc/self/statm); 0 where it cannot be read.
uint64_t ResidentBytes();

// Returns the free pages of the C heap to the OS (glibc's malloc_trim; nothing elsewhere). A model
// load frees hundreds of MB of checkpoint-sized blocks (dequantized GGUF tensors, parse buffers)
// in the middle of the heap, where glibc would otherwise keep them resident for good.
void ReturnFreeHeapToOs();

}  // namespace chunkserve

#endif  // CHUNKSERVE_RUNTIME_BASE_PROCESS_MEMORY_H_
