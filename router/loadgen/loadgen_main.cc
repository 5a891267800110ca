// chunkserve-loadgen: replays a workload against a chunkserve-router (or a single worker) over
// the wire protocol and reports prefix hit rate, TTFT and end-to-end latency percentiles,
// throughput, load imbalance and routing precision; see router/README.md ("Load generator").
//
// The workload is runtime/workload/workload.h's synthetic generator (a family: multi-tenant with
// Zipf tenant popularity, multi-turn, agent, long documents; Poisson arrivals) or a trace.
// Arrivals are open loop: each request is sent at its arrival time whatever the state of earlier
// ones, over a few connections (round robin). Every run also
// replays the negative control -- the same lengths and arrivals with no shared prefixes -- so the
// hit rate of the shared workload can be read against what sharing-free traffic gets.
//
// Per-worker figures (routed requests, cached and prompt tokens) and routing precision come from
// the router's /metrics (--http), scraped before and after each phase; without --http only the
// client-side figures are reported.
//
// Every stream is checked: token indices must be continuous from 0 (bad_indices), and a request
// that ends normally must have delivered exactly the tokens it asked for, as many as its Finish
// counts (incomplete) -- a lost or duplicated token shows in one or the other.
//
// Like the C client, it answers a server's challenge with $CHUNKSERVE_CLIENT_TOKEN (else
// $CHUNKSERVE_CLUSTER_SECRET), and speaks TLS with --tls-ca (the server's certificate must name
// the --target host).
#include <capnp/message.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "router/loadgen/report.h"
#include "runtime/base/status.h"
#include "runtime/wire/asio.h"
#include "runtime/wire/auth.h"
#include "runtime/wire/client_protocol.h"
#include "runtime/wire/connection.h"
#include "runtime/wire/tls.h"
#include "runtime/workload/workload.h"

namespace chunkserve::router {
namespace {

using Clock = std::chrono::steady_clock;
using wire::schema::Envelope;
using workload::ForFamily;
using workload::LoadTrace;
using workload::MakeSyntheticWorkload;
using workload::ParseWorkloadFamily;
using workload::ReadAll;
using workload::Rng;
using workload::TraceOptions;
using workload::WorkloadFamily;
using workload::WorkloadOptions;
using workload::WorkloadRequest;
using workload::WorkloadSource;

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string http_host = "127.0.0.1";
  uint16_t http_port = 0;  // 0: no metrics
  std::string trace;
  TraceOptions trace_options;
  WorkloadOptions workload;
  int32_t connections = 4;
  std::string json_path;
  std::string label;
  bool control = true;
  double timeout_s = 600;
  std::string tls_ca;    // set: TLS, the server verified against this CA
  std::string auth_key;  // answers the server's challenge (from the environment)
  std::shared_ptr<wire::TlsContext> tls;
};

bool SplitHostPort(const std::string& s, std::string* host, uint16_t* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  char* end = nullptr;
  const long p = std::strtol(s.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) return false;
  *host = s.substr(0, colon);
  *port = static_cast<uint16_t>(p);
  return true;
}

// --- one phase -----------------------------------------------------------------------------------

struct RequestResult {
  Clock::time_point sent;
  std::optional<Clock::time_point> first_token;
  std::optional<Clock::time_point> end;
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;
  int32_t generated = 0;
  int32_t expected_index = 0;  // tokens received so far
  int32_t max_new_tokens = 0;
  bool error = false;
  bool bad_index = false;
  bool incomplete = false;  // ended normally with fewer or more tokens than asked, or than counted
  std::string error_message;
};

class Phase {
 public:
  Phase(const Options& o, std::vector<WorkloadRequest> requests)
      : o_(o), requests_(std::move(requests)), results_(requests_.size()), timer_(io_) {}

