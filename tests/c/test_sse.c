/* test_sse.c - tests of the Server-Sent Events parser (mrl_sse_*): fields, comments, multi-line
 * data, the three line ends, [DONE], the byte-order mark, the same events whatever the chunking
 * (split at every byte boundary, byte by byte, inside UTF-8 and between CR and LF), the end of a
 * stream, limits, a stopping callback, bad arguments. No network. */
#include "support.h"

#include <stdio.h>
#include <string.h>

/* Events written as "type|data|id|retry|done\n" lines, for comparison. */
typedef struct {
  char text[8192];
  size_t len;
  int count, stop_after;
} events;

static int collect(void *ud, const mrl_sse_event *ev) {
  events *c = ud;
  int n = snprintf(c->text + c->len, sizeof c->text - c->len, "%s|%.*s|%s|%lld|%d\n", ev->type,
                   (int)ev->data_len, ev->data, ev->id, (long long)ev->retry_ms, ev->done);
  if (n > 0 && (size_t)n < sizeof c->text - c->len) c->len += (size_t)n;
  CHECK(ev->data[ev->data_len] == '\0');
  c->count++;
  return c->stop_after && c->count >= c->stop_after;
}

/* Parses text fed as the pieces cut at the given positions (sorted, ncuts of them). */
static void parse_cut(mrl_engine *e, const char *text, size_t len, const size_t *cuts, int ncuts,
                      events *out) {
  mrl_sse *p = NULL;
  MUST(mrl_sse_new(e, 0, &p));
  memset(out, 0, sizeof *out);
  size_t at = 0;
  for (int i = 0; i <= ncuts; i++) {
    size_t end = i < ncuts ? cuts[i] : len;
    CHECK(mrl_sse_feed(p, text + at, end - at, collect, out) == MRL_OK);
    at = end;
  }
  int dropped = -1;
  CHECK(mrl_sse_finish(p, &dropped) == MRL_OK);
  mrl_sse_free(p);
}

static void parse_all(mrl_engine *e, const char *text, events *out) {
  parse_cut(e, text, strlen(text), NULL, 0, out);
}

static void test_fields(void) {
  mrl_engine *e = new_engine();
  events ev;
  parse_all(e,
            ": a comment\n"
            "data: one\n\n"
            "event: update\ndata: {\"a\":1}\nid: 7\n\n"
            "data: line 1\ndata: line 2\ndata\ndata:  two spaces\n\n"
            "retry: 1500\ndata:x\n\n"
            "event: ignored because no data\n\n"
            "data: after\nunknown: field\n\n"
            "data: [DONE]\n\n",
            &ev);
  const char *want = "message|one||-1|0\n"
                     "update|{\"a\":1}|7|-1|0\n"
                     "message|line 1\nline 2\n\n two spaces|7|-1|0\n"
                     "message|x|7|1500|0\n"
                     "message|after|7|1500|0\n"
                     "message|[DONE]|7|1500|1\n";
  CHECKF(strcmp(ev.text, want) == 0, "got:\n%s", ev.text);
  CHECK(ev.count == 6);
  mrl_engine_free(e);
}

static void test_ids_and_retry_rules(void) {
  mrl_engine *e = new_engine();
  events ev;
  /* an id holding NUL is ignored; retry with a non-digit is ignored; an empty id resets it */
  const char text[] = "id: a\0b\nretry: 12x\ndata: 1\n\nid: b\ndata: 2\n\nid\ndata: 3\n\n";
  parse_cut(e, text, sizeof text - 1, NULL, 0, &ev);
  CHECKF(strcmp(ev.text, "message|1||-1|0\nmessage|2|b|-1|0\nmessage|3||-1|0\n") == 0, "got:\n%s",
         ev.text);
  mrl_engine_free(e);
}

static const char MIXED[] = "\xEF\xBB\xBF: ping\r\n\r\nevent: delta\r\ndata: h\xC3\xA9llo\r\n"
                            "data: w\xE2\x82\xACrld\r\r"
                            "id: 42\nretry: 10\ndata: {\"choices\":[]}\n\n"
                            "data: [DONE]\r\n\r\n";

static void test_line_endings(void) {
  mrl_engine *e = new_engine();
  const char *lf = "data: a\nevent: x\ndata: b\n\ndata: c\n\n";
  const char *crlf = "data: a\r\nevent: x\r\ndata: b\r\n\r\ndata: c\r\n\r\n";
  const char *cr = "data: a\revent: x\rdata: b\r\rdata: c\r\r";
  events a, b, c;
  parse_all(e, lf, &a);
  parse_all(e, crlf, &b);
  parse_all(e, cr, &c);
  CHECKF(strcmp(a.text, "x|a\nb||-1|0\nmessage|c||-1|0\n") == 0, "got:\n%s", a.text);
  CHECK(strcmp(a.text, b.text) == 0);
  CHECK(strcmp(a.text, c.text) == 0);
  /* a lone CR then LF in the next line is two line ends only when not adjacent */
  parse_all(e, "data: a\r\ndata: b\n\r\n", &a);
  CHECKF(strcmp(a.text, "message|a\nb||-1|0\n") == 0, "got:\n%s", a.text);
  mrl_engine_free(e);
}

