// GgufBuilder: small GGUF files written byte by byte for tests, including malformed ones (wrong
// counts, offsets and types can be forced). Independent of the reader in runtime/model/gguf.cc.
#ifndef CHUNKSERVE_TESTS_MODEL_GGUF_TEST_UTIL_H_
#define CHUNKSERVE_TESTS_MODEL_GGUF_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chunkserve::model::testing {

class GgufBuilder {
 public:
  // Value type numbers of the format.
  enum : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
  };

  GgufBuilder& Version(uint32_t v) { version_ = v; return *this; }
  // Forces the header's counts (to lie about them).
  GgufBuilder& KvCount(uint64_t n) { kv_count_ = n; return *this; }
  GgufBuilder& TensorCount(uint64_t n) { tensor_count_ = n; return *this; }
  // Alignment used to lay out the data section; also written as general.alignment (u32) unless
  // `write_key` is false.
  GgufBuilder& Alignment(uint32_t a, bool write_key = true) {
    alignment_ = a;
    if (write_key) Scalar<uint32_t>("general.alignment", kU32, a);
    return *this;
  }

  template <typename T>
  GgufBuilder& Scalar(std::string_view key, uint32_t type, T value) {
    Key(key, type);
    Put(kv_, value);
    ++kvs_;
    return *this;
  }
  GgufBuilder& String(std::string_view key, std::string_view value) {
    Key(key, kString);
    Str(kv_, value);
    ++kvs_;
    return *this;
  }
  template <typename T>
  GgufBuilder& Array(std::string_view key, uint32_t element_type, const std::vector<T>& values,
                     std::optional<uint64_t> count = std::nullopt) {
    Key(key, kArray);
    Put<uint32_t>(kv_, element_type);
    Put<uint64_t>(kv_, count.value_or(values.size()));
    for (const T& v : values) Put(kv_, v);
    ++kvs_;
    return *this;
  }
  GgufBuilder& StringArray(std::string_view key, const std::vector<std::string>& values) {
    Key(key, kArray);
    Put<uint32_t>(kv_, kString);
    Put<uint64_t>(kv_, values.size());
    for (const std::string& v : values) Str(kv_, v);
    ++kvs_;
    return *this;
  }
  // Raw bytes appended to the kv section (for hand-made malformed values).
  GgufBuilder& RawKv(std::string_view bytes, bool counts = true) {
    kv_.append(bytes);
    kvs_ += counts ? 1 : 0;
    return *this;
  }

  // A tensor with `data` (its bytes), placed after the previous tensor, padded to the alignment.
  // `offset` forces the offset written in the tensor info (the data stays where it was placed).
  GgufBuilder& Tensor(std::string_view name, uint32_t ggml_type, std::vector<uint64_t> dims,
                      std::string_view data, std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({std::string(name), ggml_type, std::move(dims), std::string(data), offset});
    return *this;
  }

  std::string Build() const {
    std::string out = "GGUF";
    Put<uint32_t>(out, version_);
    Put<uint64_t>(out, tensor_count_.value_or(tensors_.size()));
    Put<uint64_t>(out, kv_count_.value_or(kvs_));
    out += kv_;
    // Data layout first, so infos can carry offsets.
    std::string data;
    std::vector<uint64_t> offsets;
    for (const T& t : tensors_) {
      while (data.size() % alignment_ != 0) data.push_back('\0');
      // A forced offset is written as is; the bytes still go to the next aligned position (so an
      // absurd offset cannot make the builder allocate).
      offsets.push_back(t.offset.value_or(data.size()));
      data += t.data;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const T& t = tensors_[i];
      Str(out, t.name);
      Put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) Put<uint64_t>(out, d);
      Put<uint32_t>(out, t.type);
      Put<uint64_t>(out, offsets[i]);
    }
    if (!tensors_.empty()) {
      while (out.size() % alignment_ != 0) out.push_back('\0');
    }
    out += data;
    return out;
  }

 private:
  struct T {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> dims;
    std::string data;
    std::optional<uint64_t> offset;
  };

  template <typename V>
  static void Put(std::string& out, V v) {
    char b[sizeof(V)];
    std::memcpy(b, &v, sizeof(V));
    out.append(b, sizeof(V));
  }
  static void Put(std::string& out, const std::string& s) { Str(out, s); }
  static void Str(std::string& out, std::string_view s) {
    Put<uint64_t>(out, s.size());
    out.append(s);
  }
  void Key(std::string_view key, uint32_t type) {
    Str(kv_, key);
    Put<uint32_t>(kv_, type);
  }

  uint32_t version_ = 3;
  uint32_t alignment_ = 32;
  std::optional<uint64_t> kv_count_;
  std::optional<uint64_t> tensor_count_;
  uint64_t kvs_ = 0;
  std::string kv_;
  std::vector<T> tensors_;
};

inline std::span<const uint8_t> AsU8(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace chunkserve::model::testing

#endif  // CHUNKSERVE_TESTS_MODEL_GGUF_TEST_UTIL_H_
