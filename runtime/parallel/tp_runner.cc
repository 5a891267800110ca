#include "runtime/parallel/tp_runner.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/base/logging.h"
#include "runtime/model/tensor_parallel.h"

namespace chunkserve::parallel {
namespace {

// Every message starts with one broadcast of this many bytes: a header and, when it fits, the
// payload, so a decode step costs one broadcast.
constexpr size_t kFrameBytes = 4096;
constexpr size_t kHeaderBytes = 16;
constexpr uint32_t kMagic = 0x50545343;  // "CSTP"

struct Header {
  uint32_t magic = kMagic;
  uint32_t kind = 0;
  uint64_t payload_bytes = 0;
};
static_assert(sizeof(Header) == kHeaderBytes);

// A message as received: kind and payload.
struct Message {
  TpMessageKind kind = TpMessageKind::kShutdown;
  std::vector<std::byte> payload;
};

Status Broadcast(Communicator* comm, std::span<std::byte> bytes, std::chrono::milliseconds t) {
  return comm->Broadcast(bytes, 0, Deadline::After(t));
}

Status SendMessage(Communicator* comm, TpMessageKind kind, std::span<const std::byte> payload,
                   std::chrono::milliseconds timeout, std::vector<std::byte>* frame) {
  frame->assign(kFrameBytes, std::byte{0});
  const Header h{kMagic, static_cast<uint32_t>(kind), payload.size()};
  std::memcpy(frame->data(), &h, kHeaderBytes);
  const bool inline_payload = payload.size() <= kFrameBytes - kHeaderBytes;
  if (inline_payload && !payload.empty()) {
    std::memcpy(frame->data() + kHeaderBytes, payload.data(), payload.size());
  }
  CHUNKSERVE_RETURN_IF_ERROR(Broadcast(comm, *frame, timeout));
  if (inline_payload) return Status::Ok();
  std::vector<std::byte> rest(payload.begin(), payload.end());
  return Broadcast(comm, rest, timeout);
}

Status ReceiveMessage(Communicator* comm, std::chrono::milliseconds first_timeout,
                      std::chrono::milliseconds timeout, std::vector<std::byte>* frame,
                      Message* out) {
  frame->assign(kFrameBytes, std::byte{0});
  CHUNKSERVE_RETURN_IF_ERROR(Broadcast(comm, *frame, first_timeout));
  Header h;
  std::memcpy(&h, frame->data(), kHeaderBytes);
  if (h.magic != kMagic || h.kind < 1 || h.kind > 4 || h.payload_bytes > (1ull << 30)) {
    return Status::DataLoss("malformed tensor-parallel message header");
  }
  out->kind = static_cast<TpMessageKind>(h.kind);
  if (h.payload_bytes <= kFrameBytes - kHeaderBytes) {
    out->payload.assign(frame->begin() + kHeaderBytes,
                        frame->begin() + kHeaderBytes + static_cast<ptrdiff_t>(h.payload_bytes));
    return Status::Ok();
  }
  out->payload.assign(h.payload_bytes, std::byte{0});
  return Broadcast(comm, out->payload, timeout);
}

forward::TensorParallel ShardGroup(Communicator* comm, std::chrono::milliseconds op_timeout) {
  return {.rank = comm->rank(), .size = comm->size(), .comm = comm, .op_timeout = op_timeout};
}

// Rank r of a CUDA group runs on device r.
forward::RunnerOptions RankOptions(forward::RunnerOptions o, int32_t rank) {
  if (o.backend == forward::BackendKind::kCuda) o.cuda_device = rank;
  return o;
}

// Every rank contributes 1 when it failed; the sum says how many did.
Result<int32_t> CountFailures(Communicator* comm, bool failed, std::chrono::milliseconds t) {
  float flag = failed ? 1.0f : 0.0f;
  CHUNKSERVE_RETURN_IF_ERROR(comm->AllReduceSum(std::span<float>(&flag, 1), Deadline::After(t)));
  return static_cast<int32_t>(flag + 0.5f);
}

}  // namespace

Result<std::unique_ptr<TpLeaderRunner>> TpLeaderRunner::Create(
    const model::LoadedModel& model, const forward::RunnerOptions& options, Communicator* comm,
    const TpOptions& tp_options) {
  if (comm == nullptr || comm->rank() != 0) {
    return Status::InvalidArgument("the tensor-parallel leader must be rank 0 of its group");
  }
  if (tp_options.op_timeout.count() < 1 || tp_options.heartbeat_interval.count() < 1) {
    return Status::InvalidArgument("tensor-parallel timeouts must be positive");
  }
  // Checked before the followers are involved, so a model that does not split fails with a
  // clear message on every rank (the followers get it through the init status).
  const Status valid = model::ValidateTensorParallel(model.config(), comm->size());
  std::unique_ptr<TpLeaderRunner> b(new TpLeaderRunner(comm, tp_options));
  TpInit init;
  init.model_dir = std::filesystem::absolute(model.dir()).string();
  init.model_fingerprint = model.fingerprint();
  init.num_slots = options.num_slots;
  init.chunk_size = options.chunk_size;
  init.kv_dtype = static_cast<int32_t>(options.kv_dtype);
  init.num_threads = options.num_threads;
  init.op_timeout_ms = static_cast<int32_t>(tp_options.op_timeout.count());
  init.heartbeat_ms = static_cast<int32_t>(tp_options.heartbeat_interval.count());
  init.backend = static_cast<int32_t>(options.backend);
  init.weight_dtype = static_cast<int32_t>(model.dtype());
  std::vector<std::byte> frame;
  CHUNKSERVE_RETURN_IF_ERROR(
      SendMessage(comm, TpMessageKind::kInit, EncodeTpInit(init), tp_options.op_timeout, &frame));
  Status local = valid;
  if (local.ok()) {
    Result<std::unique_ptr<forward::LlamaModel>> shard = forward::CreateLlamaModel(
        model, RankOptions(options, 0), ShardGroup(comm, tp_options.op_timeout));
    if (shard.ok()) {
      b->local_ = std::move(shard).value();
    } else {
      local = shard.status();
    }
  }
  // Followers load the model from disk: allow them the rendezvous-scale time for it.
  Result<int32_t> failures = CountFailures(comm, !local.ok(), tp_options.op_timeout * 4);
  if (!failures.ok()) {
    comm->Abort(failures.status());
    return Status::Unavailable("tensor-parallel group failed while building shards: " +
                               failures.status().ToString());
  }
  if (!local.ok()) {
    comm->Abort(local);  // the followers failed alike (the same check) and have returned
    return local;
  }
  if (failures.value() > 0) {
    const Status s =
        Status::Unavailable(std::to_string(failures.value()) +
                            " tensor-parallel rank(s) could not build their shard of " +
                            init.model_dir + "; see their logs");
    comm->Abort(s);
    return s;
  }
  b->last_op_ = Clock::now();
  b->serving_ = true;
  b->heartbeat_ = std::thread([p = b.get()] { p->HeartbeatLoop(); });
  return b;
}

TpLeaderRunner::~TpLeaderRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  // Only a group that finished Create is serving; a failed Create already broke it.
  if (serving_ && health().ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    const Status s = SendLocked(TpMessageKind::kShutdown, {});
    if (!s.ok()) LOG(WARNING) << "tensor-parallel shutdown message not delivered: " << s;
  }
}

