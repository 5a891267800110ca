// libFuzzer target for the wire decoder: any bytes, any split, never a crash or a leak.
// Built as a normal object; wire_fuzz_replay_test.cc replays the corpus and mutations in ctest
// (under ASan/UBSan). With clang: clang++ -fsanitize=fuzzer,address wire_fuzz.cc ...
#include <cstddef>
#include <cstdint>

#include "runtime/wire/framing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using chunkserve::wire::DecodedMessage;
  using chunkserve::wire::FrameDecoder;
  using chunkserve::wire::ReaderLimits;
  const ReaderLimits limits{.max_message_bytes = 1u << 20,
                            .max_segments = 16,
                            .traversal_limit_words = 1u << 16,
                            .nesting_limit = 16};
  (void)chunkserve::wire::DecodeFrame(data, size, limits);
  // Incremental, split at a data-dependent point.
  FrameDecoder decoder(limits);
  const size_t split = size == 0 ? 0 : data[0] % (size + 1);
  if (decoder.Feed(data, split).ok()) (void)decoder.Feed(data + split, size - split);
  DecodedMessage m;
  while (decoder.Next(&m)) {
    auto root = m.root();
    if (root.which() == chunkserve::wire::schema::Envelope::GENERATE) {
      for (uint32_t t : root.getGenerate().getPrompt()) (void)t;
    }
  }
  return 0;
}
