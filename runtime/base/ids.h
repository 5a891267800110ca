// Strong ids: integer handles that cannot be mixed up with each other or with plain integers.
//
//   SeqId seq{7};           // explicit construction only
//   seq.value()             // the raw integer, for indexing and serialization
//   SeqId::Invalid()        // a sentinel that no allocator hands out
//
// Ids are stable handles: a SeqId keeps naming the same sequence while it lives, whatever the
// sequence's position in a decode batch. Positions are derived, never stored in an id.
#ifndef CHUNKSERVE_RUNTIME_BASE_IDS_H_
#define CHUNKSERVE_RUNTIME_BASE_IDS_H_

#include <compare>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>

namespace chunkserve {

template <typename Tag, typename Rep = uint32_t>
class StrongId {
 public:
  using rep_type = Rep;

  constexpr StrongId() = default;  // Invalid()
  constexpr explicit StrongId(Rep value) : value_(value) {}

  static constexpr StrongId Invalid() { return StrongId(); }
  constexpr bool valid() const { return value_ != kInvalid; }
  constexpr Rep value() const { return value_; }

  friend constexpr auto operator<=>(StrongId, StrongId) = default;
  friend std::ostream& operator<<(std::ostream& os, StrongId id) {
    if (!id.valid()) return os << Tag::kName << "(invalid)";
    return os << Tag::kName << "(" << +id.value_ << ")";
  }

 private:
  static constexpr Rep kInvalid = std::numeric_limits<Rep>::max();
  Rep value_ = kInvalid;
};

// A sequence in the KV cache (one per request, more after Fork).
struct SeqIdTag { static constexpr const char* kName = "SeqId"; };
using SeqId = StrongId<SeqIdTag, uint32_t>;

// A KV slot: storage for one chunk's K and V across every layer.
struct SlotIdTag { static constexpr const char* kName = "SlotId"; };
using SlotId = StrongId<SlotIdTag, uint32_t>;

// A node of the prefix tree.
struct ChunkIdTag { static constexpr const char* kName = "ChunkId"; };
using ChunkId = StrongId<ChunkIdTag, uint32_t>;

// A generation request (engine, wire and C ABI share the value).
struct RequestIdTag { static constexpr const char* kName = "RequestId"; };
using RequestId = StrongId<RequestIdTag, uint64_t>;

// A worker process in a cluster.
struct WorkerIdTag { static constexpr const char* kName = "WorkerId"; };
using WorkerId = StrongId<WorkerIdTag, uint32_t>;

// Token ids are plain data fed to kernels and hashes, not handles.
using TokenId = int32_t;

}  // namespace chunkserve

template <typename Tag, typename Rep>
struct std::hash<chunkserve::StrongId<Tag, Rep>> {
  size_t operator()(chunkserve::StrongId<Tag, Rep> id) const noexcept {
    return std::hash<Rep>()(id.value());
  }
};

#endif  // CHUNKSERVE_RUNTIME_BASE_IDS_H_
