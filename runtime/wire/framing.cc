#include "runtime/wire/framing.h"

#include <capnp/dynamic.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
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
  // The table must fit the decoder's first block (8 KiB of table: 2046 segments).
  if (segments > std::min<uint64_t>(limits.max_segments, 2046)) {
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

// Decodes one frame of exactly `words` (word-aligned), validating it into an owned copy. Not in
// the header: DecodedMessage's friend, for DecodeFrame and FrameDecoder.
Result<DecodedMessage> DecodeWords(kj::ArrayPtr<const capnp::word> words,
                                   const ReaderLimits& limits) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = limits.traversal_limit_words;
  options.nestingLimit = limits.nesting_limit;
  try {
    capnp::FlatArrayMessageReader reader(words, options);
    if (reader.getEnd() != words.end()) return Status::DataLoss("wire frame size mismatch");
    DecodedMessage out;
    out.builder_ = std::make_unique<capnp::MallocMessageBuilder>();
    // The copy visits every reachable word under the limits; a malformed pointer throws here.
    out.builder_->setRoot(reader.getRoot<schema::Envelope>());
    ValidateStruct(capnp::toDynamic(out.builder_->getRoot<schema::Envelope>().asReader()));
    out.frame_bytes_ = words.size() * sizeof(capnp::word);
    return out;
  } catch (const kj::Exception& e) {
    return Status::DataLoss(std::string("malformed wire frame: ") + e.getDescription().cStr());
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
  return DecodeWords(words.asPtr(), limits);
}

void FrameDecoder::Append(const uint8_t* data, size_t n) {
  while (n > 0) {
    const size_t offset = received_ % kBlockBytes;
    if (received_ / kBlockBytes == blocks_.size()) {
      blocks_.push_back(std::make_unique_for_overwrite<uint8_t[]>(kBlockBytes));
    }
    const size_t take = std::min(n, kBlockBytes - offset);
    std::memcpy(blocks_.back().get() + offset, data, take);
    received_ += take;
    data += take;
    n -= take;
  }
}

Status FrameDecoder::Complete() {
  Result<DecodedMessage> message = Status::Internal("unset");
  if (blocks_.size() == 1) {
    // operator new[] storage is aligned for any scalar: the block is readable as words.
    message = DecodeWords(
        kj::ArrayPtr<const capnp::word>(reinterpret_cast<const capnp::word*>(blocks_[0].get()),
                                        frame_size_ / sizeof(capnp::word)),
        limits_);
  } else {
    kj::Array<capnp::word> words = kj::heapArray<capnp::word>(frame_size_ / sizeof(capnp::word));
    auto* out = reinterpret_cast<uint8_t*>(words.begin());
    for (size_t k = 0, at = 0; at < frame_size_; ++k, at += kBlockBytes) {
      std::memcpy(out + at, blocks_[k].get(), std::min(kBlockBytes, frame_size_ - at));
    }
    blocks_.clear();  // before the decoded copy is made: the peak is the frame twice, not thrice
    message = DecodeWords(words.asPtr(), limits_);
  }
  blocks_.clear();
  received_ = 0;
  frame_size_ = 0;
  if (!message.ok()) return message.status();
  ready_.push_back(std::move(message).value());
  return Status::Ok();
}

Status FrameDecoder::Feed(const uint8_t* data, size_t size) {
  if (!status_.ok()) return status_;
  // Takes only what the current frame needs, so the blocks never hold more than one frame and a
  // frame's body is stored only after its segment table passed the limits. A frame that arrives
  // whole in one call is decoded straight from `data`.
  while (true) {
    if (received_ == 0 && size >= 4) {
      bool complete = false;
      Result<size_t> total = FrameSize(data, size, limits_, &complete);
      if (!total.ok()) {
        status_ = total.status();
        return status_;
      }
      if (complete && total.value() <= size) {
        Result<DecodedMessage> message = DecodeFrame(data, total.value(), limits_);
        if (!message.ok()) {
          status_ = message.status();
          return status_;
        }
        ready_.push_back(std::move(message).value());
        data += total.value();
        size -= total.value();
        continue;
      }
    }
    // How much of the current frame must be here before the next step.
    size_t want = 4;
    if (frame_size_ > 0) {
      want = frame_size_;
    } else if (received_ >= 4) {
      // The segment table is at most TableBytes(max_segments) bytes: within the first block.
      bool complete = false;
      Result<size_t> total = FrameSize(blocks_[0].get(), received_, limits_, &complete);
      if (!total.ok()) {
        status_ = total.status();
        return status_;
      }
      if (complete) {
        frame_size_ = total.value();
        want = frame_size_;
      } else {
        want = TableBytes(static_cast<uint64_t>(LoadLe32(blocks_[0].get())) + 1);
      }
    }
    if (received_ < want) {
      if (size == 0) return Status::Ok();
      const size_t take = std::min(want - received_, size);
      Append(data, take);
      data += take;
      size -= take;
      continue;
    }
    status_ = Complete();
    if (!status_.ok()) return status_;
  }
}

bool FrameDecoder::Next(DecodedMessage* message) {
  if (ready_.empty()) return false;
  *message = std::move(ready_.front());
  ready_.pop_front();
  return true;
}

}  // namespace chunkserve::wire
