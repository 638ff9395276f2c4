/* fuzz_safetensors.c - libFuzzer target: any bytes through the safetensors parser, then every
 * tensor it accepts read into float32. Besides sanitizer reports it stops on broken promises: a
 * refusal without a message, an accepted file whose tensors cannot be found or read, memory left
 * in the engine. tests/c/test_fuzz_corpus.c compiles this file too and replays the seed corpus
 * through the same entry point in the normal test run. */
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Checks one accepted file; false when the reader broke a promise. */
static bool accepted_file_holds(mrl_safetensors *f) {
  for (int64_t i = 0; i < mrl_safetensors_count(f); i++) {
    const mrl_safetensors_entry *t = mrl__safetensors_entry(f, i);
    const char *name = mrl_safetensors_name(f, i);
    if (!t || !name || mrl__safetensors_find(f, name) != i) return false;
    mrl_tensor *x = NULL;
    mrl_status st = mrl_safetensors_read(f, name, &x);
    if (st != (t->readable ? MRL_OK : MRL_ERR_UNSUPPORTED)) return false;
    if (x) {
      bool same = mrl_tensor_numel(x) == t->numel && mrl_tensor_rank(x) == t->rank;
      mrl_tensor_free(x);
      if (!same) return false;
    }
  }
  mrl_safetensors_metadata(f, "format");
  return mrl_safetensors_name(f, mrl_safetensors_count(f)) == NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mrl_engine *e = NULL;
  if (mrl_engine_new(&e) != MRL_OK) abort();
  mrl_safetensors *f = NULL;
  if (mrl__safetensors_parse(e, "fuzz", "input", data, size, &f) == MRL_OK) {
    bool ok = accepted_file_holds(f);
    mrl_safetensors_close(f);
    if (!ok) abort();
  } else if (f != NULL || mrl_engine_last_error(e)[0] == '\0') {
    abort();
  }
  if (mrl_engine_memory_used(e) != 0) abort();
  mrl_engine_free(e);
  return 0;
}