Status TpLeaderRunner::SendLocked(TpMessageKind kind, std::span<const std::byte> payload) {
  std::vector<std::byte> frame;
  return SendMessage(comm_, kind, payload, options_.op_timeout, &frame);
}

template <typename Run>
Status TpLeaderRunner::Step(const forward::StepBatch& batch, Run&& local) {
  std::lock_guard<std::mutex> lock(mu_);
  CHUNKSERVE_RETURN_IF_ERROR(health());
  Status s = SendLocked(TpMessageKind::kStep, EncodeStep(batch));
  if (s.ok()) s = local();
  last_op_ = Clock::now();
  if (s.ok()) return s;
  // A malformed batch is caught by ValidateStepBatch on every rank alike, but the group cannot
  // tell that from a partial failure: it is broken either way.
  Fail(Status(s.code(), "tensor-parallel step failed: " + std::string(s.message())));
  return health();
}

Status TpLeaderRunner::Forward(const forward::StepBatch& batch, std::span<float> logits) {
  return Step(batch, [&] { return local_->Forward(batch, logits); });
}

Status TpLeaderRunner::ForwardSample(const forward::StepBatch& batch,
                                     std::span<const backend::SampleRow> rows,
                                     std::span<TokenId> tokens,
                                     std::span<TokenLogprobs> logprobs) {
  return Step(batch, [&] { return local_->ForwardSample(batch, rows, tokens, logprobs); });
}

void TpLeaderRunner::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    stop_cv_.wait_for(lock, options_.heartbeat_interval);
    if (stop_) return;
    if (!health().ok()) return;
    if (Clock::now() - last_op_ < options_.heartbeat_interval) continue;
    Status s = SendLocked(TpMessageKind::kHeartbeat, {});
    if (s.ok()) s = CountFailures(comm_, false, options_.op_timeout).status();
    last_op_ = Clock::now();
    if (!s.ok()) {
      Fail(Status::Unavailable("tensor-parallel heartbeat failed: " + s.ToString()));
      return;
    }
  }
}

