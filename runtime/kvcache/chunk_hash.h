// ChunkHash: the chained content hash of full KV chunks, shared by workers and the router.
//
// A token sequence is cut into chunks of chunk_size tokens; chunk i covers positions
// [i * chunk_size, (i + 1) * chunk_size). Only full chunks are hashed:
//
//   h_{-1} = ChunkHashSeed(model_fingerprint, chunk_size, hash_version)
//   h_i    = XXH3_64bits_withSeed(bytes of chunk i's tokens, seed = h_{i-1})
//
// where "bytes of chunk i's tokens" are the chunk_size token ids as little-endian int32, in
// order (4 * chunk_size bytes). Because every hash seeds the next, h_i names the whole prefix
// [0, (i + 1) * chunk_size), not just chunk i: two workers that report the same h_i hold the same
// prefix (up to 64-bit collisions).
//
// The seed h_{-1} is XXH3_64bits (no seed) of this 24-byte record:
//
//   offset  size  field
//        0     8  ASCII "CSKVHASH" (domain tag, no terminator)
//        8     8  model_fingerprint, uint64 little-endian
//       16     4  chunk_size, int32 little-endian
//       20     4  hash_version, uint32 little-endian
//
// so hashes from different models, chunk sizes or hash versions never meet in one index.
// kHashVersion changes whenever any byte above (or the chunking) changes meaning; workers send it
// at registration and a router refuses workers whose version differs from its own.
//
// The values are pinned by committed test vectors (tests/kvcache/chunk_hash_test.cc) computed
// independently with Python's xxhash package.
//
// Thread safety: every function here is pure and thread-safe.
#ifndef CHUNKSERVE_RUNTIME_KVCACHE_CHUNK_HASH_H_
#define CHUNKSERVE_RUNTIME_KVCACHE_CHUNK_HASH_H_

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/base/status.h"

namespace chunkserve::kv {

inline constexpr uint32_t kHashVersion = 1;

// h_{-1}: the seed of a chain, from the 24-byte record described above.
uint64_t ChunkHashSeed(uint64_t model_fingerprint, int32_t chunk_size,
                       uint32_t hash_version = kHashVersion);

// One link of the chain: the hash of `tokens` (one full chunk) given the previous hash (or the
// seed for chunk 0). Any span length is accepted; callers pass exactly chunk_size tokens.
uint64_t ChainChunkHash(uint64_t prev_hash, std::span<const TokenId> tokens);

// h_0 .. h_{n-1} for the n = tokens.size() / chunk_size full leading chunks of `tokens`; a
// trailing partial chunk is not hashed. InvalidArgument when chunk_size < 1.
Result<std::vector<uint64_t>> FullChunkHashes(uint64_t seed, int32_t chunk_size,
                                              std::span<const TokenId> tokens);

}  // namespace chunkserve::kv

#endif  // CHUNKSERVE_RUNTIME_KVCACHE_CHUNK_HASH_H_