static void test_split_at_every_boundary(void) {
  mrl_engine *e = new_engine();
  size_t len = sizeof MIXED - 1;
  events whole, piece;
  parse_cut(e, MIXED, len, NULL, 0, &whole);
  CHECKF(strcmp(whole.text, "delta|h\xC3\xA9llo\nw\xE2\x82\xACrld||-1|0\n"
                            "message|{\"choices\":[]}|42|10|0\nmessage|[DONE]|42|10|1\n") == 0,
         "got:\n%s", whole.text);
  int bad = 0;
  for (size_t i = 0; i <= len; i++) {
    parse_cut(e, MIXED, len, &i, 1, &piece);
    bad += strcmp(whole.text, piece.text) != 0;
    for (size_t j = i; j <= len; j += 3) {
      size_t cuts[2] = {i, j};
      parse_cut(e, MIXED, len, cuts, 2, &piece);
      bad += strcmp(whole.text, piece.text) != 0;
    }
  }
  CHECKF(bad == 0, "%d splits gave other events", bad);
  /* byte by byte */
  size_t cuts[sizeof MIXED];
  for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
  parse_cut(e, MIXED, len, cuts, (int)len - 1, &piece);
  CHECK(strcmp(whole.text, piece.text) == 0);
  mrl_engine_free(e);
}

static void test_byte_order_mark(void) {
  mrl_engine *e = new_engine();
  events a, b;
  parse_all(e, "\xEF\xBB\xBF" "data: x\n\n", &a);
  CHECK(strcmp(a.text, "message|x||-1|0\n") == 0);
  /* not a mark: a line starting with EF BB is taken as text (a field name here) */
  parse_all(e, "\xEF\xBB" "data: x\n\ndata: y\n\n", &b);
  CHECKF(strcmp(b.text, "message|y||-1|0\n") == 0, "got:\n%s", b.text);
  mrl_engine_free(e);
}

static void test_end_of_stream(void) {
  mrl_engine *e = new_engine();
  mrl_sse *p = NULL;
  MUST(mrl_sse_new(e, 0, &p));
  events ev = {0};
  int dropped = -1;
  CHECK(mrl_sse_feed(p, "id: 3\ndata: complete\n\ndata: cut sh", strlen("id: 3\ndata: complete\n\ndata: cut sh"), collect, &ev) == MRL_OK);
  CHECK(mrl_sse_finish(p, &dropped) == MRL_OK);
  CHECK(dropped == 1);
  CHECK(ev.count == 1);
  /* the next stream starts clean but keeps the last id; a comment counts */
  CHECK(mrl_sse_feed(p, ":hi\ndata: next\n\n", strlen(":hi\ndata: next\n\n"), collect, &ev) == MRL_OK);
  CHECKF(strcmp(ev.text, "message|complete|3|-1|0\nmessage|next|3|-1|0\n") == 0, "got:\n%s", ev.text);
  CHECK(mrl_sse_finish(p, &dropped) == MRL_OK && dropped == 0);
  CHECK(mrl_sse_comments(p) == 1);
  mrl_sse_free(p);
  mrl_engine_free(e);
}

static void test_limits_and_stop(void) {
  mrl_engine *e = new_engine();
  mrl_sse *p = NULL;
  MUST(mrl_sse_new(e, 16, &p));
  events ev = {0};
  CHECK_FAILS(e, MRL_ERR_RANGE, "longer than 16", mrl_sse_feed(p, "data: 0123456789abcdef\n", 23, collect, &ev));
  mrl_sse_free(p);
  MUST(mrl_sse_new(e, 0, &p));
  ev = (events){.stop_after = 1};
  /* (the parser keeps its buffers, so this is not a CHECK_FAILS) */
  CHECK(mrl_sse_feed(p, "data: 1\n\ndata: 2\n\n", 18, collect, &ev) == MRL_ERR_INVALID);
  CHECK(strstr(mrl_engine_last_error(e), "stopped by the callback") != NULL);
  CHECK(ev.count == 1);
  CHECK(mrl_sse_feed(NULL, "x", 1, collect, &ev) == MRL_ERR_NULL);
  CHECK_FAILS(e, MRL_ERR_NULL, "NULL bytes", mrl_sse_feed(p, NULL, 1, collect, &ev));
  CHECK(mrl_sse_feed(p, NULL, 0, collect, &ev) == MRL_OK);
  CHECK(mrl_sse_new(NULL, 0, &p) == MRL_ERR_NULL);
  mrl_sse_free(p);
  mrl_sse_free(NULL);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static const test_case tests[] = {
    {"fields", test_fields},
    {"ids_and_retry_rules", test_ids_and_retry_rules},
    {"line_endings", test_line_endings},
    {"split_at_every_boundary", test_split_at_every_boundary},
    {"byte_order_mark", test_byte_order_mark},
    {"end_of_stream", test_end_of_stream},
    {"limits_and_stop", test_limits_and_stop},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
