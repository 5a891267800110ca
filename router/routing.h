// routing.h: the stable interface of the router's decision core (chunkserve::router).
//
// Everything here is pure library code: no sockets, no threads, no clocks. The router process
// (router/server.*), the simulator (router/sim) and the benchmarks all drive the same objects:
//
//   PrefixIndex   which worker holds which chunk-hash prefix, fed by the workers' KV events
//                 (stored with parent hash, evicted, snapshot; sequence numbers with gap
//                 detection; worker generations), plus a short-lived record of this router's own
//                 recent decisions. Memory is bounded by a byte budget (LRU) and a depth limit.
//   LoadTracker   per-worker load as the policies see it at pick time: the last load report
//                 merged with the requests this router picked and the worker has not reported
//                 yet (counted the moment they are picked, not when they start).
//   Policy        picks a worker for one request (Pick). `ttft` is the default; the baselines
//                 round_robin, least_loaded, consistent_hash and cache_aware_threshold are there
//                 for experiments. Made by name with MakePolicy.
//   RouterCore    the three above wired together the way a router uses them: membership, KV
//                 events, load reports, Route (pick + count in flight + record the decision),
//                 first token / finish, and routing precision (predicted vs reported cached
//                 tokens).
//
// Hashes are the chained chunk hashes of runtime/kvcache/chunk_hash.h, computed by the router
// from the prompt exactly as the worker's PrefixTree computes them (MakeRoutingRequest), so
// chain[i] names the whole prefix [0, (i + 1) * chunk_size) of the prompt.
//
// Time: callers pass `RouterTime`, a monotonic duration since any fixed origin (the process uses
// steady_clock::now().time_since_epoch(); the simulator uses simulated time). Nothing here reads
// a clock, so every run is deterministic given its inputs.
//
// Errors: bad input (unknown worker, malformed events, empty membership) is a Status, never an
// abort. The only routing failure is "no workers can take the request"; an unusable index
// (empty, all workers gapped) makes policies fall back to load only.
//
// Thread safety: none. Every object here is used by one thread at a time (the router's event
// loop); the caller serializes. Objects hold no references to each other except where stated.
//
// Compatibility: fields and functions are only ever added.
#ifndef CHUNKSERVE_ROUTER_ROUTING_H_
#define CHUNKSERVE_ROUTER_ROUTING_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/ids.h"
#include "runtime/base/status.h"
#include "runtime/kvcache/kv_events.h"

