#include "runtime/workload/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

namespace chunkserve::workload {

uint64_t Rng::NextU64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::Uniform01() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

int64_t Rng::UniformInt(int64_t lo, int64_t hi) {
  const auto span = static_cast<uint64_t>(hi - lo) + 1;
  if (span == 0) return static_cast<int64_t>(NextU64());  // the full 64-bit range
  // Multiply-high: bias below 2^-64 * span, irrelevant here.
  const auto r = static_cast<uint64_t>((static_cast<unsigned __int128>(NextU64()) * span) >> 64);
  return lo + static_cast<int64_t>(r);
}

double Rng::Exponential(double rate) { return -std::log1p(-Uniform01()) / rate; }

namespace {

uint64_t SeedFor(uint64_t seed, uint64_t stream, uint64_t index) {
  Rng r(seed ^ (stream * 0xd1b54a32d192ed03ull) ^ (index * 0x8cb92ba72f3d8dd7ull));
  return r.NextU64();
}

void AppendRandomTokens(Rng& rng, int32_t n, int32_t vocab, std::vector<TokenId>& out) {
  for (int32_t i = 0; i < n; ++i) out.push_back(static_cast<TokenId>(rng.UniformInt(0, vocab - 1)));
}

std::vector<TokenId> PrefixTokens(uint64_t seed, int64_t prefix_id, int32_t n, int32_t vocab) {
  Rng rng(SeedFor(seed, 1, static_cast<uint64_t>(prefix_id)));
  std::vector<TokenId> t;
  t.reserve(static_cast<size_t>(n));
  AppendRandomTokens(rng, n, vocab, t);
  return t;
}

std::vector<double> ZipfCdf(int32_t n, double s) {
  std::vector<double> cdf;
  double sum = 0;
  for (int32_t k = 0; k < n; ++k) {
    sum += 1.0 / std::pow(static_cast<double>(k + 1), s);
    cdf.push_back(sum);
  }
  for (double& c : cdf) c /= sum;
  return cdf;
}

int32_t ZipfPick(const std::vector<double>& cdf, double u) {
  return static_cast<int32_t>(
      std::min<ptrdiff_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(),
                          static_cast<ptrdiff_t>(cdf.size()) - 1));
}

// The tenants of a workload: prefix lengths, Zipf popularity, prefix tokens made on first use.
class Tenants {
 public:
  explicit Tenants(const WorkloadOptions& o)
      : seed_(o.seed),
        vocab_(o.vocab_size),
        lengths_(TenantPrefixLengths(o)),
        cdf_(ZipfCdf(o.tenants, o.zipf_s)),
        prefixes_(static_cast<size_t>(o.tenants)) {}

  int32_t Pick(Rng& rng) const { return ZipfPick(cdf_, rng.Uniform01()); }
  int32_t Length(int32_t tenant) const { return lengths_[static_cast<size_t>(tenant)]; }
  const std::vector<TokenId>& Prefix(int32_t tenant) {
    auto& p = prefixes_[static_cast<size_t>(tenant)];
    if (p.empty()) p = PrefixTokens(seed_, tenant, Length(tenant), vocab_);
    return p;
  }

 private:
  uint64_t seed_;
  int32_t vocab_;
  std::vector<int32_t> lengths_;
  std::vector<double> cdf_;
  std::vector<std::vector<TokenId>> prefixes_;
};

// Request indices and Poisson arrival times (all at t = 0 for rate 0).
class Arrivals {
 public:
  // The next request with its index and arrival set, or nullopt after num_requests.
  std::optional<WorkloadRequest> Next(const WorkloadOptions& o, Rng& rng) {
    if (next_ >= o.num_requests) return std::nullopt;
    WorkloadRequest r;
    r.index = static_cast<uint64_t>(next_++);
    if (o.arrival_rate > 0) now_ += rng.Exponential(o.arrival_rate);
    r.arrival_s = now_;
    return r;
  }

