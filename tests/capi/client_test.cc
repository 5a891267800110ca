// The C ABI's remote client (chunkserve_client_*) against a real chunkserve-worker process on
// 127.0.0.1 with an ephemeral port: the same greedy tokens as the in-process engine, callbacks,
// cancellation, server-side rejections, the worker killed mid-stream (SIGKILL), a closed port,
// bad arguments, many threads on one client, destroying the client under live streams, and a
// connection kept open past the worker's handshake and idle deadlines, the same tokens through a
// real chunkserve-router in front of the worker, that router killed and restarted under load
// (the client reconnects by itself), and a router with a cluster secret and client token (the
// token from the environment works; none or a wrong one ends requests UNAUTHENTICATED), and TLS.
//
// The client is driven through the public header only; tests/worker's WorkerProcess starts and
// kills the worker.
#include <chunkserve/chunkserve.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/capi/capi_testing.h"
#include "tests/testing/tls_fixtures.h"
#include "tests/worker/worker_process.h"

namespace chunkserve::capi {
namespace {

// The sanitized build of this file (chunkserve_capi_client_lsan_test) runs the same cases under
// another suite name, so that the two binaries' ctest names differ.
#ifndef CHUNKSERVE_CLIENT_SUITE
#define CHUNKSERVE_CLIENT_SUITE CapiClientTest
#endif

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using worker::testing::WorkerProcess;

struct ClientDeleter {
  void operator()(chunkserve_client_t* c) const { chunkserve_client_destroy(c); }
};
using ClientPtr = std::unique_ptr<chunkserve_client_t, ClientDeleter>;

// One CPU thread, as the machine running ctest -j2 is small; 16-token chunks as in
// SmallEngineOptions, so that the in-process reference computes exactly the same way.
const std::vector<std::string> kWorkerArgs = {"--threads",    "1", "--kv-cache-mb", "32",
                                              "--chunk-size", "16"};

std::unique_ptr<WorkerProcess> StartWorker(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = kWorkerArgs;
  args.insert(args.end(), extra.begin(), extra.end());
  auto worker = WorkerProcess::Start(args);
  EXPECT_TRUE(worker.ok()) << worker.status();
  return worker.ok() ? std::move(worker).value() : nullptr;
}

chunkserve_client_options_t ClientOptions(uint16_t port) {
  chunkserve_client_options_t o;
  EXPECT_EQ(chunkserve_client_options_init(&o, sizeof(o), nullptr), CHUNKSERVE_STATUS_OK);
  o.host = "127.0.0.1";
  o.port = port;
  return o;
}

ClientPtr ConnectOrDie(uint16_t port) {
  const chunkserve_client_options_t o = ClientOptions(port);
  chunkserve_client_t* client = nullptr;
  ErrorPtr error;
  EXPECT_EQ(chunkserve_client_create(&o, &client, Out(error)), CHUNKSERVE_STATUS_OK)
      << chunkserve_error_message(error.get());
  return ClientPtr(client);
}

StreamPtr SubmitRemote(chunkserve_client_t* client, const std::vector<int32_t>& prompt,
                       int32_t max_new_tokens) {
  const chunkserve_request_options_t r = RequestFor(prompt, max_new_tokens);
  chunkserve_stream_t* stream = nullptr;
  ErrorPtr error;
  EXPECT_EQ(chunkserve_client_submit(client, &r, &stream, Out(error)), CHUNKSERVE_STATUS_OK)
      << chunkserve_error_message(error.get());
  return StreamPtr(stream);
}

// Waits for the stream's first token (a request known to be running on the worker).
void WaitForFirstToken(chunkserve_stream_t* stream, std::vector<int32_t>* tokens) {
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  ASSERT_EQ(chunkserve_stream_next(stream, 60000, &e, nullptr), CHUNKSERVE_STATUS_OK);
  ASSERT_EQ(e.kind, CHUNKSERVE_EVENT_TOKEN);
  tokens->push_back(e.token);
}

// A client the server refuses for its credentials (no key, a wrong one, plaintext to a TLS
// server), while it keeps reconnecting: every attempt fails UNAUTHENTICATED, at submit (between
// connections) or as the stream's end (sent on a fresh connection).
void ExpectEveryAttemptUnauthenticated(chunkserve_client_t* client,
                                       const std::vector<int32_t>& prompt, int attempts) {
  for (int attempt = 0; attempt < attempts; ++attempt) {
    const chunkserve_request_options_t r = RequestFor(prompt, 4);
    chunkserve_stream_t* raw = nullptr;
    ErrorPtr error;
    const chunkserve_status_t submitted = chunkserve_client_submit(client, &r, &raw, Out(error));
    if (submitted != CHUNKSERVE_STATUS_OK) {
      EXPECT_EQ(submitted, CHUNKSERVE_STATUS_UNAUTHENTICATED) << chunkserve_error_message(error.get());
      std::this_thread::sleep_for(30ms);
      continue;
    }
    StreamPtr stream(raw);
    const Outcome out = Drain(stream.get());
    EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_ERROR) << out.message;
    EXPECT_EQ(out.finish.status, CHUNKSERVE_STATUS_UNAUTHENTICATED) << out.message;
  }
}

// The greedy tokens of the in-process engine (same built-in tiny model as the worker), each
// prompt run alone, one after the other.
std::vector<std::vector<int32_t>> InProcessSolo(const std::vector<std::vector<int32_t>>& prompts,
                                                int32_t max_new) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  if (engine == nullptr) return out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    StreamPtr stream = SubmitOrDie(engine.get(), prompts[i], max_new);
    if (stream != nullptr) out[i] = Drain(stream.get()).tokens;
  }
  return out;
}

std::vector<int32_t> InProcessTokens(const std::vector<int32_t>& prompt, int32_t max_new) {
  return InProcessSolo({prompt}, max_new)[0];
}

