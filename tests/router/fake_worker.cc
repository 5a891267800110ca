#include "tests/router/fake_worker.h"

#include <capnp/message.h>

#include <utility>

#include "runtime/kvcache/chunk_hash.h"
#include "runtime/wire/listen.h"
#include "runtime/wire/messages.h"

namespace chunkserve::router::testing {

using wire::schema::Envelope;

FakeWorker::FakeWorker(Options options)
    : options_(std::move(options)),
      generation_(
          static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())) {}

FakeWorker::~FakeWorker() {
  if (control_) control_->Close();
  if (!loop_.joinable()) return;
  asio::post(io_, [this] {
    asio::error_code ignored;
    acceptor_.close(ignored);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (data_) data_->Close(Status::Unavailable("fake worker stopped"));
    }
    io_.stop();
  });
  loop_.join();
}

Result<std::unique_ptr<FakeWorker>> FakeWorker::Register(uint16_t router_port, Options options) {
  std::unique_ptr<FakeWorker> w(new FakeWorker(std::move(options)));
  CHUNKSERVE_RETURN_IF_ERROR(wire::ListenTcp(w->acceptor_, "127.0.0.1", 0));
  const uint16_t data_port = w->acceptor_.local_endpoint().port();
  FakeWorker* self = w.get();
  // The router's data link (and, should it reconnect, its next one): Generates are queued for
  // NextGenerate; keepalive frames are answered inside Connection.
  wire::AcceptLoop(w->acceptor_, [self](asio::ip::tcp::socket socket) {
    auto connection = wire::Connection::Create(std::move(socket), wire::ConnectionOptions{});
    connection->Start(
        [self](wire::DecodedMessage& m) {
          if (m.root().which() != Envelope::GENERATE) return;
          Result<wire::GenerateMessage> g = wire::DecodeGenerate(m.root().getGenerate());
          if (!g.ok()) return;
          std::lock_guard<std::mutex> lock(self->mu_);
          self->generates_.push_back(std::move(g).value());
          self->cv_.notify_all();
        },
        [](const Status&) {});
    std::lock_guard<std::mutex> lock(self->mu_);
    self->data_ = connection;
  });
  w->loop_ = std::thread([self] {
    auto guard = asio::make_work_guard(self->io_);
    self->io_.run();
  });

  CHUNKSERVE_ASSIGN_OR_RETURN(w->control_,
                              wire::WireClient::Connect("127.0.0.1", router_port, kTimeout));
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<Envelope>().initRegister();
  r.setWorkerId(w->options_.name);
  r.setModelFingerprint(w->options_.model_fingerprint);
  r.setChunkSize(w->options_.chunk_size);
  r.setChunkHashVersion(kv::kHashVersion);
  r.setCapacityKvBytes(static_cast<uint64_t>(w->options_.capacity_tokens) * 1024);
  r.setCapacitySlots(w->options_.capacity_tokens);
  r.setMaxBatchSize(w->options_.max_batch_size);
  r.setMaxQueued(64);
  r.setGeneration(w->generation_);
  r.setAddress("127.0.0.1:" + std::to_string(data_port));
  CHUNKSERVE_RETURN_IF_ERROR(w->control_->Send(b));
  const auto give_up = std::chrono::steady_clock::now() + kTimeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        give_up - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::DeadlineExceeded("no RegisterAck from the router");
    CHUNKSERVE_ASSIGN_OR_RETURN(wire::DecodedMessage m, w->control_->Receive(left));
    if (m.root().which() != Envelope::REGISTER_ACK) continue;
    if (!m.root().getRegisterAck().getAccepted()) {
      return Status::FailedPrecondition(std::string("registration refused: ") +
                                        m.root().getRegisterAck().getReason().cStr());
    }
    break;
  }
  w->seed_ = kv::ChunkHashSeed(w->options_.model_fingerprint, w->options_.chunk_size);
  return w;
}

std::vector<uint64_t> FakeWorker::ChunkHashes(const std::vector<TokenId>& tokens) const {
  Result<std::vector<uint64_t>> h = kv::FullChunkHashes(seed_, options_.chunk_size, tokens);
  return h.ok() ? std::move(h).value() : std::vector<uint64_t>{};
}

Status FakeWorker::SendKvSnapshot(const std::vector<TokenId>& tokens) {
  const std::vector<uint64_t> hashes = ChunkHashes(tokens);
  capnp::MallocMessageBuilder b;
  auto ev = b.initRoot<Envelope>().initKvEvents();
  ev.setGeneration(generation_);
  ev.setSequence(++kv_sequence_);
  ev.setSnapshot(true);
  auto stored = ev.initStored(static_cast<unsigned>(hashes.size()));
  for (size_t i = 0; i < hashes.size(); ++i) {
    stored[static_cast<unsigned>(i)].setHash(hashes[i]);
    stored[static_cast<unsigned>(i)].setParentHash(i == 0 ? seed_ : hashes[i - 1]);
  }
  ev.initEvicted(0);
  return control_->Send(b);
}

Status FakeWorker::SendLoadReport(const Load& load) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<Envelope>().initLoadReport();
  r.setGeneration(generation_);
  r.setQueuedPrefillTokens(load.queued_prefill_tokens);
  r.setRunningSequences(load.running_sequences);
  r.setQueuedRequests(load.queued_requests);
  r.setFreeKvSlots(static_cast<uint64_t>(options_.capacity_tokens));
  r.setFreeKvBytes(static_cast<uint64_t>(options_.capacity_tokens) * 1024);
  r.setPrefillTokensPerS(load.prefill_tokens_per_s);
  r.setDecodeTokensPerS(100);
  r.setInFlightRequests(load.running_sequences + load.queued_requests);
  r.setEngineProgress(++progress_);
  return control_->Send(b);
}

Result<wire::GenerateMessage> FakeWorker::NextGenerate(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !generates_.empty(); })) {
    return Status::DeadlineExceeded("no Generate from the router");
  }
  wire::GenerateMessage g = std::move(generates_.front());
  generates_.pop_front();
  return g;
}

Status FakeWorker::SendToken(uint64_t request_id, TokenId token, int32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!data_) return Status::FailedPrecondition("no data link from the router");
  return data_->SendBytes(wire::EncodeToken(
      {.request_id = request_id, .token = token, .index = index, .logprobs = std::nullopt}));
}

Status FakeWorker::SendFinish(const wire::FinishMessage& finish) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!data_) return Status::FailedPrecondition("no data link from the router");
  return data_->SendBytes(wire::EncodeFinish(finish));
}

}  // namespace chunkserve::router::testing