 private:
  int64_t next_ = 0;
  double now_ = 0;
};

class SyntheticSource final : public WorkloadSource {
 public:
  explicit SyntheticSource(const WorkloadOptions& o)
      : o_(o), rng_(SeedFor(o.seed, 0, 0)), tenants_(o) {}

  std::optional<WorkloadRequest> Next() override {
    std::optional<WorkloadRequest> next = arrivals_.Next(o_, rng_);
    if (!next) return next;
    WorkloadRequest& r = *next;
    const int32_t tenant = tenants_.Pick(rng_);
    const auto suffix =
        static_cast<int32_t>(rng_.UniformInt(o_.min_suffix_tokens, o_.max_suffix_tokens));
    r.output_tokens =
        static_cast<int32_t>(rng_.UniformInt(o_.min_output_tokens, o_.max_output_tokens));
    const int32_t prefix_len = tenants_.Length(tenant);
    if (o_.shared_prefixes && prefix_len > 0) {
      r.tenant = tenant;
      r.prefix_tokens = prefix_len;
      r.prompt.reserve(static_cast<size_t>(prefix_len + suffix));
      r.prompt = tenants_.Prefix(tenant);
    } else {
      // Same lengths, fresh tokens: the control has the same prefill work but nothing to share.
      AppendRandomTokens(rng_, prefix_len, o_.vocab_size, r.prompt);
    }
    AppendRandomTokens(rng_, suffix, o_.vocab_size, r.prompt);
    return next;
  }

 private:
  WorkloadOptions o_;
  Rng rng_;
  Tenants tenants_;
  Arrivals arrivals_;
};

// multi_turn and agent (workload.h, WorkloadFamily).
class ConversationSource final : public WorkloadSource {
 public:
  explicit ConversationSource(const WorkloadOptions& o)
      : o_(o), rng_(SeedFor(o.seed, 5, 0)), tenants_(o) {}

  std::optional<WorkloadRequest> Next() override {
    std::optional<WorkloadRequest> next = arrivals_.Next(o_, rng_);
    if (!next) return next;
    WorkloadRequest& r = *next;
    const double p_new = 2.0 / (o_.min_turns + o_.max_turns);
    const auto message =
        static_cast<int32_t>(rng_.UniformInt(o_.min_suffix_tokens, o_.max_suffix_tokens));
    r.output_tokens =
        static_cast<int32_t>(rng_.UniformInt(o_.min_output_tokens, o_.max_output_tokens));
    size_t c = active_.size();
    if (!active_.empty() && (static_cast<int32_t>(active_.size()) >= o_.active_conversations ||
                             rng_.Uniform01() >= p_new)) {
      c = static_cast<size_t>(rng_.UniformInt(0, static_cast<int64_t>(active_.size()) - 1));
      if (static_cast<int64_t>(active_[c].tokens.size()) + message > o_.max_prompt_tokens) {
        End(c);  // too long to go on: this arrival starts a new conversation instead
        c = active_.size();
      }
    }
    if (c == active_.size()) {
      Conversation conv;
      conv.turns_left = static_cast<int32_t>(rng_.UniformInt(o_.min_turns, o_.max_turns));
      if (o_.family == WorkloadFamily::kMultiTurn) {
        conv.tenant = 0;
        if (system_.empty()) {
          system_ = PrefixTokens(o_.seed, 0, o_.system_tokens, o_.vocab_size);
        }
        conv.tokens = system_;
      } else {
        conv.tenant = tenants_.Pick(rng_);
        conv.tokens = tenants_.Prefix(conv.tenant);
      }
      conv.prefix_tokens = static_cast<int32_t>(conv.tokens.size());
      active_.push_back(std::move(conv));
    }
    Conversation& conv = active_[c];
    AppendRandomTokens(rng_, message, o_.vocab_size, conv.tokens);
    r.tenant = conv.prefix_tokens > 0 ? conv.tenant : -1;
    r.prefix_tokens = conv.prefix_tokens;
    r.prompt = conv.tokens;
    // The answer becomes part of the next turn's prompt.
    AppendRandomTokens(rng_, r.output_tokens, o_.vocab_size, conv.tokens);
    if (--conv.turns_left == 0) End(c);
    return next;
  }

