#include "runtime/wire/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace chunkserve::wire {
namespace {

constexpr std::string_view kDomain = "chunkserve-auth-v1";
constexpr size_t kMinSecretBytes = 16;

std::string Trim(std::string s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

}  // namespace

Result<std::string> LoadSecret(const std::string& file, const char* env) {
  std::string secret;
  std::string source;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Status::InvalidArgument("cannot read the secret file " + file);
    std::ostringstream ss;
    ss << in.rdbuf();
    secret = Trim(ss.str());
    source = "the secret file " + file;
    if (secret.empty()) return Status::InvalidArgument(source + " is empty");
  } else if (const char* v = env != nullptr ? std::getenv(env) : nullptr; v != nullptr) {
    secret = Trim(v);
    source = std::string("$") + env;
  }
  if (!secret.empty() && secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument(source + " holds a secret of " + std::to_string(secret.size()) +
                                   " bytes; use at least " + std::to_string(kMinSecretBytes) +
                                   " (e.g. openssl rand -hex 32)");
  }
  return secret;
}

Result<std::vector<uint8_t>> NewAuthNonce() {
  std::vector<uint8_t> nonce(kAuthNonceBytes);
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    return Status::Internal("cannot draw random bytes for an authentication challenge");
  }
  return nonce;
}

std::vector<uint8_t> AuthProof(std::string_view key, std::span<const uint8_t> nonce,
                               schema::AuthRole role) {
  std::vector<uint8_t> message(kDomain.begin(), kDomain.end());
  message.insert(message.end(), nonce.begin(), nonce.end());
  message.push_back(static_cast<uint8_t>(role));
  std::vector<uint8_t> out(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(),
           out.data(), &len) == nullptr) {
    return {};
  }
  out.resize(len);
  return out;
}

bool VerifyAuthProof(const AuthKeys& keys, std::span<const uint8_t> nonce, schema::AuthRole role,
                     std::span<const uint8_t> proof) {
  if (!keys.enabled() || nonce.size() != kAuthNonceBytes) return false;
  auto matches = [&](const std::string& key) {
    if (key.empty()) return false;
    const std::vector<uint8_t> want = AuthProof(key, nonce, role);
    return !want.empty() && want.size() == proof.size() &&
           CRYPTO_memcmp(want.data(), proof.data(), want.size()) == 0;
  };
  if (role == schema::AuthRole::CLIENT) {
    return matches(keys.client_token) || matches(keys.cluster_secret);
  }
  return matches(keys.cluster_secret);
}

}  // namespace chunkserve::wire
