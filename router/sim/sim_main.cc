// chunkserve-sim: runs routing policies over simulated workers and prints a table (or JSON).
//
//   chunkserve-sim [--workload NAME] [--turns MIN,MAX] [--max-prompt N] [--system-tokens N]
//                  [--conversations N] [--prefix-range MIN,MAX]
//                  [--workers N] [--tenants T] [--requests R] [--rate RPS] [--zipf S]
//                  [--policies ttft,round_robin,...|all] [--control] [--control-rate RPS]
//                  [--trace FILE.jsonl] [--block-size N] [--time-scale X] [--offset N]
//                  [--limit N]
//                  [--seed S] [--kv-chunks C] [--batch B] [--prefill-rate TOK_PER_S]
//                  [--kv-delay S] [--report-interval S] [--suffix MIN,MAX] [--output MIN,MAX]
//                  [--spill-factor F] [--spill-factor-saturated F] [--holders-busy F]
//                  [--max-holders N] [--load-cap C] [--placement-slack S]
//                  [--json] [--json-out FILE] [--log FILE.jsonl] [--plot DIR]
//
// Each policy runs on the same workload (same seed). --control adds a second run of every policy
// on the negative control (same lengths, no shared prefixes). See router/README.md.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "router/sim/simulator.h"

namespace {

using chunkserve::Result;
using chunkserve::Status;
namespace router = chunkserve::router;
namespace sim = chunkserve::router::sim;
namespace workload = chunkserve::workload;

constexpr const char* kUsage =
    "usage: chunkserve-sim [--workload multi_tenant|multi_turn|agent|long_doc]\n"
    "                      [--workers N] [--tenants T] [--requests R] [--rate RPS] [--zipf S]\n"
    "                      [--turns MIN,MAX] [--max-prompt N] [--system-tokens N]\n"
    "                      [--conversations N] [--prefix-range MIN,MAX]\n"
    "                      [--policies a,b,..|all] [--control] [--control-rate RPS]\n"
    "                      [--trace FILE.jsonl] [--block-size N] [--time-scale X]\n"
    "                      [--offset N] [--limit N] [--seed S]\n"
    "                      [--kv-chunks C] [--batch B] [--prefill-rate TOK/S] [--kv-delay S]\n"
    "                      [--report-interval S] [--suffix MIN,MAX] [--output MIN,MAX]\n"
    "                      [--spill-factor F] [--spill-factor-saturated F] [--holders-busy F]\n"
    "                      [--max-holders N] [--load-cap C]\n"
    "                      [--placement-slack S] [--similar-fraction F] [--index-depth N]\n"
    "                      [--json] [--json-out FILE] [--log FILE.jsonl] [--per-worker]\n"
    "                      [--plot DIR]\n"
    "                      [--quiet]\n";

struct Flags {
  sim::SimOptions sim;
  workload::WorkloadOptions workload;
  std::vector<router::PolicyKind> policies = router::AllPolicyKinds();
  bool control = false;
  double control_rate = 0;  // 0: same as --rate
  std::string trace;
  workload::TraceOptions trace_options;
  bool json = false;
  std::string json_out;
  std::string log;
  std::string plot;  // folder for results.json, requests.jsonl and the PNGs
  bool per_worker = false;
};

Status ParseDouble(const std::string& s, double* out) {
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size())
    return Status::InvalidArgument("bad number '" + s + "'");
  return Status::Ok();
}

template <typename Int>
Status ParseInt(const std::string& s, Int* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size())
    return Status::InvalidArgument("bad integer '" + s + "'");
  *out = static_cast<Int>(v);
  return Status::Ok();
}

Status ParseRange(const std::string& s, int32_t* lo, int32_t* hi) {
  const size_t comma = s.find(',');
  if (comma == std::string::npos)
    return Status::InvalidArgument("expected MIN,MAX, got '" + s + "'");
  CHUNKSERVE_RETURN_IF_ERROR(ParseInt(s.substr(0, comma), lo));
  return ParseInt(s.substr(comma + 1), hi);
}

