/* test_fuzz_corpus.c - replays the fuzzer's seed corpus (tests/fuzz/corpus) through the fuzz
 * target's own entry point, so every normal and sanitizer test run covers each seed, and checks
 * each seed's fate by its name: valid_* files are accepted, bad_* files refused with a message. */
#include "support.h"

/* the fuzz target itself: LLVMFuzzerTestOneInput aborts when the reader breaks a promise */
#include "../fuzz/fuzz_safetensors.c"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct {
  mrl_engine *e;
  int valid, bad;
} corpus_seen;

static void replay_one(const char *name, const unsigned char *data, size_t n, void *ud) {
  corpus_seen *c = ud;
  LLVMFuzzerTestOneInput(data, n);
  mrl_safetensors *f = NULL;
  mrl_status st = mrl__safetensors_parse(c->e, "replay", name, data, n, &f);
  if (strncmp(name, "valid_", 6) == 0) {
    CHECKF(st == MRL_OK, "%s refused: %s", name, mrl_engine_last_error(c->e));
    c->valid++;
  } else {
    CHECKF(st == MRL_ERR_INVALID, "%s: status %d, want a refusal", name, st);
    c->bad++;
  }
  mrl_safetensors_close(f);
}

static void test_corpus(void) {
  corpus_seen c = {.e = new_engine()};
  if (for_each_file("tests/fuzz/corpus", replay_one, &c) >= 0) {
    CHECKF(c.valid >= 10 && c.bad >= 25, "only %d valid and %d refused seeds", c.valid, c.bad);
    check_note("%d valid and %d refused seeds replayed", c.valid, c.bad);
  }
  CHECK(mrl_engine_memory_used(c.e) == 0);
  mrl_engine_free(c.e);
}

static const test_case tests[] = {
    {"fuzz corpus replays cleanly", test_corpus},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