namespace chunkserve::router {

// Monotonic time since an arbitrary fixed origin chosen by the caller.
using RouterTime = std::chrono::nanoseconds;

// ---------------------------------------------------------------------------------------------
// Workers and load.

// What the router knows about a worker from its registration. Static for one generation.
struct WorkerInfo {
  WorkerId id;                     // any value but Invalid() (the process hashes the name)
  std::string name;                // operator-chosen worker id (wire Register.workerId)
  uint64_t generation = 0;         // changes on every worker process start
  int32_t max_batch_size = 1;      // sequences per step (decode capacity)
  int32_t max_queued = 0;          // admission queue bound (0 = unknown)
  int64_t kv_capacity_tokens = 0;  // KV slots (tokens) the arena holds (0 = unknown)
};

// A worker's load as reported (wire LoadReport), or as seen at pick time (see LoadTracker).
struct WorkerLoad {
  uint64_t queued_prefill_tokens = 0;  // prompt tokens waiting for prefill
  int32_t running_sequences = 0;       // sequences in the running batch
  int32_t queued_requests = 0;         // submitted, not yet admitted
  uint64_t free_kv_slots = 0;          // KV slots free or reclaimable
  double prefill_tokens_per_s = 0;     // measured prefill rate; <= 0: unknown (a default is used)
  double decode_tokens_per_s = 0;      // measured decode rate; <= 0: unknown
  bool draining = false;               // the worker stopped admitting
};

// What a policy sees about one worker when it picks.
struct WorkerState {
  WorkerInfo info;
  WorkerLoad load;        // effective load at pick time (LoadTracker::Effective)
  bool accepting = true;  // healthy, registered and not draining; false: never picked
};

// ---------------------------------------------------------------------------------------------
// Requests and decisions.

// One request as the router routes it. `chunk_hashes` are the chained hashes of the prompt's
// full leading chunks (kv::FullChunkHashes with the cluster's seed and chunk size).
struct RoutingRequest {
  std::span<const TokenId> prompt;     // may be empty when only the length is known
  int64_t prompt_tokens = 0;           // number of prompt tokens (>= chunk_hashes * chunk)
  std::vector<uint64_t> chunk_hashes;  // h_0 .. h_{n-1}
  int32_t chunk_size = 0;              // tokens per chunk the hashes were cut with
  int32_t max_new_tokens = 0;          // output cap, used as the expected output length in
                                       // the ttft slot-wait term; 0: unknown (the policy
                                       // assumes PolicyOptions::default_output_tokens)
};

// Builds a RoutingRequest: hashes `prompt` with kv::FullChunkHashes(seed, chunk_size, .).
// The returned request's `prompt` span refers to `prompt` (keep it alive while routing).
// InvalidArgument when chunk_size < 1.
Result<RoutingRequest> MakeRoutingRequest(uint64_t chain_seed, int32_t chunk_size,
                                          std::span<const TokenId> prompt,
                                          int32_t max_new_tokens = 0);

// Why a worker was chosen (for logs, metrics and tests).
enum class DecisionReason : int32_t {
  kCacheHit = 0,            // the worker holds the longest known prefix and is the best by score
  kSpill = 1,               // a holder existed but was overloaded/slow; sent to another worker
  kNewPrefixPlacement = 2,  // no one holds the prefix: rendezvous / hash placement
  kLoadOnly = 3,            // index unusable or empty prompt: chosen by load only
  kLoadCap = 4,             // the workers holding the longest prefix were over the load cap: the
                            // lowest predicted TTFT among the others
  kRoundRobin = 5,          // baseline round_robin
  kLeastLoaded = 6,         // baseline least_loaded
  kConsistentHash = 7,      // baseline consistent_hash
  kImbalance = 8,           // threshold policy: load imbalance exceeded; least loaded chosen
};

std::string_view DecisionReasonName(DecisionReason reason);

struct RoutingDecision {
  WorkerId worker;                      // the chosen worker
  int64_t predicted_cached_tokens = 0;  // prompt tokens the router expects the worker to hit
  DecisionReason reason = DecisionReason::kLoadOnly;
  double predicted_ttft_s = 0;  // policy's TTFT estimate (ttft policy; else 0)
};

// ---------------------------------------------------------------------------------------------
// The prefix index.

// One batch of KV events from a worker (wire KvEvents).
struct KvEventBatch {
  uint64_t generation = 0;  // worker generation
  uint64_t sequence = 0;    // sequence number of the last change in this batch
  bool snapshot = false;    // true: `stored` is everything the worker holds as of `sequence`
  std::vector<kv::StoredChunkHash> stored;  // chunks now held (hash, parent_hash)
  std::vector<uint64_t> evicted;            // chunk hashes no longer held
};

// What ApplyKvEvents did with a batch.
enum class KvApplyOutcome : int32_t {
  kApplied = 0,        // increments or snapshot applied
  kNeedSnapshot = 1,   // a sequence gap (or increments before any snapshot): the worker's
                       // entries are unusable and dropped until a snapshot arrives; the caller
                       // should re-subscribe (wire SubscribeKv) to get one
  kStaleIgnored = 2,   // an increment whose sequence was already seen (duplicate)
  kNewGeneration = 3,  // the generation changed and the batch was a snapshot: everything of
                       // the old generation was dropped and the snapshot applied. (A new
                       // generation's increment drops the old entries and returns
                       // kNeedSnapshot.) Any generation value different from the last one
                       // counts as new: workers pick a fresh value at every start.
};

std::string_view KvApplyOutcomeName(KvApplyOutcome outcome);

struct PrefixIndexOptions {
  // Upper bound on the index's accounted bytes (nodes + holder entries); least recently used
  // chunk entries go first. Must be >= 4096.
  size_t byte_budget = size_t{256} << 20;
  // Only the first max_depth chunks of any chain are indexed (deeper stored events are ignored;
  // lookups stop there). Must be >= 1. 2,048 chunks of 64 = 128k-token prompts: at 256 (16k
  // tokens) a router saw a 100k-token document as a 16k-token saving and spilled it too eagerly.
  int32_t max_depth = 2048;
  // How long a recorded routing decision counts as "the worker will hold this prefix".
  RouterTime decision_ttl = std::chrono::seconds(2);
  // Bound on remembered decisions (oldest dropped first). Must be >= 1.
  int32_t max_decisions = 65536;
};

// Per-worker matched prefix length for one lookup.
struct WorkerMatch {
  WorkerId worker;
  int32_t matched_chunks = 0;  // leading chunks of the chain the worker holds (> 0)
  bool from_decision = false;  // true: (part of) the match comes from a recent decision
};

struct PrefixIndexStats {
  size_t bytes_used = 0;       // accounted bytes of the chunk index (<= byte_budget)
  size_t decision_bytes = 0;   // accounted bytes of the decision record
  size_t chunk_nodes = 0;      // distinct chunk hashes indexed
  size_t holder_entries = 0;   // (chunk hash, worker) pairs indexed
  size_t workers = 0;          // workers known to the index
  size_t usable_workers = 0;   // of those, not waiting for a snapshot
  size_t decisions = 0;        // live decision records
  uint64_t lru_evictions = 0;  // chunk nodes dropped for the byte budget
  uint64_t gaps = 0;           // sequence gaps detected
  uint64_t depth_limited = 0;  // stored events ignored for max_depth
  uint64_t orphaned = 0;       // stored events ignored: parent neither a root nor indexed
};

// The index from chunk-hash chains to the workers holding them. See the file comment.
//
// Per worker it follows the KV event stream of one generation. Workers number events one by one
// (runtime/engine/engine.h: +1 per stored or evicted hash) and a batch carries the number of its
// last event, so with changes = stored.size() + evicted.size() an increment is in order iff
// sequence == last_sequence + changes. sequence <= last_sequence is a duplicate (ignored); any
// other value is a gap: the worker's entries are dropped and it stays unusable until a snapshot.
// The first batch of a generation must be a snapshot; a new generation drops everything of the
// old one. The wire lists a batch's stored hashes before its evicted ones, losing their order;
// because stored/evicted strictly alternate per hash (kv_events.h), the net count per hash
// decides: more stores -> held, more evictions -> not held, equal -> unchanged.
//
// Memory: every chunk node and (node, worker) entry is accounted in bytes; when bytes_used would
// exceed byte_budget the least recently used chunk nodes (touched by stored events and lookups)
// are dropped with all their holders. Chains deeper than max_depth are not indexed.
class PrefixIndex {
 public:
  // InvalidArgument for out-of-range options.
  static Result<std::unique_ptr<PrefixIndex>> Create(const PrefixIndexOptions& options);
  ~PrefixIndex();
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Applies one batch from `worker` (adds the worker if new). A snapshot replaces everything
  // known about the worker. A stored chunk whose parent_hash is 0 or a chain seed (SetChainSeeds)
  // is a chain's first chunk. InvalidArgument for a malformed batch (nothing applied).
  // Cost: O(changes) for increments; O(indexed nodes) when the worker's entries are dropped
  // (snapshot, gap, new generation).
  Result<KvApplyOutcome> ApplyKvEvents(WorkerId worker, const KvEventBatch& batch);

