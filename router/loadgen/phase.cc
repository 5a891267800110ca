#include "router/loadgen/phase.h"

#include <capnp/message.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "runtime/wire/auth.h"
#include "runtime/wire/client_protocol.h"

namespace chunkserve::router::loadgen {

using wire::schema::Envelope;

Status Phase::Run() {
  for (int i = 0; i < o_.connections; ++i) {
    asio::ip::tcp::socket socket(io_);
    asio::error_code ec;
    socket.connect({asio::ip::make_address(o_.host, ec), o_.port}, ec);
    if (ec) return Status::Unavailable("connect to " + o_.host + ": " + ec.message());
    wire::ConnectionOptions copts;
    copts.max_outgoing_bytes = 256u << 20;
    if (!o_.auth_key.empty()) {
      copts.client_auth = wire::ClientAuth{o_.auth_key, wire::schema::AuthRole::CLIENT};
    }
    copts.tls = o_.tls;
    copts.tls_host = o_.host;
    auto c = wire::Connection::Create(std::move(socket), copts);
    c->Start([this](wire::DecodedMessage& m) { OnMessage(m); },
             [this](const Status& reason) {
               if (!reason.ok() && !stopping_) connection_problem_ = reason.ToString();
               if (outstanding_ > 0 && !stopping_) {
                 lost_ = Status::Unavailable("connection closed: " + Why(reason.ToString()));
                 io_.stop();
               }
             });
    connections_.push_back(c);
  }
  start_ = Clock::now();
  ScheduleNext();
  deadline_timer_ = std::make_unique<asio::steady_timer>(
      io_, std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000)));
  deadline_timer_->async_wait([this](const asio::error_code& ec) {
    if (!ec) {
      lost_ = Status::DeadlineExceeded("phase did not finish within the timeout");
      io_.stop();
    }
  });
  io_.run();
  end_ = Clock::now();
  stopping_ = true;
  for (auto& c : connections_) c->Close(Status::Ok());
  io_.restart();
  io_.poll();
  return lost_;
}

PhaseReport Phase::Report(const std::string& name) const {
  PhaseReport r;
  r.name = name;
  r.requests = static_cast<int64_t>(requests_.size());
  std::vector<double> ttft, e2e;
  double prompt = 0, cached = 0, generated = 0;
  for (const RequestResult& x : results_) {
    if (x.error) {
      r.errors++;
      if (r.first_error.empty()) r.first_error = x.error_message;
      continue;
    }
    if (!x.end) continue;
    r.finished++;
    r.bad_indices += x.bad_index;
    r.incomplete += x.incomplete;
    r.tokens += x.expected_index;
    prompt += x.prompt_tokens;
    cached += x.cached_tokens;
    generated += x.generated;
    if (x.first_token) {
      ttft.push_back(std::chrono::duration<double, std::milli>(*x.first_token - x.sent).count());
    }
    e2e.push_back(std::chrono::duration<double, std::milli>(*x.end - x.sent).count());
  }
  r.hit_rate = prompt > 0 ? cached / prompt : 0;
  double sum = 0;
  for (double t : ttft) sum += t;
  r.ttft_mean_ms = ttft.empty() ? 0 : sum / static_cast<double>(ttft.size());
  r.ttft_p50_ms = Percentile(ttft, 0.5);
  r.ttft_p99_ms = Percentile(ttft, 0.99);
  r.e2e_p50_ms = Percentile(e2e, 0.5);
  r.e2e_p99_ms = Percentile(e2e, 0.99);
  r.wall_s = std::chrono::duration<double>(end_ - start_).count();
  r.requests_per_s = r.wall_s > 0 ? static_cast<double>(r.finished) / r.wall_s : 0;
  r.output_tokens_per_s = r.wall_s > 0 ? generated / r.wall_s : 0;
  return r;
}

void Phase::ScheduleNext() {
  if (next_ >= requests_.size()) return;
  const auto at = start_ + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(requests_[next_].arrival_s));
  timer_.expires_at(at);
  timer_.async_wait([this](const asio::error_code& ec) {
    if (ec) return;
    // Send everything due (a late timer catches up without drifting the schedule).
    while (next_ < requests_.size()) {
      const auto due = start_ + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(requests_[next_].arrival_s));
      if (due > Clock::now()) break;
      Send(next_++);
    }
    ScheduleNext();
  });
}

void Phase::Send(size_t i) {
  const WorkloadRequest& w = requests_[i];
  wire::GenerateMessage g;
  g.request_id = i + 1;
  g.prompt = w.prompt;
  g.max_new_tokens = std::max(1, w.output_tokens);
  std::vector<uint8_t> frame = wire::EncodeGenerate(g);
  results_[i].sent = Clock::now();
  results_[i].max_new_tokens = g.max_new_tokens;
  outstanding_++;
  const Status s = connections_[i % connections_.size()]->SendBytes(std::move(frame));
  if (!s.ok()) Fail(i, s.ToString());
}

// `message`, with the reason a connection closed when one did.
std::string Phase::Why(const std::string& message) const {
  if (connection_problem_.empty() || message == connection_problem_) return message;
  return message + " (" + connection_problem_ + ")";
}

void Phase::Fail(size_t i, const std::string& message) {
  results_[i].error = true;
  results_[i].error_message = Why(message);
  Done();
}

void Phase::Done() {
  outstanding_--;
  completed_++;
  if (completed_ == requests_.size()) io_.stop();
}

void Phase::OnMessage(wire::DecodedMessage& m) {
  Envelope::Reader root = m.root();
  const auto now = Clock::now();
  auto result = [&](uint64_t id) -> RequestResult* {
    return id >= 1 && id <= results_.size() ? &results_[id - 1] : nullptr;
  };
  switch (root.which()) {
    case Envelope::TOKEN: {
      Result<wire::TokenMessage> t = wire::DecodeToken(root.getToken());
      RequestResult* r = t.ok() ? result(t->request_id) : nullptr;
      if (r == nullptr) return;
      if (!r->first_token) r->first_token = now;
      if (t->index != r->expected_index) r->bad_index = true;
      r->expected_index++;
      break;
    }
    case Envelope::FINISH: {
      const wire::FinishMessage f = wire::DecodeFinish(root.getFinish());
      RequestResult* r = result(f.request_id);
      if (r == nullptr || r->end || r->error) return;
      r->end = now;
      r->prompt_tokens = f.prompt_tokens;
      r->cached_tokens = f.cached_tokens;
      r->generated = f.generated_tokens;
      if (f.reason == FinishReason::kError || f.reason == FinishReason::kUnavailable) {
        r->error = true;
        r->error_message = std::string(f.error.message());
      } else {
        // No stop tokens are sent, so a normal end delivers exactly max_new_tokens.
        r->incomplete =
            r->expected_index != r->max_new_tokens || f.generated_tokens != r->expected_index;
      }
      Done();
      break;
    }
    case Envelope::ERROR: {
      auto e = root.getError();
      if (e.getRequestId() == 0) {
        // About the connection (e.g. "unauthenticated"): the reason it is about to close.
        connection_problem_ = e.getMessage().cStr();
        return;
      }
      RequestResult* r = result(e.getRequestId());
      if (r == nullptr || r->end || r->error) return;
      r->end = now;
      Fail(e.getRequestId() - 1, e.getMessage().cStr());
      break;
    }
    default:
      break;
  }
}

}  // namespace chunkserve::router::loadgen
