// Frozen facts of the C ABI that the implementation needs: the sizes of the first published
// version of each versioned struct (the smallest struct_size the library accepts) and the version
// string. abi_layout.cc pins every layout with static asserts.
#ifndef CHUNKSERVE_CAPI_ABI_LAYOUT_H_
#define CHUNKSERVE_CAPI_ABI_LAYOUT_H_

#include <cstddef>

#include "capi/include/chunkserve/chunkserve.h"

namespace chunkserve::capi {

// Version 1 (chunkserve 0.1) sizes on LP64. Never change these: a struct grows by appending
// fields, and callers built against version 1 keep passing these sizes.
inline constexpr size_t kEngineOptionsV1Size = 56;
inline constexpr size_t kRequestOptionsV1Size = 72;
inline constexpr size_t kEngineStatsV1Size = 160;
inline constexpr size_t kEngineInfoV1Size = 24;
inline constexpr size_t kStreamEventV1Size = 48;
inline constexpr size_t kClientOptionsV1Size = 24;  // added after the engine, still 0.1
// Later versions of a struct (its current size, pinned by abi_layout.cc).
inline constexpr size_t kClientOptionsV2Size = 48;  // + tls_ca_file, tls_cert_file, tls_key_file
inline constexpr size_t kClientOptionsV3Size = 56;  // + tls_crl_file
inline constexpr size_t kEngineOptionsV2Size = 64;   // + tiny_model, gguf_dtype (0.4; 0.5 names it)
inline constexpr size_t kRequestOptionsV2Size = 80;  // + logprobs, reserved0 (0.4)
inline constexpr size_t kStreamEventV2Size = 216;    // + logprobs of TOKEN events (0.4)

#define CHUNKSERVE_CAPI_STR_INNER_(x) #x
#define CHUNKSERVE_CAPI_STR_(x) CHUNKSERVE_CAPI_STR_INNER_(x)
inline constexpr const char kVersionString[] =
    CHUNKSERVE_CAPI_STR_(CHUNKSERVE_VERSION_MAJOR) "." CHUNKSERVE_CAPI_STR_(
        CHUNKSERVE_VERSION_MINOR) "." CHUNKSERVE_CAPI_STR_(CHUNKSERVE_VERSION_PATCH);

}  // namespace chunkserve::capi

#endif  // CHUNKSERVE_CAPI_ABI_LAYOUT_H_