  // The values a stored chunk's parent_hash takes for a first chunk: the chain seeds of the
  // cluster (kv::ChunkHashSeed); 0 is always accepted too.
  void SetChainSeeds(std::span<const uint64_t> seeds);

  // Forgets the worker: its entries and decisions go at once (dead worker, removed member).
  void DropWorker(WorkerId worker);

  // True when the worker has a usable view (snapshot received, no gap since).
  bool IsUsable(WorkerId worker) const;

  // Per worker, how many leading chunks of `chain` it holds: the longer of its index match (only
  // usable workers have entries) and its unexpired recorded decisions. Workers matching 0 chunks
  // are not listed. Order: by worker id. Marks the matched entries as recently used (hence not
  // const). Cost: about the number of workers holding chain[0], plus O(chain) hash lookups.
  std::vector<WorkerMatch> LongestMatch(std::span<const uint64_t> chain, RouterTime now);

  // Remembers that `worker` was just sent a request with this chain: until now + decision_ttl +
  // extra, LongestMatch counts the worker as holding the first min(chain.size(), max_depth)
  // chunks. `extra` (RouterCore: the decision's predicted TTFT, at most 60 s) keeps a decision
  // alive until the worker's KV events can show the prefix: a 100k-token prompt takes seconds
  // to prefill, longer than decision_ttl.
  void RecordDecision(WorkerId worker, std::span<const uint64_t> chain, RouterTime now,
                      RouterTime extra = RouterTime(0));