  Status Run() {
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

  PhaseReport Report(const std::string& name) const {
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

 private:
  void ScheduleNext() {
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

  void Send(size_t i) {
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
  std::string Why(const std::string& message) const {
    if (connection_problem_.empty() || message == connection_problem_) return message;
    return message + " (" + connection_problem_ + ")";
  }

  void Fail(size_t i, const std::string& message) {
    results_[i].error = true;
    results_[i].error_message = Why(message);
    Done();
  }

  void Done() {
    outstanding_--;
    completed_++;
    if (completed_ == requests_.size()) io_.stop();
  }

  void OnMessage(wire::DecodedMessage& m) {
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

  const Options& o_;
  std::vector<WorkloadRequest> requests_;
  std::vector<RequestResult> results_;
  asio::io_context io_;
  asio::steady_timer timer_;
  std::unique_ptr<asio::steady_timer> deadline_timer_;
  std::vector<std::shared_ptr<wire::Connection>> connections_;
  size_t next_ = 0;
  size_t completed_ = 0;
  int64_t outstanding_ = 0;
  bool stopping_ = false;
  Status lost_;
  // Why a connection closed (its close reason, or the server's Error with requestId 0).
  std::string connection_problem_;
  Clock::time_point start_, end_;
};

Result<std::vector<WorkloadRequest>> Collect(Result<std::unique_ptr<WorkloadSource>> source) {
  if (!source.ok()) return source.status();
  return ReadAll(*source.value());
}

bool ParseIntList(const std::string& s, std::vector<int32_t>* out) {
  out->clear();
  std::istringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1000000) return false;
    out->push_back(static_cast<int32_t>(v));
  }
  return !out->empty();
}

constexpr char kUsage[] =
    "usage: chunkserve-loadgen --target HOST:PORT [--metrics HOST:PORT] [--trace FILE.jsonl]\n"
    "         [--workload multi_tenant|multi_turn|agent|long_doc] [--turns MIN,MAX]\n"
    "         [--max-prompt N] [--system-tokens N]\n"
    "         [--block-size N] [--time-scale X] [--offset N] [--limit N]\n"
    "         [--requests N] [--rate R] [--tenants T] [--zipf S] [--prefix-tokens A,B,..]\n"
    "         [--suffix-tokens MIN,MAX] [--output-tokens MIN,MAX] [--vocab N] [--seed N]\n"
    "         [--connections N] [--no-control] [--label TEXT] [--json FILE] [--timeout-s N]\n"
    "         [--tls-ca PEM]\n"
    "a server that asks for a key gets $CHUNKSERVE_CLIENT_TOKEN, else $CHUNKSERVE_CLUSTER_SECRET\n";

int Main(int argc, char** argv) {
  Options o;
  // --workload first: its defaults, then every other flag overrides them.
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) != "--workload") continue;
    Result<WorkloadFamily> family = ParseWorkloadFamily(argv[i + 1]);
    if (!family.ok()) {
      std::fprintf(stderr, "%s\n%s", family.status().ToString().c_str(), kUsage);
      return 2;
    }
    o.workload = ForFamily(*family);
  }
  o.workload.vocab_size = 1024;  // the built-in tiny model
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "--no-control") {
      o.control = false;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "missing value for %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const std::string v = argv[++i];
    char* end = nullptr;
    bool ok = true;
    std::vector<int32_t> list;
    if (flag == "--workload") {
      // applied above
    } else if (flag == "--turns") {
      ok = ParseIntList(v, &list) && list.size() == 2 && list[0] <= list[1];
      if (ok) {
        o.workload.min_turns = list[0];
        o.workload.max_turns = list[1];
      }
    } else if (flag == "--max-prompt") {
      o.workload.max_prompt_tokens = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o.workload.max_prompt_tokens > 0;
    } else if (flag == "--system-tokens") {
      o.workload.system_tokens = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o.workload.system_tokens > 0;
    } else if (flag == "--target") {
      ok = SplitHostPort(v, &o.host, &o.port);
    } else if (flag == "--metrics") {
      ok = SplitHostPort(v, &o.http_host, &o.http_port);
    } else if (flag == "--trace") {
      o.trace = v;
    } else if (flag == "--block-size") {
      o.trace_options.block_size = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o.trace_options.block_size > 0;
    } else if (flag == "--time-scale") {
      o.trace_options.time_scale = std::strtod(v.c_str(), &end);
      ok = *end == '\0' && o.trace_options.time_scale >= 0;
    } else if (flag == "--offset" || flag == "--limit") {
      const long long n = std::strtoll(v.c_str(), &end, 10);
      ok = *end == '\0' && n >= 0;
      (flag == "--offset" ? o.trace_options.offset : o.trace_options.limit) = n;
    } else if (flag == "--requests") {
      o.workload.num_requests = std::strtoll(v.c_str(), &end, 10);
      ok = *end == '\0' && o.workload.num_requests > 0;
    } else if (flag == "--rate") {
      o.workload.arrival_rate = std::strtod(v.c_str(), &end);
      ok = *end == '\0' && o.workload.arrival_rate > 0;
    } else if (flag == "--tenants") {
      o.workload.tenants = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o.workload.tenants > 0;
    } else if (flag == "--zipf") {
      o.workload.zipf_s = std::strtod(v.c_str(), &end);
      ok = *end == '\0' && o.workload.zipf_s >= 0;
    } else if (flag == "--prefix-tokens") {
      ok = ParseIntList(v, &o.workload.prefix_length_bases);
      if (ok) {
        o.workload.min_prefix_tokens = 1;
        o.workload.max_prefix_tokens = 1 << 20;
      }
    } else if (flag == "--suffix-tokens" || flag == "--output-tokens") {
      ok = ParseIntList(v, &list) && list.size() == 2 && list[0] <= list[1];
      if (ok && flag == "--suffix-tokens") {
        o.workload.min_suffix_tokens = list[0];
        o.workload.max_suffix_tokens = list[1];
      } else if (ok) {
        o.workload.min_output_tokens = list[0];
        o.workload.max_output_tokens = list[1];
      }
    } else if (flag == "--vocab") {
      o.workload.vocab_size = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o.workload.vocab_size > 1;
    } else if (flag == "--seed") {
      o.workload.seed = std::strtoull(v.c_str(), &end, 10);
      ok = *end == '\0';
    } else if (flag == "--connections") {
      o.connections = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o.connections >= 1 && o.connections <= 1024;
    } else if (flag == "--label") {
      o.label = v;
    } else if (flag == "--json") {
      o.json_path = v;
    } else if (flag == "--timeout-s") {
      o.timeout_s = std::strtod(v.c_str(), &end);
      ok = *end == '\0' && o.timeout_s > 0;
    } else if (flag == "--tls-ca") {
      o.tls_ca = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for %s: %s\n", flag.c_str(), v.c_str());
      return 2;
    }
  }
  if (o.port == 0) {
    std::fprintf(stderr, "--target is required\n%s", kUsage);
    return 2;
  }
  for (const char* env : {wire::kClientTokenEnv, wire::kClusterSecretEnv}) {
    Result<std::string> key = wire::LoadSecret("", env);
    if (!key.ok()) {
      std::fprintf(stderr, "$%s: %s\n", env, key.status().ToString().c_str());
      return 2;
    }
    if (!key.value().empty()) {
      o.auth_key = key.value();
      break;
    }
  }
  if (!o.tls_ca.empty()) {
    wire::TlsFiles files;
    files.ca_file = o.tls_ca;
    Result<std::shared_ptr<wire::TlsContext>> tls =
        wire::TlsContext::Create(wire::TlsContext::Side::kClient, files);
    if (!tls.ok()) {
      std::fprintf(stderr, "--tls-ca: %s\n", tls.status().ToString().c_str());
      return 2;
    }
    o.tls = tls.value();
  }

