/* fuzz_sse.c - libFuzzer target: any bytes through the Server-Sent Events parser (mrl_sse), fed
 * several ways, which must agree. Besides sanitizer reports it stops (abort) on a broken promise:
 *   - the events (type, data, id, retry, done), the comment count and finish's "dropped" are the
 *     same whether the bytes come at once, one at a time, or in chunks of varying sizes;
 *   - every event is well formed: type and id free of CR and LF, data NUL-terminated at
 *     data_len with no CR in it, done exactly when data is "[DONE]", retry >= -1 (a type may
 *     hold a NUL, as `event:` takes any bytes, so its C string may read as empty);
 *   - with a short line limit the parser either agrees with the unlimited one or fails with
 *     MRL_ERR_RANGE and a message after a prefix of its events (at once and byte by byte alike);
 *   - a callback that stops at the k-th event gets exactly the first k events, and the feed
 *     fails with MRL_ERR_INVALID;
 *   - under a memory cap the parser agrees or fails with MRL_ERR_NOMEM after a prefix;
 *   - nothing is left in the engine once the parsers are freed.
 * The first input byte also picks the line limit, the chunk sizes, the stop and the cap, so the
 * fuzzer explores them too. tests/c/test_fuzz_sse_corpus.c compiles this file and replays the
 * seed corpus (tests/fuzz/sse_corpus) through the same entry point in the normal test run. */
#include "moonrl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What one pass saw: the events written out one after another, with where each one ends. */
typedef struct {
  unsigned char *p;
  size_t len, cap;
  size_t *ends;
  size_t n, ends_cap;
  size_t stop_at; /* the callback asks to stop at this event (0: never) */
} trace;

static void put(trace *t, const void *s, size_t n) {
  if (t->len + n > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + n) cap *= 2;
    unsigned char *p = realloc(t->p, cap);
    if (!p) abort();
    t->p = p;
    t->cap = cap;
  }
  if (n) memcpy(t->p + t->len, s, n);
  t->len += n;
}

static void put_size(trace *t, uint64_t v) { put(t, &v, sizeof v); }

static int has_line_end(const char *s, size_t n) {
  return memchr(s, '\r', n) != NULL || memchr(s, '\n', n) != NULL;
}

static int on_event(void *ud, const mrl_sse_event *ev) {
  trace *t = ud;
  if (!ev->type || !ev->data || !ev->id) abort();
  size_t type_len = strlen(ev->type), id_len = strlen(ev->id);
  if (has_line_end(ev->type, type_len) || has_line_end(ev->id, id_len)) abort();
  if (ev->data[ev->data_len] != '\0' || memchr(ev->data, '\r', ev->data_len)) abort();
  int done = ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0;
  if (ev->done != done || ev->retry_ms < -1) abort();
  put_size(t, type_len);
  put(t, ev->type, type_len);
  put_size(t, ev->data_len);
  put(t, ev->data, ev->data_len);
  put_size(t, id_len);
  put(t, ev->id, id_len);
  put_size(t, (uint64_t)ev->retry_ms);
  put_size(t, (uint64_t)ev->done);
  if (t->n == t->ends_cap) {
    t->ends_cap = t->ends_cap ? 2 * t->ends_cap : 16;
    size_t *ends = realloc(t->ends, t->ends_cap * sizeof *ends);
    if (!ends) abort();
    t->ends = ends;
  }
  t->ends[t->n++] = t->len;
  return t->stop_at && t->n == t->stop_at;
}

typedef struct {
  mrl_status status; /* of the feeds (the first failure) */
  int dropped;       /* from finish, when the feeds succeeded */
  int64_t comments;
} outcome;

/* Feeds data in chunks: all at once (chunk 0), by `chunk` bytes, or (chunk < 0) in sizes from a
 * small generator seeded by -chunk. */