  // Drops expired decisions (LongestMatch and RecordDecision also do it as they go).
  void ExpireDecisions(RouterTime now);

  PrefixIndexStats Stats() const;

  // True when at least one known worker has a usable view (snapshot, no gap). When false and no
  // decision matches, policies route by load only.
  bool AnyUsable() const;

  // Accounting constants, for reports: bytes of one chunk node without holders, and of one
  // holder entry before malloc rounding of the node's holder vector.
  static size_t BytesPerNode();
  static size_t BytesPerHolder();

  class Impl;

 private:
  explicit PrefixIndex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Load at pick time.

// Merges reported loads with this router's own in-flight requests. A request counts from the
// moment it is picked (OnPicked): it occupies a sequence until OnFinished, and because reports
// lag and other routers add load this router does not see, request counts are
// max(reported, own view). Its uncached prompt tokens are pending prefill until the second
// report after the pick, which certainly covers it (and knows how far its prefill got): queued
// prefill is max(reported + picked since the last report, picked since the one before).
class LoadTracker {
 public:
  // A load report from the worker. `fresh` = false: this router's correction of the last report
  // (a request it saw start or end), which replaces the values but is no newer report: it
  // covers no pick the last report did not.
  void SetReported(WorkerId worker, const WorkerLoad& load, bool fresh = true);
  void DropWorker(WorkerId worker);

  // The request was routed to `worker`; `uncached_prompt_tokens` await prefill there.
  // AlreadyExists when the request id is in flight.
  Status OnPicked(RequestId request, WorkerId worker, int64_t uncached_prompt_tokens);
  // Prefill done (first token): the pending prefill tokens of the request are released.
  // NotFound for an unknown request.
  Status OnFirstToken(RequestId request);
  // The request left the worker (finished, failed, cancelled). NotFound for an unknown request.
  Status OnFinished(RequestId request);

  // The load a policy should use for `worker` now.
  WorkerLoad Effective(WorkerId worker) const;
  // Requests in flight on `worker` from this router.
  int32_t InFlight(WorkerId worker) const;
  // The worker a request was picked for (Invalid() when unknown).
  WorkerId WorkerOf(RequestId request) const;

