#include "runtime/wire/messages.h"

#include <string>
#include <utility>

#include "runtime/wire/framing.h"

namespace chunkserve::wire {

schema::ErrorCode ToWireErrorCode(StatusCode code) {
  const auto v = static_cast<uint16_t>(code);
  return v <= static_cast<uint16_t>(StatusCode::kUnauthenticated) ? static_cast<schema::ErrorCode>(v)
                                                          : schema::ErrorCode::INTERNAL;
}

StatusCode FromWireErrorCode(schema::ErrorCode code) {
  const auto v = static_cast<uint16_t>(code);
  return v <= static_cast<uint16_t>(StatusCode::kUnauthenticated) ? static_cast<StatusCode>(v)
                                                                  : StatusCode::kInternal;
}

bool IsRetryable(StatusCode code) {
  return code == StatusCode::kResourceExhausted || code == StatusCode::kUnavailable;
}

std::vector<uint8_t> EncodeOrEmpty(capnp::MessageBuilder& builder) {
  Result<std::vector<uint8_t>> bytes = EncodeFrame(builder);
  return bytes.ok() ? std::move(bytes).value() : std::vector<uint8_t>{};
}

std::vector<uint8_t> ErrorFrame(uint64_t request_id, const Status& status) {
  capnp::MallocMessageBuilder builder;
  auto error = builder.initRoot<schema::Envelope>().initError();
  error.setRequestId(request_id);
  error.setCode(ToWireErrorCode(status.code()));
  error.setMessage(std::string(status.message()));
  error.setRetryable(IsRetryable(status.code()));
  return EncodeOrEmpty(builder);
}

}  // namespace chunkserve::wire