 private:
  struct Conversation {
    std::vector<TokenId> tokens;  // the next turn's prompt so far
    int32_t tenant = 0;
    int32_t prefix_tokens = 0;
    int32_t turns_left = 1;
  };
  void End(size_t c) {
    std::swap(active_[c], active_.back());
    active_.pop_back();
  }

  WorkloadOptions o_;
  Rng rng_;
  Tenants tenants_;
  Arrivals arrivals_;
  std::vector<TokenId> system_;
  std::vector<Conversation> active_;
};

// The negative control of a family: same lengths and arrivals, every token fresh.
class FreshTokensSource final : public WorkloadSource {
 public:
  FreshTokensSource(std::unique_ptr<WorkloadSource> inner, const WorkloadOptions& o)
      : inner_(std::move(inner)), rng_(SeedFor(o.seed, 6, 0)), vocab_(o.vocab_size) {}
  std::optional<WorkloadRequest> Next() override {
    std::optional<WorkloadRequest> r = inner_->Next();
    if (!r) return r;
    const auto n = static_cast<int32_t>(r->prompt.size());
    r->prompt.clear();
    AppendRandomTokens(rng_, n, vocab_, r->prompt);
    r->tenant = -1;
    r->prefix_tokens = 0;
    return r;
  }

 private:
  std::unique_ptr<WorkloadSource> inner_;
  Rng rng_;
  int32_t vocab_;
};

class VectorSource final : public WorkloadSource {
 public:
  explicit VectorSource(std::vector<WorkloadRequest> requests) : requests_(std::move(requests)) {}
  std::optional<WorkloadRequest> Next() override {
    if (next_ >= requests_.size()) return std::nullopt;
    return std::move(requests_[next_++]);
  }

 private:
  std::vector<WorkloadRequest> requests_;
  size_t next_ = 0;
};

Status Validate(const WorkloadOptions& o) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument("workload: " + m); };
  if (o.num_requests < 0) return bad("num_requests must be >= 0");
  if (o.tenants < 1) return bad("tenants must be >= 1");
  if (!(o.zipf_s >= 0) || o.zipf_s > 10) return bad("zipf_s must be in [0, 10]");
  if (!(o.arrival_rate >= 0) || std::isinf(o.arrival_rate)) return bad("arrival_rate must be >= 0");
  // The shortest and longest shared prefix a request can have.
  int32_t min_prefix = o.min_prefix_tokens, max_prefix = o.max_prefix_tokens;
  if (o.prefix_lengths.empty()) {
    if (o.prefix_length_bases.empty()) return bad("prefix_length_bases is empty");
    for (int32_t b : o.prefix_length_bases) {
      if (b < 1) return bad("prefix length base " + std::to_string(b) + " < 1");
    }
    if (o.min_prefix_tokens < 1 || o.max_prefix_tokens < o.min_prefix_tokens) {
      return bad("need 1 <= min_prefix_tokens <= max_prefix_tokens");
    }
  } else {
    for (int32_t n : o.prefix_lengths) {
      if (n < 0 || n > (1 << 24))
        return bad("prefix length " + std::to_string(n) + " not in [0, 2^24]");
    }
    min_prefix = *std::min_element(o.prefix_lengths.begin(), o.prefix_lengths.end());
    max_prefix = *std::max_element(o.prefix_lengths.begin(), o.prefix_lengths.end());
  }
  if (o.min_suffix_tokens < 0 || o.max_suffix_tokens < o.min_suffix_tokens) {
    return bad("need 0 <= min_suffix_tokens <= max_suffix_tokens");
  }
  const bool first_prompt_may_be_empty =
      o.family == WorkloadFamily::kMultiTurn ? o.system_tokens < 1 : min_prefix < 1;
  if (o.min_suffix_tokens < 1 && first_prompt_may_be_empty) {
    return bad("min_suffix_tokens must be >= 1 where a shared prefix may be empty");
  }
  if (o.min_output_tokens < 1 || o.max_output_tokens < o.min_output_tokens) {
    return bad("need 1 <= min_output_tokens <= max_output_tokens");
  }
  if (int64_t{max_prefix} + o.max_suffix_tokens > (int64_t{1} << 24)) {
    return bad("prompts longer than 16M tokens");
  }
  if (o.vocab_size < 2) return bad("vocab_size must be >= 2");
  if (o.family == WorkloadFamily::kMultiTurn || o.family == WorkloadFamily::kAgent) {
    if (o.min_turns < 1 || o.max_turns < o.min_turns) {
      return bad("need 1 <= min_turns <= max_turns");
    }
    if (o.active_conversations < 1) return bad("active_conversations must be >= 1");
    if (o.max_prompt_tokens > (1 << 24)) return bad("max_prompt_tokens > 16M");
    const int64_t first =
        (o.family == WorkloadFamily::kMultiTurn ? int64_t{o.system_tokens} : int64_t{max_prefix}) +
        o.max_suffix_tokens;
    if (o.family == WorkloadFamily::kMultiTurn && o.system_tokens < 1) {
      return bad("system_tokens must be >= 1");
    }
    if (first > o.max_prompt_tokens) {
      return bad("a first turn (" + std::to_string(first) + " tokens) exceeds max_prompt_tokens " +
                 std::to_string(o.max_prompt_tokens));
    }
  }
  return Status::Ok();
}

}  // namespace