  LoadTracker();
  ~LoadTracker();
  LoadTracker(LoadTracker&&) noexcept;
  LoadTracker& operator=(LoadTracker&&) noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// ---------------------------------------------------------------------------------------------
// Policies.

enum class PolicyKind : int32_t {
  kTtft = 0,  // default: predicted time to first token, cache-aware, load cap
  kRoundRobin = 1,
  kLeastLoaded = 2,
  kConsistentHash = 3,       // hash ring (virtual nodes) on the first chunk hash
  kCacheAwareThreshold = 4,  // SGLang-style: cache-aware unless load imbalance exceeds thresholds
};

// "ttft", "round_robin", "least_loaded", "consistent_hash", "cache_aware_threshold".
std::string_view PolicyKindName(PolicyKind kind);
// Accepts the names above. InvalidArgument lists the valid names otherwise.
Result<PolicyKind> ParsePolicyKind(std::string_view name);
std::vector<PolicyKind> AllPolicyKinds();

struct PolicyOptions {
  // ttft: predicted TTFT of worker w for this request =
  //     (w's queued prefill tokens + this request's uncached prompt tokens) / w's prefill rate
  //   + slot wait: when running + queued requests >= max_batch_size, each request beyond the
  //     batch waits about (expected output tokens / w's decode rate) for a sequence to finish
  //   + w's running sequences / w's decode rate (per-step decode interference)
  // Expected output = the mean output of the requests this router saw end on their own
  // (PickContext::mean_output_tokens), at most the request's max_new_tokens; without that mean,
  // max_new_tokens; default_output_tokens when neither is known.
  // The rates used when a worker has not reported them (tokens/s):
  double default_prefill_tokens_per_s = 8000;
  double default_decode_tokens_per_s = 1000;
  double default_output_tokens = 128;
  // Seconds added per running sequence when the worker's decode rate is unknown.
  double decode_seconds_per_running_seq = 0.002;
  // A worker is over the load cap when running + queued requests > load_cap * max_batch_size.
  // Over-cap workers are left out; when every accepting worker is over the cap, none is.
  double load_cap = 1.5;
  // Hot prefix spill: the holders of the prompt's prefix are the workers matching at least half
  // of the longest match (so missing another request's private tail does not matter) whose
  // saving is similar to the best (similar_fraction below); the request goes to the best holder
  // unless its predicted TTFT exceeds spill_factor * the best non-holder's and fewer workers
  // than the holder cap hold the prefix; then it spills to that non-holder (which becomes a
  // holder through the decision record). The holder cap is max_holders_per_prefix, or when that
  // is 0, max(2, ceil(max_holder_fraction * accepting workers)). By default there is none
  // (fraction 1): spilling is load-driven alone. A count cap starves a prefix hotter than the
  // capped workers can serve: cap 4 on 256 workers with Zipf tenants gave mean TTFT 0.32 s
  // instead of 0.05 s, and 25% of the workers, with a first block shared by all traffic, made
  // its first holders the only candidates for every new conversation (issue 19: p99 TTFT 3x
  // least_loaded's at 4 workers).
  double spill_factor = 1.5;
  // The spill factor when the prefix has a single holder (max with spill_factor).
  double spill_factor_single_holder = 2.0;
  // The spill factor when the holders are short of slots and the non-holder has a free one
  // (min with the factors above; 0 = off): the best holder's batch is full (running + queued >=
  // max_batch_size: this request would wait for a slot), or the prefix has several holders whose
  // batches together are more than holders_busy_fraction full. The holders then serve less than
  // the prefix's demand, which every later request of it pays, while a spill's prefill is paid
  // once and adds a holder. Otherwise requests wait behind the prefix's own prefill, and moving
  // them buys nothing: a second copy of a 100k-token document takes as long as the first.
  double spill_factor_saturated = 0.5;
  double holders_busy_fraction = 0.5;
  int32_t max_holders_per_prefix = 0;
  double max_holder_fraction = 1.0;
  // Savings that are similar do not decide: a worker is a holder only when its cached tokens are
  // within similar_fraction * prompt tokens of the most any worker has cached, so a prefix that
  // saves little of this prompt (a system prompt shared by all traffic) leaves the choice to
  // load. 0 = holders by match length alone.
  double similar_fraction = 0.3;
  // A match shorter than this many chunks does not make a holder.
  int32_t min_match_chunks = 1;
  // New prefix placement: rendezvous hashing on the first chunk hash among the workers whose
  // predicted TTFT is within placement_slack * the lowest one (+1 ms), so routers with the same
  // membership (and similar load) agree, and a busy worker is never forced to take a new prefix.
  double placement_slack = 1.5;
  // consistent_hash: virtual nodes per worker.
  int32_t virtual_nodes = 160;
  // cache_aware_threshold (SGLang's defaults): the cluster is imbalanced when
  // max_load - min_load > balance_abs_threshold AND max_load > balance_rel_threshold * min_load
  // (load = running + queued requests); then least loaded. Otherwise the worker with the longest
  // match if matched tokens / prompt tokens >= cache_threshold, else the least loaded.
  int32_t balance_abs_threshold = 32;
  double balance_rel_threshold = 1.1;
  double cache_threshold = 0.5;
};

// Inputs of one pick. `workers` is the membership as the caller sees it (any order); `index` may
// be null (no index: load only). Policies must not keep the span or pointer past the call.
struct PickContext {
  std::span<const WorkerState> workers;
  PrefixIndex* index = nullptr;
  RouterTime now{0};
  // Mean output length of the requests this router saw end on their own (length or stop
  // token), recent ones weighted most; 0 until one has. A request's max_new_tokens is a cap,
  // not its length: the slot wait predicted for a full batch uses this (ExpectedOutputTokens).
  double mean_output_tokens = 0;
};

// A routing policy. One file per policy under router/policies/, made through the registry in
// router/policy.cc; each states its algorithm at the top. Policies may keep state (round robin's cursor), so one
// instance serves one router.
class Policy {
 public:
  virtual ~Policy() = default;
  virtual PolicyKind kind() const = 0;
  std::string_view name() const { return PolicyKindName(kind()); }