Result<Flags> Parse(int argc, char** argv) {
  Flags f;
  f.sim.progress = true;
  // --workload first: its defaults, then every other flag overrides them.
  bool kv_chunks_given = false;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--workload") {
      CHUNKSERVE_ASSIGN_OR_RETURN(workload::WorkloadFamily family,
                                  workload::ParseWorkloadFamily(argv[i + 1]));
      f.workload = workload::ForFamily(family);
    }
    kv_chunks_given |= std::string(argv[i]) == "--kv-chunks";
  }
  if (f.workload.family == workload::WorkloadFamily::kLongDoc && !kv_chunks_given) {
    f.sim.worker.kv_capacity_chunks = 4096;  // documents reach 120k tokens (1,885 chunks)
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= argc) return Status::InvalidArgument(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--control") {
      f.control = true;
    } else if (a == "--json") {
      f.json = true;
    } else if (a == "--per-worker") {
      f.per_worker = true;
    } else if (a == "--quiet") {
      f.sim.progress = false;
    } else if (a == "--help" || a == "-h") {
      return Status::Cancelled("help");
    } else {
      CHUNKSERVE_ASSIGN_OR_RETURN(std::string v, value());
      if (a == "--workload") {
        // applied above
      } else if (a == "--turns") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseRange(v, &f.workload.min_turns, &f.workload.max_turns));
      } else if (a == "--max-prompt") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.workload.max_prompt_tokens));
      } else if (a == "--system-tokens") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.workload.system_tokens));
      } else if (a == "--conversations") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.workload.active_conversations));
      } else if (a == "--prefix-range") {
        CHUNKSERVE_RETURN_IF_ERROR(
            ParseRange(v, &f.workload.min_prefix_tokens, &f.workload.max_prefix_tokens));
      } else if (a == "--holders-busy") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.sim.router.policy.holders_busy_fraction));
      } else if (a == "--spill-factor-saturated") {
        CHUNKSERVE_RETURN_IF_ERROR(
            ParseDouble(v, &f.sim.router.policy.spill_factor_saturated));
      } else if (a == "--spill-factor-single") {
        CHUNKSERVE_RETURN_IF_ERROR(
            ParseDouble(v, &f.sim.router.policy.spill_factor_single_holder));
      } else if (a == "--index-depth") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.sim.router.index.max_depth));
      } else if (a == "--similar-fraction") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.sim.router.policy.similar_fraction));
      } else if (a == "--workers") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.sim.num_workers));
      } else if (a == "--tenants") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.workload.tenants));
      } else if (a == "--requests") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.workload.num_requests));
      } else if (a == "--rate") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.workload.arrival_rate));
      } else if (a == "--control-rate") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.control_rate));
        f.control = true;
      } else if (a == "--spill-factor") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.sim.router.policy.spill_factor));
      } else if (a == "--max-holders") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.sim.router.policy.max_holders_per_prefix));
      } else if (a == "--load-cap") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.sim.router.policy.load_cap));
      } else if (a == "--placement-slack") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.sim.router.policy.placement_slack));
      } else if (a == "--zipf") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.workload.zipf_s));
      } else if (a == "--seed") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.workload.seed));
      } else if (a == "--kv-chunks") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.sim.worker.kv_capacity_chunks));
      } else if (a == "--batch") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.sim.worker.max_batch_size));
      } else if (a == "--prefill-rate") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.sim.worker.prefill_tokens_per_s));
      } else if (a == "--kv-delay") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.sim.kv_event_delay_s));
      } else if (a == "--report-interval") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.sim.load_report_interval_s));
      } else if (a == "--suffix") {
        CHUNKSERVE_RETURN_IF_ERROR(
            ParseRange(v, &f.workload.min_suffix_tokens, &f.workload.max_suffix_tokens));
      } else if (a == "--output") {
        CHUNKSERVE_RETURN_IF_ERROR(
            ParseRange(v, &f.workload.min_output_tokens, &f.workload.max_output_tokens));
      } else if (a == "--trace") {
        f.trace = v;
      } else if (a == "--block-size") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.trace_options.block_size));
      } else if (a == "--time-scale") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseDouble(v, &f.trace_options.time_scale));
      } else if (a == "--offset") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.trace_options.offset));
      } else if (a == "--limit") {
        CHUNKSERVE_RETURN_IF_ERROR(ParseInt(v, &f.trace_options.limit));
      } else if (a == "--json-out") {
        f.json_out = v;
      } else if (a == "--log") {
        f.log = v;
      } else if (a == "--plot") {
        f.plot = v;
      } else if (a == "--policies") {
        if (v != "all") {
          f.policies.clear();
          std::stringstream ss(v);
          std::string name;
          while (std::getline(ss, name, ',')) {
            CHUNKSERVE_ASSIGN_OR_RETURN(router::PolicyKind k, router::ParsePolicyKind(name));
            f.policies.push_back(k);
          }
        }
      } else {
        return Status::InvalidArgument("unknown flag " + a);
      }
    }
  }
  if (f.control && !f.trace.empty()) {
    return Status::InvalidArgument("--control applies to the synthetic workload, not --trace");
  }
  if (!f.plot.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.plot, ec);
    if (ec) return Status::InvalidArgument("--plot: cannot create " + f.plot + ": " + ec.message());
    if (f.json_out.empty()) f.json_out = (std::filesystem::path(f.plot) / "results.json").string();
    if (f.log.empty()) f.log = (std::filesystem::path(f.plot) / "requests.jsonl").string();
  }
  return f;
}

