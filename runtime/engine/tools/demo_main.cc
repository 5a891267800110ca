// chunkserve-demo: the in-process engine serving a multi-tenant workload, twice: with prefix
// sharing on and off, side by side. A few long system prompts (the ChunkAttention paper's Table 2
// lengths) are shared by many requests arriving as a Poisson process; the report compares
// throughput, latency percentiles, peak KV memory and prefix-hit rate, and checks that greedy
// outputs are identical in both runs.
//
//   chunkserve-demo --tiny-model         built-in tiny model (random weights), sized for ~1 minute
//                                        on 2 cores
//   chunkserve-demo --model DIR          a Llama-family model directory (config.json + safetensors)
//                                        or a llama .gguf file; with tokenizer files the demo
//                                        ends with a few readable answers
//   chunkserve-demo --json               also print one JSON object per run
//   chunkserve-demo --backend cuda       the CUDA backend (CUDA builds, one GPU; f16 KV)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/workload_runner.h"
#include "runtime/tokenizer/model_text.h"
#include "runtime/workload/workload.h"

namespace {

using chunkserve::engine::Engine;
using chunkserve::engine::EngineOptions;
using chunkserve::engine::EngineStats;
using chunkserve::engine::WorkloadReport;
using chunkserve::workload::WorkloadOptions;

struct Flags {
  std::string model;
  bool tiny = false;  // --tiny-model: random weights, asked for explicitly
  int requests = 96;
  double rate = 16.0;
  int max_new = 32;
  std::vector<int32_t> systems = {1324, 879, 1432};
  int min_suffix = 16, max_suffix = 64;
  int kv_cache_mb = 256;
  int threads = 0;
  int chunk = 64;
  int budget = 512;
  int max_batch = 64;
  std::string sharing = "both";
  uint64_t seed = 1;
  bool json = false;
  std::string backend = "cpu";
  bool requests_given = false;
  bool kv_given = false;
};

void Usage() {
  std::cout <<
      "usage: chunkserve-demo (--model DIR|FILE.gguf | --tiny-model) [--requests N]\n"
      "                       [--rate REQ_PER_S] [--max-new N]\n"
      "                       [--system-lengths A,B,...] [--suffix MIN,MAX] [--kv-cache-mb N]\n"
      "                       [--threads N] [--chunk N] [--budget TOKENS] [--max-batch N]\n"
      "                       [--sharing on|off|both] [--seed N] [--json] [--backend cpu|cuda]\n";
}

bool ParseInts(const std::string& s, std::vector<int32_t>* out) {
  out->clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v < 0 || v > 1 << 20) return false;
    out->push_back(static_cast<int32_t>(v));
  }
  return true;
}

bool Parse(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::cerr << "chunkserve-demo: " << name << " needs a value\n";
        return nullptr;
      }
      return argv[++i];
    };
    auto num = [&](const char* name, auto* out) {
      const char* v = next(name);
      if (v == nullptr) return false;
      char* end = nullptr;
      const double d = std::strtod(v, &end);
      if (end == v || *end != '\0' || d < 0) {
        std::cerr << "chunkserve-demo: bad value for " << name << ": " << v << "\n";
        return false;
      }
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(d);
      return true;
    };
    if (a == "--help" || a == "-h") {
      Usage();
      std::exit(0);
    } else if (a == "--model") {
      const char* v = next("--model");
      if (v == nullptr) return false;
      f->model = v;
    } else if (a == "--requests") {
      if (!num("--requests", &f->requests)) return false;
      f->requests_given = true;
    } else if (a == "--rate") { if (!num("--rate", &f->rate)) return false;
    } else if (a == "--max-new") { if (!num("--max-new", &f->max_new)) return false;
    } else if (a == "--kv-cache-mb") {
      if (!num("--kv-cache-mb", &f->kv_cache_mb)) return false;
      f->kv_given = true;
    } else if (a == "--threads") { if (!num("--threads", &f->threads)) return false;
    } else if (a == "--chunk") { if (!num("--chunk", &f->chunk)) return false;
    } else if (a == "--budget") { if (!num("--budget", &f->budget)) return false;
    } else if (a == "--max-batch") { if (!num("--max-batch", &f->max_batch)) return false;
    } else if (a == "--seed") { if (!num("--seed", &f->seed)) return false;
    } else if (a == "--tiny-model") { f->tiny = true;
    } else if (a == "--json") { f->json = true;
    } else if (a == "--system-lengths" || a == "--suffix") {
      const char* v = next(a.c_str());
      std::vector<int32_t> ints;
      if (v == nullptr || !ParseInts(v, &ints)) {
        std::cerr << "chunkserve-demo: bad list for " << a << "\n";
        return false;
      }
      if (a == "--suffix") {
        if (ints.size() != 2 || ints[0] > ints[1]) {
          std::cerr << "chunkserve-demo: --suffix takes MIN,MAX\n";
          return false;
        }
        f->min_suffix = ints[0];
        f->max_suffix = ints[1];
      } else {
        f->systems = ints;
      }
    } else if (a == "--sharing") {
      const char* v = next("--sharing");
      if (v == nullptr) return false;
      f->sharing = v;
      if (f->sharing != "on" && f->sharing != "off" && f->sharing != "both") {
        std::cerr << "chunkserve-demo: --sharing takes on, off or both\n";
        return false;
      }
    } else if (a == "--backend") {
      const char* v = next("--backend");
      if (v == nullptr) return false;
      f->backend = v;
      if (f->backend != "cpu" && f->backend != "cuda") {
        std::cerr << "chunkserve-demo: --backend takes cpu or cuda\n";
        return false;
      }
    } else {
      std::cerr << "chunkserve-demo: unknown flag " << a << "\n";
      Usage();
      return false;
    }
  }
  return true;
}

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