std::vector<int32_t> TenantPrefixLengths(const WorkloadOptions& o) {
  if (!o.prefix_lengths.empty()) return o.prefix_lengths;
  std::vector<int32_t> lengths;
  if (o.prefix_length_bases.empty()) return lengths;
  Rng rng(SeedFor(o.seed, 2, 0));
  for (int32_t t = 0; t < o.tenants; ++t) {
    const double base =
        o.prefix_length_bases[static_cast<size_t>(t) % o.prefix_length_bases.size()];
    const double len = base * (0.5 + rng.Uniform01());
    lengths.push_back(std::clamp(static_cast<int32_t>(std::lround(len)), o.min_prefix_tokens,
                                 o.max_prefix_tokens));
  }
  return lengths;
}

Result<std::unique_ptr<WorkloadSource>> MakeSyntheticWorkload(const WorkloadOptions& given) {
  WorkloadOptions options = given;
  if (!options.prefix_lengths.empty()) {  // one tenant per exact length
    if (options.prefix_lengths.size() > (1u << 20)) {
      return Status::InvalidArgument("workload: more than 2^20 prefix lengths");
    }
    options.tenants = static_cast<int32_t>(options.prefix_lengths.size());
  }
  CHUNKSERVE_RETURN_IF_ERROR(Validate(options));
  switch (options.family) {
    case WorkloadFamily::kMultiTenant:
    case WorkloadFamily::kLongDoc:  // the same generator, huge prefixes (ForFamily)
      return std::unique_ptr<WorkloadSource>(new SyntheticSource(options));
    case WorkloadFamily::kMultiTurn:
    case WorkloadFamily::kAgent: {
      std::unique_ptr<WorkloadSource> source(new ConversationSource(options));
      if (!options.shared_prefixes) {
        source = std::make_unique<FreshTokensSource>(std::move(source), options);
      }
      return source;
    }
  }
  return Status::InvalidArgument("workload: unknown family");
}

std::vector<WorkloadRequest> ReadAll(WorkloadSource& source) {
  std::vector<WorkloadRequest> out;
  while (std::optional<WorkloadRequest> r = source.Next()) out.push_back(std::move(*r));
  return out;
}

Result<std::vector<WorkloadRequest>> GenerateWorkload(const WorkloadOptions& options) {
  CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<WorkloadSource> source,
                              MakeSyntheticWorkload(options));
  return ReadAll(*source);
}

