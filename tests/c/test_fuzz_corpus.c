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


static void test_corpus(void) {
  const char *root = getenv("MOONRL_ROOT");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus", root ? root : ".");
  DIR *d = opendir(dir);
  if (!CHECKF(d != NULL, "cannot open %s", dir)) return;
  int valid = 0, bad = 0;
  struct dirent *de;
  mrl_engine *e = new_engine();
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    size_t n = 0;
    unsigned char *data = read_bytes(path, &n);
    if (!CHECKF(data != NULL, "cannot read %s", path)) continue;
    LLVMFuzzerTestOneInput(data, n);
    mrl_safetensors *f = NULL;
    mrl_status st = mrl__safetensors_parse(e, "replay", de->d_name, data, n, &f);
    if (strncmp(de->d_name, "valid_", 6) == 0) {
      CHECKF(st == MRL_OK, "%s refused: %s", de->d_name, mrl_engine_last_error(e));
      valid++;
    } else {
      CHECKF(st == MRL_ERR_INVALID, "%s: status %d, want a refusal", de->d_name, st);
      bad++;
    }
    mrl_safetensors_close(f);
    free(data);
  }
  closedir(d);
  CHECKF(valid >= 10 && bad >= 25, "only %d valid and %d refused seeds", valid, bad);
  check_note("%d valid and %d refused seeds replayed", valid, bad);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static const test_case tests[] = {
    {"fuzz corpus replays cleanly", test_corpus},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
