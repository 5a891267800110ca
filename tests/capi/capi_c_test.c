/* The C header used from real C: compiled with -std=c99 -Wall -Wextra -Werror -pedantic, linked
 * against libchunkserve.so only. Plain checks, exit status 0 on success (no test framework).
 *
 * Walks the API end to end on the built-in tiny model: versions, options, errors, three requests
 * sharing a prompt prefix pulled with stream_next, a callback stream, cancellation, stats,
 * destroying the engine while a stream is still live, and the text functions (0.3), which the
 * tiny model, having no tokenizer, answers with FAILED_PRECONDITION. */
#define _POSIX_C_SOURCE 200809L

#include <chunkserve/chunkserve.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* assert() is compiled out in Release builds (NDEBUG), so checks are explicit. */
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* Checks a status; on failure prints the error object's code and message. */
#define CHECK_OK(call)                                                      \
  do {                                                                      \
    chunkserve_status_t check_st_ = (call);                                 \
    if (check_st_ != CHUNKSERVE_STATUS_OK) {                                \
      fprintf(stderr, "%s:%d: %s returned %s\n", __FILE__, __LINE__, #call, \
              chunkserve_status_name(check_st_));                           \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

enum { kSystemPromptLength = 48, kUserPromptLength = 8, kNumRequests = 3, kMaxNewTokens = 6 };

static chunkserve_engine_t* CreateEngine(void) {
  chunkserve_engine_options_t options;
  chunkserve_engine_t* engine = NULL;
  chunkserve_error_t* error = NULL;
  CHECK_OK(chunkserve_engine_options_init(&options, sizeof options, NULL));
  CHECK(options.struct_size == sizeof options);
  CHECK(options.model_path == NULL);
  CHECK(options.tiny_model == 0);
  /* Version 2 asks for random weights explicitly: without a model the engine is refused. */
  CHECK(chunkserve_engine_create(&options, &engine, &error) == CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(chunkserve_error_message(error), "no model") != NULL);
  chunkserve_error_free(error);
  error = NULL;
  options.tiny_model = 1;
  options.kv_cache_bytes = 8u << 20;
  options.chunk_size = 16;
  options.num_threads = 1;
  if (chunkserve_engine_create(&options, &engine, &error) != CHUNKSERVE_STATUS_OK) {
    fprintf(stderr, "engine_create: %s: %s\n", chunkserve_status_name(chunkserve_error_code(error)),
            chunkserve_error_message(error));
    chunkserve_error_free(error);
    exit(1);
  }
  CHECK(error == NULL);
  CHECK(engine != NULL);
  return engine;
}

static void TestVersions(void) {
  char expected[32];
  sprintf(expected, "%d.%d.%d", CHUNKSERVE_VERSION_MAJOR, CHUNKSERVE_VERSION_MINOR,
          CHUNKSERVE_VERSION_PATCH);
  CHECK(strcmp(chunkserve_version(), expected) == 0);
  CHECK(chunkserve_abi_version() == CHUNKSERVE_ABI_VERSION);
  CHECK(strcmp(chunkserve_status_name(CHUNKSERVE_STATUS_INVALID_ARGUMENT), "INVALID_ARGUMENT") ==
        0);
  CHECK(strcmp(chunkserve_status_name(12345), "UNKNOWN") == 0);
  CHECK(strcmp(chunkserve_finish_reason_name(CHUNKSERVE_FINISH_LENGTH), "length") == 0);
}

static void TestErrors(void) {
  chunkserve_engine_options_t options;
  chunkserve_error_t* error = NULL;
  chunkserve_engine_t* engine = NULL;
  /* A struct_size no version of the struct has. */
  CHECK(chunkserve_engine_options_init(&options, 3, &error) == CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  CHECK(error != NULL);
  CHECK(chunkserve_error_code(error) == CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(chunkserve_error_message(error), "struct_size") != NULL);
  chunkserve_error_free(error);
  /* out_error may be NULL. */
  CHECK(chunkserve_engine_create(NULL, NULL, NULL) == CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  CHECK_OK(chunkserve_engine_options_init(&options, sizeof options, NULL));
  options.model_path = "/nonexistent/chunkserve/model";
  CHECK(chunkserve_engine_create(&options, &engine, &error) != CHUNKSERVE_STATUS_OK);
  CHECK(engine == NULL);
  CHECK(chunkserve_error_message(error)[0] != '\0');
  chunkserve_error_free(error);
  /* NULL is accepted everywhere an object is released or inspected. */
  chunkserve_error_free(NULL);
  chunkserve_engine_destroy(NULL);
  chunkserve_stream_destroy(NULL);
  CHECK(chunkserve_error_code(NULL) == CHUNKSERVE_STATUS_OK);
  CHECK(strcmp(chunkserve_error_message(NULL), "") == 0);
  CHECK(chunkserve_stream_id(NULL) == 0);
}

static void TestBadRequest(chunkserve_engine_t* engine) {
  chunkserve_request_options_t request;
  chunkserve_stream_t* stream = NULL;
  chunkserve_error_t* error = NULL;
  int32_t prompt[2] = {5, 1024}; /* vocab is 1024: the second id is out of range */
  CHECK_OK(chunkserve_request_options_init(&request, sizeof request, NULL));
  request.prompt_tokens = prompt;
  request.num_prompt_tokens = 2;
  CHECK(chunkserve_engine_submit(engine, &request, &stream, &error) ==
        CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  CHECK(stream == NULL);
  CHECK(strstr(chunkserve_error_message(error), "1024") != NULL);
  chunkserve_error_free(error);
}

/* The tiny model has no tokenizer: the text functions say so, and fill nothing. */
static void TestTextWithoutTokenizer(chunkserve_engine_t* engine) {
  static const char kText[] = "hello";
  const char* roles[1] = {"user"};
  const char* contents[1] = {"hi"};
  int32_t ids[8];
  char text[16];
  size_t n = 99;
  chunkserve_detokenizer_t* detokenizer = NULL;
  chunkserve_error_t* error = NULL;
  CHECK(chunkserve_tokenize(engine, kText, sizeof kText - 1, 0, ids, 8, &n, &error) ==
        CHUNKSERVE_STATUS_FAILED_PRECONDITION);
  CHECK(n == 0);
  CHECK(strstr(chunkserve_error_message(error), "chunkserve_tokenize: ") ==
        chunkserve_error_message(error));
  CHECK(strstr(chunkserve_error_message(error), "tiny model") != NULL);
  chunkserve_error_free(error);
  CHECK(chunkserve_detokenize(engine, ids, 0, 1, text, sizeof text, &n, NULL) ==
        CHUNKSERVE_STATUS_FAILED_PRECONDITION);
  CHECK(chunkserve_detokenizer_create(engine, 1, &detokenizer, NULL) ==
        CHUNKSERVE_STATUS_FAILED_PRECONDITION);
  CHECK(detokenizer == NULL);
  chunkserve_detokenizer_destroy(detokenizer); /* NULL: a no-op */
  CHECK(chunkserve_apply_chat_template(engine, roles, contents, 1, 1, text, sizeof text, &n,
                                       NULL) == CHUNKSERVE_STATUS_FAILED_PRECONDITION);
  CHECK(chunkserve_engine_eos_ids(engine, ids, 8, &n, NULL) ==
        CHUNKSERVE_STATUS_FAILED_PRECONDITION);
  CHECK(chunkserve_detokenizer_push(NULL, 1, text, sizeof text, &n, NULL) ==
        CHUNKSERVE_STATUS_INVALID_ARGUMENT);
  CHECK(chunkserve_detokenizer_flush(NULL, text, sizeof text, &n, NULL) ==
        CHUNKSERVE_STATUS_INVALID_ARGUMENT);
}

/* Three requests sharing a system prompt, pulled round-robin with short timeouts. */
static void TestSharedPrefixPull(chunkserve_engine_t* engine) {
  int32_t prompts[kNumRequests][kSystemPromptLength + kUserPromptLength];
  chunkserve_stream_t* streams[kNumRequests];
  int generated[kNumRequests];
  int finished[kNumRequests];
  int cached_total = 0;
  int remaining = kNumRequests;
  int i, j;
  chunkserve_engine_stats_t stats;
  for (i = 0; i < kNumRequests; ++i) {
    chunkserve_request_options_t request;
    for (j = 0; j < kSystemPromptLength; ++j) prompts[i][j] = (j * 37 + 11) % 1024;
    for (j = 0; j < kUserPromptLength; ++j) prompts[i][kSystemPromptLength + j] = 100 * i + j + 3;
    CHECK_OK(chunkserve_request_options_init(&request, sizeof request, NULL));
    request.prompt_tokens = prompts[i];
    request.num_prompt_tokens = kSystemPromptLength + kUserPromptLength;
    request.max_new_tokens = kMaxNewTokens;
    CHECK_OK(chunkserve_engine_submit(engine, &request, &streams[i], NULL));
    CHECK(chunkserve_stream_id(streams[i]) != 0);
    generated[i] = 0;
    finished[i] = 0;
  }
  CHECK(chunkserve_stream_id(streams[0]) != chunkserve_stream_id(streams[1]));
  while (remaining > 0) {
    for (i = 0; i < kNumRequests; ++i) {
      chunkserve_stream_event_t event;
      chunkserve_status_t st;
      if (finished[i]) continue;
      event.struct_size = sizeof event;
      st = chunkserve_stream_next(streams[i], 20, &event, NULL);
      if (st == CHUNKSERVE_STATUS_DEADLINE_EXCEEDED) continue;
      CHECK(st == CHUNKSERVE_STATUS_OK);
      if (event.kind == CHUNKSERVE_EVENT_TOKEN) {
        CHECK(event.index == generated[i]);
        CHECK(event.token >= 0 && event.token < 1024);
        ++generated[i];
      } else {
        CHECK(event.kind == CHUNKSERVE_EVENT_FINISHED);
        CHECK(event.finish_reason == CHUNKSERVE_FINISH_LENGTH);
        CHECK(event.status == CHUNKSERVE_STATUS_OK);
        CHECK(event.error_message == NULL);
        CHECK(event.generated_tokens == kMaxNewTokens);
        CHECK(event.prompt_tokens == kSystemPromptLength + kUserPromptLength);
        cached_total += event.cached_tokens;
        finished[i] = 1;
        --remaining;
      }
    }
  }
  for (i = 0; i < kNumRequests; ++i) {
    chunkserve_stream_event_t event;
    CHECK(generated[i] == kMaxNewTokens);
    event.struct_size = sizeof event;
    CHECK(chunkserve_stream_next(streams[i], 0, &event, NULL) == CHUNKSERVE_STATUS_OUT_OF_RANGE);
    /* Cancelling a finished stream is a harmless no-op. */
    CHECK_OK(chunkserve_stream_cancel(streams[i], NULL));
    chunkserve_stream_destroy(streams[i]);
  }
  stats.struct_size = sizeof stats;
  CHECK_OK(chunkserve_engine_stats(engine, &stats, NULL));
  CHECK(stats.requests_submitted >= kNumRequests);
  CHECK(stats.generated_tokens >= kNumRequests * kMaxNewTokens);
  CHECK(stats.kv_bytes_capacity > 0);
  /* The 48-token system prompt is three full 16-token chunks; whether a request finds them cached
   * depends on scheduling (they may all prefill together), so only report. */
  printf("shared prefix: %d prompt tokens served from the cache\n", cached_total);
}

struct CallbackState {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int tokens;
  int finished;
  int32_t finish_reason;
};

static void OnEvent(const chunkserve_stream_event_t* event, void* user_data) {
  struct CallbackState* state = (struct CallbackState*)user_data;
  pthread_mutex_lock(&state->mu);
  if (event->kind == CHUNKSERVE_EVENT_TOKEN) {
    ++state->tokens;
  } else {
    state->finished = 1;
    state->finish_reason = event->finish_reason;
    pthread_cond_broadcast(&state->cv);
  }
  pthread_mutex_unlock(&state->mu);
}

static void TestCallback(chunkserve_engine_t* engine) {
  struct CallbackState state;
  chunkserve_request_options_t request;
  chunkserve_stream_t* stream = NULL;
  chunkserve_stream_event_t event;
  int32_t prompt[4] = {1, 2, 3, 4};
  pthread_mutex_init(&state.mu, NULL);
  pthread_cond_init(&state.cv, NULL);
  state.tokens = 0;
  state.finished = 0;
  state.finish_reason = -1;
  CHECK_OK(chunkserve_request_options_init(&request, sizeof request, NULL));
  request.prompt_tokens = prompt;
  request.num_prompt_tokens = 4;
  request.max_new_tokens = 5;
  request.temperature = 0.8f;
  request.seed = 42;
  CHECK_OK(chunkserve_engine_submit(engine, &request, &stream, NULL));
  CHECK_OK(chunkserve_stream_set_callback(stream, OnEvent, &state, NULL));
  pthread_mutex_lock(&state.mu);
  while (!state.finished) pthread_cond_wait(&state.cv, &state.mu);
  pthread_mutex_unlock(&state.mu);
  CHECK(state.tokens == 5);
  CHECK(state.finish_reason == CHUNKSERVE_FINISH_LENGTH);
  event.struct_size = sizeof event;
  CHECK(chunkserve_stream_next(stream, 0, &event, NULL) == CHUNKSERVE_STATUS_FAILED_PRECONDITION);
  chunkserve_stream_destroy(stream);
  pthread_cond_destroy(&state.cv);
  pthread_mutex_destroy(&state.mu);
}

static void TestCancel(chunkserve_engine_t* engine) {
  chunkserve_request_options_t request;
  chunkserve_stream_t* stream = NULL;
  chunkserve_stream_event_t event;
  int32_t prompt[3] = {9, 8, 7};
  CHECK_OK(chunkserve_request_options_init(&request, sizeof request, NULL));
  request.prompt_tokens = prompt;
  request.num_prompt_tokens = 3;
  request.max_new_tokens = 1000;
  CHECK_OK(chunkserve_engine_submit(engine, &request, &stream, NULL));
  CHECK_OK(chunkserve_stream_cancel(stream, NULL));
  event.struct_size = sizeof event;
  do {
    CHECK_OK(chunkserve_stream_next(stream, CHUNKSERVE_WAIT_FOREVER, &event, NULL));
  } while (event.kind == CHUNKSERVE_EVENT_TOKEN);
  CHECK(event.finish_reason == CHUNKSERVE_FINISH_CANCELLED);
  CHECK(event.generated_tokens < 1000);
  /* The engine no longer knows the request. */
  CHECK(chunkserve_engine_cancel(engine, chunkserve_stream_id(stream), NULL) ==
        CHUNKSERVE_STATUS_NOT_FOUND);
  chunkserve_stream_destroy(stream);
}

/* Destroying the engine ends a live stream with UNAVAILABLE; the stream stays usable. */
static void TestEngineDestroyedUnderStream(void) {
  chunkserve_engine_t* engine = CreateEngine();
  chunkserve_request_options_t request;
  chunkserve_stream_t* stream = NULL;
  chunkserve_stream_event_t event;
  int32_t prompt[2] = {10, 20};
  CHECK_OK(chunkserve_request_options_init(&request, sizeof request, NULL));
  request.prompt_tokens = prompt;
  request.num_prompt_tokens = 2;
  request.max_new_tokens = 1000;
  CHECK_OK(chunkserve_engine_submit(engine, &request, &stream, NULL));
  chunkserve_engine_destroy(engine);
  event.struct_size = sizeof event;
  do {
    CHECK_OK(chunkserve_stream_next(stream, CHUNKSERVE_WAIT_FOREVER, &event, NULL));
  } while (event.kind == CHUNKSERVE_EVENT_TOKEN);
  CHECK(event.finish_reason == CHUNKSERVE_FINISH_UNAVAILABLE);
  CHECK(event.status == CHUNKSERVE_STATUS_UNAVAILABLE);
  CHECK(event.error_message != NULL && event.error_message[0] != '\0');
  CHECK_OK(chunkserve_stream_cancel(stream, NULL));
  chunkserve_stream_destroy(stream);
}

int main(void) {
  chunkserve_engine_t* engine;
  TestVersions();
  TestErrors();
  engine = CreateEngine();
  TestBadRequest(engine);
  TestTextWithoutTokenizer(engine);
  TestSharedPrefixPull(engine);
  TestCallback(engine);
  TestCancel(engine);
  CHECK_OK(chunkserve_engine_shutdown(engine, CHUNKSERVE_SHUTDOWN_DRAIN, NULL));
  chunkserve_engine_destroy(engine);
  TestEngineDestroyedUnderStream();
  printf("capi_c_test: all checks passed\n");
  return 0;
}
