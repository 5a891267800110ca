# chunkserve wire protocol: every message between clients, routers and workers.
#
# Each frame on a TCP connection is one Cap'n Proto message (standard stream framing: segment
# table, then segments) whose root is an Envelope. Compatibility rule: fields, union members and
# enumerants are only ever appended (new ordinals); nothing is renamed in meaning, removed or
# renumbered. Readers treat an unknown union member as "not understood" and answer with an
# Error (code unimplemented) instead of closing the connection.
#
# Token ids are UInt32 in [0, vocab). Chunk hashes are the 64-bit chained chunk hashes of
# runtime/kvcache/chunk_hash.h (their algorithm is named by `chunkHashVersion`).

@0xa1c1430fd770b139;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("chunkserve::wire::schema");

# Why a request ended. Numeric values equal chunkserve::FinishReason (runtime/base/finish_reason.h)
# and the C ABI's CHUNKSERVE_FINISH_*; consumers treat an unknown value as `error`.
enum FinishReason {
  stopToken @0;    # a stop token was generated (included in the stream)
  length @1;       # maxNewTokens were generated, or the context is full
  cancelled @2;    # the client cancelled or disconnected
  deadline @3;     # the request's deadline passed
  error @4;        # the request failed; see Finish.errorCode / errorMessage
  unavailable @5;  # the serving side went away (shutdown, failure); retryable
}

# Error codes. Numeric values equal chunkserve::StatusCode (runtime/base/status.h).
enum ErrorCode {
  ok @0;
  invalidArgument @1;
  notFound @2;
  alreadyExists @3;
  resourceExhausted @4;   # "overloaded": queue full or no capacity; retryable elsewhere/later
  failedPrecondition @5;
  outOfRange @6;
  unavailable @7;         # retryable
  deadlineExceeded @8;
  cancelled @9;
  internal @10;
  unimplemented @11;
  dataLoss @12;           # malformed frame
  aborted @13;
  unauthenticated @14;    # the peer did not prove the cluster secret / client token
}

# Sampling rules (runtime/sched/request.h SamplingParams). temperature 0 = greedy.
struct Sampling {
  temperature @0 :Float32 = 0;  # >= 0
  topK @1 :Int32 = 0;           # >= 0; 0 = no limit
  topP @2 :Float32 = 1;         # in (0, 1]; 1 = no limit
  seed @3 :UInt64 = 0;          # seed of the sampling generator
}

# Client -> router / worker: start one request. Answered by Token* then exactly one Finish, or by
# one Error carrying the same requestId when it is not admitted.
struct Generate {
  requestId @0 :UInt64;          # chosen by the sender, unique per connection; echoed back
  prompt @1 :List(UInt32);       # non-empty prompt token ids
  sampling @2 :Sampling;         # absent = greedy
  maxNewTokens @3 :Int32 = 16;   # >= 1
  stopTokens @4 :List(UInt32);   # generating one of these ends the request with stopToken
  deadlineMs @5 :UInt32 = 0;     # relative deadline from receipt in milliseconds; 0 = none
  priority @6 :Int32 = 0;        # higher runs first and is preempted last
  logprobs @7 :Int32 = -1;       # -1: none; k in [0, 20]: each Token carries its logprobs and
                                 # the k most likely tokens at its position
}

# Worker / router -> client: one generated token of a request, in order.
struct Token {
  requestId @0 :UInt64;        # the Generate's requestId
  token @1 :UInt32;            # the generated token id
  index @2 :Int32;             # 0-based position among the generated tokens
  logprobs @3 :TokenLogprobs;  # present when the Generate asked for logprobs
}

# Log-probabilities under the model's distribution softmax(logits), before temperature and
# top-k / top-p (what OpenAI's API reports).
struct TokenLogprobs {
  logprob @0 :Float32;        # of the generated token
  top @1 :List(TopLogprob);   # the most likely tokens, most likely first; at most 20
}

struct TopLogprob {
  token @0 :UInt32;
  logprob @1 :Float32;
}

