/* test_fuzz_request_corpus.c - replays the request-body fuzzer's seed corpus
 * (tests/fuzz/request_corpus) through the fuzz target's own entry point, so every normal and
 * sanitizer test run covers each seed (the target aborts on a broken promise), and checks each
 * seed's status against the one its name carries (NAME-sSTATUS.req). */
#include "support.h"

/* the fuzz target itself */
#include "../fuzz/fuzz_request.c"

#include <stdio.h>
#include <string.h>

typedef struct {
  int seeds, by_status[3]; /* 200, 400, 404 */
} corpus_seen;

static void replay_one(const char *name, const unsigned char *data, size_t n, void *ud) {
  corpus_seen *c = ud;
  LLVMFuzzerTestOneInput(data, n);
  const char *mark = strrchr(name, '-');
  int want = -1;
  CHECKF(mark && sscanf(mark, "-s%d.req", &want) == 1, "%s: no -sN.req in the name", name);
  CHECKF(n > 0, "%s: empty", name);
  if (n == 0) return;
  mrl_server *s = server();
  s->tool_format = data[0] & 8 ? 1 : 0;
  srv_buf reply = {0};
  int got = mrl__serve_check_request(s, kinds[data[0] & 7], (const char *)data + 1, n - 1, &reply);
  CHECKF(got == want, "%s: status %d, want %d: %.200s", name, got, want, reply.p ? reply.p : "");
  mrl__sb_free(&reply);
  c->seeds++;
  c->by_status[got == 200 ? 0 : got == 400 ? 1 : 2]++;
}

static void test_corpus(void) {
  corpus_seen c = {0};
  if (for_each_file("tests/fuzz/request_corpus", replay_one, &c) >= 0) {
    CHECKF(c.seeds >= 30, "only %d seeds", c.seeds);
    check_note("%d seeds replayed: %d valid, %d refused with 400, %d with 404", c.seeds,
               c.by_status[0], c.by_status[1], c.by_status[2]);
  }
  mrl_server *s = server();
  mrl_tokenizer_free(s->t);
  CHECK(mrl_engine_memory_used(s->e) == 0);
  mrl_engine_free(s->e);
  pthread_mutex_destroy(&s->mu);
}

static const test_case tests[] = {
    {"request-body fuzz corpus replays with the statuses its names carry", test_corpus},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
