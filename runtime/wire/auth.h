// Cluster authentication on the wire: keys, challenge nonces and proofs.
//
// A server with a cluster secret sends every new connection a Challenge (32 random bytes); the
// peer's first frame must be an Auth with proof = HMAC-SHA256(key, "chunkserve-auth-v1" || nonce
// || role), where key is the cluster secret for the roles worker and router, and for role client
// the client token or the cluster secret (who holds the secret could register a worker anyway). The secret never
// crosses the wire and a proof is good for one connection only. Workers must authenticate as
// role worker to Register; a router's data link to a worker authenticates as role router.
//
// Secrets come from a file (`--secret-file`, `--client-token-file`) or an environment variable
// (CHUNKSERVE_CLUSTER_SECRET, CHUNKSERVE_CLIENT_TOKEN), never from a command-line value that
// `ps` would show, and are never logged.
//
// HMAC, random bytes and the constant-time comparison are OpenSSL's libcrypto.
#ifndef CHUNKSERVE_RUNTIME_WIRE_AUTH_H_
#define CHUNKSERVE_RUNTIME_WIRE_AUTH_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/chunkserve.capnp.h"

namespace chunkserve::wire {

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr const char* kClusterSecretEnv = "CHUNKSERVE_CLUSTER_SECRET";
inline constexpr const char* kClientTokenEnv = "CHUNKSERVE_CLIENT_TOKEN";

// What a server accepts. Empty cluster_secret: authentication off.
struct AuthKeys {
  std::string cluster_secret;
  std::string client_token;  // empty: clients prove the cluster secret
  bool enabled() const { return !cluster_secret.empty(); }
};

// What a connecting peer proves when challenged. Empty key: it cannot answer (the server then
// refuses it with Unauthenticated).
struct ClientAuth {
  std::string key;
  schema::AuthRole role = schema::AuthRole::CLIENT;
};

// A secret from `file` when it is non-empty (surrounding whitespace trimmed), else from the
// environment variable `env` (may be unset: empty result). InvalidArgument for an unreadable or
// empty file, or a secret shorter than 16 bytes (too weak to be meant).
Result<std::string> LoadSecret(const std::string& file, const char* env);

// 32 fresh random bytes.
Result<std::vector<uint8_t>> NewAuthNonce();

// HMAC-SHA256(key, "chunkserve-auth-v1" || nonce || role as one byte): 32 bytes.
std::vector<uint8_t> AuthProof(std::string_view key, std::span<const uint8_t> nonce,
                               schema::AuthRole role);

// Whether `proof` answers `nonce` for `role` under `keys` (constant-time comparison).
bool VerifyAuthProof(const AuthKeys& keys, std::span<const uint8_t> nonce, schema::AuthRole role,
                     std::span<const uint8_t> proof);

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_AUTH_H_
