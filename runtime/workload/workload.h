// Workloads: the one deterministic request generator of the project. chunkserve-demo and
// `chunkserve-bench engine` replay it in process (runtime/engine/workload_runner.h), the router's
// simulator (router/sim) and load generator (router/loadgen) over the router.
//
// Synthetic multi-tenant shared prompts: T tenants, each with a system prompt whose length is
// drawn around the paper's Table 2 (ChunkAttention, Table 2: Chameleon avg 1324, CREATOR 879,
// PDFTriage 4257, ToolQA 1432 shared tokens); tenants are picked with Zipf popularity; arrivals
// are a Poisson process; each request appends a unique user suffix to its tenant's system prompt
// and asks for an output length drawn uniformly. Exact tenant lengths (`prefix_lengths`) give the
// demo's fixed system prompts and the ChunkAttention paper's microbenchmark shape (ForSharedPrefix:
// n_p prompt tokens of which the first n_s are shared by every request, n_c output tokens).
// The negative control (shared_prefixes = false)
// keeps every length distribution but draws every prompt token fresh, so no two requests share
// even a first chunk.
//
// A JSONL trace is the other source: one request per line, either with explicit tokens
//   {"arrival_s": 0.25, "prompt": [1, 2, 3], "output_tokens": 64}
// or compactly, with tokens synthesized deterministically from the prefix id and the line number
//   {"arrival_s": 0.25, "prefix_id": 7, "prefix_tokens": 1324, "suffix_tokens": 80,
//    "output_tokens": 64}
// ("tenant" is accepted as an alias of "prefix_id"; lines may be blank).
//
// A block-hash trace is the format public KV-cache traces use (e.g. Mooncake's): one request per
// line,
//   {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}
// with `timestamp` in milliseconds and `hash_ids` the ids of the prompt's consecutive blocks of
// `block_size` tokens (the last one may be partial): equal id = identical block content and
// identical prefix before it. LoadTrace reads it without expanding tokens: a request carries its
// block ids, and BlockChunkHashes derives the router's chunk hash chain from them (chunk c, ending
// at token e, gets a hash of the block holding token e - 1 and e's offset in that block, so two
// chunks hash equal exactly when their prefixes are equal by block identity). Where real tokens
// are needed (chunkserve-loadgen) `synthesize_tokens` fills the prompt from the block ids: block
// id b always gives the same block_size tokens, so equal ids give equal tokens.
//
// Everything is deterministic given the seed, on every platform: a private generator
// (splitmix64) and explicit sampling formulas, no std::*_distribution.
//
// Thread safety: a WorkloadGenerator is used by one thread; different instances are independent.
#ifndef CHUNKSERVE_RUNTIME_WORKLOAD_WORKLOAD_H_
#define CHUNKSERVE_RUNTIME_WORKLOAD_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/base/status.h"

namespace chunkserve::workload {

// splitmix64: small, fast, and the same sequence everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t NextU64();
  double Uniform01();                          // [0, 1)
  int64_t UniformInt(int64_t lo, int64_t hi);  // [lo, hi], lo <= hi
  double Exponential(double rate);             // mean 1 / rate, rate > 0

 private:
  uint64_t state_;
};

// Workload families (WorkloadOptions::family; `--workload NAME` in chunkserve-sim and
// chunkserve-loadgen). ForFamily gives each its default shape; every option below still applies.
//  - multi_tenant: the synthetic multi-tenant workload above.
//  - multi_turn: conversations behind one short system prompt shared by all (system_tokens).
//    Up to active_conversations run at once; each arrival starts a new conversation with
//    probability 1 / mean turns (while fewer are active) or continues a uniformly chosen active
//    one. A turn's prompt is the previous turn's prompt + its answer (output_tokens synthesized
//    tokens) + a new message (suffix range); a conversation ends after its turn count
//    (uniform in [min_turns, max_turns]) or when the next prompt would pass max_prompt_tokens.
//  - agent: the same conversation mechanics behind long tool definitions (one of `tenants`
//    tool sets, prefix lengths as for tenants, Zipf): many turns, each a short tool result and
//    a short answer.
//  - long_doc: a few (`tenants`) huge documents (prefix lengths, up to 120k tokens by default),
//    Zipf popularity; each request is a document + a short unique question.
// The negative control (shared_prefixes = false) keeps every length and arrival of a family
// and replaces every prompt token with a fresh one.
enum class WorkloadFamily : int32_t { kMultiTenant, kMultiTurn, kAgent, kLongDoc };
std::string_view WorkloadFamilyName(WorkloadFamily family);
Result<WorkloadFamily> ParseWorkloadFamily(std::string_view name);
std::vector<WorkloadFamily> AllWorkloadFamilies();

struct WorkloadOptions {
  WorkloadFamily family = WorkloadFamily::kMultiTenant;
  int64_t num_requests = 1000;
  int32_t tenants = 64;
  double zipf_s = 1.0;       // tenant popularity: P(tenant k) ~ 1 / (k + 1)^s; 0 = uniform
  double arrival_rate = 10;  // requests per second (Poisson); 0: every request arrives at t = 0
  // Tenant system prompt lengths: tenant t's length is base[t % size] * U(0.5, 1.5), clipped to
  // [min_prefix_tokens, max_prefix_tokens]. Default: Table 2's averages.
  std::vector<int32_t> prefix_length_bases = {1324, 879, 4257, 1432};
  int32_t min_prefix_tokens = 128;
  int32_t max_prefix_tokens = 4096;
  // Non-empty: exact lengths instead, one tenant each (`tenants` and the bases are then unused);
  // 0 = that tenant's requests share nothing (tenant -1, the prompt is its suffix alone).
  std::vector<int32_t> prefix_lengths;
  // Unique user part, uniform in [min, max]; min may be 0 where every prefix is non-empty.
  int32_t min_suffix_tokens = 32;
  int32_t max_suffix_tokens = 256;
  int32_t min_output_tokens = 32;  // output length, uniform in [min, max]
  int32_t max_output_tokens = 256;
  bool shared_prefixes = true;  // false: negative control (no two prompts share a token run)
  int32_t vocab_size = 32000;
  uint64_t seed = 1;
  // multi_turn / agent.
  int32_t system_tokens = 256;  // multi_turn: the system prompt every conversation starts with
  int32_t min_turns = 2;
  int32_t max_turns = 12;
  int32_t max_prompt_tokens = 32768;  // a conversation ends before its prompt passes this
  int32_t active_conversations = 256;
};

