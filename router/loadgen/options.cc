#include "router/loadgen/options.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/wire/auth.h"

namespace chunkserve::router::loadgen {
namespace {

using workload::ForFamily;
using workload::ParseWorkloadFamily;
using workload::WorkloadFamily;

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

}  // namespace

std::optional<int> ParseOptions(int argc, char** argv, Options* o) {
  // --workload first: its defaults, then every other flag overrides them.
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) != "--workload") continue;
    Result<WorkloadFamily> family = ParseWorkloadFamily(argv[i + 1]);
    if (!family.ok()) {
      std::fprintf(stderr, "%s\n%s", family.status().ToString().c_str(), kUsage);
      return 2;
    }
    o->workload = ForFamily(*family);
  }
  o->workload.vocab_size = 1024;  // the built-in tiny model
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "--no-control") {
      o->control = false;
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
        o->workload.min_turns = list[0];
        o->workload.max_turns = list[1];
      }
    } else if (flag == "--max-prompt") {
      o->workload.max_prompt_tokens = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o->workload.max_prompt_tokens > 0;
    } else if (flag == "--system-tokens") {
      o->workload.system_tokens = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o->workload.system_tokens > 0;
    } else if (flag == "--target") {
      ok = SplitHostPort(v, &o->host, &o->port);
    } else if (flag == "--metrics") {
      ok = SplitHostPort(v, &o->http_host, &o->http_port);
    } else if (flag == "--trace") {
      o->trace = v;
    } else if (flag == "--block-size") {
      o->trace_options.block_size = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o->trace_options.block_size > 0;
    } else if (flag == "--time-scale") {
      o->trace_options.time_scale = std::strtod(v.c_str(), &end);
      ok = *end == '\0' && o->trace_options.time_scale >= 0;
    } else if (flag == "--offset" || flag == "--limit") {
      const long long n = std::strtoll(v.c_str(), &end, 10);
      ok = *end == '\0' && n >= 0;
      (flag == "--offset" ? o->trace_options.offset : o->trace_options.limit) = n;
    } else if (flag == "--requests") {
      o->workload.num_requests = std::strtoll(v.c_str(), &end, 10);
      ok = *end == '\0' && o->workload.num_requests > 0;
    } else if (flag == "--rate") {
      o->workload.arrival_rate = std::strtod(v.c_str(), &end);
      ok = *end == '\0' && o->workload.arrival_rate > 0;
    } else if (flag == "--tenants") {
      o->workload.tenants = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o->workload.tenants > 0;
    } else if (flag == "--zipf") {
      o->workload.zipf_s = std::strtod(v.c_str(), &end);
      ok = *end == '\0' && o->workload.zipf_s >= 0;
    } else if (flag == "--prefix-tokens") {
      ok = ParseIntList(v, &o->workload.prefix_length_bases);
      if (ok) {
        o->workload.min_prefix_tokens = 1;
        o->workload.max_prefix_tokens = 1 << 20;
      }
    } else if (flag == "--suffix-tokens" || flag == "--output-tokens") {
      ok = ParseIntList(v, &list) && list.size() == 2 && list[0] <= list[1];
      if (ok && flag == "--suffix-tokens") {
        o->workload.min_suffix_tokens = list[0];
        o->workload.max_suffix_tokens = list[1];
      } else if (ok) {
        o->workload.min_output_tokens = list[0];
        o->workload.max_output_tokens = list[1];
      }
    } else if (flag == "--vocab") {
      o->workload.vocab_size = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o->workload.vocab_size > 1;
    } else if (flag == "--seed") {
      o->workload.seed = std::strtoull(v.c_str(), &end, 10);
      ok = *end == '\0';
    } else if (flag == "--connections") {
      o->connections = static_cast<int32_t>(std::strtol(v.c_str(), &end, 10));
      ok = *end == '\0' && o->connections >= 1 && o->connections <= 1024;
    } else if (flag == "--label") {
      o->label = v;
    } else if (flag == "--json") {
      o->json_path = v;
    } else if (flag == "--timeout-s") {
      o->timeout_s = std::strtod(v.c_str(), &end);
      ok = *end == '\0' && o->timeout_s > 0;
    } else if (flag == "--tls-ca") {
      o->tls_ca = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for %s: %s\n", flag.c_str(), v.c_str());
      return 2;
    }
  }
  if (o->port == 0) {
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
      o->auth_key = key.value();
      break;
    }
  }
  if (!o->tls_ca.empty()) {
    wire::TlsFiles files;
    files.ca_file = o->tls_ca;
    Result<std::shared_ptr<wire::TlsContext>> tls =
        wire::TlsContext::Create(wire::TlsContext::Side::kClient, files);
    if (!tls.ok()) {
      std::fprintf(stderr, "--tls-ca: %s\n", tls.status().ToString().c_str());
      return 2;
    }
    o->tls = tls.value();
  }
  return std::nullopt;
}

}  // namespace chunkserve::router::loadgen
