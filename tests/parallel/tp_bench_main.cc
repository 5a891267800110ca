// chunkserve-tp-bench: CPU decode throughput of the engine on the tiny model with tp = 1, 2, 4
// (rank 0 in this process, ranks 1..T-1 as chunkserve-worker rank processes over Gloo on
// 127.0.0.1). Every run serves the same requests: --requests prompts of --prompt tokens whose
// first half is one shared system prompt, --gen greedy tokens each, all submitted at once; decode
// tokens/s counts the tokens generated after every request had its first token (all prefills
// done) over the time to the last token. Prints a table, then one JSON object per row.
//
//   build/bin/chunkserve-tp-bench [--tp 1,2,4] [--requests 16] [--prompt 256] [--gen 64]
//                                 [--threads 1] [--worker PATH]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/model/tiny_model.h"
#include "worker/tp_group.h"

namespace {

using namespace chunkserve;
using Clock = std::chrono::steady_clock;

struct Row {
  int32_t tp = 1;
  int64_t tokens = 0;
  int64_t decode_tokens = 0;  // generated after every request had its first token
  double decode_s = 0;
  double total_s = 0;
};

Result<Row> RunOnce(int32_t tp, const std::string& model_dir, int32_t requests, int32_t prompt,
                    int32_t gen, int32_t threads, const std::string& worker) {
  std::unique_ptr<worker::TpGroup> group;
  engine::EngineOptions o;
  o.model_dir = model_dir;
  o.num_threads = threads;
  o.kv_cache_bytes = 128u << 20;
  o.max_batch_size = requests;
  if (tp > 1) {
    worker::TpGroupOptions g;
    g.size = tp;
    g.rank_binary = worker;
    g.timeout = std::chrono::seconds(60);
    CHUNKSERVE_ASSIGN_OR_RETURN(group, worker::TpGroup::Start(g));
    o.runner_factory = group->RunnerFactory();
  }
  CHUNKSERVE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> e, engine::Engine::Create(o));
  std::vector<std::shared_ptr<sched::RequestStream>> streams;
  const auto start = Clock::now();
  for (int32_t r = 0; r < requests; ++r) {
    sched::RequestOptions req;
    for (int32_t i = 0; i < prompt; ++i) {
      req.prompt.push_back(i < prompt / 2 ? (i * 31 + 7) % 1000 + 3 : (r * 97 + i * 13) % 1000 + 3);
    }
    req.max_new_tokens = gen;
    CHUNKSERVE_ASSIGN_OR_RETURN(auto s, e->Submit(std::move(req)));
    streams.push_back(s);
  }
  Row row;
  row.tp = tp;
  // Decode phase: from the moment every request has its first token (all prefills done) to the
  // last token, read off the engine's counters every 2 ms.
  const uint64_t total = static_cast<uint64_t>(requests) * gen;
  Clock::time_point t1{};
  uint64_t g1 = 0;
  for (;;) {
    const engine::EngineStats st = e->Stats();
    if (t1 == Clock::time_point{} && st.generated_tokens >= static_cast<uint64_t>(requests)) {
      t1 = Clock::now();
      g1 = st.generated_tokens;
    }
    if (st.generated_tokens >= total || st.requests_finished >= static_cast<uint64_t>(requests)) {
      break;
    }
    if (Clock::now() - start > std::chrono::seconds(600)) {
      return Status::DeadlineExceeded("benchmark run did not finish");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const Clock::time_point t2 = Clock::now();
  for (auto& s : streams) {
    sched::StreamEvent ev;
    while (s->Next(&ev, std::chrono::seconds(60)) == sched::RequestStream::NextResult::kEvent) {
      if (ev.kind == sched::StreamEvent::Kind::kFinished) {
        if (ev.finish.reason != FinishReason::kLength) return ev.finish.error;
        break;
      }
      ++row.tokens;
    }
  }
  row.total_s = std::chrono::duration<double>(t2 - start).count();
  row.decode_tokens = static_cast<int64_t>(total - g1);
  row.decode_s = std::chrono::duration<double>(t2 - t1).count();
  e->Shutdown(engine::ShutdownMode::kDrain);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int32_t> tps = {1, 2, 4};
  int32_t requests = 16, prompt = 256, gen = 64, threads = 1;
  std::string worker;
  {
    std::error_code ec;
    worker =
        (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "chunkserve-worker")
            .string();
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const char* v = argv[i + 1];
    if (f == "--tp") {
      tps.clear();
      for (const char* p = v; *p;) {
        tps.push_back(std::atoi(p));
        p = std::strchr(p, ',');
        if (p == nullptr) break;
        ++p;
      }
    } else if (f == "--requests") {
      requests = std::atoi(v);
    } else if (f == "--prompt") {
      prompt = std::atoi(v);
    } else if (f == "--gen") {
      gen = std::atoi(v);
    } else if (f == "--threads") {
      threads = std::atoi(v);
    } else if (f == "--worker") {
      worker = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("chunkserve-tp-bench-" + std::to_string(getpid()));
  model::TinyModelOptions t;
  t.num_kv_heads = 4;  // splits over 1, 2 and 4 ranks
  if (Status s = model::WriteTinyModel(dir, t); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<Row> rows;
  for (int32_t tp : tps) {
    Result<Row> r = RunOnce(tp, dir.string(), requests, prompt, gen, threads, worker);
    if (!r.ok()) {
      std::fprintf(stderr, "tp=%d: %s\n", tp, r.status().ToString().c_str());
      std::filesystem::remove_all(dir);
      return 1;
    }
    rows.push_back(r.value());
  }
  std::filesystem::remove_all(dir);
  std::printf("| tp | threads/rank | requests | tokens | wall s | tok/s (wall) | decode tok/s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %d | %d | %d | %lld | %.2f | %.1f | %.1f |\n", r.tp, threads, requests,
                static_cast<long long>(r.tokens), r.total_s, r.tokens / r.total_s,
                r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0.0);
  }
  for (const Row& r : rows) {
    std::printf(
        "{\"tp\": %d, \"threads_per_rank\": %d, \"requests\": %d, \"prompt\": %d, "
        "\"gen\": %d, \"tokens\": %lld, \"wall_s\": %.3f, \"tokens_per_s\": %.1f, "
        "\"decode_tokens_per_s\": %.1f}\n",
        r.tp, threads, requests, prompt, gen, static_cast<long long>(r.tokens), r.total_s,
        r.tokens / r.total_s, r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0.0);
  }
  return 0;
}
