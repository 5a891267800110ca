// Why a request ended: one closed set shared by the engine, the wire protocol and the C ABI.
//
// Every request ends with exactly one terminal event carrying one of these. The numeric values
// are part of the wire format and the C ABI (CHUNKSERVE_FINISH_*) and never change; new reasons
// are only appended, and consumers treat an unknown value as kError.
#ifndef CHUNKSERVE_RUNTIME_BASE_FINISH_REASON_H_
#define CHUNKSERVE_RUNTIME_BASE_FINISH_REASON_H_

#include <cstdint>
#include <string_view>

namespace chunkserve {

enum class FinishReason : int32_t {
  kStopToken = 0,    // a stop token was generated (it is included in the stream)
  kLength = 1,       // max_new_tokens were generated (or the context is full)
  kCancelled = 2,    // the client cancelled, or disconnected
  kDeadline = 3,     // the request's deadline passed
  kError = 4,        // the request failed; the terminal event carries a Status
  kUnavailable = 5,  // the serving side went away (shutdown, worker or rank failure); retryable
};

constexpr std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStopToken: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kDeadline: return "deadline";
    case FinishReason::kError: return "error";
    case FinishReason::kUnavailable: return "unavailable";
  }
  return "error";
}

}  // namespace chunkserve

#endif  // CHUNKSERVE_RUNTIME_BASE_FINISH_REASON_H_
