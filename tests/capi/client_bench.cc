// The remote client's cost next to the in-process engine, both through the C ABI: the same
// requests to an in-process engine and to a chunkserve-worker process on 127.0.0.1 with the same
// settings (tiny model, 1 CPU thread, 16-token chunks). Prints a table, or one JSON object per
// line with --json. Never asserts on time.
//
//   chunkserve_capi_client_bench [--json] [--repeats N]
//
// Scenarios: one stream of 128 tokens (time to first token, decode tokens/s), and 16 concurrent
// streams of 32 tokens each (aggregate tokens/s).
#include <chunkserve/chunkserve.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/capi/capi_testing.h"
#include "tests/worker/worker_process.h"

namespace chunkserve::capi {
namespace {

using Clock = std::chrono::steady_clock;

struct Run {
  double ttft_ms = 0;
  double tokens_per_s = 0;
  int tokens = 0;
};

using Submit = std::function<chunkserve_stream_t*(const chunkserve_request_options_t&)>;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Submits `streams` requests at once and pulls them all to the end.
Run Measure(const Submit& submit, int streams, int max_new, int salt) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < streams; ++i) prompts.push_back(Prompt(64, salt * 100 + i));
  const auto start = Clock::now();
  std::vector<chunkserve_stream_t*> handles;
  for (const auto& p : prompts) handles.push_back(submit(RequestFor(p, max_new)));
  Run run;
  Clock::time_point first{};
  for (chunkserve_stream_t* s : handles) {
    if (s == nullptr) continue;
    chunkserve_stream_event_t e;
    e.struct_size = sizeof(e);
    while (chunkserve_stream_next(s, CHUNKSERVE_WAIT_FOREVER, &e, nullptr) ==
           CHUNKSERVE_STATUS_OK) {
      if (e.kind != CHUNKSERVE_EVENT_TOKEN) break;
      if (run.tokens++ == 0) first = Clock::now();
    }
    chunkserve_stream_destroy(s);
  }
  const auto end = Clock::now();
  run.ttft_ms = Ms(first - start);
  run.tokens_per_s = run.tokens / std::chrono::duration<double>(end - start).count();
  return run;
}

Run Median(std::vector<Run> runs) {
  std::sort(runs.begin(), runs.end(),
            [](const Run& a, const Run& b) { return a.tokens_per_s < b.tokens_per_s; });
  return runs[runs.size() / 2];
}

int Main(int argc, char** argv) {
  bool json = false;
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--repeats N]\n", argv[0]);
      return 2;
    }
  }
  auto worker = worker::testing::WorkerProcess::Start(
      {"--threads", "1", "--kv-cache-mb", "32", "--chunk-size", "16"});
  if (!worker.ok()) {
    std::fprintf(stderr, "cannot start the worker: %s\n", worker.status().ToString().c_str());
    return 1;
  }
  chunkserve_engine_options_t eo = SmallEngineOptions();
  eo.kv_cache_bytes = 32u << 20;
  chunkserve_engine_t* engine = nullptr;
  chunkserve_client_options_t co;
  chunkserve_client_options_init(&co, sizeof(co), nullptr);
  co.host = "127.0.0.1";
  co.port = worker.value()->port();
  chunkserve_client_t* client = nullptr;
  if (chunkserve_engine_create(&eo, &engine, nullptr) != CHUNKSERVE_STATUS_OK ||
      chunkserve_client_create(&co, &client, nullptr) != CHUNKSERVE_STATUS_OK) {
    std::fprintf(stderr, "cannot create the engine or the client\n");
    return 1;
  }
  const Submit in_process = [&](const chunkserve_request_options_t& r) {
    chunkserve_stream_t* s = nullptr;
    chunkserve_engine_submit(engine, &r, &s, nullptr);
    return s;
  };
  const Submit remote = [&](const chunkserve_request_options_t& r) {
    chunkserve_stream_t* s = nullptr;
    chunkserve_client_submit(client, &r, &s, nullptr);
    return s;
  };
  struct Scenario {
    const char* name;
    int streams;
    int max_new;
  };
  const Scenario scenarios[] = {{"1 stream x 128 tokens", 1, 128},
                                {"16 streams x 32 tokens", 16, 32}};
  if (!json) {
    std::printf("%-24s %-11s %10s %12s %8s\n", "scenario", "path", "ttft_ms", "tokens/s", "tokens");
  }
  int salt = 1;
  for (const Scenario& sc : scenarios) {
    for (const auto& [path, submit] :
         {std::pair<const char*, const Submit*>{"in-process", &in_process}, {"remote", &remote}}) {
      Measure(*submit, sc.streams, 4, salt++);  // warm-up
      std::vector<Run> runs;
      // Fresh prompts each time, so that neither path is served from its prefix cache.
      for (int r = 0; r < repeats; ++r)
        runs.push_back(Measure(*submit, sc.streams, sc.max_new, salt++));
      const Run m = Median(runs);
      if (json) {
        std::printf(
            "{\"bench\":\"capi_client\",\"scenario\":\"%s\",\"path\":\"%s\",\"streams\":%d,"
            "\"max_new_tokens\":%d,\"repeats\":%d,\"ttft_ms\":%.3f,\"tokens_per_s\":%.1f,"
            "\"tokens\":%d}\n",
            sc.name, path, sc.streams, sc.max_new, repeats, m.ttft_ms, m.tokens_per_s, m.tokens);
      } else {
        std::printf("%-24s %-11s %10.2f %12.1f %8d\n", sc.name, path, m.ttft_ms, m.tokens_per_s,
                    m.tokens);
      }
    }
  }
  chunkserve_client_destroy(client);
  chunkserve_engine_destroy(engine);
  return 0;
}

}  // namespace
}  // namespace chunkserve::capi

int main(int argc, char** argv) { return chunkserve::capi::Main(argc, argv); }