struct Run {
  std::string name;
  WorkloadReport report;
};

nlohmann::json ToJson(const Run& run, const Flags& f) {
  const WorkloadReport& r = run.report;
  auto pct = [](const chunkserve::engine::Percentiles& p) {
    return nlohmann::json{{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"mean", p.mean}};
  };
  return {{"run", run.name},
          {"requests", r.requests},
          {"failed", r.failed},
          {"rate", f.rate},
          {"wall_s", r.wall_s},
          {"prompt_tokens", r.prompt_tokens},
          {"generated_tokens", r.generated_tokens},
          {"generated_tokens_per_s", r.generated_tokens_per_s},
          {"ttft_ms", pct(r.ttft_ms)},
          {"tpot_ms", pct(r.tpot_ms)},
          {"e2e_ms", pct(r.e2e_ms)},
          {"kv_bytes_peak", r.kv_bytes_peak},
          {"prefix_hit_rate", r.prefix_hit_rate},
          {"preemptions", r.preemptions},
          {"evicted_chunks", r.evicted_chunks}};
}

// The engine both the workload runs and the answers use.
EngineOptions DemoEngineOptions(const Flags& f, bool sharing) {
  EngineOptions o;
  o.model_dir = f.model;
  o.tiny_model = f.tiny;
  o.num_threads = f.threads;
  o.chunk_size = f.chunk;
  o.kv_cache_bytes = static_cast<uint64_t>(f.kv_cache_mb) << 20;
  o.prefill_token_budget = f.budget;
  o.max_batch_size = f.max_batch;
  o.enable_prefix_sharing = sharing;
  if (f.backend == "cuda") {
    // The CUDA backend computes in the KV dtype, which must be 16-bit.
    o.backend = chunkserve::engine::BackendKind::kCuda;
    o.kv_dtype = chunkserve::kernels::DType::kF16;
  }
  return o;
}