  struct PhaseSpec {
    std::string name;
    Result<std::vector<WorkloadRequest>> requests;
  };
  std::vector<PhaseSpec> phases;
  if (!o.trace.empty()) {
    TraceOptions t = o.trace_options;
    t.synthesize_tokens = true;  // block-hash traces: real tokens, equal block ids = equal tokens
    t.vocab_size = o.workload.vocab_size;
    t.seed = o.workload.seed;
    phases.push_back({"trace", Collect(LoadTrace(o.trace, t))});
  } else {
    phases.push_back({"shared", Collect(MakeSyntheticWorkload(o.workload))});
  }
  if (o.control && !o.trace.empty()) {
    // The trace's own arrivals and lengths, every prompt token fresh: nothing shared.
    std::vector<WorkloadRequest> control;
    if (phases.front().requests.ok()) {
      Rng rng(o.workload.seed + 1000003);
      for (const WorkloadRequest& r : phases.front().requests.value()) {
        WorkloadRequest c;
        c.index = r.index;
        c.arrival_s = r.arrival_s;
        c.output_tokens = r.output_tokens;
        c.prompt.resize(r.prompt.size());
        for (TokenId& t : c.prompt) {
          t = static_cast<TokenId>(rng.UniformInt(0, o.workload.vocab_size - 1));
        }
        control.push_back(std::move(c));
      }
    }
    phases.push_back({"control", std::move(control)});
  } else if (o.control) {
    // The negative control: the synthetic workload's lengths and arrivals, no shared prefixes
    // (for a trace: the synthetic defaults under the same options).
    WorkloadOptions control = o.workload;
    control.shared_prefixes = false;
    control.seed = o.workload.seed + 1000003;  // tokens unrelated to the shared phase's
    phases.push_back({"control", Collect(MakeSyntheticWorkload(control))});
  }