static outcome run(mrl_engine *e, size_t max_line, const uint8_t *data, size_t size, long chunk,
                   trace *t) {
  outcome o = {MRL_OK, 0, 0};
  mrl_sse *p = NULL;
  if (mrl_sse_new(e, max_line, &p) != MRL_OK) {
    o.status = MRL_ERR_NOMEM;
    if (mrl_engine_last_error(e)[0] == '\0') abort();
    return o;
  }
  uint32_t x = (uint32_t)(chunk < 0 ? -chunk : 1) * 2654435761u + 1;
  for (size_t i = 0; i < size && o.status == MRL_OK;) {
    size_t n = size - i;
    if (chunk > 0 && (size_t)chunk < n) n = (size_t)chunk;
    if (chunk < 0) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      size_t want = 1 + x % 23;
      if (want < n) n = want;
    }
    o.status = mrl_sse_feed(p, (const char *)data + i, n, on_event, t);
    i += n;
  }
  if (o.status == MRL_OK) {
    if (mrl_sse_finish(p, &o.dropped) != MRL_OK) abort();
  } else if (mrl_engine_last_error(e)[0] == '\0') {
    abort();
  }
  o.comments = mrl_sse_comments(p);
  mrl_sse_free(p);
  return o;
}

static void trace_free(trace *t) {
  free(t->p);
  free(t->ends);
}

static int same(const trace *a, const trace *b) {
  return a->n == b->n && a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

/* b holds the first b->n events of a. */
static int prefix(const trace *a, const trace *b) {
  if (b->n > a->n) return 0;
  size_t len = b->n ? a->ends[b->n - 1] : 0;
  return b->len == len && (len == 0 || memcmp(a->p, b->p, len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mrl_engine *e = NULL;
  if (mrl_engine_new(&e) != MRL_OK) abort();
  unsigned knob = size ? data[0] : 0;

  /* at once, one byte at a time, in varying chunks: the same */
  trace whole = {0}, bytes = {0}, chunks = {0};
  outcome a = run(e, 0, data, size, 0, &whole);
  outcome b = run(e, 0, data, size, 1, &bytes);
  outcome c = run(e, 0, data, size, -(long)(knob + 1), &chunks);
  if (a.status != MRL_OK) abort(); /* no line reaches 16 MiB here */
  if (!same(&whole, &bytes) || !same(&whole, &chunks)) abort();
  if (b.status != a.status || c.status != a.status || b.dropped != a.dropped ||
      c.dropped != a.dropped || b.comments != a.comments || c.comments != a.comments)
    abort();

  /* a short line limit: all or a prefix, then MRL_ERR_RANGE; the same at once and by bytes */
  size_t max_line = 1 + knob % 64;
  trace short_whole = {0}, short_bytes = {0};
  outcome s1 = run(e, max_line, data, size, 0, &short_whole);
  outcome s2 = run(e, max_line, data, size, 1, &short_bytes);
  if (s1.status != s2.status || !same(&short_whole, &short_bytes)) abort();
  if (s1.status == MRL_OK ? !same(&whole, &short_whole)
                          : s1.status != MRL_ERR_RANGE || !prefix(&whole, &short_whole))
    abort();

  /* a callback that stops at the k-th event */
  if (whole.n > 0) {
    trace stopped = {0};
    stopped.stop_at = 1 + knob % whole.n;
    outcome st = run(e, 0, data, size, 2, &stopped);
    if (st.status != MRL_ERR_INVALID || stopped.n != stopped.stop_at || !prefix(&whole, &stopped))
      abort();
    trace_free(&stopped);
  }

  /* a memory cap: all or a prefix, then MRL_ERR_NOMEM */
  mrl_engine *small = NULL;
  if (mrl_engine_new(&small) != MRL_OK) abort();
  if (mrl_engine_set_memory_limit(small, mrl_engine_memory_used(small) + 64 * (1 + knob % 16)))
    abort();
  trace capped = {0};
  outcome m = run(small, 0, data, size, 3, &capped);
  if (m.status == MRL_OK ? !same(&whole, &capped)
                         : m.status != MRL_ERR_NOMEM || !prefix(&whole, &capped))
    abort();
  if (mrl_engine_memory_used(small) != 0) abort();
  mrl_engine_free(small);

  trace_free(&whole);
  trace_free(&bytes);
  trace_free(&chunks);
  trace_free(&short_whole);
  trace_free(&short_bytes);
  trace_free(&capped);
  if (mrl_engine_memory_used(e) != 0) abort();
  mrl_engine_free(e);
  return 0;
}
