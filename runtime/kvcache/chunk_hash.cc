#include "runtime/kvcache/chunk_hash.h"

#include <xxhash.h>

#include <bit>
#include <cstring>
#include <string>
#include <vector>

namespace chunkserve::kv {
namespace {

void PutLe(uint64_t v, int bytes, unsigned char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

uint64_t ChunkHashSeed(uint64_t model_fingerprint, int32_t chunk_size, uint32_t hash_version) {
  unsigned char record[24];
  std::memcpy(record, "CSKVHASH", 8);
  PutLe(model_fingerprint, 8, record + 8);
  PutLe(static_cast<uint32_t>(chunk_size), 4, record + 16);
  PutLe(hash_version, 4, record + 20);
  return XXH3_64bits(record, sizeof(record));
}

uint64_t ChainChunkHash(uint64_t prev_hash, std::span<const TokenId> tokens) {
  if constexpr (std::endian::native == std::endian::little) {
    return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), prev_hash);
  } else {
    // Big-endian hosts hash the same little-endian bytes from a converted copy.
    std::vector<unsigned char> bytes(tokens.size_bytes());
    for (size_t i = 0; i < tokens.size(); ++i) {
      PutLe(static_cast<uint32_t>(tokens[i]), 4, bytes.data() + 4 * i);
    }
    return XXH3_64bits_withSeed(bytes.data(), bytes.size(), prev_hash);
  }
}

Result<std::vector<uint64_t>> FullChunkHashes(uint64_t seed, int32_t chunk_size,
                                              std::span<const TokenId> tokens) {
  if (chunk_size < 1) {
    return Status::InvalidArgument("chunk size " + std::to_string(chunk_size) + " < 1");
  }
  const size_t c = static_cast<size_t>(chunk_size);
  std::vector<uint64_t> hashes;
  hashes.reserve(tokens.size() / c);
  uint64_t h = seed;
  for (size_t begin = 0; begin + c <= tokens.size(); begin += c) {
    h = ChainChunkHash(h, tokens.subspan(begin, c));
    hashes.push_back(h);
  }
  return hashes;
}

}  // namespace chunkserve::kv
