// Fuzz target for the safetensors header parser: any bytes, as a whole file, must yield a Status
// or a header whose every tensor lies inside the input. With clang this file is a libFuzzer target
// (chunkserve-safetensors-fuzzer); what parses must also re-encode to the same tensors (the
// round-trip oracle). With every compiler, safetensors_fuzz_replay_test.cc drives it
// over tests/model/fuzz_corpus/ and mutations of it under ASan and UBSan.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "runtime/model/dtype.h"
#include "runtime/model/safetensors.h"

// Written with every checksum so the compiler cannot drop the reads.
volatile unsigned chunkserve_fuzz_sink = 0;

namespace {

// Reads every byte of every tensor (so the sanitizers see any out-of-bounds view) and decodes a
// few elements; a wrong size is a bug in the parser, reported by abort() for the fuzzer.
void TouchTensors(std::span<const std::byte> file, const chunkserve::model::SafetensorsHeader& h) {
  using chunkserve::model::ConvertToFloat;
  unsigned sum = 0;
  for (const auto& t : h.tensors) {
    if (h.data_offset() + t.end > file.size() || t.begin > t.end) std::abort();
    const std::byte* data = file.data() + h.data_offset() + t.begin;
    for (uint64_t i = 0; i < t.size_bytes(); ++i) sum += static_cast<unsigned>(data[i]);
    const uint64_t elements = static_cast<uint64_t>(t.num_elements());
    if (elements * chunkserve::model::DTypeSize(t.dtype) != t.size_bytes()) std::abort();
    float first[4];
    const size_t n = elements < 4 ? static_cast<size_t>(elements) : 4;
    ConvertToFloat(t.dtype, data, std::span<float>(first, n));
  }
  chunkserve_fuzz_sink = sum;
}

// What parses re-encodes (EncodeSafetensors) to a file that parses to the same tensors -- names,
// dtypes, shapes and bytes -- and metadata, whatever the original's order, gaps and padding.
void RoundTrip(std::span<const std::byte> file, const chunkserve::model::SafetensorsHeader& h) {
  using namespace chunkserve::model;
  std::vector<TensorToWrite> tensors;
  for (const auto& t : h.tensors) {
    tensors.push_back({t.name, t.dtype, t.shape,
                       file.subspan(h.data_offset() + t.begin, t.size_bytes())});
  }
  auto encoded = EncodeSafetensors(tensors, h.metadata);
  if (!encoded.ok()) std::abort();
  auto again = ParseSafetensorsHeader(*encoded, "re-encoded.safetensors");
  if (!again.ok() || again->tensors.size() != h.tensors.size() || again->metadata != h.metadata) {
    std::abort();
  }
  for (size_t i = 0; i < h.tensors.size(); ++i) {  // both sorted by name
    const auto& a = h.tensors[i];
    const auto& b = again->tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape ||
        a.size_bytes() != b.size_bytes() ||
        std::memcmp(file.data() + h.data_offset() + a.begin,
                    encoded->data() + again->data_offset() + b.begin, a.size_bytes()) != 0) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  auto header = chunkserve::model::ParseSafetensorsHeader(file, "fuzz.safetensors");
  if (header.ok()) {
    TouchTensors(file, *header);
    RoundTrip(file, *header);
  }
  return 0;
}
