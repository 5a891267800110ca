// Cap'n Proto stream framing with reader limits: bytes <-> Envelope messages.
//
// A frame is Cap'n Proto's standard stream framing: a segment table (uint32 segment count - 1,
// then one uint32 size in words per segment, padded to 8 bytes) followed by the segments. The
// FrameDecoder consumes bytes in any split (as they arrive from a socket) and yields complete,
// validated messages. A hostile peer cannot make it allocate more than `max_message_bytes` per
// frame: the announced size is checked against the limit before any buffer for the body exists.
//
// Every decoded message is validated by copying it (under the traversal and nesting limits) into
// a DecodedMessage the caller owns; reading a DecodedMessage can therefore not fail later.
// Errors are Status values (DataLoss for malformed bytes, ResourceExhausted for limits); no
// kj::Exception leaves this file. After an error the decoder stays failed: close the connection.
//
// Thread safety: none; one decoder per connection, used by one thread at a time.
#ifndef CHUNKSERVE_RUNTIME_WIRE_FRAMING_H_
#define CHUNKSERVE_RUNTIME_WIRE_FRAMING_H_

#include <capnp/message.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/chunkserve.capnp.h"

namespace chunkserve::wire {

struct ReaderLimits {
  size_t max_message_bytes = 16u << 20;       // whole frame incl. segment table
  uint32_t max_segments = 64;                 // segments per frame (at most 2046)
  uint64_t traversal_limit_words = 4u << 20;  // words a reader may visit (amplification bound)
  int32_t nesting_limit = 32;                 // pointer depth
};

// One validated message. Its root is always readable without exceptions.
class DecodedMessage {
 public:
  DecodedMessage() = default;
  schema::Envelope::Reader root() { return builder_->getRoot<schema::Envelope>().asReader(); }
  size_t frame_bytes() const { return frame_bytes_; }

 private:
  friend class FrameDecoder;
  friend Result<DecodedMessage> DecodeWords(kj::ArrayPtr<const capnp::word>, const ReaderLimits&);
  std::unique_ptr<capnp::MallocMessageBuilder> builder_;
  size_t frame_bytes_ = 0;
};

// Serializes a message in stream framing. Never fails for a well-formed builder; kj exceptions
// (out of memory) become Internal.
Result<std::vector<uint8_t>> EncodeFrame(capnp::MessageBuilder& message);

// Decodes exactly one frame that spans all of [data, data + size).
Result<DecodedMessage> DecodeFrame(const uint8_t* data, size_t size, const ReaderLimits& limits);

class FrameDecoder {
 public:
  explicit FrameDecoder(ReaderLimits limits = {}) : limits_(limits) {}

  // Appends received bytes and decodes every frame they complete. Returns the first error
  // (sticky: later calls return it again and consume nothing).
  Status Feed(const uint8_t* data, size_t size);

  // Pops the oldest decoded message; false when none is ready.
  bool Next(DecodedMessage* message);

  // A partial frame is stored in fixed blocks allocated as its bytes arrive and never
  // reallocated: the memory held is what arrived rounded up to a block, with no growth copies
  // left behind in the allocator, and that is what a connection's buffer budget is charged.
  static constexpr size_t kBlockBytes = 16u << 10;

  // Memory held for the frame not yet complete (whole blocks; 0 between frames).
  size_t buffered_bytes() const { return blocks_.size() * kBlockBytes; }
  // Changes the frame size limit for frames not yet started (a connection that authenticated as
  // a worker may send larger frames than an anonymous one).
  void set_max_message_bytes(size_t n) { limits_.max_message_bytes = n; }
  const Status& status() const { return status_; }

 private:
  // Copies `n` bytes to the end of the current frame.
  void Append(const uint8_t* data, size_t n);
  // Decodes the complete frame in blocks_ and starts the next one.
  Status Complete();

  ReaderLimits limits_;
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  size_t received_ = 0;    // bytes of the current frame so far, segment table included
  size_t frame_size_ = 0;  // 0 until the segment table is complete
  std::deque<DecodedMessage> ready_;
  Status status_;
};

}  // namespace chunkserve::wire

#endif  // CHUNKSERVE_RUNTIME_WIRE_FRAMING_H_
