// Small builders shared by every process that answers on the wire (worker, router): status codes
// as wire error codes, the retryable rule, and Error frames.
#ifndef CHUNKSERVE_RUNTIME_WIRE_MESSAGES_H_
#define CHUNKSERVE_RUNTIME_WIRE_MESSAGES_H_

#include <capnp/message.h>

#include <cstdint>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/chunkserve.capnp.h"

namespace chunkserve::wire {

// The wire ErrorCode of a StatusCode (their numeric values are equal); unknown codes: internal.
schema::ErrorCode ToWireErrorCode(StatusCode code);
// The StatusCode of a wire ErrorCode; a code this build does not know (a newer peer) is internal.
StatusCode FromWireErrorCode(schema::ErrorCode code);

// Whether retrying (elsewhere or later) may succeed: overloaded (resource exhausted) and
// unavailable.
bool IsRetryable(StatusCode code);

// EncodeFrame for messages this process built itself, which cannot be malformed: an empty vector
// in the impossible failure case, which Connection::SendBytes then sends as nothing.
std::vector<uint8_t> EncodeOrEmpty(capnp::MessageBuilder& builder);

// An Envelope.error answering `request_id` (0: the connection) with `status`; retryable per
// IsRetryable.
std::vector<uint8_t> ErrorFrame(uint64_t request_id, const Status& status);

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_MESSAGES_H_
