/* Asks libchunkserve for an engine on the CUDA backend and prints the outcome as
 * "<STATUS_NAME> <message>" (or "OK"); exits 0 whatever the outcome. For cuda_plugin_test.sh. */
#include <chunkserve/chunkserve.h>
#include <stdio.h>

int main(void) {
  chunkserve_engine_options_t o;
  chunkserve_engine_options_init(&o, sizeof o, NULL);
  o.tiny_model = 1;
  o.backend = CHUNKSERVE_BACKEND_CUDA;
  o.kv_dtype = CHUNKSERVE_DTYPE_F16;
  o.kv_cache_bytes = 32u << 20;
  o.chunk_size = 16;
  chunkserve_engine_t* engine = NULL;
  chunkserve_error_t* error = NULL;
  const chunkserve_status_t status = chunkserve_engine_create(&o, &engine, &error);
  printf("%s %s\n", chunkserve_status_name(status), error ? chunkserve_error_message(error) : "");
  chunkserve_error_free(error);
  chunkserve_engine_destroy(engine);
  return 0;
}