# Worker / router -> client: the terminal event of a request (exactly one per admitted request).
struct Finish {
  requestId @0 :UInt64;        # the Generate's requestId
  reason @1 :FinishReason;     # why it ended
  errorCode @2 :ErrorCode;     # ok unless reason is error / unavailable
  errorMessage @3 :Text;       # human-readable, empty when errorCode is ok
  promptTokens @4 :Int32;      # tokens in the prompt
  cachedTokens @5 :Int32;      # prompt tokens whose KV came from the prefix cache
  generatedTokens @6 :Int32;   # tokens streamed to the client
}

# Client -> router / worker: cancel a request; its Finish (reason cancelled, unless it already
# ended) still follows. Unknown ids are ignored.
struct Cancel {
  requestId @0 :UInt64;  # the Generate's requestId
}

# Any direction: a failure. With requestId != 0 it answers that request (not admitted; no
# Finish follows); with requestId 0 it concerns the connection (e.g. a malformed frame, after
# which the sender closes the connection).
struct Error {
  requestId @0 :UInt64;    # the request it answers, or 0 for the connection
  code @1 :ErrorCode;      # what went wrong
  message @2 :Text;        # human-readable detail
  retryable @3 :Bool;      # true for overloaded / unavailable: retrying (elsewhere) may succeed
}

# Worker -> router: first message on a router link; identifies the worker and its model.
struct Register {
  workerId @0 :Text;            # stable operator-chosen id, unique in the cluster
  modelFingerprint @1 :UInt64;  # Engine::model_fingerprint(); routers only mix equal models
  chunkSize @2 :Int32;          # tokens per KV chunk
  chunkHashVersion @3 :UInt32;  # version of the chunk hash algorithm (chunk_hash.h)
  capacityKvBytes @4 :UInt64;   # KV arena size in bytes
  capacitySlots @5 :Int32;      # KV slots (tokens) the arena holds
  maxBatchSize @6 :Int32;       # sequences per step
  maxQueued @7 :Int32;          # admission queue bound
  generation @8 :UInt64;        # worker generation: changes on every process start
  address @9 :Text;             # host:port where clients reach this worker
}

# Router -> worker: answer to Register.
struct RegisterAck {
  accepted @0 :Bool;   # false: the router refuses (e.g. model fingerprint mismatch)
  reason @1 :Text;     # why, when refused
}

# Worker -> router: periodic load report used for routing.
struct LoadReport {
  generation @0 :UInt64;            # worker generation
  queuedPrefillTokens @1 :UInt64;   # prompt tokens waiting for prefill
  runningSequences @2 :Int32;       # sequences in the running batch
  queuedRequests @3 :Int32;         # submitted, not yet admitted
  freeKvSlots @4 :UInt64;           # KV slots free or reclaimable (retained)
  prefillTokensPerS @5 :Float64;    # measured prefill rate over the last seconds
  decodeTokensPerS @6 :Float64;     # decode rate over the last seconds of steps, idle time and
                                    # the steps' prefill excluded
  draining @7 :Bool;                # true once the worker stopped admitting
  freeKvBytes @8 :UInt64;           # KV arena bytes free or reclaimable (exact; freeKvSlots is
                                    # derived from it and is 0 until the slot size is known)
  inFlightRequests @9 :Int32;       # requests admitted and not yet finished (all connections)
  engineProgress @10 :UInt64;       # engine progress since start (steps run + requests ended):
                                    # moves whenever the engine does anything
  oldestUnservedMs @11 :UInt32;     # age of the oldest admitted request still without its first
                                    # token (0: none); with engineProgress still, a frozen engine
}

# Client / router -> worker: subscribe to KV events. The worker answers with one KvEvents with
# snapshot = true (every chunk hash it holds), then increments.
struct SubscribeKv {
  lastGeneration @0 :UInt64;  # generation the subscriber saw last (informational)
}