  // Picks a worker among those with accepting == true. Unavailable("no workers ...") when none
  // accepts; never an error otherwise. Does not change load or the index: the caller counts the
  // request (LoadTracker::OnPicked) and records the decision (PrefixIndex::RecordDecision) --
  // RouterCore::Route does both.
  virtual Result<RoutingDecision> Pick(const RoutingRequest& request,
                                       const PickContext& context) = 0;
};

// InvalidArgument for out-of-range options.
Result<std::unique_ptr<Policy>> MakePolicy(PolicyKind kind, const PolicyOptions& options = {});
Result<std::unique_ptr<Policy>> MakePolicy(std::string_view name,
                                           const PolicyOptions& options = {});

// Rendezvous (highest random weight) choice of a worker for a key: the same key and membership
// give the same worker on every router. Exposed for tests and the server. Invalid() when empty.
WorkerId RendezvousPick(uint64_t key, std::span<const WorkerId> workers);

// ---------------------------------------------------------------------------------------------
// Precision accounting.

// Predicted cached tokens (at pick) vs. cached tokens the worker reported (at finish: the wire
// carries the count only in Finish).
struct PrecisionStats {
  uint64_t requests = 0;
  uint64_t predicted_tokens = 0;  // sum of predicted cached tokens
  uint64_t reported_tokens = 0;   // sum of reported cached tokens
  uint64_t overlap_tokens = 0;    // sum of min(predicted, reported)
  uint64_t exact = 0;             // requests where predicted == reported

  void Add(int64_t predicted, int64_t reported);
  // overlap / predicted (1 when nothing predicted): how much of what we promised was there.
  double Precision() const;
  // overlap / reported (1 when nothing reported): how much of what was there we predicted.
  double Recall() const;
};

// ---------------------------------------------------------------------------------------------
// The core a router process (and the simulator) drives.

struct RouterCoreOptions {
  PrefixIndexOptions index;
  PolicyOptions policy;
  PolicyKind policy_kind = PolicyKind::kTtft;
  // Chain seeds of the cluster (kv::ChunkHashSeed of the model fingerprint and chunk size); used
  // to recognize first chunks in KV events. May be empty (parent_hash 0 still works).
  std::vector<uint64_t> chain_seeds;
};

class RouterCore {
 public:
  static Result<std::unique_ptr<RouterCore>> Create(const RouterCoreOptions& options);
  ~RouterCore();

  // Membership. AddWorker with a known id updates its info; a changed generation drops the
  // worker's index entries (its KV cache is gone). RemoveWorker drops entries and load; requests
  // still in flight on it stay known to the tracker until OnFinished (the caller re-routes them).
  Status AddWorker(const WorkerInfo& info);
  Status RemoveWorker(WorkerId worker);
  // accepting = false: never picked (unhealthy or draining); entries are kept.
  Status SetAccepting(WorkerId worker, bool accepting);
  // `fresh`: a report from the worker (false: a local correction of the last one; see
  // LoadTracker::SetReported).
  Status UpdateLoad(WorkerId worker, const WorkerLoad& load, bool fresh = true);
  Result<KvApplyOutcome> ApplyKvEvents(WorkerId worker, const KvEventBatch& batch);

  // Picks a worker, counts the request in flight there at once and records the decision in the
  // index. Unavailable when no worker accepts; AlreadyExists for a request id in flight.
  Result<RoutingDecision> Route(RequestId request, const RoutingRequest& routing_request,
                                RouterTime now);
  // The request's first token arrived: its pending prefill tokens are released from the
  // worker's load (it keeps occupying a sequence until OnFinished). NotFound when unknown.
  Status OnFirstToken(RequestId request);
  // The request left the worker. `reported_cached_tokens` is the prompt-cache hit the worker
  // reported for it (wire Finish.cachedTokens); when given, the prediction made at Route and
  // this report are added to precision(). Leave it empty when the worker reported nothing
  // meaningful (the leg failed, was re-routed, or was cancelled before its prefill). NotFound
  // for an unknown request (nothing recorded).
  // `output_tokens`: how many tokens it generated when it ended on its own (length or stop
  // token; leave it empty for failures and cancellations), for PickContext::mean_output_tokens.
  Status OnFinished(RequestId request, std::optional<int64_t> reported_cached_tokens = {},
                    std::optional<int32_t> output_tokens = {});

  // Read access (plus index lookups). Change load only through the methods above: the workers'
  // effective loads are refreshed by them, not per pick.
  const std::vector<WorkerState>& workers() const;
  PrefixIndex& index();
  const LoadTracker& loads() const;
  Policy& policy();
  const PrecisionStats& precision() const;

 private:
  RouterCore();
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace chunkserve::router

#endif  // CHUNKSERVE_ROUTER_ROUTING_H_
