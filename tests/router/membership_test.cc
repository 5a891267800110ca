// Membership: model checks (fixed and adopted), stable ids from names, leases, replacement.
#include "router/membership.h"

#include <gtest/gtest.h>

#include <chrono>

#include "runtime/kvcache/chunk_hash.h"
#include "tests/testing/status_matchers.h"

namespace chunkserve::router {
namespace {

using namespace std::chrono_literals;

Registration Reg(const std::string& name, uint64_t fingerprint = 77, int32_t chunk = 64) {
  Registration r;
  r.name = name;
  r.model_fingerprint = fingerprint;
  r.chunk_size = chunk;
  r.chunk_hash_version = kv::kHashVersion;
  r.host = "127.0.0.1";
  r.port = 7000;
  r.generation = 1;
  return r;
}

TEST(MembershipTest, AdoptsTheFirstModelThenRefusesOthers) {
  Membership m({}, 1s);
  EXPECT_FALSE(m.model_known());
  ASSERT_OK(m.Validate(Reg("a")));
  EXPECT_TRUE(m.model_known());
  EXPECT_EQ(m.chain_seed(), kv::ChunkHashSeed(77, 64));
  EXPECT_EQ(m.Validate(Reg("b", 78)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.Validate(Reg("b", 77, 32)).code(), StatusCode::kFailedPrecondition);
  Registration bad_version = Reg("b");
  bad_version.chunk_hash_version = kv::kHashVersion + 1;
  EXPECT_EQ(m.Validate(bad_version).code(), StatusCode::kFailedPrecondition);
  EXPECT_OK(m.Validate(Reg("b")));
}

TEST(MembershipTest, PinnedModelRefusesTheFirstWorkerToo) {
  Membership m({.model_fingerprint = 5, .chunk_size = 64}, 1s);
  EXPECT_TRUE(m.model_known());
  EXPECT_EQ(m.Validate(Reg("a", 6)).code(), StatusCode::kFailedPrecondition);
  EXPECT_OK(m.Validate(Reg("a", 5)));
}

TEST(MembershipTest, MalformedRegistrationsAreInvalidArguments) {
  Membership m({}, 1s);
  EXPECT_EQ(m.Validate(Reg("")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Validate(Reg("a", 77, 0)).code(), StatusCode::kInvalidArgument);
  Registration no_port = Reg("a");
  no_port.port = 0;
  EXPECT_EQ(m.Validate(no_port).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(m.model_known()) << "a refused registration must not fix the model";
}

TEST(MembershipTest, IdsComeFromNamesAndAreValid) {
  EXPECT_EQ(Membership::IdFor("gpu-node-1"), Membership::IdFor("gpu-node-1"));
  EXPECT_NE(Membership::IdFor("gpu-node-1"), Membership::IdFor("gpu-node-2"));
  EXPECT_TRUE(Membership::IdFor("").valid());
  // FNV-1a 32 of "a": pinned so that every router build derives the same ids.
  EXPECT_EQ(Membership::IdFor("a").value(), 0xe40c292cu);
}

TEST(MembershipTest, LeasesExpireUnlessRenewedAndReplacementKeepsTheId) {
  Membership m({}, std::chrono::milliseconds(100));
  const RouterTime t0 = std::chrono::seconds(10);
  ASSERT_OK(m.Validate(Reg("a")));
  const WorkerId a = m.Admit(Reg("a"), 1, t0);
  ASSERT_OK(m.Validate(Reg("b")));
  const WorkerId b = m.Admit(Reg("b"), 2, t0);
  EXPECT_TRUE(m.Expired(t0 + std::chrono::milliseconds(50)).empty());
  ASSERT_OK(m.Renew(a, t0 + std::chrono::milliseconds(80)));
  EXPECT_EQ(m.Expired(t0 + std::chrono::milliseconds(150)), std::vector<WorkerId>{b});
  EXPECT_EQ(m.Renew(WorkerId(12345), t0).code(), StatusCode::kNotFound);
  EXPECT_EQ(m.FindByLink(2)->id, b);
  // A restart: same name, new generation, new link; same id.
  Registration again = Reg("a");
  again.generation = 2;
  EXPECT_EQ(m.Admit(again, 3, t0), a);
  EXPECT_EQ(m.Find(a)->registration.generation, 2u);
  EXPECT_EQ(m.FindByLink(1), nullptr);
  m.Remove(a);
  EXPECT_EQ(m.Find(a), nullptr);
  EXPECT_EQ(m.size(), 1u);
}

TEST(MembershipTest, ParsesHostPort) {
  std::string host;
  uint16_t port = 0;
  ASSERT_OK(ParseHostPort("10.0.1.2:7100", &host, &port));
  EXPECT_EQ(host, "10.0.1.2");
  EXPECT_EQ(port, 7100);
  ASSERT_OK(ParseHostPort("[::1]:7000", &host, &port));
  EXPECT_EQ(host, "::1");
  for (const char* bad : {"", "host", ":7000", "host:", "host:0", "host:70000", "host:7x"}) {
    EXPECT_EQ(ParseHostPort(bad, &host, &port).code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace chunkserve::router