Result<std::unique_ptr<workload::WorkloadSource>> MakeSource(const Flags& f, bool shared) {
  std::unique_ptr<workload::WorkloadSource> source;
  if (!f.trace.empty()) {
    workload::TraceOptions t = f.trace_options;
    t.vocab_size = f.workload.vocab_size;
    t.seed = f.workload.seed;
    CHUNKSERVE_ASSIGN_OR_RETURN(source, workload::LoadTrace(f.trace, t));
  } else {
    workload::WorkloadOptions w = f.workload;
    w.shared_prefixes = shared;
    if (!shared && f.control_rate > 0) w.arrival_rate = f.control_rate;
    CHUNKSERVE_ASSIGN_OR_RETURN(source, workload::MakeSyntheticWorkload(w));
  }
  return source;
}

Result<std::vector<sim::SimReport>> RunAll(const Flags& f, bool shared) {
  std::vector<sim::SimReport> out;
  // The oracles depend on the workload only: once per workload, printed beside every policy.
  CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<workload::WorkloadSource> oracle_source,
                              MakeSource(f, shared));
  CHUNKSERVE_ASSIGN_OR_RETURN(sim::OracleReport oracle,
                              sim::ComputeOracles(f.sim, *oracle_source));
  for (router::PolicyKind kind : f.policies) {
    CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<workload::WorkloadSource> source,
                                MakeSource(f, shared));
    sim::SimOptions o = f.sim;
    o.router.policy_kind = kind;
    CHUNKSERVE_ASSIGN_OR_RETURN(sim::SimReport r, sim::RunSimulation(o, *source));
    r.oracle_infinite = oracle.infinite_hit_rate;
    r.oracle_affinity = oracle.affinity_hit_rate;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