  std::vector<PhaseReport> reports;
  bool timed_out = false;
  for (PhaseSpec& spec : phases) {
    if (!spec.requests.ok()) {
      std::fprintf(stderr, "workload %s: %s\n", spec.name.c_str(),
                   spec.requests.status().ToString().c_str());
      return 1;
    }
    std::optional<Samples> before;
    if (o.http_port != 0) {
      Result<Samples> s = Scrape(o.http_host, o.http_port);
      if (s.ok()) before = s.value();
    }
    Phase phase(o, std::move(spec.requests).value());
    const Status run = phase.Run();
    if (!run.ok() && run.code() != StatusCode::kDeadlineExceeded) {
      std::fprintf(stderr, "phase %s: %s\n", spec.name.c_str(), run.ToString().c_str());
      return 1;
    }
    // On timeout: report what finished (partial results), then stop with an error.
    PhaseReport report = phase.Report(run.ok() ? spec.name : spec.name + " (timed out)");
    if (before) {
      // After a timeout the router may be out of reach (a partition): a short bound, so that the
      // client's error comes close to its --timeout-s.
      const std::chrono::seconds bound(run.ok() ? 3 : 1);
      Result<Samples> after = Scrape(o.http_host, o.http_port, bound);
      if (after.ok()) AddMetrics(*before, after.value(), &report);
    }
    reports.push_back(std::move(report));
    if (!run.ok()) {
      std::fprintf(stderr, "phase %s: %s; partial results follow\n", spec.name.c_str(),
                   run.ToString().c_str());
      timed_out = true;
      break;
    }
  }
  PrintTable(reports, o.label);
  const std::string json = Json(reports, o.label);
  std::printf("\nJSON %s\n", json.c_str());
  if (!o.json_path.empty()) {
    FILE* f = std::fopen(o.json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", o.json_path.c_str());
      return 1;
    }
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
  return timed_out ? 1 : 0;
}

}  // namespace
}  // namespace chunkserve::router

int main(int argc, char** argv) { return chunkserve::router::Main(argc, argv); }
