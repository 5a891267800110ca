#include "router/loadgen/report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "runtime/wire/asio.h"

namespace chunkserve::router {
namespace {

double Delta(const Samples& before, const Samples& after, const std::string& series) {
  auto a = after.find(series);
  if (a == after.end()) return 0;
  auto b = before.find(series);
  return a->second - (b == before.end() ? 0 : b->second);
}

// Worker names from series like chunkserve_router_worker_routed_total{worker="w1"}.
std::vector<std::string> WorkerNames(const Samples& s) {
  std::vector<std::string> out;
  const std::string prefix = "chunkserve_router_worker_routed_total{worker=\"";
  for (const auto& [k, v] : s) {
    if (k.rfind(prefix, 0) == 0 && k.size() > prefix.size() + 2) {
      out.push_back(k.substr(prefix.size(), k.size() - prefix.size() - 2));
    }
  }
  return out;
}

}  // namespace

Result<Samples> Scrape(const std::string& http_host, uint16_t http_port,
                       std::chrono::milliseconds timeout) {
  // Asynchronous operations under one deadline: Beast's synchronous calls ignore the stream's
  // timeout, and a router behind a silent partition would hold a synchronous connect for minutes.
  namespace bhttp = boost::beast::http;
  asio::io_context io;
  boost::beast::tcp_stream s(io);
  bhttp::request<bhttp::empty_body> req(bhttp::verb::get, "/metrics", 11);
  req.set(bhttp::field::host, http_host);
  req.keep_alive(false);
  boost::beast::flat_buffer buffer;
  bhttp::response<bhttp::string_body> res;
  boost::system::error_code error = asio::error::timed_out;
  asio::ip::tcp::endpoint endpoint;
  try {
    endpoint = asio::ip::tcp::endpoint(asio::ip::make_address(http_host), http_port);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("metrics: ") + e.what());
  }
  s.expires_after(timeout);
  s.async_connect(endpoint, [&](const boost::system::error_code& ec) {
    if (ec) return void(error = ec);
    bhttp::async_write(s, req, [&](const boost::system::error_code& ec, size_t) {
      if (ec) return void(error = ec);
      bhttp::async_read(s, buffer, res, [&](const boost::system::error_code& ec, size_t) {
        error = ec;
      });
    });
  });
  io.run();  // ends when the exchange does, or at the stream's deadline (timed_out)
  if (error) return Status::Unavailable("metrics: " + error.message());
  if (res.result_int() != 200) return Status::Unavailable("bad /metrics reply");
  Samples out;
  std::istringstream in(res.body());
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return out;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

void AddMetrics(const Samples& before, const Samples& after, PhaseReport* r) {
  r->have_metrics = true;
  double total = 0, max_routed = 0;
  for (const std::string& w : WorkerNames(after)) {
    const std::string label = "{worker=\"" + w + "\"}";
    WorkerFigures f;
    f.routed = Delta(before, after, "chunkserve_router_worker_routed_total" + label);
    f.prompt_tokens = Delta(before, after, "chunkserve_router_worker_prompt_tokens_total" + label);
    f.cached_tokens = Delta(before, after, "chunkserve_router_worker_cached_tokens_total" + label);
    r->workers[w] = f;
    total += f.routed;
    max_routed = std::max(max_routed, f.routed);
  }
  const double mean = r->workers.empty() ? 0 : total / static_cast<double>(r->workers.size());
  r->imbalance = mean > 0 ? max_routed / mean : 0;
  r->predicted_tokens = Delta(before, after, "chunkserve_router_predicted_cached_tokens_total");
  r->reported_tokens = Delta(before, after, "chunkserve_router_reported_cached_tokens_total");
  const double overlap = Delta(before, after, "chunkserve_router_overlap_cached_tokens_total");
  r->precision = r->predicted_tokens > 0 ? overlap / r->predicted_tokens : 1.0;
}

void PrintTable(const std::vector<PhaseReport>& reports, const std::string& label) {
  std::printf("\n%s\n", label.empty() ? "loadgen results" : ("loadgen results: " + label).c_str());
  std::printf("%-8s %6s %5s %7s %9s %9s %9s %9s %9s %8s %9s %9s %9s\n", "phase", "reqs", "err",
              "hit", "ttft_mean", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "req/s", "tok/s",
              "imbalance", "precision");
  for (const PhaseReport& r : reports) {
    std::printf("%-8s %6lld %5lld %6.1f%% %7.1fms %7.1fms %7.1fms %7.1fms %7.1fms %8.2f %9.1f ",
                r.name.c_str(), static_cast<long long>(r.finished),
                static_cast<long long>(r.errors), 100 * r.hit_rate, r.ttft_mean_ms, r.ttft_p50_ms,
                r.ttft_p99_ms, r.e2e_p50_ms, r.e2e_p99_ms, r.requests_per_s, r.output_tokens_per_s);
    if (r.have_metrics) {
      std::printf("%9.2f %8.1f%%\n", r.imbalance, 100 * r.precision);
    } else {
      std::printf("%9s %9s\n", "-", "-");
    }
  }
  for (const PhaseReport& r : reports) {
    if (!r.have_metrics) continue;
    std::printf("\nper worker (%s): routed, hit rate\n", r.name.c_str());
    for (const auto& [w, f] : r.workers) {
      std::printf("  %-16s %6.0f  %5.1f%%\n", w.c_str(), f.routed,
                  f.prompt_tokens > 0 ? 100 * f.cached_tokens / f.prompt_tokens : 0.0);
    }
  }
  for (const PhaseReport& r : reports) {
    if (r.bad_indices > 0) {
      std::printf("WARNING: %lld requests of %s saw non-continuous token indices\n",
                  static_cast<long long>(r.bad_indices), r.name.c_str());
    }
    if (r.incomplete > 0) {
      std::printf("WARNING: %lld requests of %s ended without exactly the tokens they asked for\n",
                  static_cast<long long>(r.incomplete), r.name.c_str());
    }
    if (!r.first_error.empty()) {
      std::printf("first error (%s): %s\n", r.name.c_str(), r.first_error.c_str());
    }
  }
}

std::string Json(const std::vector<PhaseReport>& reports, const std::string& label) {
  std::ostringstream j;
  j << "{\"label\":\"" << label << "\",\"phases\":[";
  for (size_t i = 0; i < reports.size(); ++i) {
    const PhaseReport& r = reports[i];
    if (i) j << ",";
    j << "{\"phase\":\"" << r.name << "\",\"requests\":" << r.requests
      << ",\"finished\":" << r.finished << ",\"errors\":" << r.errors
      << ",\"bad_indices\":" << r.bad_indices << ",\"incomplete\":" << r.incomplete
      << ",\"tokens\":" << r.tokens << ",\"hit_rate\":" << r.hit_rate
      << ",\"ttft_mean_ms\":" << r.ttft_mean_ms << ",\"ttft_p50_ms\":" << r.ttft_p50_ms
      << ",\"ttft_p99_ms\":" << r.ttft_p99_ms << ",\"e2e_p50_ms\":" << r.e2e_p50_ms
      << ",\"e2e_p99_ms\":" << r.e2e_p99_ms << ",\"wall_s\":" << r.wall_s
      << ",\"requests_per_s\":" << r.requests_per_s
      << ",\"output_tokens_per_s\":" << r.output_tokens_per_s;
    if (r.have_metrics) {
      j << ",\"imbalance\":" << r.imbalance << ",\"precision\":" << r.precision
        << ",\"predicted_cached_tokens\":" << r.predicted_tokens
        << ",\"reported_cached_tokens\":" << r.reported_tokens << ",\"workers\":{";
      bool first = true;
      for (const auto& [w, f] : r.workers) {
        if (!first) j << ",";
        first = false;
        j << "\"" << w << "\":{\"routed\":" << f.routed << ",\"prompt_tokens\":" << f.prompt_tokens
          << ",\"cached_tokens\":" << f.cached_tokens << "}";
      }
      j << "}";
    }
    j << "}";
  }
  j << "]}";
  return j.str();
}

}  // namespace chunkserve::router