std::string_view WorkloadFamilyName(WorkloadFamily f) {
  switch (f) {
    case WorkloadFamily::kMultiTenant:
      return "multi_tenant";
    case WorkloadFamily::kMultiTurn:
      return "multi_turn";
    case WorkloadFamily::kAgent:
      return "agent";
    case WorkloadFamily::kLongDoc:
      return "long_doc";
  }
  return "unknown";
}

std::vector<WorkloadFamily> AllWorkloadFamilies() {
  return {WorkloadFamily::kMultiTenant, WorkloadFamily::kMultiTurn, WorkloadFamily::kAgent,
          WorkloadFamily::kLongDoc};
}

Result<WorkloadFamily> ParseWorkloadFamily(std::string_view name) {
  for (WorkloadFamily f : AllWorkloadFamilies()) {
    if (WorkloadFamilyName(f) == name) return f;
  }
  return Status::InvalidArgument("unknown workload '" + std::string(name) +
                                 "' (multi_tenant, multi_turn, agent, long_doc)");
}

WorkloadOptions ForFamily(WorkloadFamily family) {
  WorkloadOptions o;
  o.family = family;
  switch (family) {
    case WorkloadFamily::kMultiTenant:
      break;
    case WorkloadFamily::kMultiTurn:
      o.tenants = 1;
      o.system_tokens = 256;
      o.min_suffix_tokens = 64;
      o.max_suffix_tokens = 1024;
      o.min_output_tokens = 64;
      o.max_output_tokens = 512;
      o.min_turns = 2;
      o.max_turns = 12;
      o.max_prompt_tokens = 32768;
      o.active_conversations = 256;
      break;
    case WorkloadFamily::kAgent:
      o.tenants = 8;
      o.prefix_length_bases = {8000, 12000, 6000, 10000};
      o.min_prefix_tokens = 2000;
      o.max_prefix_tokens = 16000;
      o.min_suffix_tokens = 32;
      o.max_suffix_tokens = 256;
      o.min_output_tokens = 16;
      o.max_output_tokens = 128;
      o.min_turns = 8;
      o.max_turns = 40;
      o.max_prompt_tokens = 65536;
      o.active_conversations = 256;
      break;
    case WorkloadFamily::kLongDoc:
      o.tenants = 8;
      o.prefix_length_bases = {80000};
      o.min_prefix_tokens = 16000;
      o.max_prefix_tokens = 120000;
      o.min_suffix_tokens = 32;
      o.max_suffix_tokens = 512;
      o.min_output_tokens = 32;
      o.max_output_tokens = 256;
      break;
  }
  return o;
}

WorkloadOptions ForSharedPrefix(int32_t n_p, int32_t n_s, int32_t n_c) {
  WorkloadOptions o;
  o.prefix_lengths = {n_s};
  o.min_suffix_tokens = o.max_suffix_tokens = n_p - n_s;
  o.min_output_tokens = o.max_output_tokens = n_c;
  return o;
}

