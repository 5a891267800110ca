// chunkserve-worker: serves one Engine over the wire protocol; see worker/README.md.
#include <algorithm>
#include "runtime/wire/asio.h"
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "runtime/base/process_memory.h"
#include "runtime/base/status.h"
#include "runtime/openai/api_flags.h"
#include "runtime/wire/server_flags.h"
#include "worker/server.h"
#include "worker/tp_group.h"

namespace chunkserve::worker {
namespace {

bool SplitHostPort(const std::string& s, std::string* host, int32_t* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  *host = s.substr(0, colon);
  char* end = nullptr;
  const long p = std::strtol(s.c_str() + colon + 1, &end, 10);
  if (end == s.c_str() + colon + 1 || *end != '\0' || p < 0 || p > 65535) return false;
  *port = static_cast<int32_t>(p);
  return !host->empty();
}

bool ParseInt(const std::string& s, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

constexpr char kUsage[] =
    "usage: chunkserve-worker [--listen HOST:PORT] [--http HOST:PORT]\n"
    "         (--model DIR|FILE.gguf | --tiny-model)\n"
    "         [--kv-cache-mb N] [--max-queue N] [--chunk-size N] [--threads N]\n"
    "         [--drain-timeout-ms N]\n"
    "         [--worker-id ID] [--router HOST:PORT] [--advertise HOST:PORT]\n"
    "         [--load-report-ms N] [--backend cpu|cuda] [--cuda-device N]\n"
    "         [--kv-dtype f32|f16|bf16] [--gguf-dtype f32|f16|bf16] [--prefix-sharing on|off]\n"
    "         [--tp N] [--tp-rendezvous HOST:PORT] [--tp-timeout-ms N] [--tp-comm gloo|nccl]\n"
    "--model is required; --tiny-model serves the built-in tiny model (random weights, for tests\n"
    "and demos without a model).\n"
    "--gguf-dtype: what a .gguf's tensors are dequantized to (default f32); on the CPU f16 / bf16\n"
    "weights stay half-size and are widened inside the GEMM.\n"
    "--backend cuda keeps KV, weights and activations in --kv-dtype (f16, the default, or bf16);\n"
    "with --tp N it runs N GPU ranks over NCCL, rank r on CUDA device r.\n"
    "accepted connections (clients and routers' data links):\n";

int Main(int argc, char** argv) {
  int tp_exit = 0;
  if (MaybeRunTpRank(argc, argv, &tp_exit)) return tp_exit;  // a tensor-parallel rank process
  TpGroupOptions tp;
  bool tp_comm_given = false, kv_dtype_given = false;
  WorkerOptions options;
  wire::ServerFlags server_flags;
  // As the router: a connection neither side used for a minute is closed. Router data links
  // ping every second, clients every 5 s, and a peer being streamed to is not idle; what this
  // reaps is the connection of a peer that vanished without a word while nothing flowed.
  server_flags.idle_timeout_ms = 60000;
  openai::ApiFlags api_flags;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::fputs(wire::ServerFlagsUsage(), stdout);
      std::fputs(openai::ApiFlagsUsage(), stdout);
      return 0;
    }
    if (flag == "--tiny-model") {  // the one flag without a value
      options.engine.tiny_model = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "missing value for %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const std::string value = argv[++i];
    long long n = 0;
    bool ok = true;
    if (flag == "--listen") {
      int32_t port = 0;
      ok = SplitHostPort(value, &options.listen_host, &port);
      options.listen_port = static_cast<uint16_t>(port);
    } else if (flag == "--http") {
      ok = SplitHostPort(value, &options.http_host, &options.http_port);
    } else if (flag == "--model") {
      options.engine.model_dir = value;
    } else if (flag == "--kv-cache-mb") {
      ok = ParseInt(value, 1, 1 << 20, &n);
      options.engine.kv_cache_bytes = static_cast<uint64_t>(n) << 20;
    } else if (flag == "--max-queue") {
      ok = ParseInt(value, 1, 1 << 24, &n);
      options.engine.max_queued_requests = static_cast<int32_t>(n);
    } else if (flag == "--chunk-size") {
      ok = ParseInt(value, 16, 256, &n);
      options.engine.chunk_size = static_cast<int32_t>(n);
    } else if (flag == "--threads") {
      ok = ParseInt(value, 0, 1024, &n);
      options.engine.num_threads = static_cast<int32_t>(n);
    } else if (flag == "--drain-timeout-ms") {
      ok = ParseInt(value, 0, 3600000, &n);
      options.drain_timeout = std::chrono::milliseconds(n);
    } else if (openai::IsApiFlag(flag)) {
      if (Status s = openai::ParseApiFlag(flag, value, &api_flags); !s.ok()) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        return 2;
      }
    } else if (wire::IsServerFlag(flag)) {
      if (Status s = wire::ParseServerFlag(flag, value, &server_flags); !s.ok()) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        return 2;
      }
    } else if (flag == "--worker-id") {
      options.worker_id = value;
    } else if (flag == "--router") {
      // Repeatable, or comma-separated: one link per router.
      size_t start = 0;
      while (ok && start <= value.size()) {
        const size_t comma = std::min(value.find(',', start), value.size());
        const std::string one = value.substr(start, comma - start);
        std::string host;
        int32_t port = 0;
        ok = SplitHostPort(one, &host, &port) && port > 0;
        options.routers.push_back(one);
        start = comma + 1;
      }
    } else if (flag == "--advertise") {
      std::string host;
      int32_t port = 0;
      ok = SplitHostPort(value, &host, &port) && port > 0;
      options.advertise = value;
    } else if (flag == "--load-report-ms") {
      ok = ParseInt(value, 10, 600000, &n);
      options.load_report_interval = std::chrono::milliseconds(n);
    } else if (flag == "--backend") {
      ok = value == "cpu" || value == "cuda";
      options.engine.backend =
          value == "cuda" ? engine::BackendKind::kCuda : engine::BackendKind::kCpu;
    } else if (flag == "--cuda-device") {
      ok = ParseInt(value, 0, 1023, &n);
      options.engine.cuda_device = static_cast<int32_t>(n);
    } else if (flag == "--kv-dtype") {
      ok = value == "f32" || value == "f16" || value == "bf16";
      options.engine.kv_dtype = value == "f16"    ? kernels::DType::kF16
                                : value == "bf16" ? kernels::DType::kBF16
                                                  : kernels::DType::kF32;
      kv_dtype_given = true;
    } else if (flag == "--gguf-dtype") {
      ok = value == "f32" || value == "f16" || value == "bf16";
      options.engine.gguf_dtype = value == "f16"    ? kernels::DType::kF16
                                  : value == "bf16" ? kernels::DType::kBF16
                                                    : kernels::DType::kF32;
    } else if (flag == "--prefix-sharing") {
      ok = value == "on" || value == "off";
      options.engine.enable_prefix_sharing = value == "on";
    } else if (flag == "--tp" || flag == "--tp-rendezvous" || flag == "--tp-timeout-ms" ||
               flag == "--tp-comm") {
      ok = ParseTpFlag(flag, value, &tp).ok();
      tp_comm_given = tp_comm_given || flag == "--tp-comm";
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for %s: %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }

