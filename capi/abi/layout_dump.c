/* Prints the C compiler's view of every struct in chunkserve.h: one line per struct size and per
 * field offset/size. Bindings that redeclare the ABI by hand (bindings/rust/chunkserve-sys) compare
 * their own layouts against this output in their tests, so a drift between the header and a
 * binding fails a test instead of corrupting memory. Lines:
 *   struct <type> <sizeof> <alignof>
 *   field <type> <field> <offsetof> <sizeof>
 * The Rust test also parses the header, so a field missing from this list fails it too. */
#include <chunkserve/chunkserve.h>

#include <stddef.h>
#include <stdio.h>

#define STRUCT(T)                                                               \
  printf("struct %s %lu %lu\n", #T, (unsigned long)sizeof(T),                   \
         (unsigned long)offsetof(struct { char c; T t; }, t))
#define FIELD(T, f)                                                             \
  printf("field %s %s %lu %lu\n", #T, #f, (unsigned long)offsetof(T, f),        \
         (unsigned long)sizeof(((T*)0)->f))

int main(void) {
  STRUCT(chunkserve_engine_options_t);
  FIELD(chunkserve_engine_options_t, struct_size);
  FIELD(chunkserve_engine_options_t, backend);
  FIELD(chunkserve_engine_options_t, model_path);
  FIELD(chunkserve_engine_options_t, kv_cache_bytes);
  FIELD(chunkserve_engine_options_t, chunk_size);
  FIELD(chunkserve_engine_options_t, kv_dtype);
  FIELD(chunkserve_engine_options_t, enable_prefix_sharing);
  FIELD(chunkserve_engine_options_t, num_threads);
  FIELD(chunkserve_engine_options_t, max_batch_size);
  FIELD(chunkserve_engine_options_t, prefill_token_budget);
  FIELD(chunkserve_engine_options_t, max_queued_requests);
  FIELD(chunkserve_engine_options_t, reserved0);
  FIELD(chunkserve_engine_options_t, tiny_model);
  FIELD(chunkserve_engine_options_t, gguf_dtype);

  STRUCT(chunkserve_request_options_t);
  FIELD(chunkserve_request_options_t, struct_size);
  FIELD(chunkserve_request_options_t, max_new_tokens);
  FIELD(chunkserve_request_options_t, prompt_tokens);
  FIELD(chunkserve_request_options_t, num_prompt_tokens);
  FIELD(chunkserve_request_options_t, stop_tokens);
  FIELD(chunkserve_request_options_t, num_stop_tokens);
  FIELD(chunkserve_request_options_t, temperature);
  FIELD(chunkserve_request_options_t, top_k);
  FIELD(chunkserve_request_options_t, top_p);
  FIELD(chunkserve_request_options_t, priority);
  FIELD(chunkserve_request_options_t, seed);
  FIELD(chunkserve_request_options_t, deadline_ms);
  FIELD(chunkserve_request_options_t, logprobs);
  FIELD(chunkserve_request_options_t, reserved0);

  STRUCT(chunkserve_engine_stats_t);
  FIELD(chunkserve_engine_stats_t, struct_size);
  FIELD(chunkserve_engine_stats_t, running);
  FIELD(chunkserve_engine_stats_t, requests_submitted);
  FIELD(chunkserve_engine_stats_t, requests_finished);
  FIELD(chunkserve_engine_stats_t, prompt_tokens);
  FIELD(chunkserve_engine_stats_t, prefix_hit_tokens);
  FIELD(chunkserve_engine_stats_t, prefill_tokens);
  FIELD(chunkserve_engine_stats_t, generated_tokens);
  FIELD(chunkserve_engine_stats_t, steps);
  FIELD(chunkserve_engine_stats_t, evicted_chunks);
  FIELD(chunkserve_engine_stats_t, preemptions);
  FIELD(chunkserve_engine_stats_t, queued);
  FIELD(chunkserve_engine_stats_t, last_batch_size);
  FIELD(chunkserve_engine_stats_t, kv_bytes_used);
  FIELD(chunkserve_engine_stats_t, kv_bytes_referenced);
  FIELD(chunkserve_engine_stats_t, kv_bytes_if_unshared);
  FIELD(chunkserve_engine_stats_t, kv_bytes_capacity);
  FIELD(chunkserve_engine_stats_t, kv_bytes_peak);
  FIELD(chunkserve_engine_stats_t, chunks_total);
  FIELD(chunkserve_engine_stats_t, chunks_shared);
  FIELD(chunkserve_engine_stats_t, chunks_retained);
  FIELD(chunkserve_engine_stats_t, reserved0);
  FIELD(chunkserve_engine_stats_t, decode_tokens_per_s);
  FIELD(chunkserve_engine_stats_t, prefill_tokens_per_s);

  STRUCT(chunkserve_engine_info_t);
  FIELD(chunkserve_engine_info_t, struct_size);
  FIELD(chunkserve_engine_info_t, vocab_size);
  FIELD(chunkserve_engine_info_t, max_context);
  FIELD(chunkserve_engine_info_t, chunk_size);
  FIELD(chunkserve_engine_info_t, model_fingerprint);

  STRUCT(chunkserve_stream_event_t);
  FIELD(chunkserve_stream_event_t, struct_size);
  FIELD(chunkserve_stream_event_t, kind);
  FIELD(chunkserve_stream_event_t, token);
  FIELD(chunkserve_stream_event_t, index);
  FIELD(chunkserve_stream_event_t, finish_reason);
  FIELD(chunkserve_stream_event_t, status);
  FIELD(chunkserve_stream_event_t, prompt_tokens);
  FIELD(chunkserve_stream_event_t, cached_tokens);
  FIELD(chunkserve_stream_event_t, generated_tokens);
  FIELD(chunkserve_stream_event_t, reserved0);
  FIELD(chunkserve_stream_event_t, error_message);
  FIELD(chunkserve_stream_event_t, num_top_logprobs);
  FIELD(chunkserve_stream_event_t, logprob);
  FIELD(chunkserve_stream_event_t, top_tokens);
  FIELD(chunkserve_stream_event_t, top_logprobs);

  STRUCT(chunkserve_client_options_t);
  FIELD(chunkserve_client_options_t, struct_size);
  FIELD(chunkserve_client_options_t, port);
  FIELD(chunkserve_client_options_t, host);
  FIELD(chunkserve_client_options_t, connect_timeout_ms);
  FIELD(chunkserve_client_options_t, keepalive_interval_ms);
  FIELD(chunkserve_client_options_t, tls_ca_file);
  FIELD(chunkserve_client_options_t, tls_cert_file);
  FIELD(chunkserve_client_options_t, tls_key_file);
  FIELD(chunkserve_client_options_t, tls_crl_file);
  return 0;
}
