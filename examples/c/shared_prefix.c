/* chunkserve from C: several requests that share a system prompt, streamed token by token.
 *
 * Creates an engine on the built-in tiny model, submits four requests whose prompts start with
 * the same 64-token "system prompt", pulls their tokens round-robin as they are generated, and
 * prints how much of the prompts the prefix cache served.
 *
 *   cc shared_prefix.c $(pkg-config --cflags --libs chunkserve) -o shared_prefix && ./shared_prefix
 */
#include <chunkserve/chunkserve.h>
#include <stdio.h>
#include <stdlib.h>

enum { kRequests = 4, kSystemTokens = 64, kUserTokens = 8, kMaxNewTokens = 12 };

/* Prints the error (if any), frees it and exits when status is not OK. */
static void Check(chunkserve_status_t status, chunkserve_error_t* error, const char* what) {
  if (status == CHUNKSERVE_STATUS_OK) return;
  fprintf(stderr, "%s failed: %s: %s\n", what, chunkserve_status_name(status),
          chunkserve_error_message(error));
  chunkserve_error_free(error);
  exit(1);
}

int main(void) {
  chunkserve_engine_options_t engine_options;
  chunkserve_engine_t* engine = NULL;
  chunkserve_stream_t* streams[kRequests];
  int32_t prompts[kRequests][kSystemTokens + kUserTokens];
  int finished[kRequests] = {0};
  int remaining = kRequests;
  chunkserve_error_t* error = NULL;
  chunkserve_engine_stats_t stats;
  int i, j;

  printf("libchunkserve %s (ABI %d)\n", chunkserve_version(), chunkserve_abi_version());
  if (chunkserve_abi_version() != CHUNKSERVE_ABI_VERSION) {
    fprintf(stderr, "built against ABI %d\n", CHUNKSERVE_ABI_VERSION);
    return 1;
  }

  Check(chunkserve_engine_options_init(&engine_options, sizeof engine_options, &error), error,
        "options_init");
#if CHUNKSERVE_VERSION_MAJOR > 0 || CHUNKSERVE_VERSION_MINOR >= 4
  engine_options.tiny_model = 1; /* the built-in tiny model (random weights): no download */
#else
  engine_options.model_path = NULL; /* before 0.4 (version 1 options): the built-in tiny model */
#endif
  engine_options.kv_cache_bytes = 32u << 20;
  engine_options.chunk_size = 16;
  Check(chunkserve_engine_create(&engine_options, &engine, &error), error, "engine_create");

  for (i = 0; i < kRequests; ++i) {
    chunkserve_request_options_t request;
    for (j = 0; j < kSystemTokens; ++j) prompts[i][j] = (j * 29 + 3) % 1024; /* shared */
    for (j = 0; j < kUserTokens; ++j) prompts[i][kSystemTokens + j] = 500 + 10 * i + j;
    Check(chunkserve_request_options_init(&request, sizeof request, &error), error,
          "request_options_init");
    request.prompt_tokens = prompts[i];
    request.num_prompt_tokens = kSystemTokens + kUserTokens;
    request.max_new_tokens = kMaxNewTokens;
    request.temperature = 0.7f;
    request.seed = (uint64_t)i;
    Check(chunkserve_engine_submit(engine, &request, &streams[i], &error), error, "submit");
  }

  while (remaining > 0) {
    for (i = 0; i < kRequests; ++i) {
      chunkserve_stream_event_t event;
      chunkserve_status_t status;
      if (finished[i]) continue;
      event.struct_size = sizeof event;
      status = chunkserve_stream_next(streams[i], 10, &event, &error);
      if (status == CHUNKSERVE_STATUS_DEADLINE_EXCEEDED) { /* nothing new yet */
        chunkserve_error_free(error);
        continue;
      }
      Check(status, error, "stream_next");
      if (event.kind == CHUNKSERVE_EVENT_TOKEN) {
        printf("request %d token #%d: %d\n", i, event.index, event.token);
      } else {
        printf(
            "request %d finished (%s): %d prompt tokens, %d from the prefix cache, %d "
            "generated\n",
            i, chunkserve_finish_reason_name(event.finish_reason), event.prompt_tokens,
            event.cached_tokens, event.generated_tokens);
        finished[i] = 1;
        --remaining;
      }
    }
  }

  stats.struct_size = sizeof stats;
  Check(chunkserve_engine_stats(engine, &stats, &error), error, "stats");
  printf(
      "engine: %llu requests, %llu prompt tokens, %llu served from the prefix cache, %llu "
      "generated\n",
      (unsigned long long)stats.requests_finished, (unsigned long long)stats.prompt_tokens,
      (unsigned long long)stats.prefix_hit_tokens, (unsigned long long)stats.generated_tokens);

  for (i = 0; i < kRequests; ++i) chunkserve_stream_destroy(streams[i]);
  chunkserve_engine_destroy(engine);
  return 0;
}