  if (options.engine.model_dir.empty() == !options.engine.tiny_model) {
    std::fprintf(stderr, "chunkserve-worker: %s\n%s",
                 options.engine.tiny_model ? "--model and --tiny-model exclude each other"
                                           : "no model: pass --model DIR|FILE.gguf (or --tiny-model "
                                             "for the built-in random-weight test model)",
                 kUsage);
    return 2;
  }
  Result<wire::ServerConnections> connections = wire::MakeServerConnections(server_flags);
  if (!connections.ok()) {
    std::fprintf(stderr, "chunkserve-worker: %s\n", connections.status().ToString().c_str());
    return 2;
  }
  options.connection = connections.value().connection;
  options.cluster_secret = connections.value().cluster_secret;
  options.tls_client = connections.value().tls.client;
  options.max_connections = connections.value().max_connections;
  Result<openai::ApiSetup> api = openai::MakeApiSetup(api_flags, options.engine.model_dir);
  if (!api.ok()) {
    std::fprintf(stderr, "chunkserve-worker: %s\n", api.status().ToString().c_str());
    return 2;
  }
  options.model_text = api.value().model_text;
  options.api_key = api.value().api_key;

  const bool cuda = options.engine.backend == engine::BackendKind::kCuda;
  if (cuda && !kv_dtype_given) options.engine.kv_dtype = kernels::DType::kF16;
  // The backend decides the communicator: CPU ranks reduce host memory over Gloo, GPU ranks device
  // memory over NCCL.
  if (!tp_comm_given && cuda) tp.comm = TpComm::kNccl;
  if (tp.size > 1 && (tp.comm == TpComm::kNccl) != cuda) {
    std::fprintf(stderr, "chunkserve-worker: %s\n",
                 cuda ? "--backend cuda runs GPU ranks, which reduce over NCCL (--tp-comm nccl)"
                      : "--tp-comm nccl runs GPU ranks: add --backend cuda");
    return 2;
  }

  asio::io_context io(1);
  std::unique_ptr<TpGroup> tp_group;  // outlives the engine, whose backend leads the group
  if (tp.size > 1) {
    Result<std::unique_ptr<TpGroup>> group = TpGroup::Start(tp);
    if (!group.ok()) {
      std::fprintf(stderr, "chunkserve-worker: %s\n", group.status().ToString().c_str());
      return 1;
    }
    tp_group = std::move(group).value();
    options.engine.runner_factory = tp_group->RunnerFactory();
  }
  Result<std::unique_ptr<WorkerServer>> server = WorkerServer::Create(io, options);
  if (!server.ok()) {
    std::fprintf(stderr, "chunkserve-worker: %s\n", server.status().ToString().c_str());
    return 1;
  }
  // Loading left freed buffers in the heap (checkpoint, tokenizer): give their pages back.
  ReturnFreeHeapToOs();
  std::printf("listening on %s:%u\n", options.listen_host.c_str(), server.value()->port());
  if (options.http_port >= 0) {
    std::printf("http on %s:%u\n", options.http_host.c_str(), server.value()->http_port());
  }
  std::fflush(stdout);

  // Signals are handled here, in the executable only.
  asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](const asio::error_code& ec, int) {
    if (ec) return;
    server.value()->BeginDrain([&io] { io.stop(); });
  });
  // A failed tensor-parallel group: requests already ended with the error; stop being ready,
  // drain and exit non-zero.
  int exit_code = 0;
  if (tp_group) {
    tp_group->SetFailureCallback([&](const Status& s) {
      asio::post(io, [&, s] {
        std::fprintf(stderr, "chunkserve-worker: %s; exiting\n", s.ToString().c_str());
        exit_code = 3;
        server.value()->BeginDrain([&io] { io.stop(); });
      });
    });
  }
  io.run();
  server.value().reset();
  return exit_code;
}

}  // namespace
}  // namespace chunkserve::worker

int main(int argc, char** argv) { return chunkserve::worker::Main(argc, argv); }
