/* test_fuzz_sse_corpus.c - replays the SSE fuzzer's seed corpus (tests/fuzz/sse_corpus) through
 * the fuzz target's own entry point, so every normal and sanitizer test run covers each seed
 * (the target aborts on a broken promise), and checks each seed's event count, which its name
 * carries (NAME-eN.sse). */
#include "support.h"

/* the fuzz target itself */
#include "../fuzz/fuzz_sse.c"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int count_event(void *ud, const mrl_sse_event *ev) {
  (void)ev;
  ++*(int *)ud;
  return 0;
}

static void test_corpus(void) {
  const char *root = getenv("MOONRL_ROOT");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/tests/fuzz/sse_corpus", root ? root : ".");
  DIR *d = opendir(dir);
  if (!CHECKF(d != NULL, "cannot open %s", dir)) return;
  int seeds = 0, events_total = 0;
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
    const char *mark = strrchr(de->d_name, '-');
    int want = -1;
    CHECKF(mark && sscanf(mark, "-e%d.sse", &want) == 1, "%s: no -eN.sse in the name", de->d_name);
    mrl_sse *p = NULL;
    MUST(mrl_sse_new(e, 0, &p));
    int events = 0;
    CHECKF(mrl_sse_feed(p, (const char *)data, n, count_event, &events) == MRL_OK, "%s: %s",
           de->d_name, mrl_engine_last_error(e));
    MUST(mrl_sse_finish(p, NULL));
    mrl_sse_free(p);
    CHECKF(events == want, "%s: %d events, want %d", de->d_name, events, want);
    seeds++;
    events_total += events;
    free(data);
  }
  closedir(d);
  CHECKF(seeds >= 20, "only %d seeds", seeds);
  check_note("%d seeds replayed (%d events)", seeds, events_total);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static const test_case tests[] = {
    {"SSE fuzz corpus replays cleanly", test_corpus},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