// Readable answers from a real model, after the report: a few questions behind one system prompt,
// greedy, through a fresh engine with sharing on. Models without tokenizer files (the tiny model)
// have no text to show; that is said, not an error.
int PrintAnswers(const Flags& f) {
  if (f.model.empty()) return 0;
  auto text = chunkserve::tokenizer::LoadModelText(f.model);
  if (!text.ok() || text->chat_template == nullptr) {
    std::cout << "\n(no answers to show: "
              << (text.ok() ? "the model has no chat template" : text.status().ToString())
              << ")\n";
    return 0;
  }
  auto engine = Engine::Create(DemoEngineOptions(f, /*sharing=*/true));
  if (!engine.ok()) {
    std::cerr << "chunkserve-demo: cannot create the engine: " << engine.status() << "\n";
    return 1;
  }
  const std::string system =
      "You are a friendly assistant for a science museum. Answer every question in one or two "
      "short sentences that a curious twelve-year-old understands.";
  const std::vector<std::string> questions = {"Why is the sky blue?",
                                              "How far away is the Moon?",
                                              "What do bees make, and how?"};
  std::vector<std::shared_ptr<chunkserve::sched::RequestStream>> streams;
  for (const std::string& q : questions) {
    const std::vector<chunkserve::tokenizer::ChatMessage> messages = {{"system", system},
                                                                      {"user", q}};
    auto rendered = text->chat_template->Render(messages, /*add_generation_prompt=*/true);
    auto ids = rendered.ok() ? text->tokenizer->Encode(*rendered, false)
                             : chunkserve::Result<std::vector<int32_t>>(rendered.status());
    if (!ids.ok()) {
      std::cerr << "chunkserve-demo: " << ids.status() << "\n";
      return 1;
    }
    chunkserve::sched::RequestOptions r;
    r.prompt.assign(ids->begin(), ids->end());
    r.max_new_tokens = 64;
    r.stop_tokens.assign(text->eos_ids.begin(), text->eos_ids.end());
    auto stream = (*engine)->Submit(std::move(r));
    if (!stream.ok()) {
      std::cerr << "chunkserve-demo: " << stream.status() << "\n";
      return 1;
    }
    streams.push_back(*stream);
  }
  std::cout << "\n" << text->name << " answers (greedy, one shared system prompt):\n";
  for (size_t i = 0; i < streams.size(); ++i) {
    chunkserve::tokenizer::StreamDecoder decoder(*text->tokenizer, true);
    std::string answer;
    chunkserve::sched::StreamEvent e;
    while (streams[i]->Next(&e, std::chrono::minutes(2)) ==
           chunkserve::sched::RequestStream::NextResult::kEvent) {
      if (e.kind == chunkserve::sched::StreamEvent::Kind::kFinished) {
        answer += decoder.Flush();
        std::printf("  Q: %s\n  A: %s\n     (%d tokens; %d of %d prompt tokens from the prefix "
                    "cache)\n",
                    questions[i].c_str(), answer.c_str(), e.finish.generated_tokens,
                    e.finish.cached_tokens, e.finish.prompt_tokens);
        break;
      }
      auto piece = decoder.Push(e.token);
      if (piece.ok()) answer += *piece;
    }
  }
  (*engine)->Shutdown(chunkserve::engine::ShutdownMode::kDrain);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!Parse(argc, argv, &f)) return 2;
  if (f.model.empty() == !f.tiny) {
    std::cerr << "chunkserve-demo: "
              << (f.tiny ? "--model and --tiny-model exclude each other"
                         : "no model: pass --model DIR|FILE.gguf, or --tiny-model for the "
                           "built-in random-weight model")
              << "\n";
    Usage();
    return 2;
  }
  // A real model is a hundred times the tiny one: fewer requests keep the no-sharing run near a
  // minute on 2 cores, and a larger arena holds its bigger KV without preemption.
  if (!f.model.empty()) {
    if (!f.requests_given) f.requests = 32;
    if (!f.kv_given) f.kv_cache_mb = 1024;
  }
  chunkserve::InitLogging({.program_name = "chunkserve-demo", .min_level = 1});
  chunkserve::InstallCrashHandlerForExecutable();
  const bool tty = isatty(STDOUT_FILENO);

  std::vector<bool> modes;
  if (f.sharing != "off") modes.push_back(true);
  if (f.sharing != "on") modes.push_back(false);

  std::vector<Run> runs;
  for (bool sharing : modes) {
    auto engine = Engine::Create(DemoEngineOptions(f, sharing));
    if (!engine.ok()) {
      std::cerr << "chunkserve-demo: cannot create the engine: " << engine.status() << "\n";
      return 1;
    }
    WorkloadOptions w;
    w.num_requests = f.requests;
    // One tenant per system prompt; none given: prompts share nothing.
    w.prefix_lengths = f.systems.empty() ? std::vector<int32_t>{0} : f.systems;
    w.min_suffix_tokens = f.min_suffix;
    w.max_suffix_tokens = f.max_suffix;
    w.min_output_tokens = w.max_output_tokens = f.max_new;
    w.arrival_rate = f.rate;
    w.vocab_size = (*engine)->vocab_size();
    w.seed = f.seed;
    const auto workload = chunkserve::workload::GenerateWorkload(w);
    if (!workload.ok()) {
      std::cerr << "chunkserve-demo: " << workload.status() << "\n";
      Usage();
      return 2;
    }
    const std::string name = sharing ? "sharing on" : "sharing off";
    if (runs.empty()) {
      std::cout << "chunkserve-demo: " << (f.model.empty() ? "built-in tiny model" : f.model)
                << ", " << f.requests << " requests at " << f.rate << "/s, system prompts {";
      for (size_t i = 0; i < f.systems.size(); ++i) std::cout << (i ? "," : "") << f.systems[i];
      std::cout << "} tokens + " << f.min_suffix << ".." << f.max_suffix << " user tokens, "
                << f.max_new << " new tokens each, chunk " << f.chunk << "\n";
    }
    chunkserve::engine::RunOptions ro;
    ro.progress_interval_s = tty ? 0.25 : 2.0;
    ro.progress = [&](const EngineStats& s, int32_t done, double t) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "[%-11s] %5.1fs  done %3d/%d  running %3d  queued %3d  KV %7.1f MiB  "
                    "decode %6.0f tok/s",
                    name.c_str(), t, done, f.requests, s.running, s.queued,
                    MiB(s.kv_bytes_referenced), s.decode_tokens_per_s);
      std::cout << (tty ? "\r" : "") << line << (tty ? "" : "\n") << std::flush;
    };
    auto report = chunkserve::engine::RunWorkload(**engine, *workload, ro);
    if (tty) std::cout << "\n";
    if (!report.ok()) {
      std::cerr << "chunkserve-demo: run failed: " << report.status() << "\n";
      return 1;
    }
    (*engine)->Shutdown(chunkserve::engine::ShutdownMode::kDrain);
    runs.push_back({name, std::move(report).value()});
  }

  std::cout << "\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-28s", "");
  std::cout << buf;
  for (const Run& r : runs) {
    std::snprintf(buf, sizeof buf, "%16s", r.name.c_str());
    std::cout << buf;
  }
  std::cout << "\n";
  auto row = [&](const char* label, auto value, const char* fmt) {
    std::snprintf(buf, sizeof buf, "%-28s", label);
    std::cout << buf;
    for (const Run& r : runs) {
      std::snprintf(buf, sizeof buf, fmt, value(r.report));
      std::cout << buf;
    }
    std::cout << "\n";
  };
  row("generated tokens/s", [](const WorkloadReport& r) { return r.generated_tokens_per_s; },
      "%16.1f");
  row("TTFT p50 / ms", [](const WorkloadReport& r) { return r.ttft_ms.p50; }, "%16.1f");
  row("TTFT p99 / ms", [](const WorkloadReport& r) { return r.ttft_ms.p99; }, "%16.1f");
  row("per-token latency p50 / ms", [](const WorkloadReport& r) { return r.tpot_ms.p50; },
      "%16.2f");
  row("per-token latency p99 / ms", [](const WorkloadReport& r) { return r.tpot_ms.p99; },
      "%16.2f");
  row("end to end p50 / ms", [](const WorkloadReport& r) { return r.e2e_ms.p50; }, "%16.1f");
  row("peak KV / MiB", [](const WorkloadReport& r) { return MiB(r.kv_bytes_peak); }, "%16.1f");
  row("prefix-hit rate / %", [](const WorkloadReport& r) { return 100 * r.prefix_hit_rate; },
      "%16.1f");
  row("preemptions", [](const WorkloadReport& r) { return static_cast<double>(r.preemptions); },
      "%16.0f");
  row("failed requests", [](const WorkloadReport& r) { return static_cast<double>(r.failed); },
      "%16.0f");
  int failed = 0;
  for (const Run& r : runs) failed += r.report.failed;
  if (runs.size() == 2) {
    const auto& on = runs[0].report;
    const auto& off = runs[1].report;
    std::printf("\nsharing on vs off: %.2fx tokens/s, %.2fx TTFT p50, %.0f%% less peak KV\n",
                off.generated_tokens_per_s > 0 ? on.generated_tokens_per_s /
                                                     off.generated_tokens_per_s : 0.0,
                on.ttft_ms.p50 > 0 ? off.ttft_ms.p50 / on.ttft_ms.p50 : 0.0,
                off.kv_bytes_peak > 0
                    ? 100.0 * (1.0 - static_cast<double>(on.kv_bytes_peak) / off.kv_bytes_peak)
                    : 0.0);
    const bool same = on.outputs == off.outputs;
    std::printf("greedy outputs identical in both runs: %s\n", same ? "yes" : "NO");
    if (!same) failed += 1;
  }
  if (f.json) {
    for (const Run& r : runs) std::cout << ToJson(r, f).dump() << "\n";
  }
  if (PrintAnswers(f) != 0) failed += 1;
  return failed == 0 ? 0 : 1;
}