// The default options of a family (see WorkloadFamily).
WorkloadOptions ForFamily(WorkloadFamily family);

// The ChunkAttention paper's microbenchmark shape (multi_tenant, one tenant): every prompt has
// n_p tokens, of which the first n_s (0 <= n_s <= n_p) are shared by every request, and asks for
// n_c output tokens. Other options keep their defaults.
WorkloadOptions ForSharedPrefix(int32_t n_p, int32_t n_s, int32_t n_c);

struct WorkloadRequest {
  uint64_t index = 0;         // 0, 1, 2, ... in arrival order
  double arrival_s = 0;       // seconds since the start of the run
  int32_t tenant = -1;        // -1: no shared prefix
  int32_t prefix_tokens = 0;  // leading tokens shared with the tenant's other requests
  std::vector<TokenId> prompt;
  int32_t output_tokens = 1;
  // Block-hash traces (prompt empty unless synthesized): the prompt's block ids, the block size
  // and the prompt length in tokens. PromptLength() is the length either way.
  std::vector<uint64_t> block_ids;
  int32_t block_size = 0;
  int64_t prompt_length = 0;
};

// prompt.size(), or prompt_length for a block-hash request without tokens.
int64_t PromptLength(const WorkloadRequest& request);

// A finite request stream.
class WorkloadSource {
 public:
  virtual ~WorkloadSource() = default;
  // The next request, or nullopt at the end.
  virtual std::optional<WorkloadRequest> Next() = 0;
};

// The synthetic generator. InvalidArgument for out-of-range options.
Result<std::unique_ptr<WorkloadSource>> MakeSyntheticWorkload(const WorkloadOptions& options);

// Every request left in `source`, in order.
std::vector<WorkloadRequest> ReadAll(WorkloadSource& source);
// MakeSyntheticWorkload, read to the end.
Result<std::vector<WorkloadRequest>> GenerateWorkload(const WorkloadOptions& options);

// A JSONL trace (see the file comment). Parses the whole file up front; InvalidArgument names the
// line of the first bad record, NotFound when the file cannot be opened. `vocab_size` bounds the
// synthesized tokens (and is checked against explicit ones); `seed` varies synthesized tokens.
Result<std::unique_ptr<WorkloadSource>> LoadJsonlTrace(const std::string& path,
                                                       int32_t vocab_size = 32000,
                                                       uint64_t seed = 1);
// The same from text already in memory (tests).
Result<std::unique_ptr<WorkloadSource>> ParseJsonlTrace(std::string_view text,
                                                        int32_t vocab_size = 32000,
                                                        uint64_t seed = 1);

// Any trace file: the block-hash format (a first record with "hash_ids") or the JSONL format
// above, with selection and time scaling. Parses the whole file up front (tokens of block-hash
// requests are synthesized lazily, per Next()); InvalidArgument "trace line N: ..." names the
// line of the first bad record, NotFound when the file cannot be opened.
struct TraceOptions {
  int32_t block_size = 512;        // tokens per hash_ids block (Mooncake traces: 512)
  double time_scale = 1.0;         // arrival = (t - t of the first selected record) * time_scale
  int64_t offset = 0;              // skip this many records first
  int64_t limit = 0;               // at most this many records (0: all)
  bool synthesize_tokens = false;  // block-hash requests get real prompt tokens (loadgen)
  int32_t vocab_size = 32000;
  uint64_t seed = 1;
};

Result<std::unique_ptr<WorkloadSource>> LoadTrace(const std::string& path,
                                                  const TraceOptions& options);
Result<std::unique_ptr<WorkloadSource>> ParseTrace(std::string_view text,
                                                   const TraceOptions& options);

// The chunk hash chain of a block-hash prompt (see the file comment): prompt_tokens / chunk_size
// hashes; InvalidArgument when the block ids do not cover them.
Result<std::vector<uint64_t>> BlockChunkHashes(uint64_t chain_seed, int32_t chunk_size,
                                               int32_t block_size,
                                               const std::vector<uint64_t>& block_ids,
                                               int64_t prompt_tokens);
// The tokens of a block-hash prompt: block id b gives the same block_size tokens everywhere.
std::vector<TokenId> SynthesizeBlockTokens(const std::vector<uint64_t>& block_ids,
                                           int32_t block_size, int64_t prompt_tokens,
                                           int32_t vocab_size, uint64_t seed);

// One trace line in the compact form (tokens not written): lets a generated workload be saved and
// replayed exactly (a replay synthesizes equal tokens given the same seed and vocab_size only for
// compact lines; use explicit prompts to pin tokens).
std::string ToJsonlLine(const WorkloadRequest& request, bool with_tokens);

// System prompt length of each tenant under `options` (for reports).
std::vector<int32_t> TenantPrefixLengths(const WorkloadOptions& options);

}  // namespace chunkserve::workload

#endif  // CHUNKSERVE_RUNTIME_WORKLOAD_WORKLOAD_H_