Result<std::unique_ptr<WorkloadSource>> ParseJsonlTrace(std::string_view text, int32_t vocab_size,
                                                        uint64_t seed) {
  using Json = nlohmann::json;
  if (vocab_size < 2) return Status::InvalidArgument("trace: vocab_size must be >= 2");
  std::vector<WorkloadRequest> out;
  std::istringstream in{std::string(text)};
  std::string line;
  int64_t line_no = 0;
  double last_arrival = 0;
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const std::string& m) {
      return Status::InvalidArgument("trace line " + std::to_string(line_no) + ": " + m);
    };
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    WorkloadRequest r;
    r.index = out.size();
    auto number = [&](const char* key, double& v) -> bool {
      auto it = j.find(key);
      if (it == j.end()) return false;
      if (!it->is_number()) return false;
      v = it->get<double>();
      return std::isfinite(v);
    };
    double arrival = 0, output = 0;
    if (!number("arrival_s", arrival) || arrival < 0) return bad("arrival_s missing or < 0");
    if (arrival < last_arrival) return bad("arrival_s decreases");
    last_arrival = arrival;
    r.arrival_s = arrival;
    if (!number("output_tokens", output) || output < 1 || output > kMaxTokens) {
      return bad("output_tokens missing or not in [1, 2^24]");
    }
    r.output_tokens = static_cast<int32_t>(output);
    if (auto p = j.find("prompt"); p != j.end()) {
      if (!p->is_array() || p->empty() || p->size() > static_cast<size_t>(kMaxTokens)) {
        return bad("prompt must be a non-empty array of token ids");
      }
      for (const Json& t : *p) {
        if (!t.is_number_integer()) return bad("prompt token is not an integer");
        const auto id = t.get<int64_t>();
        if (id < 0 || id >= vocab_size) {
          return bad("token id " + std::to_string(id) + " not in [0, " +
                     std::to_string(vocab_size) + ")");
        }
        r.prompt.push_back(static_cast<TokenId>(id));
      }
      double tenant = -1;
      if (number("tenant", tenant) || number("prefix_id", tenant)) {
        r.tenant = static_cast<int32_t>(tenant);
      }
    } else {
      double prefix_id = 0, prefix = 0, suffix = 0;
      if (!number("prefix_id", prefix_id) && !number("tenant", prefix_id)) {
        return bad("needs \"prompt\" or \"prefix_id\"");
      }
      if (prefix_id < 0 || prefix_id > 2147483647.0) return bad("prefix_id not in [0, 2^31)");
      if (!number("prefix_tokens", prefix) || prefix < 0 || prefix > kMaxTokens) {
        return bad("prefix_tokens missing or not in [0, 2^24]");
      }
      if (!number("suffix_tokens", suffix) || suffix < 0 || suffix > kMaxTokens ||
          prefix + suffix < 1) {
        return bad("suffix_tokens missing, not in [0, 2^24], or an empty prompt");
      }
      r.tenant = static_cast<int32_t>(prefix_id);
      r.prefix_tokens = static_cast<int32_t>(prefix);
      r.prompt = PrefixTokens(seed, r.tenant, r.prefix_tokens, vocab_size);
      Rng rng(SeedFor(seed, 3, static_cast<uint64_t>(line_no)));
      AppendRandomTokens(rng, static_cast<int32_t>(suffix), vocab_size, r.prompt);
    }
    out.push_back(std::move(r));
  }
  return std::unique_ptr<WorkloadSource>(new VectorSource(std::move(out)));
}

Result<std::unique_ptr<WorkloadSource>> LoadJsonlTrace(const std::string& path, int32_t vocab_size,
                                                       uint64_t seed) {
  std::ifstream f(path);
  if (!f) return Status::NotFound("cannot open trace file '" + path + "'");
  std::stringstream buf;
  buf << f.rdbuf();
  auto parsed = ParseJsonlTrace(buf.str(), vocab_size, seed);
  if (!parsed.ok()) return parsed.status().Annotate(path);
  return parsed;
}

int64_t PromptLength(const WorkloadRequest& r) {
  return r.prompt.empty() ? r.prompt_length : static_cast<int64_t>(r.prompt.size());
}

namespace {

uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Block-hash trace requests; tokens synthesized on the way out when asked.
class BlockTraceSource final : public WorkloadSource {
 public:
  BlockTraceSource(std::vector<WorkloadRequest> requests, const TraceOptions& o)
      : requests_(std::move(requests)), o_(o) {}
  std::optional<WorkloadRequest> Next() override {
    if (next_ >= requests_.size()) return std::nullopt;
    WorkloadRequest r = std::move(requests_[next_++]);
    if (o_.synthesize_tokens) {
      r.prompt =
          SynthesizeBlockTokens(r.block_ids, r.block_size, r.prompt_length, o_.vocab_size, o_.seed);
    }
    return r;
  }

