/* chunkserve from C, remotely: stream tokens from a chunkserve-worker or chunkserve-router.
 *
 *   chunkserve-worker --listen 127.0.0.1:7000 &
 *   chunkserve-example-c-remote 127.0.0.1 7000
 *
 * Connects with chunkserve_client_create, submits two requests that share a prompt prefix, pulls
 * their tokens with chunkserve_stream_next (the same stream API as the in-process engine), and
 * prints each request's terminal event. A server that goes away ends the streams with
 * CHUNKSERVE_FINISH_UNAVAILABLE, which is retryable: the program then exits with status 2.
 */
#include <chunkserve/chunkserve.h>
#include <stdio.h>
#include <stdlib.h>

enum { kRequests = 2, kPromptTokens = 48, kMaxNewTokens = 10 };

static void Check(chunkserve_status_t status, chunkserve_error_t* error, const char* what) {
  if (status == CHUNKSERVE_STATUS_OK) return;
  fprintf(stderr, "%s failed: %s: %s\n", what, chunkserve_status_name(status),
          chunkserve_error_message(error));
  chunkserve_error_free(error);
  exit(status == CHUNKSERVE_STATUS_UNAVAILABLE ? 2 : 1);
}

int main(int argc, char** argv) {
  chunkserve_client_options_t options;
  chunkserve_client_t* client = NULL;
  chunkserve_stream_t* streams[kRequests];
  int32_t prompts[kRequests][kPromptTokens];
  chunkserve_error_t* error = NULL;
  int unavailable = 0;
  int i, j;

  if (argc != 3) {
    fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
    return 1;
  }
  Check(chunkserve_client_options_init(&options, sizeof options, &error), error, "options_init");
  options.host = argv[1];
  options.port = atoi(argv[2]);
  options.connect_timeout_ms = 3000;
  Check(chunkserve_client_create(&options, &client, &error), error, "connect");
  printf("connected to %s:%s\n", argv[1], argv[2]);

  /* Both prompts share their first 32 tokens; the server may serve them from its prefix
   * cache. */
  for (i = 0; i < kRequests; ++i) {
    chunkserve_request_options_t request;
    for (j = 0; j < kPromptTokens; ++j) {
      prompts[i][j] = (int32_t)((j < 32 ? j * 7 + 3 : j * 11 + i * 101) % 1000);
    }
    Check(chunkserve_request_options_init(&request, sizeof request, &error), error,
          "request_options_init");
    request.prompt_tokens = prompts[i];
    request.num_prompt_tokens = kPromptTokens;
    request.max_new_tokens = kMaxNewTokens;
    Check(chunkserve_client_submit(client, &request, &streams[i], &error), error, "submit");
  }

  for (i = 0; i < kRequests; ++i) {
    chunkserve_stream_event_t event;
    chunkserve_status_t status;
    event.struct_size = sizeof event;
    printf("request %llu:", (unsigned long long)chunkserve_stream_id(streams[i]));
    /* Every request gets a FINISHED event, also when the connection fails, so this ends. */
    while ((status = chunkserve_stream_next(streams[i], 1000, &event, NULL)) !=
           CHUNKSERVE_STATUS_OUT_OF_RANGE) {
      if (status == CHUNKSERVE_STATUS_DEADLINE_EXCEEDED) continue; /* still generating */
      if (status != CHUNKSERVE_STATUS_OK) break;
      if (event.kind == CHUNKSERVE_EVENT_TOKEN) {
        printf(" %d", event.token);
        fflush(stdout);
        continue;
      }
      printf("\n  finished (%s): %d prompt tokens, %d cached, %d generated%s%s\n",
             chunkserve_finish_reason_name(event.finish_reason), event.prompt_tokens,
             event.cached_tokens, event.generated_tokens, event.error_message ? "; " : "",
             event.error_message ? event.error_message : "");
      if (event.finish_reason == CHUNKSERVE_FINISH_UNAVAILABLE) unavailable = 1;
    }
    chunkserve_stream_destroy(streams[i]);
  }
  chunkserve_client_destroy(client);
  return unavailable ? 2 : 0;
}