// --plot: runs chunkserve-sim-plot.py (router/sim/tools/plot.py, copied next to this binary by the
// build) on the files just written. The interpreter: $CHUNKSERVE_PYTHON, else the project's
// virtual environment (.ci/python-deps installs matplotlib there), else python3 on the PATH.
int Plot(const Flags& f) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path script = self.parent_path() / "chunkserve-sim-plot.py";
  if (ec || !std::filesystem::is_regular_file(script, ec)) {
    std::cerr << "chunkserve-sim: --plot: " << script.string() << " is missing\n";
    return 1;
  }
  std::string python = "python3";
  if (const char* env = std::getenv("CHUNKSERVE_PYTHON"); env != nullptr && *env != '\0') {
    python = env;
  } else if (const char* home = std::getenv("HOME"); home != nullptr) {
    const std::filesystem::path venv =
        std::filesystem::path(home) / ".cache" / "chunkserve" / "venv" / "bin" / "python";
    if (std::filesystem::exists(venv, ec)) python = venv.string();
  }
  const std::vector<std::string> args = {python, script.string(), "--json", f.json_out,
                                         "--log", f.log, "--out", f.plot};
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    std::cerr << "chunkserve-sim: --plot: cannot run " << python << "\n";
    return 1;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::cerr << "chunkserve-sim: --plot: the plot script failed\n";
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  Result<Flags> flags = Parse(argc, argv);
  if (!flags.ok()) {
    if (flags.status().code() == chunkserve::StatusCode::kCancelled) {
      std::cout << kUsage;
      return 0;
    }
    std::cerr << "chunkserve-sim: " << flags.status() << "\n" << kUsage;
    return 2;
  }
  const Flags& f = *flags;
  nlohmann::json all = nlohmann::json::object();
  all["config"] = {
      {"workers", f.sim.num_workers},
      {"workload", std::string(workload::WorkloadFamilyName(f.workload.family))},
      {"tenants", f.workload.tenants},
      {"requests", f.workload.num_requests},
      {"rate_rps", f.workload.arrival_rate},
      {"control_rate_rps", f.control_rate > 0 ? f.control_rate : f.workload.arrival_rate},
      {"zipf_s", f.workload.zipf_s},
      {"seed", f.workload.seed},
      {"trace", f.trace},
      {"chunk_size", f.sim.chunk_size},
      {"kv_capacity_chunks", f.sim.worker.kv_capacity_chunks},
      {"max_batch_size", f.sim.worker.max_batch_size},
      {"prefill_tokens_per_s", f.sim.worker.prefill_tokens_per_s},
      {"kv_event_delay_s", f.sim.kv_event_delay_s}};
  FILE* log = nullptr;
  if (!f.log.empty()) {
    log = std::fopen(f.log.c_str(), "w");
    if (log == nullptr) {
      std::cerr << "chunkserve-sim: cannot write " << f.log << "\n";
      return 1;
    }
  }
  std::vector<std::pair<std::string, bool>> runs = {{"shared", true}};
  if (f.control) runs.emplace_back("control", false);
  for (const auto& [label, shared] : runs) {
    Flags run_flags = f;
    run_flags.sim.log = log;
    Result<std::vector<sim::SimReport>> reports = RunAll(run_flags, shared);
    if (!reports.ok()) {
      std::cerr << "chunkserve-sim: " << reports.status() << "\n";
      return 1;
    }
    all[label] = nlohmann::json::parse(sim::ToJson(*reports));
    if (!f.json) {
      if (f.trace.empty()) {
        std::printf(
            "%s %s workload: %d workers (KV %d chunks each), %d tenants, %lld requests at %.1f "
            "req/s (seed %llu)\n",
            label.c_str(), std::string(workload::WorkloadFamilyName(f.workload.family)).c_str(),
            f.sim.num_workers, f.sim.worker.kv_capacity_chunks, f.workload.tenants,
            static_cast<long long>(f.workload.num_requests),
            !shared && f.control_rate > 0 ? f.control_rate : f.workload.arrival_rate,
            static_cast<unsigned long long>(f.workload.seed));
      } else {
        std::printf("trace %s: %d workers, %lld requests\n", f.trace.c_str(), f.sim.num_workers,
                    static_cast<long long>(reports->empty() ? 0 : reports->front().requests));
      }
      std::printf("%s\n", sim::FormatTable(*reports).c_str());
      if (f.per_worker) {
        for (const sim::SimReport& r : *reports) {
          std::printf("%s\n", sim::FormatWorkerTable(r).c_str());
        }
      }
    }
  }
  if (log != nullptr && std::fclose(log) != 0) {
    std::cerr << "chunkserve-sim: cannot write " << f.log << "\n";
    return 1;
  }
  if (f.json) std::cout << all.dump(2) << "\n";
  if (!f.json_out.empty()) {
    std::ofstream out(f.json_out);
    out << all.dump(2) << "\n";
    if (!out) {
      std::cerr << "chunkserve-sim: cannot write " << f.json_out << "\n";
      return 1;
    }
  }
  if (!f.plot.empty()) return Plot(f);
  return 0;
}
