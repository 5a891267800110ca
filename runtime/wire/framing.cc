#include "runtime/wire/framing.h"

#include <capnp/dynamic.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>
#include <string>

namespace chunkserve::wire {
namespace {

uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// Size of the segment table for `segments` segments, in bytes (padded to a word).
size_t TableBytes(uint64_t segments) { return ((segments + 2) / 2) * 8; }

// Total frame size announced by a complete segment table, or an error.
Result<size_t> FrameSize(const uint8_t* data, size_t available, const ReaderLimits& limits,
                         bool* complete) {
  *complete = false;
  if (available < 4) return size_t{0};
  const uint64_t segments = static_cast<uint64_t>(LoadLe32(data)) + 1;
  if (segments > limits.max_segments) {
    return Status::DataLoss("wire frame announces " + std::to_string(segments) +
                            " segments (limit " + std::to_string(limits.max_segments) + ")");
  }
  const size_t table = TableBytes(segments);
  if (table > limits.max_message_bytes) {
    return Status::ResourceExhausted("wire frame segment table exceeds the message size limit");
  }
  if (available < table) return size_t{0};
  uint64_t words = 0;
  for (uint64_t i = 0; i < segments; ++i) words += LoadLe32(data + 4 + 4 * i);
  const uint64_t total = table + words * 8;
  if (words == 0) return Status::DataLoss("wire frame has no content");
  if (total > limits.max_message_bytes) {
    return Status::ResourceExhausted("wire frame of " + std::to_string(total) +
                                     " bytes exceeds the limit of " +
                                     std::to_string(limits.max_message_bytes));
  }
  *complete = true;
  return static_cast<size_t>(total);
}

// Reads every field the schema knows, recursively, so that a list or struct of an incompatible
// layout (which Cap'n Proto only detects when the field is read) throws here, inside the
// decoder's try block, and never later in the caller.
void Validate(const capnp::DynamicValue::Reader& value);

void ValidateStruct(const capnp::DynamicStruct::Reader& s) {
  KJ_IF_MAYBE (field, s.which()) {
    Validate(s.get(*field));
  }
  for (const capnp::StructSchema::Field& field : s.getSchema().getNonUnionFields()) {
    if (s.has(field)) Validate(s.get(field));
  }
}

void Validate(const capnp::DynamicValue::Reader& value) {
  switch (value.getType()) {
    case capnp::DynamicValue::STRUCT:
      ValidateStruct(value.as<capnp::DynamicStruct>());
      break;
    case capnp::DynamicValue::LIST: {
      const capnp::DynamicList::Reader list = value.as<capnp::DynamicList>();
      for (uint32_t i = 0; i < list.size(); ++i) Validate(list[i]);
      break;
    }
    case capnp::DynamicValue::TEXT:
      (void)value.as<capnp::Text>();
      break;
    case capnp::DynamicValue::DATA:
      (void)value.as<capnp::Data>();
      break;
    default:
      break;  // scalars and enums cannot be malformed
  }
}

}  // namespace

Result<std::vector<uint8_t>> EncodeFrame(capnp::MessageBuilder& message) {
  try {
    kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
    kj::ArrayPtr<const kj::byte> bytes = words.asBytes();
    return std::vector<uint8_t>(bytes.begin(), bytes.end());
  } catch (const kj::Exception& e) {
    return Status::Internal(std::string("wire encode failed: ") + e.getDescription().cStr());
  }
}

Result<DecodedMessage> DecodeFrame(const uint8_t* data, size_t size, const ReaderLimits& limits) {
  bool complete = false;
  CHUNKSERVE_ASSIGN_OR_RETURN(size_t total, FrameSize(data, size, limits, &complete));
  if (!complete || total > size) return Status::DataLoss("wire frame truncated");
  if (total != size) return Status::DataLoss("trailing bytes after wire frame");
  // Copy into word-aligned storage: the reader requires alignment.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(total / 8);
  std::memcpy(words.begin(), data, total);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = limits.traversal_limit_words;
  options.nestingLimit = limits.nesting_limit;
  try {
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    if (reader.getEnd() != words.end()) return Status::DataLoss("wire frame size mismatch");
    DecodedMessage out;
    out.builder_ = std::make_unique<capnp::MallocMessageBuilder>();
    // The copy visits every reachable word under the limits; a malformed pointer throws here.
    out.builder_->setRoot(reader.getRoot<schema::Envelope>());
    ValidateStruct(capnp::toDynamic(out.builder_->getRoot<schema::Envelope>().asReader()));
    out.frame_bytes_ = total;
    return out;
  } catch (const kj::Exception& e) {
    return Status::DataLoss(std::string("malformed wire frame: ") + e.getDescription().cStr());
  }
}

Status FrameDecoder::Feed(const uint8_t* data, size_t size) {
  if (!status_.ok()) return status_;
  // Takes only what the current frame needs, so the buffer never holds more than one frame and
  // a frame's body is buffered only after its segment table passed the limits.
  auto append = [&](size_t want) {
    const size_t take = want < size ? want : size;
    buffer_.insert(buffer_.end(), data, data + take);
    data += take;
    size -= take;
  };
  while (true) {
    if (frame_size_ == 0) {
      size_t need = 4;
      if (buffer_.size() >= 4) {
        status_ = ParseHeader();
        if (!status_.ok()) return status_;
        if (frame_size_ == 0)
          need = TableBytes(static_cast<uint64_t>(LoadLe32(buffer_.data())) + 1);
      }
      if (frame_size_ == 0) {
        if (size == 0) return Status::Ok();
        append(need - buffer_.size());
        continue;
      }
    }
    if (buffer_.size() < frame_size_) {
      if (size == 0) return Status::Ok();
      append(frame_size_ - buffer_.size());
      continue;
    }
    Result<DecodedMessage> message = DecodeFrame(buffer_.data(), buffer_.size(), limits_);
    if (!message.ok()) {
      status_ = message.status();
      return status_;
    }
    ready_.push_back(std::move(message).value());
    buffer_.clear();
    if (buffer_.capacity() > (64u << 10)) buffer_.shrink_to_fit();
    frame_size_ = 0;
  }
}

Status FrameDecoder::ParseHeader() {
  bool complete = false;
  Result<size_t> total = FrameSize(buffer_.data(), buffer_.size(), limits_, &complete);
  if (!total.ok()) return total.status();
  if (complete) {
    frame_size_ = total.value();
    buffer_.reserve(frame_size_);
  }
  return Status::Ok();
}

bool FrameDecoder::Next(DecodedMessage* message) {
  if (ready_.empty()) return false;
  *message = std::move(ready_.front());
  ready_.pop_front();
  return true;
}

}  // namespace chunkserve::wire
