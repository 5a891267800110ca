// Fuzz target for the GGUF reader: any bytes, as a whole file, must yield a Status or a GgufFile
// whose every key can be read back and whose every tensor lies inside the input. With clang this
// file is a libFuzzer target (chunkserve-gguf-fuzzer); with every compiler,
// gguf_fuzz_replay_test.cc drives it over tests/model/gguf_fuzz_corpus/ and mutations of it under
// ASan and UBSan.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "runtime/model/gguf.h"
#include "runtime/model/gguf_quant.h"

// Written with every checksum so the compiler cannot drop the reads.
volatile unsigned chunkserve_gguf_fuzz_sink = 0;

namespace {

using chunkserve::model::GgufFile;
using chunkserve::model::GgufValueType;

// Reads every key through the getter its type calls for, and through the wrong ones (which must
// fail cleanly). A getter that fails on a key of its own type is a parser bug: abort().
unsigned WalkKeys(const GgufFile& g) {
  unsigned sum = 0;
  for (const std::string& key : g.keys()) {
    const auto type = g.Type(key);
    if (!type.ok()) std::abort();
    switch (*type) {
      case GgufValueType::kString:
        if (!g.GetString(key).ok()) std::abort();
        sum += static_cast<unsigned>(g.GetString(key)->size());
        break;
      case GgufValueType::kFloat32:
      case GgufValueType::kFloat64:
        if (!g.GetFloat(key).ok()) std::abort();
        break;
      case GgufValueType::kBool:
        sum += g.GetBool(key).value_or(false) ? 1 : 0;
        break;
      case GgufValueType::kArray: {
        const auto element = g.ArrayType(key);
        const auto length = g.ArrayLength(key);
        if (!element.ok() || !length.ok()) std::abort();
        if (*element == GgufValueType::kString) {
          const auto strings = g.GetStringArray(key);
          if (!strings.ok() || strings->size() != *length) std::abort();
          for (const std::string& s : *strings) sum += static_cast<unsigned>(s.size());
        } else if (*element == GgufValueType::kFloat32 || *element == GgufValueType::kFloat64) {
          const auto floats = g.GetFloatArray(key);
          if (!floats.ok() || floats->size() != *length) std::abort();
        } else {
          // Integers (a uint64 above INT64_MAX fails cleanly) or bools (not integers).
          const auto ints = g.GetIntArray(key);
          if (ints.ok() && ints->size() != *length) std::abort();
        }
        break;
      }
      default: {  // integers: a uint64 above INT64_MAX fails cleanly
        const auto v = g.GetInt(key);
        sum += v.ok() ? static_cast<unsigned>(*v) : 0;
        break;
      }
    }
    // Wrong-type reads fail without touching anything they should not.
    sum += g.GetBool(key).ok() ? 1 : 0;
    sum += g.GetStringArray(key).ok() ? 1 : 0;
    sum += g.GetFloat(key).ok() ? 1 : 0;
  }
  return sum;
}

// Reads every byte of every tensor (so the sanitizers see any out-of-bounds view) and checks the
// size against the type's block layout; dequantizes the small ones.
unsigned TouchTensors(std::span<const uint8_t> file, const GgufFile& g) {
  unsigned sum = 0;
  for (const auto& t : g.tensors()) {
    if (t.data < file.data() || t.size_bytes > file.size() ||
        t.data + t.size_bytes > file.data() + file.size()) {
      std::abort();
    }
    const auto traits = chunkserve::model::GgmlTypeInfo(static_cast<uint32_t>(t.type));
    if (!traits.has_value()) std::abort();
    const uint64_t elements = static_cast<uint64_t>(t.num_elements());
    if (elements / static_cast<uint64_t>(traits->block_size) *
            static_cast<uint64_t>(traits->type_size) != t.size_bytes) {
      std::abort();
    }
    for (uint64_t i = 0; i < t.size_bytes; ++i) sum += t.data[i];
    // Dequantize what the loader would (bounded, so a large empty-looking tensor stays cheap).
    if (chunkserve::model::CanDequantize(t.type) && elements <= (1u << 16)) {
      std::vector<float> out(static_cast<size_t>(elements));
      if (!chunkserve::model::DequantizeGgml(t.type, t.bytes(), out).ok()) std::abort();
    }
    if (g.FindTensor(t.name) != &t) std::abort();
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> file(data, size);
  auto g = GgufFile::Parse(file, "fuzz.gguf");
  if (g.ok()) chunkserve_gguf_fuzz_sink = WalkKeys(**g) + TouchTensors(file, **g);
  return 0;
}