// A port on 127.0.0.1 that nothing listens on: bound, then closed.
uint16_t ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(CHUNKSERVE_CLIENT_SUITE, StreamsTheInProcessEnginesGreedyTokens) {
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(worker->port());
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> prompt = Prompt(100, 1);
  StreamPtr stream = SubmitRemote(client.get(), prompt, 16);
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(chunkserve_stream_id(stream.get()), 1u);
  const Outcome remote = Drain(stream.get());
  EXPECT_EQ(remote.finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
  EXPECT_EQ(remote.finish.status, CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(remote.finish.prompt_tokens, 100);
  EXPECT_EQ(remote.finish.generated_tokens, 16);
  EXPECT_EQ(remote.finish.error_message, nullptr);
  ASSERT_EQ(remote.tokens.size(), 16u);
  EXPECT_EQ(remote.tokens, InProcessTokens(prompt, 16));

  // The same prompt again: the worker serves it from its prefix cache, with the same tokens.
  StreamPtr again = SubmitRemote(client.get(), prompt, 16);
  const Outcome cached = Drain(again.get());
  EXPECT_EQ(cached.tokens, remote.tokens);
  EXPECT_GT(cached.finish.cached_tokens, 0);

  // After the terminal event, next() says the stream ended, as for an engine stream.
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  EXPECT_EQ(chunkserve_stream_next(again.get(), 0, &e, nullptr), CHUNKSERVE_STATUS_OUT_OF_RANGE);
}

// Logprobs cross the wire: the worker's events carry the same numbers as the in-process engine's.
TEST(CHUNKSERVE_CLIENT_SUITE, LogprobsCrossTheWire) {
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(worker->port());
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> prompt = Prompt(30, 9);
  chunkserve_request_options_t r = RequestFor(prompt, 5);
  r.logprobs = 4;
  const auto events = [&](chunkserve_stream_t* raw) {
    StreamPtr stream(raw);
    std::vector<chunkserve_stream_event_t> out;
    for (;;) {
      chunkserve_stream_event_t e{};
      e.struct_size = sizeof(e);
      if (chunkserve_stream_next(stream.get(), 60000, &e, nullptr) != CHUNKSERVE_STATUS_OK) break;
      if (e.kind != CHUNKSERVE_EVENT_TOKEN) break;
      out.push_back(e);
    }
    return out;
  };
  chunkserve_stream_t* raw = nullptr;
  ASSERT_EQ(chunkserve_client_submit(client.get(), &r, &raw, nullptr), CHUNKSERVE_STATUS_OK);
  const auto remote = events(raw);
  EnginePtr engine = CreateEngineOrDie(SmallEngineOptions());
  raw = nullptr;
  ASSERT_EQ(chunkserve_engine_submit(engine.get(), &r, &raw, nullptr), CHUNKSERVE_STATUS_OK);
  const auto local = events(raw);
  ASSERT_EQ(remote.size(), 5u);
  ASSERT_EQ(local.size(), 5u);
  for (size_t i = 0; i < remote.size(); ++i) {
    EXPECT_EQ(remote[i].token, local[i].token) << i;
    ASSERT_EQ(remote[i].num_top_logprobs, 4) << i;
    EXPECT_NEAR(remote[i].logprob, local[i].logprob, 1e-4) << i;
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(remote[i].top_tokens[k], local[i].top_tokens[k]) << i << " " << k;
      EXPECT_NEAR(remote[i].top_logprobs[k], local[i].top_logprobs[k], 1e-4) << i << " " << k;
    }
  }
  // Refused before anything is sent.
  r.logprobs = 99;
  raw = nullptr;
  EXPECT_EQ(chunkserve_client_submit(client.get(), &r, &raw, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(raw, nullptr);
}

TEST(CHUNKSERVE_CLIENT_SUITE, CallbacksAndTimeoutsWorkOnRemoteStreams) {
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(worker->port());
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> prompt = Prompt(40, 2);
  const std::vector<int32_t> reference = InProcessTokens(prompt, 8);

  struct Seen {
    std::mutex mu;
    std::vector<int32_t> tokens;
    int32_t finish_reason = -1;
    std::atomic<bool> done{false};
  } seen;
  StreamPtr stream = SubmitRemote(client.get(), prompt, 8);
  ASSERT_NE(stream, nullptr);
  const auto callback = [](const chunkserve_stream_event_t* e, void* user_data) {
    auto* s = static_cast<Seen*>(user_data);
    std::lock_guard<std::mutex> lock(s->mu);
    if (e->kind == CHUNKSERVE_EVENT_TOKEN) {
      s->tokens.push_back(e->token);
    } else {
      s->finish_reason = e->finish_reason;
      s->done = true;
    }
  };
  ASSERT_EQ(chunkserve_stream_set_callback(stream.get(), callback, &seen, nullptr),
            CHUNKSERVE_STATUS_OK);
  WaitFor([&] { return seen.done.load(); });
  {
    std::lock_guard<std::mutex> lock(seen.mu);
    EXPECT_EQ(seen.finish_reason, CHUNKSERVE_FINISH_LENGTH);
    EXPECT_EQ(seen.tokens, reference);
  }
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  EXPECT_EQ(chunkserve_stream_next(stream.get(), 0, &e, nullptr),
            CHUNKSERVE_STATUS_FAILED_PRECONDITION);

  // A request that cannot produce its first token within 0 ms: next() times out, then works.
  StreamPtr slow = SubmitRemote(client.get(), Prompt(200, 3), 4);
  ErrorPtr error;
  const chunkserve_status_t st = chunkserve_stream_next(slow.get(), 0, &e, Out(error));
  EXPECT_TRUE(st == CHUNKSERVE_STATUS_DEADLINE_EXCEEDED || st == CHUNKSERVE_STATUS_OK)
      << chunkserve_status_name(st);
  Drain(slow.get());
}

TEST(CHUNKSERVE_CLIENT_SUITE, CancelMidStreamEndsWithCancelled) {
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(worker->port());
  ASSERT_NE(client, nullptr);

  // Through the stream.
  StreamPtr stream = SubmitRemote(client.get(), Prompt(20, 4), 4000);
  ASSERT_NE(stream, nullptr);
  std::vector<int32_t> first;
  WaitForFirstToken(stream.get(), &first);
  EXPECT_EQ(chunkserve_stream_cancel(stream.get(), nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(chunkserve_stream_cancel(stream.get(), nullptr), CHUNKSERVE_STATUS_OK);  // idempotent
  const Outcome out = Drain(stream.get(), first);
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_CANCELLED);
  EXPECT_LT(out.tokens.size() + 1, 4000u);
  EXPECT_EQ(chunkserve_stream_cancel(stream.get(), nullptr), CHUNKSERVE_STATUS_OK);  // after end

  // Through the client, by id; an id that is no longer live is NOT_FOUND.
  StreamPtr other = SubmitRemote(client.get(), Prompt(20, 5), 4000);
  ASSERT_NE(other, nullptr);
  std::vector<int32_t> other_first;
  WaitForFirstToken(other.get(), &other_first);
  const uint64_t id = chunkserve_stream_id(other.get());
  EXPECT_EQ(chunkserve_client_cancel(client.get(), id, nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(Drain(other.get(), other_first).finish.finish_reason, CHUNKSERVE_FINISH_CANCELLED);
  ErrorPtr error;
  EXPECT_EQ(chunkserve_client_cancel(client.get(), id, Out(error)), CHUNKSERVE_STATUS_NOT_FOUND);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr(std::to_string(id)));
  EXPECT_EQ(chunkserve_client_cancel(client.get(), 999999, nullptr), CHUNKSERVE_STATUS_NOT_FOUND);

  // Destroying a stream mid-request cancels it on the worker; the client keeps working.
  StreamPtr dropped = SubmitRemote(client.get(), Prompt(20, 6), 4000);
  WaitForFirstToken(dropped.get(), &first);
  dropped.reset();
  StreamPtr after = SubmitRemote(client.get(), Prompt(30, 7), 4);
  EXPECT_EQ(Drain(after.get()).finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
}

TEST(CHUNKSERVE_CLIENT_SUITE, ServerSideRejectionsEndTheStream) {
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(worker->port());
  ASSERT_NE(client, nullptr);
  // Token 5000 is outside the tiny model's vocabulary (1024): only the worker knows that.
  StreamPtr stream = SubmitRemote(client.get(), {1, 2, 5000}, 4);
  ASSERT_NE(stream, nullptr);
  const Outcome out = Drain(stream.get());
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_ERROR);
  EXPECT_EQ(out.finish.status, CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(out.message, HasSubstr("5000"));
  EXPECT_TRUE(out.tokens.empty());
  // The connection survives a rejected request.
  StreamPtr ok = SubmitRemote(client.get(), Prompt(10, 8), 3);
  EXPECT_EQ(Drain(ok.get()).finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
}

TEST(CHUNKSERVE_CLIENT_SUITE, WorkerKilledMidStreamEndsStreamsAsUnavailable) {
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(worker->port());
  ASSERT_NE(client, nullptr);
  StreamPtr pulled = SubmitRemote(client.get(), Prompt(20, 9), 4000);
  StreamPtr waiting = SubmitRemote(client.get(), Prompt(20, 10), 4000);
  ASSERT_NE(pulled, nullptr);
  ASSERT_NE(waiting, nullptr);
  std::vector<int32_t> first;
  WaitForFirstToken(pulled.get(), &first);

  // Another thread is blocked in next(WAIT_FOREVER) when the worker dies.
  chunkserve_stream_event_t blocked_event{};
  std::atomic<bool> blocked_done{false};
  std::thread blocked([&] {
    blocked_event.struct_size = sizeof(blocked_event);
    while (chunkserve_stream_next(waiting.get(), CHUNKSERVE_WAIT_FOREVER, &blocked_event,
                                  nullptr) == CHUNKSERVE_STATUS_OK &&
           blocked_event.kind == CHUNKSERVE_EVENT_TOKEN) {
    }
    blocked_done = true;
  });

  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(worker->Signal(SIGKILL).ok());
  const Outcome out = Drain(pulled.get(), first);
  blocked.join();
  const auto took = std::chrono::steady_clock::now() - killed_at;
  EXPECT_LT(took, 30s);  // bounded, never a hang (generous for a loaded machine)
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_UNAVAILABLE);
  EXPECT_EQ(out.finish.status, CHUNKSERVE_STATUS_UNAVAILABLE);
  EXPECT_THAT(out.message, HasSubstr("127.0.0.1:" + std::to_string(worker->port())));
  EXPECT_THAT(out.message, HasSubstr("lost"));
  EXPECT_TRUE(blocked_done.load());
  EXPECT_EQ(blocked_event.kind, CHUNKSERVE_EVENT_FINISHED);
  EXPECT_EQ(blocked_event.finish_reason, CHUNKSERVE_FINISH_UNAVAILABLE);

  // Later submits fail at once with UNAVAILABLE and a message.
  const std::vector<int32_t> prompt = Prompt(5, 1);
  const chunkserve_request_options_t r = RequestFor(prompt, 2);
  chunkserve_stream_t* s = reinterpret_cast<chunkserve_stream_t*>(1);
  ErrorPtr error;
  EXPECT_EQ(chunkserve_client_submit(client.get(), &r, &s, Out(error)),
            CHUNKSERVE_STATUS_UNAVAILABLE);
  EXPECT_EQ(s, nullptr);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("not connected"));
}

TEST(CHUNKSERVE_CLIENT_SUITE, CancelAgainstAServerThatNeverAnswersEndsInBoundedTime) {
  // A listening socket that never accepts: the kernel completes the connection, nothing answers.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ClientPtr client = ConnectOrDie(ntohs(addr.sin_port));
  ASSERT_NE(client, nullptr);
  StreamPtr stream = SubmitRemote(client.get(), Prompt(10, 17), 4);
  StreamPtr abandoned = SubmitRemote(client.get(), Prompt(10, 18), 4);
  ASSERT_NE(stream, nullptr);
  chunkserve_stream_event_t e;
  e.struct_size = sizeof(e);
  EXPECT_EQ(chunkserve_stream_next(stream.get(), 200, &e, nullptr),
            CHUNKSERVE_STATUS_DEADLINE_EXCEEDED);
  const auto cancelled_at = std::chrono::steady_clock::now();
  ASSERT_EQ(chunkserve_stream_cancel(stream.get(), nullptr), CHUNKSERVE_STATUS_OK);
  const Outcome out = Drain(stream.get());
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_CANCELLED);
  EXPECT_EQ(out.finish.status, CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(out.finish.prompt_tokens, 10);
  EXPECT_LT(std::chrono::steady_clock::now() - cancelled_at, 30s);  // a few seconds of grace
  // Destroying the client with a request the server never answered does not hang either.
  client.reset();
  EXPECT_EQ(Drain(abandoned.get()).finish.finish_reason, CHUNKSERVE_FINISH_UNAVAILABLE);
  ::close(fd);
}

// TLS (the worker started with --tls-*; test certificates from tests/testing/tls): with the
// cluster CA the client gets the same tokens; another CA, a plaintext client and a TLS client of
// a plaintext server are refused UNAUTHENTICATED; unusable files are INVALID_ARGUMENT.
TEST(CHUNKSERVE_CLIENT_SUITE, SpeaksTlsWithTheClusterCa) {
  const wire::TlsFiles node = chunkserve::testing::NodeTlsFiles();
  auto worker = StartWorker(chunkserve::testing::TlsFlags(node));
  ASSERT_NE(worker, nullptr);
  const std::vector<int32_t> prompt = Prompt(40, 6);
  const auto create = [](chunkserve_client_options_t o, ErrorPtr* error) {
    chunkserve_client_t* raw = nullptr;
    const chunkserve_status_t st = chunkserve_client_create(&o, &raw, Out(*error));
    return std::make_pair(st, ClientPtr(raw));
  };

  chunkserve_client_options_t o = ClientOptions(worker->port());
  o.tls_ca_file = node.ca_file.c_str();
  ErrorPtr error;
  auto [st, client] = create(o, &error);
  ASSERT_EQ(st, CHUNKSERVE_STATUS_OK) << chunkserve_error_message(error.get());
  StreamPtr stream = SubmitRemote(client.get(), prompt, 8);
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(Drain(stream.get()).tokens, InProcessTokens(prompt, 8));

  // A certificate from another authority: create fails, saying why.
  const std::string other_ca = chunkserve::testing::TlsFixture("other-ca.pem");
  o.tls_ca_file = other_ca.c_str();
  auto [wrong_st, wrong] = create(o, &error);
  EXPECT_EQ(wrong_st, CHUNKSERVE_STATUS_UNAUTHENTICATED);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("TLS"));
  EXPECT_EQ(wrong, nullptr);

  // Unusable files.
  o.tls_ca_file = "/nonexistent/ca.pem";
  EXPECT_EQ(create(o, &error).first, CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  o.tls_ca_file = nullptr;
  o.tls_cert_file = node.cert_file.c_str();
  o.tls_key_file = node.key_file.c_str();
  EXPECT_EQ(create(o, &error).first, CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("tls_ca_file"));

  // Plaintext to the TLS worker: refused for its credentials, never served.
  ClientPtr plain = ConnectOrDie(worker->port());
  ASSERT_NE(plain, nullptr);
  ExpectEveryAttemptUnauthenticated(plain.get(), prompt, 3);

  // TLS to a plaintext worker: create fails at once.
  auto plain_worker = StartWorker();
  ASSERT_NE(plain_worker, nullptr);
  chunkserve_client_options_t p = ClientOptions(plain_worker->port());
  p.tls_ca_file = node.ca_file.c_str();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(create(p, &error).first, CHUNKSERVE_STATUS_UNAUTHENTICATED)
      << chunkserve_error_message(error.get());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
}

// Revocation (tls_crl_file, version 3): a worker presenting a certificate the CA's list revokes
// is refused UNAUTHENTICATED, the same list admits a worker with a valid certificate, and a list
// that is not the CA's, or set without a CA, is INVALID_ARGUMENT. A version 2 caller's struct
// (48 bytes) has no such field and checks no revocation.
TEST(CHUNKSERVE_CLIENT_SUITE, RefusesAServerWhoseCertificateIsRevoked) {
  const wire::TlsFiles node = chunkserve::testing::NodeTlsFiles();
  const wire::TlsFiles revoked = chunkserve::testing::RevokedTlsFiles();
  const std::string crl = chunkserve::testing::TlsFixture("crl.pem");
  const std::string other_crl = chunkserve::testing::TlsFixture("other-crl.pem");
  auto revoked_worker = StartWorker(chunkserve::testing::TlsFlags(revoked));
  auto good_worker = StartWorker(chunkserve::testing::TlsFlags(node));
  ASSERT_NE(revoked_worker, nullptr);
  ASSERT_NE(good_worker, nullptr);
  const auto create = [](chunkserve_client_options_t o, ErrorPtr* error) {
    chunkserve_client_t* raw = nullptr;
    const chunkserve_status_t st = chunkserve_client_create(&o, &raw, Out(*error));
    return std::make_pair(st, ClientPtr(raw));
  };
  ErrorPtr error;

  chunkserve_client_options_t o = ClientOptions(revoked_worker->port());
  o.tls_ca_file = node.ca_file.c_str();
  o.tls_crl_file = crl.c_str();
  auto [st, refused] = create(o, &error);
  EXPECT_EQ(st, CHUNKSERVE_STATUS_UNAUTHENTICATED);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("revoked"));
  EXPECT_EQ(refused, nullptr);

  // The same options without the list (or from a version 2 caller) connect: the list refused it.
  chunkserve_client_options_t v2 = o;
  v2.struct_size = 48;
  auto [v2_st, v2_client] = create(v2, &error);
  EXPECT_EQ(v2_st, CHUNKSERVE_STATUS_OK) << chunkserve_error_message(error.get());

  chunkserve_client_options_t good = ClientOptions(good_worker->port());
  good.tls_ca_file = node.ca_file.c_str();
  good.tls_crl_file = crl.c_str();
  auto [good_st, client] = create(good, &error);
  ASSERT_EQ(good_st, CHUNKSERVE_STATUS_OK) << chunkserve_error_message(error.get());
  const std::vector<int32_t> prompt = Prompt(40, 7);
  StreamPtr stream = SubmitRemote(client.get(), prompt, 6);
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(Drain(stream.get()).tokens, InProcessTokens(prompt, 6));

  good.tls_crl_file = other_crl.c_str();
  EXPECT_EQ(create(good, &error).first, CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("not signed"));
  good.tls_ca_file = nullptr;
  good.tls_crl_file = crl.c_str();
  EXPECT_EQ(create(good, &error).first, CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("tls_crl_file needs tls_ca_file"));
}

TEST(CHUNKSERVE_CLIENT_SUITE, ConnectingToAClosedPortFailsClearly) {
  const uint16_t port = ClosedPort();
  const chunkserve_client_options_t o = ClientOptions(port);
  chunkserve_client_t* client = reinterpret_cast<chunkserve_client_t*>(1);
  ErrorPtr error;
  EXPECT_EQ(chunkserve_client_create(&o, &client, Out(error)), CHUNKSERVE_STATUS_UNAVAILABLE);
  EXPECT_EQ(client, nullptr);
  EXPECT_EQ(chunkserve_error_code(error.get()), CHUNKSERVE_STATUS_UNAVAILABLE);
  EXPECT_THAT(chunkserve_error_message(error.get()),
              HasSubstr("127.0.0.1:" + std::to_string(port)));
}

TEST(CHUNKSERVE_CLIENT_SUITE, BadArgumentsAreRejected) {
  // options_init.
  chunkserve_client_options_t o;
  EXPECT_EQ(chunkserve_client_options_init(nullptr, sizeof(o), nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  for (uint32_t size : {0u, 8u, 23u, 4097u}) {
    ErrorPtr error;
    EXPECT_EQ(chunkserve_client_options_init(&o, size, Out(error)),
              CHUNKSERVE_STATUS_INVALID_ARGUMENT)
        << size;
    EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr("struct_size"));
  }
  ASSERT_EQ(chunkserve_client_options_init(&o, sizeof(o), nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_EQ(o.struct_size, sizeof(o));
  EXPECT_EQ(o.host, nullptr);
  EXPECT_EQ(o.port, 0);
  EXPECT_EQ(o.connect_timeout_ms, 5000);
  EXPECT_EQ(o.keepalive_interval_ms, 5000);

  // create.
  const auto create_fails = [](const chunkserve_client_options_t* options, const char* what) {
    chunkserve_client_t* client = reinterpret_cast<chunkserve_client_t*>(1);
    ErrorPtr error;
    EXPECT_EQ(chunkserve_client_create(options, &client, Out(error)),
              CHUNKSERVE_STATUS_INVALID_ARGUMENT)
        << what;
    EXPECT_EQ(client, nullptr) << what;
    EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr(what));
  };
  create_fails(nullptr, "options is NULL");
  chunkserve_client_options_t bad = ClientOptions(1234);
  bad.host = nullptr;
  create_fails(&bad, "host");
  bad.host = "";
  create_fails(&bad, "host is empty");
  bad = ClientOptions(0);
  create_fails(&bad, "port");
  bad = ClientOptions(1234);
  bad.port = 70000;
  create_fails(&bad, "port");
  bad = ClientOptions(1234);
  bad.connect_timeout_ms = -1;
  create_fails(&bad, "connect_timeout_ms");
  bad = ClientOptions(1234);
  bad.keepalive_interval_ms = -2;
  create_fails(&bad, "keepalive_interval_ms");
  bad = ClientOptions(1234);
  bad.struct_size = 4;
  create_fails(&bad, "struct_size");
  const chunkserve_client_options_t good = ClientOptions(1234);
  EXPECT_EQ(chunkserve_client_create(&good, nullptr, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);

  // destroy(NULL), cancel(NULL), submit with bad arguments (checked before anything is sent).
  chunkserve_client_destroy(nullptr);
  EXPECT_EQ(chunkserve_client_cancel(nullptr, 1, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(worker->port());
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> prompt = Prompt(8, 1);
  chunkserve_request_options_t r = RequestFor(prompt, 4);
  chunkserve_stream_t* s = nullptr;
  EXPECT_EQ(chunkserve_client_submit(nullptr, &r, &s, nullptr), CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(chunkserve_client_submit(client.get(), nullptr, &s, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(chunkserve_client_submit(client.get(), &r, nullptr, nullptr),
            CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  const auto submit_fails = [&](const chunkserve_request_options_t& req, const char* what) {
    chunkserve_stream_t* stream = reinterpret_cast<chunkserve_stream_t*>(1);
    ErrorPtr error;
    EXPECT_EQ(chunkserve_client_submit(client.get(), &req, &stream, Out(error)),
              CHUNKSERVE_STATUS_INVALID_ARGUMENT)
        << what;
    EXPECT_EQ(stream, nullptr);
    EXPECT_THAT(chunkserve_error_message(error.get()), HasSubstr(what));
  };
  chunkserve_request_options_t b = r;
  b.struct_size = 0;
  submit_fails(b, "struct_size");
  b = r;
  b.num_prompt_tokens = 0;
  submit_fails(b, "empty prompt");
  const std::vector<int32_t> negative = {1, -3, 2};
  b = RequestFor(negative, 4);
  submit_fails(b, "has id -3");
  b = r;
  b.max_new_tokens = 0;
  submit_fails(b, "max_new_tokens");
  b = r;
  b.top_p = 2.0f;
  submit_fails(b, "top_p");
  b = r;
  b.prompt_tokens = nullptr;
  submit_fails(b, "prompt_tokens");
  b = r;
  b.num_prompt_tokens = uint64_t{1} << 40;  // never copied: rejected on the count
  submit_fails(b, "4000000");

  // None of that reached the worker or hurt the connection.
  StreamPtr ok = SubmitRemote(client.get(), prompt, 4);
  ASSERT_NE(ok, nullptr);
  EXPECT_EQ(chunkserve_stream_id(ok.get()), 1u);
  EXPECT_EQ(Drain(ok.get()).finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
}

TEST(CHUNKSERVE_CLIENT_SUITE, ManyThreadsSubmitAtOnce) {
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(worker->port());
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 8;
  constexpr int kPerThread = 4;
  constexpr int kPrompts = 4;  // threads share prompts, so their outputs must agree
  std::vector<std::vector<int32_t>> reference(kPrompts);
  for (int p = 0; p < kPrompts; ++p) {
    StreamPtr s = SubmitRemote(client.get(), Prompt(24 + p, 20 + p), 6);
    reference[p] = Drain(s.get()).tokens;
    ASSERT_EQ(reference[p].size(), 6u);
  }
  std::vector<std::vector<Outcome>> outcomes(kThreads);
  std::vector<std::vector<uint64_t>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<StreamPtr> streams;
      for (int i = 0; i < kPerThread; ++i) {
        const int p = (t + i) % kPrompts;
        streams.push_back(SubmitRemote(client.get(), Prompt(24 + p, 20 + p), 6));
        if (streams.back() == nullptr) return;
        ids[t].push_back(chunkserve_stream_id(streams.back().get()));
      }
      for (auto& s : streams) outcomes[t].push_back(Drain(s.get()));
    });
  }
  for (auto& th : threads) th.join();
  std::vector<uint64_t> all_ids;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(outcomes[t].size(), static_cast<size_t>(kPerThread)) << t;
    for (int i = 0; i < kPerThread; ++i) {
      EXPECT_EQ(outcomes[t][i].finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
      EXPECT_EQ(outcomes[t][i].tokens, reference[(t + i) % kPrompts]) << t << "/" << i;
    }
    all_ids.insert(all_ids.end(), ids[t].begin(), ids[t].end());
  }
  std::sort(all_ids.begin(), all_ids.end());
  EXPECT_EQ(std::adjacent_find(all_ids.begin(), all_ids.end()), all_ids.end())
      << "request ids must be unique per client";
}

TEST(CHUNKSERVE_CLIENT_SUITE, DestroyingTheClientEndsLiveStreams) {
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(worker->port());
  ASSERT_NE(client, nullptr);
  StreamPtr pulled = SubmitRemote(client.get(), Prompt(20, 11), 4000);
  StreamPtr queued = SubmitRemote(client.get(), Prompt(30, 12), 4000);
  StreamPtr with_callback = SubmitRemote(client.get(), Prompt(25, 13), 4000);
  ASSERT_NE(pulled, nullptr);
  ASSERT_NE(queued, nullptr);
  ASSERT_NE(with_callback, nullptr);
  std::atomic<int32_t> callback_reason{-1};
  ASSERT_EQ(chunkserve_stream_set_callback(
                with_callback.get(),
                [](const chunkserve_stream_event_t* e, void* user_data) {
                  if (e->kind == CHUNKSERVE_EVENT_FINISHED) {
                    static_cast<std::atomic<int32_t>*>(user_data)->store(e->finish_reason);
                  }
                },
                &callback_reason, nullptr),
            CHUNKSERVE_STATUS_OK);
  std::vector<int32_t> first;
  WaitForFirstToken(pulled.get(), &first);

  client.reset();  // destroy with three live streams

  const Outcome a = Drain(pulled.get(), first);
  EXPECT_EQ(a.finish.finish_reason, CHUNKSERVE_FINISH_UNAVAILABLE);
  EXPECT_EQ(a.finish.status, CHUNKSERVE_STATUS_UNAVAILABLE);
  EXPECT_THAT(a.message, HasSubstr("destroyed"));
  EXPECT_EQ(Drain(queued.get()).finish.finish_reason, CHUNKSERVE_FINISH_UNAVAILABLE);
  EXPECT_EQ(callback_reason.load(), CHUNKSERVE_FINISH_UNAVAILABLE);
  // The streams outlive their client: cancel and id still work, destroy frees them.
  EXPECT_EQ(chunkserve_stream_cancel(pulled.get(), nullptr), CHUNKSERVE_STATUS_OK);
  EXPECT_GT(chunkserve_stream_id(queued.get()), 0u);

  // The worker cancelled the dropped connection's requests: a new client is served promptly.
  ClientPtr next = ConnectOrDie(worker->port());
  StreamPtr s = SubmitRemote(next.get(), Prompt(10, 14), 3);
  EXPECT_EQ(Drain(s.get()).finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
}

TEST(CHUNKSERVE_CLIENT_SUITE, AnIdleClientOutlivesTheWorkersDeadlines) {
  // The worker closes connections whose first frame is later than 300 ms, and connections silent
  // for 600 ms. The client's first frame and its keepalive probes (every 150 ms) keep it open.
  auto worker = StartWorker({"--handshake-timeout-ms", "300", "--idle-timeout-ms", "600"});
  ASSERT_NE(worker, nullptr);
  chunkserve_client_options_t o = ClientOptions(worker->port());
  o.keepalive_interval_ms = 150;
  chunkserve_client_t* raw = nullptr;
  ASSERT_EQ(chunkserve_client_create(&o, &raw, nullptr), CHUNKSERVE_STATUS_OK);
  ClientPtr client(raw);
  std::this_thread::sleep_for(2s);
  StreamPtr s = SubmitRemote(client.get(), Prompt(10, 15), 3);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(Drain(s.get()).finish.finish_reason, CHUNKSERVE_FINISH_LENGTH);
}

#ifdef CHUNKSERVE_ROUTER_BIN
// A chunkserve-router child process on 127.0.0.1:0; killed when destroyed.
class RouterProcess {
 public:
  ~RouterProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }

  // Starts the router on `listen` (127.0.0.1:0: an ephemeral port); a second Start after Kill
  // brings up a new router process.
  bool Start(const std::string& listen = "127.0.0.1:0", std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {CHUNKSERVE_ROUTER_BIN, "--listen", listen};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    int fds[2];
    if (::pipe(fds) != 0) return false;
    pid_ = ::fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execv(CHUNKSERVE_ROUTER_BIN, argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
    std::string out;
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    const std::string prefix = "listening on 127.0.0.1:";
    while (std::chrono::steady_clock::now() < give_up) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n <= 0) return false;
      out.append(buf, static_cast<size_t>(n));
      const size_t at = out.find(prefix);
      if (at != std::string::npos && out.find('\n', at) != std::string::npos) {
        port_ = static_cast<uint16_t>(std::atoi(out.c_str() + at + prefix.size()));
        return port_ != 0;
      }
    }
    return false;
  }

  uint16_t port() const { return port_; }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Submits until the router has a worker: before the worker registers it answers "no workers
// available" (retryable, FINISH_UNAVAILABLE). Gives up after 60 s with the last outcome.
Outcome SubmitOnceServed(chunkserve_client_t* client, const std::vector<int32_t>& prompt,
                         int32_t max_new) {
  Outcome out;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  do {
    StreamPtr stream = SubmitRemote(client, prompt, max_new);
    if (stream == nullptr) return out;
    out = Drain(stream.get());
    if (out.finish.finish_reason != CHUNKSERVE_FINISH_UNAVAILABLE) break;
    std::this_thread::sleep_for(50ms);
  } while (std::chrono::steady_clock::now() < give_up);
  return out;
}

TEST(CHUNKSERVE_CLIENT_SUITE, ThroughARouterTheSameTokens) {
  RouterProcess router;
  ASSERT_TRUE(router.Start());
  auto worker = StartWorker({"--router", "127.0.0.1:" + std::to_string(router.port())});
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(router.port());
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> prompt = Prompt(70, 16);
  const Outcome out = SubmitOnceServed(client.get(), prompt, 10);
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_LENGTH) << out.message;
  EXPECT_EQ(out.tokens, InProcessTokens(prompt, 10));
}

// The router is killed (SIGKILL) and restarted on the same port while two threads keep
// submitting through one client: the client reconnects by itself, requests succeed again, and no
// stream outlives its deadline (plus the client's one-second grace) whatever happened to it.
TEST(CHUNKSERVE_CLIENT_SUITE, AClientRidesOutARouterRestart) {
  RouterProcess router;
  ASSERT_TRUE(router.Start());
  const uint16_t port = router.port();
  auto worker = StartWorker({"--router", "127.0.0.1:" + std::to_string(port)});
  ASSERT_NE(worker, nullptr);
  ClientPtr client = ConnectOrDie(port);
  ASSERT_NE(client, nullptr);

  constexpr uint64_t kDeadlineMs = 4000;
  // Each thread cycles through 7 prompts; what they generate alone is what any served attempt
  // must stream (and any attempt cut short by the restart a prefix of it).
  auto prompt_of = [](int seed, int i) { return Prompt(24, seed * 1000 + i % 7); };
  std::map<std::vector<int32_t>, std::vector<int32_t>> solo;
  {
    std::vector<std::vector<int32_t>> prompts;
    for (int seed : {1, 2}) {
      for (int i = 0; i < 7; ++i) prompts.push_back(prompt_of(seed, i));
    }
    const auto tokens = InProcessSolo(prompts, 6);
    for (size_t i = 0; i < prompts.size(); ++i) solo[prompts[i]] = tokens[i];
  }
  struct Attempt {
    chunkserve_status_t submit = CHUNKSERVE_STATUS_OK;
    int32_t finish = -1;
    std::chrono::steady_clock::time_point at;
    std::chrono::steady_clock::duration took{};
    std::vector<int32_t> prompt, tokens;
  };
  std::mutex mu;
  std::vector<Attempt> results;
  std::atomic<bool> stop{false};
  auto load = [&](int seed) {
    for (int i = 0; !stop.load(); ++i) {
      const std::vector<int32_t> prompt = prompt_of(seed, i);
      chunkserve_request_options_t r = RequestFor(prompt, 6);
      r.deadline_ms = kDeadlineMs;
      Attempt res;
      res.prompt = prompt;
      res.at = std::chrono::steady_clock::now();
      chunkserve_stream_t* raw = nullptr;
      res.submit = chunkserve_client_submit(client.get(), &r, &raw, nullptr);
      if (res.submit == CHUNKSERVE_STATUS_OK) {
        StreamPtr stream(raw);
        Outcome out = Drain(stream.get());
        res.finish = out.finish.finish_reason;
        res.tokens = std::move(out.tokens);
      }
      res.took = std::chrono::steady_clock::now() - res.at;
      {
        std::lock_guard<std::mutex> lock(mu);
        results.push_back(res);
      }
      if (res.submit != CHUNKSERVE_STATUS_OK || res.finish != CHUNKSERVE_FINISH_LENGTH) {
        std::this_thread::sleep_for(20ms);  // a caller's retry pause
      }
    }
  };
  auto successes_since = [&](std::chrono::steady_clock::time_point t) {
    std::lock_guard<std::mutex> lock(mu);
    return std::count_if(results.begin(), results.end(), [&](const Attempt& r) {
      return r.at >= t && r.finish == CHUNKSERVE_FINISH_LENGTH;
    });
  };
  std::thread a(load, 1), b(load, 2);
  // Served before the restart (the worker registers first).
  const auto started = std::chrono::steady_clock::now();
  WaitFor([&] { return successes_since(started) >= 4; });

  router.Kill();
  const auto killed = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(300ms);
  bool restarted = false;
  for (int attempt = 0; attempt < 50 && !restarted; ++attempt) {
    restarted = router.Start("127.0.0.1:" + std::to_string(port));
    if (!restarted) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(restarted);
  // The worker registers with the new router and the same client is served again.
  WaitFor([&] { return successes_since(killed + 300ms) >= 4; });
  const double back_after =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  stop = true;
  a.join();
  b.join();

  int refused = 0, lost = 0, ok = 0;
  for (const Attempt& r : results) {
    EXPECT_LT(r.took, std::chrono::milliseconds(kDeadlineMs) + 2s);
    if (r.submit != CHUNKSERVE_STATUS_OK) {
      EXPECT_EQ(r.submit, CHUNKSERVE_STATUS_UNAVAILABLE);  // retryable, while reconnecting
      ++refused;
    } else if (r.finish == CHUNKSERVE_FINISH_LENGTH) {
      EXPECT_EQ(r.tokens, solo[r.prompt]) << "a served request differs from a solo run";
      ++ok;
    } else {
      const std::vector<int32_t>& want = solo[r.prompt];
      EXPECT_TRUE(r.tokens.size() <= want.size() &&
                  std::equal(r.tokens.begin(), r.tokens.end(), want.begin()))
          << "a request cut short streamed tokens a solo run does not start with";
      // Ended by the restart (connection lost, no worker yet) or by the deadline: never a hang.
      EXPECT_TRUE(r.finish == CHUNKSERVE_FINISH_UNAVAILABLE ||
                  r.finish == CHUNKSERVE_FINISH_DEADLINE)
          << r.finish;
      ++lost;
    }
  }
  std::printf("router restart under load: %d served, %d ended by the restart, %d submits refused "
              "while reconnecting; served again %.1f s after the kill\n",
              ok, lost, refused, back_after);
}

// A router with a cluster secret and a client token: the client proves the token from
// $CHUNKSERVE_CLIENT_TOKEN; without it (or with a wrong one) its requests end UNAUTHENTICATED,
// not as a retryable loss.
TEST(CHUNKSERVE_CLIENT_SUITE, AuthenticatesWithTheTokenFromTheEnvironment) {
  char dir_template[] = "/tmp/chunkserve_client_auth_XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string secret = dir + "/secret", token = dir + "/token";
  {
    FILE* f = std::fopen(secret.c_str(), "w");
    std::fputs("0123456789abcdef0123456789abcdef\n", f);
    std::fclose(f);
    f = std::fopen(token.c_str(), "w");
    std::fputs("client-token-0123456789abcdef\n", f);
    std::fclose(f);
  }
  RouterProcess router;
  ASSERT_TRUE(router.Start("127.0.0.1:0", {"--secret-file", secret, "--client-token-file", token}));
  auto worker = StartWorker({"--router", "127.0.0.1:" + std::to_string(router.port()),
                             "--secret-file", secret});
  ASSERT_NE(worker, nullptr);
  const std::vector<int32_t> prompt = Prompt(30, 4);

  for (const char* key : {static_cast<const char*>(nullptr), "wrong-token-0123456789abcdef"}) {
    if (key == nullptr) {
      ::unsetenv("CHUNKSERVE_CLIENT_TOKEN");
    } else {
      ::setenv("CHUNKSERVE_CLIENT_TOKEN", key, 1);
    }
    ::unsetenv("CHUNKSERVE_CLUSTER_SECRET");
    ClientPtr client = ConnectOrDie(router.port());
    ASSERT_NE(client, nullptr);
    ExpectEveryAttemptUnauthenticated(client.get(), prompt, 5);
  }

  ::setenv("CHUNKSERVE_CLIENT_TOKEN", "client-token-0123456789abcdef", 1);
  ClientPtr client = ConnectOrDie(router.port());
  ::unsetenv("CHUNKSERVE_CLIENT_TOKEN");
  ASSERT_NE(client, nullptr);
  const Outcome out = SubmitOnceServed(client.get(), prompt, 4);
  EXPECT_EQ(out.finish.finish_reason, CHUNKSERVE_FINISH_LENGTH) << out.message;
  std::remove(secret.c_str());
  std::remove(token.c_str());
  ::rmdir(dir.c_str());
}
#endif  // CHUNKSERVE_ROUTER_BIN

}  // namespace
}  // namespace chunkserve::capi
