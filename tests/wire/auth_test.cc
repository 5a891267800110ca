// Authentication primitives: secrets from files and the environment (never too short), proofs
// equal to Python's hmac module on the same input (tests/wire/auth_vectors.py regenerates
// them), and verification that depends on key, role and nonce.
#include "runtime/wire/auth.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace chunkserve::wire {
namespace {

using ::chunkserve::testing::StatusIs;
using schema::AuthRole;

std::string Hex(const std::vector<uint8_t>& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

std::vector<uint8_t> CountingNonce() {
  std::vector<uint8_t> nonce(kAuthNonceBytes);
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<uint8_t>(i);
  return nonce;
}

constexpr const char* kKey = "0123456789abcdef0123456789abcdef";

TEST(AuthTest, ProofsEqualAnIndependentHmac) {
  const std::vector<uint8_t> nonce = CountingNonce();
  EXPECT_EQ(Hex(AuthProof(kKey, nonce, AuthRole::CLIENT)),
            "54ee980c603dba57bc6905e1b67b8429b129bc452845d7a891612f0ac38288a3");
  EXPECT_EQ(Hex(AuthProof(kKey, nonce, AuthRole::WORKER)),
            "467b5fd9b1891b53f0bb5bdb3af207828c438c0e3f80bdb8a8039cbd6eb4dbee");
  EXPECT_EQ(Hex(AuthProof(kKey, nonce, AuthRole::ROUTER)),
            "bccd9793acacb9016dd75d91680879548725236d37f4c029373ca88d2a02047d");
}

TEST(AuthTest, VerificationDependsOnKeyRoleAndNonce) {
  const AuthKeys keys{.cluster_secret = kKey, .client_token = "client-token-0123456789"};
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> nonce, NewAuthNonce());
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> other, NewAuthNonce());
  EXPECT_NE(nonce, other);
  EXPECT_TRUE(VerifyAuthProof(keys, nonce, AuthRole::WORKER, AuthProof(kKey, nonce, AuthRole::WORKER)));
  EXPECT_TRUE(VerifyAuthProof(keys, nonce, AuthRole::CLIENT,
                              AuthProof("client-token-0123456789", nonce, AuthRole::CLIENT)));
  // A proof for another role, another nonce or under another key does not pass.
  EXPECT_FALSE(VerifyAuthProof(keys, nonce, AuthRole::WORKER, AuthProof(kKey, nonce, AuthRole::ROUTER)));
  EXPECT_FALSE(VerifyAuthProof(keys, nonce, AuthRole::WORKER, AuthProof(kKey, other, AuthRole::WORKER)));
  EXPECT_FALSE(VerifyAuthProof(keys, nonce, AuthRole::WORKER,
                               AuthProof("client-token-0123456789", nonce, AuthRole::WORKER)));
  // The cluster secret also makes a client (who holds it may register a worker anyway); the
  // client token never makes a worker or a router.
  EXPECT_TRUE(VerifyAuthProof(keys, nonce, AuthRole::CLIENT, AuthProof(kKey, nonce, AuthRole::CLIENT)));
  EXPECT_FALSE(VerifyAuthProof(keys, nonce, AuthRole::ROUTER,
                               AuthProof("client-token-0123456789", nonce, AuthRole::ROUTER)));
  // Truncated and empty proofs.
  std::vector<uint8_t> proof = AuthProof(kKey, nonce, AuthRole::WORKER);
  proof.pop_back();
  EXPECT_FALSE(VerifyAuthProof(keys, nonce, AuthRole::WORKER, proof));
  EXPECT_FALSE(VerifyAuthProof(keys, nonce, AuthRole::WORKER, {}));
  // Without a client token, clients prove the cluster secret.
  const AuthKeys secret_only{.cluster_secret = kKey, .client_token = ""};
  EXPECT_TRUE(VerifyAuthProof(secret_only, nonce, AuthRole::CLIENT,
                              AuthProof(kKey, nonce, AuthRole::CLIENT)));
}

TEST(AuthTest, SecretsComeFromFilesOrTheEnvironmentAndAreLongEnough) {
  ::chunkserve::testing::TempDir dir;
  const std::string good = (dir.path() / "good").string();
  const std::string shorty = (dir.path() / "short").string();
  const std::string empty = (dir.path() / "empty").string();
  std::ofstream(good) << "  " << kKey << "\n";
  std::ofstream(shorty) << "tooshort\n";
  std::ofstream(empty) << "\n";
  ASSERT_OK_AND_ASSIGN(std::string s, LoadSecret(good, nullptr));
  EXPECT_EQ(s, kKey);  // surrounding whitespace trimmed
  EXPECT_THAT(LoadSecret(shorty, nullptr).status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(LoadSecret(empty, nullptr).status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(LoadSecret((dir.path() / "missing").string(), nullptr).status(),
              StatusIs(StatusCode::kInvalidArgument));
  // The message names the file, never the secret.
  const Status weak = LoadSecret(shorty, nullptr).status();
  EXPECT_EQ(std::string(weak.message()).find("tooshort"), std::string::npos);

  ::setenv("CHUNKSERVE_AUTH_TEST_SECRET", "fedcba9876543210fedcba", 1);
  ASSERT_OK_AND_ASSIGN(s, LoadSecret("", "CHUNKSERVE_AUTH_TEST_SECRET"));
  EXPECT_EQ(s, "fedcba9876543210fedcba");
  // A file wins over the environment.
  ASSERT_OK_AND_ASSIGN(s, LoadSecret(good, "CHUNKSERVE_AUTH_TEST_SECRET"));
  EXPECT_EQ(s, kKey);
  ::setenv("CHUNKSERVE_AUTH_TEST_SECRET", "short", 1);
  EXPECT_THAT(LoadSecret("", "CHUNKSERVE_AUTH_TEST_SECRET").status(),
              StatusIs(StatusCode::kInvalidArgument));
  ::unsetenv("CHUNKSERVE_AUTH_TEST_SECRET");
  ASSERT_OK_AND_ASSIGN(s, LoadSecret("", "CHUNKSERVE_AUTH_TEST_SECRET"));
  EXPECT_EQ(s, "");  // neither: authentication off
}

}  // namespace
}  // namespace chunkserve::wire