void TpLeaderRunner::Fail(const Status& reason) {
  std::function<void(const Status&)> callback;
  Status first;
  {
    std::lock_guard<std::mutex> lock(fail_mu_);
    if (failed_.ok()) {
      failed_ = Status::Unavailable(reason.message().empty() ? "tensor-parallel group failed"
                                                             : reason.message());
      LOG(ERROR) << "tensor-parallel group failed: " << failed_;
    }
    first = failed_;
    if (!callback_ran_ && on_failure_) {
      callback_ran_ = true;
      callback = on_failure_;
    }
  }
  comm_->Abort(first);
  if (callback) callback(first);
}

void TpLeaderRunner::SetFailureCallback(std::function<void(const Status&)> callback) {
  Status already;
  {
    std::lock_guard<std::mutex> lock(fail_mu_);
    on_failure_ = callback;
    if (!failed_.ok() && !callback_ran_ && callback) {
      callback_ran_ = true;
      already = failed_;
    }
  }
  if (!already.ok()) callback(already);
}

Status TpLeaderRunner::health() const {
  std::lock_guard<std::mutex> lock(fail_mu_);
  return failed_;
}

Status RunTpFollower(Communicator* comm, std::chrono::milliseconds init_timeout) {
  if (comm == nullptr || comm->rank() == 0) {
    return Status::InvalidArgument("followers are ranks 1..T-1");
  }
  auto fail = [comm](Status s) {
    comm->Abort(s);
    return s;
  };
  std::vector<std::byte> frame;
  Message msg;
  CHUNKSERVE_RETURN_IF_ERROR(ReceiveMessage(comm, init_timeout, init_timeout, &frame, &msg));
  if (msg.kind != TpMessageKind::kInit) {
    return fail(Status::DataLoss("expected the tensor-parallel init message first"));
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(const TpInit init, DecodeTpInit(msg.payload));
  const auto op_timeout = std::chrono::milliseconds(std::max(1, init.op_timeout_ms));
  const auto idle_timeout = op_timeout + std::chrono::milliseconds(std::max(1, init.heartbeat_ms));

  // Build the shard; every failure is reported to the group before returning it.
  std::unique_ptr<forward::LlamaModel> local;
  // A GGUF dequantized to the leader's dtype (the fingerprint depends on it); safetensors keep
  // their file's dtype whatever this says.
  model::LoadModelOptions load_options;
  load_options.gguf_dtype = static_cast<kernels::DType>(init.weight_dtype);
  Result<model::LoadedModel> model = model::LoadedModel::Load(init.model_dir, load_options);
  Status built = model.status();
  if (built.ok() && model.value().fingerprint() != init.model_fingerprint) {
    built = Status::FailedPrecondition("rank " + std::to_string(comm->rank()) + " loaded " +
                                       init.model_dir + " with another fingerprint than rank 0");
  }
  if (built.ok()) {
    const forward::RunnerOptions base{.backend = static_cast<forward::BackendKind>(init.backend),
                                      .num_threads = init.num_threads,
                                      .num_slots = init.num_slots,
                                      .chunk_size = init.chunk_size,
                                      .kv_dtype = static_cast<kernels::DType>(init.kv_dtype)};
    Result<std::unique_ptr<forward::LlamaModel>> shard = forward::CreateLlamaModel(
        model.value(), RankOptions(base, comm->rank()), ShardGroup(comm, op_timeout));
    built = shard.status();
    if (shard.ok()) local = std::move(shard).value();
    model.value().ReleaseWeights();  // the shard holds its own copy
  }
  if (!built.ok()) {
    LOG(ERROR) << "tensor-parallel rank " << comm->rank() << ": " << built;
  }
  Result<int32_t> failures = CountFailures(comm, !built.ok(), op_timeout * 4);
  if (!failures.ok()) return fail(failures.status());
  if (!built.ok()) return fail(built);
  if (failures.value() > 0) return fail(Status::Unavailable("another rank failed to build"));

  DecodedStep step;
  for (;;) {
    Status s = ReceiveMessage(comm, idle_timeout, op_timeout, &frame, &msg);
    if (!s.ok()) {
      return fail(Status(s.code(), "waiting for rank 0: " + std::string(s.message())));
    }
    switch (msg.kind) {
      case TpMessageKind::kStep:
        s = DecodeStep(msg.payload, &step);
        if (s.ok()) s = local->Forward(step.batch(), {});
        break;
      case TpMessageKind::kHeartbeat:
        s = CountFailures(comm, false, op_timeout).status();
        break;
      case TpMessageKind::kShutdown:
        return Status::Ok();
      case TpMessageKind::kInit:
        s = Status::DataLoss("unexpected second init message");
        break;
    }
    if (!s.ok()) return fail(s);
  }
}

}  // namespace chunkserve::parallel