# Worker -> subscriber: a batch of KV cache changes.
struct KvEvents {
  generation @0 :UInt64;       # worker generation; a new value invalidates everything known
  sequence @1 :UInt64;         # event sequence number of the last change in this batch; strictly
                               # increasing per generation; a gap means events were lost
  snapshot @2 :Bool;           # true: `stored` is the complete set held as of `sequence`
  stored @3 :List(StoredChunk);  # chunks now held
  evicted @4 :List(UInt64);    # chunk hashes no longer held
}

# One stored chunk.
struct StoredChunk {
  hash @0 :UInt64;        # chained chunk hash
  parentHash @1 :UInt64;  # hash of the preceding chunk; 0 for a first chunk
}

# Stats request (empty) / reply.
struct StatsRequest {
  unused @0 :Bool;  # reserved; ignored
}

# Worker -> client: engine statistics (runtime/engine/engine.h EngineStats).
struct Stats {
  requestsSubmitted @0 :UInt64;
  requestsFinished @1 :UInt64;
  promptTokens @2 :UInt64;       # prompt tokens of admitted requests
  prefixHitTokens @3 :UInt64;    # prompt tokens whose KV came from the cache
  generatedTokens @4 :UInt64;    # tokens streamed out
  evictedChunks @5 :UInt64;
  preemptions @6 :UInt64;
  running @7 :Int32;             # sequences in the running batch
  queued @8 :Int32;              # submitted, not yet admitted
  kvBytesUsed @9 :UInt64;        # slots in use, shared counted once
  kvBytesReferenced @10 :UInt64; # slots referenced by live sequences
  kvBytesCapacity @11 :UInt64;   # KV arena size
  chunksTotal @12 :Int32;        # chunks in the prefix tree
  chunksShared @13 :Int32;       # chunks referenced by >= 2 live sequences
  chunksRetained @14 :Int32;     # unreferenced chunks kept for reuse
  steps @15 :UInt64;             # engine steps run
}

# Health probe / reply.
struct HealthRequest {
  unused @0 :Bool;  # reserved; ignored
}

struct Health {
  live @0 :Bool;       # the process answers
  ready @1 :Bool;      # model loaded, engine making progress, not draining
  draining @2 :Bool;   # SIGTERM received; finishing in-flight requests
  generation @3 :UInt64;  # worker generation
}

# Keepalive, any direction, on any link: a Ping is answered by a Pong with the same nonce. Either
# counts as traffic for idle deadlines, so an idle link is never taken for a dead one. Handled by
# the connection layer (runtime/wire/connection.h); applications never see them.
struct Ping {
  nonce @0 :UInt64;
}

struct Pong {
  nonce @0 :UInt64;
}

# Server -> connecting peer, first frame of every connection to a server that requires
# authentication (a cluster secret is configured). The peer answers with Auth before anything
# else; the secret itself never crosses the wire.
struct Challenge {
  nonce @0 :Data;  # 32 random bytes, fresh per connection
}

# Peer -> server: proof = HMAC-SHA256(key, "chunkserve-auth-v1" || nonce || role), where key is the
# cluster secret (roles worker and router) or the client token (role client; the cluster secret
# also works for a client). A wrong or missing proof: Error (unauthenticated), then close.
enum AuthRole {
  client @0;
  worker @1;   # may Register
  router @2;   # a router's data link to a worker
}

struct Auth {
  role @0 :AuthRole;
  proof @1 :Data;  # 32 bytes
}

# The root of every frame. Exactly one member is set.
struct Envelope {
  union {
    generate @0 :Generate;
    token @1 :Token;
    finish @2 :Finish;
    cancel @3 :Cancel;
    error @4 :Error;
    register @5 :Register;
    registerAck @6 :RegisterAck;
    loadReport @7 :LoadReport;
    subscribeKv @8 :SubscribeKv;
    kvEvents @9 :KvEvents;
    statsRequest @10 :StatsRequest;
    stats @11 :Stats;
    healthRequest @12 :HealthRequest;
    health @13 :Health;
    ping @14 :Ping;
    pong @15 :Pong;
    challenge @16 :Challenge;
    auth @17 :Auth;
  }
}