 private:
  std::vector<WorkloadRequest> requests_;
  TraceOptions o_;
  size_t next_ = 0;
};

Status ValidateTraceOptions(const TraceOptions& o) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument("trace: " + m); };
  if (o.block_size < 1 || o.block_size > (1 << 20)) return bad("block_size not in [1, 2^20]");
  if (!(o.time_scale >= 0) || std::isinf(o.time_scale)) return bad("time_scale must be >= 0");
  if (o.offset < 0) return bad("offset must be >= 0");
  if (o.limit < 0) return bad("limit must be >= 0");
  if (o.vocab_size < 2) return bad("vocab_size must be >= 2");
  return Status::Ok();
}

Result<std::unique_ptr<WorkloadSource>> ParseBlockTrace(std::string_view text,
                                                        const TraceOptions& o) {
  using Json = nlohmann::json;
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  std::vector<WorkloadRequest> out;
  int64_t line_no = 0, records = 0;
  double last_ts = -1, first_ts = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (o.limit > 0 && static_cast<int64_t>(out.size()) >= o.limit) break;
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto bad = [&](const std::string& m) {
      return Status::InvalidArgument("trace line " + std::to_string(line_no) + ": " + m);
    };
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t& v) -> Status {
      auto it = j.find(key);
      if (it == j.end()) return bad(std::string("\"") + key + "\" missing");
      if (it->is_number_integer()) {
        v = it->get<int64_t>();
      } else if (it->is_number_float() && std::isfinite(it->get<double>()) &&
                 it->get<double>() == std::floor(it->get<double>()) &&
                 std::fabs(it->get<double>()) < 9e15) {
        v = static_cast<int64_t>(it->get<double>());
      } else {
        return bad(std::string("\"") + key + "\" is not an integer");
      }
      if (v < lo || v > hi) {
        return bad(std::string("\"") + key + "\" = " + std::to_string(v) + " not in [" +
                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
      }
      return Status::Ok();
    };
    double ts = 0;
    {
      auto it = j.find("timestamp");
      if (it == j.end() || !it->is_number() || !std::isfinite(it->get<double>()) ||
          it->get<double>() < 0) {
        return bad("\"timestamp\" (ms) missing or not a number >= 0");
      }
      ts = it->get<double>();
    }
    if (ts < last_ts) return bad("\"timestamp\" decreases");
    last_ts = ts;
    int64_t input = 0, output = 0;
    CHUNKSERVE_RETURN_IF_ERROR(integer("input_length", 1, kMaxTokens, input));
    CHUNKSERVE_RETURN_IF_ERROR(integer("output_length", 0, kMaxTokens, output));
    auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array()) return bad("\"hash_ids\" missing or not an array");
    const int64_t blocks = (input + o.block_size - 1) / o.block_size;
    if (static_cast<int64_t>(ids->size()) != blocks) {
      return bad("input_length " + std::to_string(input) + " needs " + std::to_string(blocks) +
                 " blocks of " + std::to_string(o.block_size) + " tokens, hash_ids has " +
                 std::to_string(ids->size()) + " (wrong --block-size?)");
    }
    if (records++ < o.offset) continue;
    WorkloadRequest r;
    r.index = out.size();
    if (out.empty()) first_ts = ts;
    r.arrival_s = (ts - first_ts) / 1000.0 * o.time_scale;
    r.prompt_length = input;
    r.output_tokens = static_cast<int32_t>(std::max<int64_t>(1, output));
    r.block_size = o.block_size;
    r.block_ids.reserve(ids->size());
    for (const Json& id : *ids) {
      if (!id.is_number_integer() ||
          (id.is_number_integer() && !id.is_number_unsigned() && id.get<int64_t>() < 0)) {
        return bad("hash_ids holds something other than a non-negative integer");
      }
      r.block_ids.push_back(id.get<uint64_t>());
    }
    out.push_back(std::move(r));
  }
  return std::unique_ptr<WorkloadSource>(new BlockTraceSource(std::move(out), o));
}

