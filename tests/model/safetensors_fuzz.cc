// Fuzz target for the safetensors header parser: any bytes, as a whole file, must yield a Status
// or a header whose every tensor lies inside the input. With clang this file is a libFuzzer target
// (chunkserve-safetensors-fuzzer); with every compiler, safetensors_fuzz_replay_test.cc drives it
// over tests/model/fuzz_corpus/ and mutations of it under ASan and UBSan.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  auto header = chunkserve::model::ParseSafetensorsHeader(file, "fuzz.safetensors");
  if (header.ok()) TouchTensors(file, *header);
  return 0;
}
