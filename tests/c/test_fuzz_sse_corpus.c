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

typedef struct {
  mrl_engine *e;
  int seeds, events;
} corpus_seen;

static void replay_one(const char *name, const unsigned char *data, size_t n, void *ud) {
  corpus_seen *c = ud;
  LLVMFuzzerTestOneInput(data, n);
  const char *mark = strrchr(name, '-');
  int want = -1;
  CHECKF(mark && sscanf(mark, "-e%d.sse", &want) == 1, "%s: no -eN.sse in the name", name);
  mrl_sse *p = NULL;
  MUST(mrl_sse_new(c->e, 0, &p));
  int events = 0;
  CHECKF(mrl_sse_feed(p, (const char *)data, n, count_event, &events) == MRL_OK, "%s: %s", name,
         mrl_engine_last_error(c->e));
  MUST(mrl_sse_finish(p, NULL));
  mrl_sse_free(p);
  CHECKF(events == want, "%s: %d events, want %d", name, events, want);
  c->seeds++;
  c->events += events;
}

static void test_corpus(void) {
  corpus_seen c = {.e = new_engine()};
  if (for_each_file("tests/fuzz/sse_corpus", replay_one, &c) >= 0) {
    CHECKF(c.seeds >= 20, "only %d seeds", c.seeds);
    check_note("%d seeds replayed (%d events)", c.seeds, c.events);
  }
  CHECK(mrl_engine_memory_used(c.e) == 0);
  mrl_engine_free(c.e);
}

static const test_case tests[] = {
    {"SSE fuzz corpus replays cleanly", test_corpus},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