bool IsBlockTrace(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    return j.is_object() && j.contains("hash_ids");
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<WorkloadSource>> ParseTrace(std::string_view text, const TraceOptions& o) {
  CHUNKSERVE_RETURN_IF_ERROR(ValidateTraceOptions(o));
  if (IsBlockTrace(text)) return ParseBlockTrace(text, o);
  CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<WorkloadSource> all,
                              ParseJsonlTrace(text, o.vocab_size, o.seed));
  std::vector<WorkloadRequest> out;
  int64_t n = 0;
  double first = 0;
  while (auto r = all->Next()) {
    if (n++ < o.offset) continue;
    if (o.limit > 0 && static_cast<int64_t>(out.size()) >= o.limit) break;
    if (out.empty()) first = r->arrival_s;
    r->arrival_s = (r->arrival_s - first) * o.time_scale;
    r->index = out.size();
    out.push_back(std::move(*r));
  }
  return std::unique_ptr<WorkloadSource>(new VectorSource(std::move(out)));
}

Result<std::unique_ptr<WorkloadSource>> LoadTrace(const std::string& path, const TraceOptions& o) {
  std::ifstream f(path);
  if (!f) return Status::NotFound("cannot open trace file '" + path + "'");
  std::stringstream buf;
  buf << f.rdbuf();
  auto parsed = ParseTrace(buf.str(), o);
  if (!parsed.ok()) return parsed.status().Annotate(path);
  return parsed;
}

Result<std::vector<uint64_t>> BlockChunkHashes(uint64_t chain_seed, int32_t chunk_size,
                                               int32_t block_size,
                                               const std::vector<uint64_t>& block_ids,
                                               int64_t prompt_tokens) {
  if (chunk_size < 1 || block_size < 1 || prompt_tokens < 0) {
    return Status::InvalidArgument("block hashes: chunk_size, block_size must be >= 1");
  }
  const int64_t chunks = prompt_tokens / chunk_size;
  std::vector<uint64_t> out;
  out.reserve(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = (c + 1) * chunk_size;
    const int64_t block = (end - 1) / block_size;
    if (block >= static_cast<int64_t>(block_ids.size())) {
      return Status::InvalidArgument("block hashes: " + std::to_string(block_ids.size()) +
                                     " blocks of " + std::to_string(block_size) +
                                     " tokens do not cover " + std::to_string(prompt_tokens) +
                                     " prompt tokens");
    }
    const auto offset = static_cast<uint64_t>(end - block * block_size);
    uint64_t h =
        Mix64(chain_seed ^ Mix64(block_ids[static_cast<size_t>(block)] + 0x9e3779b97f4a7c15ull) ^
              (offset * 0xd1b54a32d192ed03ull));
    if (h == 0 || h == chain_seed) h = 1 + (h ^ 0x5bd1e995);  // keep clear of the seed and 0
    out.push_back(h);
  }
  return out;
}

std::vector<TokenId> SynthesizeBlockTokens(const std::vector<uint64_t>& block_ids,
                                           int32_t block_size, int64_t prompt_tokens,
                                           int32_t vocab_size, uint64_t seed) {
  std::vector<TokenId> t;
  t.reserve(static_cast<size_t>(std::max<int64_t>(0, prompt_tokens)));
  for (uint64_t id : block_ids) {
    const int64_t left = prompt_tokens - static_cast<int64_t>(t.size());
    if (left <= 0) break;
    Rng rng(SeedFor(seed, 4, id));
    AppendRandomTokens(rng, static_cast<int32_t>(std::min<int64_t>(left, block_size)), vocab_size,
                       t);
  }
  return t;
}

std::string ToJsonlLine(const WorkloadRequest& r, bool with_tokens) {
  nlohmann::json j;
  j["arrival_s"] = r.arrival_s;
  j["output_tokens"] = r.output_tokens;
  if (with_tokens || r.tenant < 0) {
    j["prompt"] = r.prompt;
    if (r.tenant >= 0) j["tenant"] = r.tenant;
  } else {
    j["prefix_id"] = r.tenant;
    j["prefix_tokens"] = r.prefix_tokens;
    j["suffix_tokens"] = static_cast<int64_t>(r.prompt.size()) - r.prefix_tokens;
  }
  return j.dump();
}

}  // namespace chunkserve::workload
