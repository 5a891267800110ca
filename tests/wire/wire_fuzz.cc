// libFuzzer target for the wire decoder: any bytes, any split, never a crash or a leak; one-shot
// and incremental decoding agree (so trailing bytes after a frame are refused); and for the client
// protocol codecs, whatever decodes re-encodes to an equal message.
// Built as a normal object; wire_fuzz_replay_test.cc replays the corpus and mutations in ctest
// (under ASan/UBSan). With clang: clang++ -fsanitize=fuzzer,address wire_fuzz.cc ...
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "runtime/wire/client_protocol.h"
#include "runtime/wire/framing.h"

namespace {

using chunkserve::wire::DecodeFinish;
using chunkserve::wire::DecodeGenerate;
using chunkserve::wire::DecodeToken;
using chunkserve::wire::EncodeFinish;
using chunkserve::wire::EncodeGenerate;
using chunkserve::wire::EncodeToken;
using chunkserve::wire::FinishMessage;
using chunkserve::wire::schema::Envelope;

// Decodes a frame the codec wrote and checks `same` on it; a mismatch is a bug: trap.
template <typename Same>
void RoundTrip(const std::vector<uint8_t>& frame, const chunkserve::wire::ReaderLimits& limits,
               Same same) {
  auto decoded = chunkserve::wire::DecodeFrame(frame.data(), frame.size(), limits);
  if (!decoded.ok() || !same(decoded->root())) __builtin_trap();
}

// Equal logprobs, floats compared by their bits (a fuzzed NaN must survive the round trip too).
bool SameLogprobs(const std::optional<chunkserve::TokenLogprobs>& a,
                  const std::optional<chunkserve::TokenLogprobs>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a.has_value()) return true;
  const auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  if (bits(a->logprob) != bits(b->logprob) || a->top.size() != b->top.size()) return false;
  for (size_t i = 0; i < a->top.size(); ++i) {
    if (a->top[i].token != b->top[i].token || bits(a->top[i].logprob) != bits(b->top[i].logprob)) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using chunkserve::wire::DecodedMessage;
  using chunkserve::wire::FrameDecoder;
  using chunkserve::wire::ReaderLimits;
  const ReaderLimits limits{.max_message_bytes = 1u << 20,
                            .max_segments = 16,
                            .traversal_limit_words = 1u << 16,
                            .nesting_limit = 16};
  // One-shot and incremental decoding agree: DecodeFrame accepts exactly the inputs that are one
  // whole frame for the incremental decoder (no trailing bytes, no second frame), with the same
  // message.
  auto one_shot = chunkserve::wire::DecodeFrame(data, size, limits);
  {
    FrameDecoder whole(limits);
    DecodedMessage m;
    int frames = 0;
    size_t first_bytes = 0;
    Envelope::Which first_which = Envelope::Which::GENERATE;
    const bool fed = whole.Feed(data, size).ok();
    while (fed && whole.Next(&m)) {
      if (frames++ == 0) {
        first_bytes = m.frame_bytes();
        first_which = m.root().which();
      }
    }
    const bool exactly_one = fed && frames == 1 && first_bytes == size;
    if (one_shot.ok() != exactly_one) __builtin_trap();
    if (one_shot.ok() && one_shot->root().which() != first_which) __builtin_trap();
  }
  // Incremental, split at a data-dependent point.
  FrameDecoder decoder(limits);
  const size_t split = size == 0 ? 0 : data[0] % (size + 1);
  if (decoder.Feed(data, split).ok()) (void)decoder.Feed(data + split, size - split);
  DecodedMessage m;
  while (decoder.Next(&m)) {
    auto root = m.root();
    // The typed codecs (client_protocol.h): what decodes must re-encode to itself.
    switch (root.which()) {
      case Envelope::GENERATE:
        if (auto g = DecodeGenerate(root.getGenerate()); g.ok()) {
          RoundTrip(EncodeGenerate(*g), limits, [&](Envelope::Reader r) {
            auto again = DecodeGenerate(r.getGenerate());
            return again.ok() && again->prompt == g->prompt &&
                   again->stop_tokens == g->stop_tokens &&
                   again->max_new_tokens == g->max_new_tokens &&
                   again->sampling.has_value() == g->sampling.has_value() &&
                   again->request_id == g->request_id && again->deadline_ms == g->deadline_ms &&
                   again->priority == g->priority && again->logprobs == g->logprobs;
          });
        }
        break;
      case Envelope::TOKEN:
        if (auto t = DecodeToken(root.getToken()); t.ok()) {
          RoundTrip(EncodeToken(*t), limits, [&](Envelope::Reader r) {
            auto again = DecodeToken(r.getToken());
            return again.ok() && again->request_id == t->request_id &&
                   again->token == t->token && again->index == t->index &&
                   SameLogprobs(again->logprobs, t->logprobs);
          });
        }
        break;
      case Envelope::FINISH: {
        const FinishMessage f = DecodeFinish(root.getFinish());
        RoundTrip(EncodeFinish(f), limits, [&](Envelope::Reader r) {
          const FinishMessage again = DecodeFinish(r.getFinish());
          return again.request_id == f.request_id && again.reason == f.reason &&
                 again.error == f.error && again.prompt_tokens == f.prompt_tokens &&
                 again.cached_tokens == f.cached_tokens &&
                 again.generated_tokens == f.generated_tokens;
        });
        break;
      }
      default:
        break;
    }
  }
  return 0;
}
