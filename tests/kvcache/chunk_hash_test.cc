#include "runtime/kvcache/chunk_hash.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace chunkserve::kv {
namespace {

using ::chunkserve::testing::StatusIs;

// Test vectors computed independently with Python's xxhash package (4.1.0, libxxhash 0.8.4):
//
//   import struct, xxhash
//   def seed(fp, c, v=1):
//       return xxhash.xxh3_64_intdigest(b"CSKVHASH" + struct.pack("<QiI", fp, c, v))
//   def chain(s, c, toks):
//       out, h = [], s
//       for i in range(0, len(toks) - c + 1, c):
//           h = xxhash.xxh3_64_intdigest(struct.pack("<%di" % c, *toks[i:i+c]), seed=h)
//           out.append(h)
//       return out
//
// Changing any of them breaks compatibility between workers and routers: bump kHashVersion.

TEST(ChunkHashTest, SeedMatchesReferenceVectors) {
  EXPECT_EQ(ChunkHashSeed(0, 64, 1), 0x736cfb86dede5cf0ULL);
  EXPECT_EQ(ChunkHashSeed(0x0123456789abcdefULL, 4, 1), 0xcdf7dfbc989f3569ULL);
  EXPECT_EQ(ChunkHashSeed(0xfedcba9876543210ULL, 16, 7), 0xb27f90d0f3c7fea2ULL);
}

TEST(ChunkHashTest, DefaultVersionIsCurrent) {
  EXPECT_EQ(kHashVersion, 1u);
  EXPECT_EQ(ChunkHashSeed(0, 64), ChunkHashSeed(0, 64, kHashVersion));
}

TEST(ChunkHashTest, ChainMatchesReferenceVectors) {
  // chain(seed(0x0123456789abcdef, 4), 4, range(10))
  std::vector<TokenId> tokens;
  for (int i = 0; i < 10; ++i) tokens.push_back(i);
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> hashes,
                       FullChunkHashes(ChunkHashSeed(0x0123456789abcdefULL, 4), 4, tokens));
  EXPECT_EQ(hashes, (std::vector<uint64_t>{0x59e9c9c827d06c72ULL, 0xd71e8e2f918ba1c2ULL}));
}

TEST(ChunkHashTest, TokensHashAsLittleEndianInt32) {
  // chain(seed(42, 4), 4, [-1, 2**31 - 1, -2**31, 123456])
  const std::vector<TokenId> tokens = {-1, 2147483647, INT32_MIN, 123456};
  EXPECT_EQ(ChainChunkHash(ChunkHashSeed(42, 4), tokens), 0x60ec05e7ec3d71d3ULL);
}

TEST(ChunkHashTest, ChunkSize64MatchesReferenceVectors) {
  // chain(seed(0x5eed, 64), 64, [i * 7919 % 32000 for i in range(200)])
  std::vector<TokenId> tokens;
  for (int i = 0; i < 200; ++i) tokens.push_back(i * 7919 % 32000);
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> hashes,
                       FullChunkHashes(ChunkHashSeed(0x5eed, 64), 64, tokens));
  EXPECT_EQ(hashes, (std::vector<uint64_t>{0x5c2e70fe6dfd23aaULL, 0x6cc5531b220ae345ULL,
                                           0x5b8283b06487606fULL}));
}

TEST(ChunkHashTest, PartialTrailingChunkIsNotHashed) {
  const std::vector<TokenId> tokens(7, 3);
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> hashes, FullChunkHashes(1, 4, tokens));
  EXPECT_EQ(hashes.size(), 1u);
  ASSERT_OK_AND_ASSIGN(hashes, FullChunkHashes(1, 8, tokens));
  EXPECT_TRUE(hashes.empty());
}

TEST(ChunkHashTest, HashNamesTheWholePrefix) {
  // Same last chunk, different first chunk: different h_1.
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> a,
                       FullChunkHashes(1, 2, std::vector<TokenId>{1, 2, 5, 6}));
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> b,
                       FullChunkHashes(1, 2, std::vector<TokenId>{1, 3, 5, 6}));
  EXPECT_NE(a[1], b[1]);
  EXPECT_EQ(a[1], ChainChunkHash(a[0], std::vector<TokenId>{5, 6}));
}

TEST(ChunkHashTest, SeedSeparatesModelsChunkSizesAndVersions) {
  EXPECT_NE(ChunkHashSeed(1, 64), ChunkHashSeed(2, 64));
  EXPECT_NE(ChunkHashSeed(1, 64), ChunkHashSeed(1, 32));
  EXPECT_NE(ChunkHashSeed(1, 64, 1), ChunkHashSeed(1, 64, 2));
}

TEST(ChunkHashTest, NonPositiveChunkSizeIsInvalidArgument) {
  const std::vector<TokenId> tokens = {1, 2, 3};
  EXPECT_THAT(FullChunkHashes(0, 0, tokens), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(FullChunkHashes(0, -4, tokens), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace chunkserve::kv
