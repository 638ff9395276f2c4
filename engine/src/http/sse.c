/* sse.c - the incremental Server-Sent Events parser (mrl_sse): bytes in, events out, following
 * the HTML standard's event-stream interpretation; no network, no libcurl. */
#include "http_internal.h"

#include <string.h>

enum { DEFAULT_MAX_LINE = 16 << 20 };

static const unsigned char BOM[3] = {0xEF, 0xBB, 0xBF};

struct mrl_sse {
  mrl_engine *e;
  size_t max_line;
  mrl__buf line, data, type, id;
  int64_t retry_ms;
  int64_t comments;
  int after_cr;  /* the last byte was CR: an LF right after it ends nothing */
  int at_start;  /* no byte of this stream has been taken yet (the byte-order mark may come) */
  int bom_seen;  /* bytes of the byte-order mark matched so far */
};

mrl_status mrl_sse_new(mrl_engine *e, size_t max_line, mrl_sse **out) {
  if (!e || !out) return mrl__fail(e, MRL_ERR_NULL, "mrl_sse_new", "NULL argument");
  mrl_sse *p = mrl__alloc(e, sizeof *p);
  if (!p) return mrl__fail(e, MRL_ERR_NOMEM, "mrl_sse_new", "out of memory");
  memset(p, 0, sizeof *p);
  p->e = e;
  p->max_line = max_line ? max_line : DEFAULT_MAX_LINE;
  p->retry_ms = -1;
  p->at_start = 1;
  mrl__engine_retain(e);
  *out = p;
  return MRL_OK;
}

void mrl_sse_free(mrl_sse *p) {
  if (!p) return;
  mrl_engine *e = p->e;
  mrl__buf_free(e, &p->line);
  mrl__buf_free(e, &p->data);
  mrl__buf_free(e, &p->type);
  mrl__buf_free(e, &p->id);
  mrl__free(e, p, sizeof *p);
  mrl__engine_release(e);
}

int64_t mrl_sse_comments(const mrl_sse *p) { return p ? p->comments : 0; }

static mrl_status nomem(mrl_sse *p) {
  return mrl__fail(p->e, MRL_ERR_NOMEM, "mrl_sse_feed", "out of memory");
}

/* A blank line: hands the event over when it has data, then starts the next one. Returns 1 when
 * the callback asked to stop. */
static int dispatch(mrl_sse *p, mrl_sse_event_fn fn, void *ud) {
  int stop = 0;
  if (p->data.len > 0) {
    p->data.len--; /* the LF after the last data line */
    p->data.p[p->data.len] = '\0';
    mrl_sse_event ev = {
        .type = p->type.len ? p->type.p : "message",
        .data = p->data.p,
        .data_len = p->data.len,
        .id = p->id.len ? p->id.p : "",
        .retry_ms = p->retry_ms,
        .done = p->data.len == 6 && memcmp(p->data.p, "[DONE]", 6) == 0,
    };
    stop = fn ? fn(ud, &ev) != 0 : 0;
  }
  p->data.len = 0;
  p->type.len = 0;
  return stop;
}

static int field_is(const char *name, size_t n, const char *want) {
  return n == strlen(want) && memcmp(name, want, n) == 0;
}

/* One complete line (without its end). Returns MRL_OK, MRL_ERR_NOMEM, or 1 for a stop. */
static int take_line(mrl_sse *p, const char *s, size_t n, mrl_sse_event_fn fn, void *ud) {
  if (n == 0) return dispatch(p, fn, ud);
  if (s[0] == ':') {
    p->comments++;
    return MRL_OK;
  }
  const char *colon = memchr(s, ':', n);
  size_t name_len = colon ? (size_t)(colon - s) : n;
  const char *value = colon ? colon + 1 : s + n;
  size_t value_len = (size_t)(s + n - value);
  if (value_len > 0 && value[0] == ' ') value++, value_len--;
  if (field_is(s, name_len, "data")) {
    if (mrl__buf_add(p->e, &p->data, value, value_len) || mrl__buf_add(p->e, &p->data, "\n", 1))
      return MRL_ERR_NOMEM;
  } else if (field_is(s, name_len, "event")) {
    p->type.len = 0;
    if (mrl__buf_add(p->e, &p->type, value, value_len)) return MRL_ERR_NOMEM;
  } else if (field_is(s, name_len, "id")) {
    if (!memchr(value, '\0', value_len)) {
      p->id.len = 0;
      if (mrl__buf_add(p->e, &p->id, value, value_len)) return MRL_ERR_NOMEM;
    }
  } else if (field_is(s, name_len, "retry")) {
    int64_t v = 0;
    size_t i = 0;
    for (; i < value_len && value[i] >= '0' && value[i] <= '9'; i++)
      if (v < INT64_MAX / 10 - 10) v = v * 10 + (value[i] - '0');
    if (value_len > 0 && i == value_len) p->retry_ms = v;
  }
  return MRL_OK;
}

static mrl_status end_line(mrl_sse *p, mrl_sse_event_fn fn, void *ud) {
  int rc = take_line(p, p->line.p ? p->line.p : "", p->line.len, fn, ud);
  p->line.len = 0;
  if (rc == MRL_ERR_NOMEM) return nomem(p);
  if (rc == 1) return mrl__fail(p->e, MRL_ERR_INVALID, "mrl_sse_feed", "stopped by the callback");
  return MRL_OK;
}

static mrl_status add_to_line(mrl_sse *p, const char *s, size_t n) {
  if (n == 0) return MRL_OK;
  if (p->line.len + n > p->max_line)
    return mrl__fail(p->e, MRL_ERR_RANGE, "mrl_sse_feed", "a line is longer than %zu bytes",
                     p->max_line);
  return mrl__buf_add(p->e, &p->line, s, n) ? nomem(p) : MRL_OK;
}

mrl_status mrl_sse_feed(mrl_sse *p, const char *bytes, size_t len, mrl_sse_event_fn fn, void *ud) {
  if (!p) return MRL_ERR_NULL;
  if (!bytes && len) return mrl__fail(p->e, MRL_ERR_NULL, "mrl_sse_feed", "NULL bytes");
  size_t i = 0;
  while (i < len && p->at_start) {
    if ((unsigned char)bytes[i] == BOM[p->bom_seen]) {
      i++;
      if (++p->bom_seen == 3) p->at_start = 0;
      continue;
    }
    /* not a byte-order mark after all: the bytes matched so far are text */
    mrl_status st = add_to_line(p, (const char *)BOM, (size_t)p->bom_seen);
    if (st) return st;
    p->at_start = 0;
  }
  while (i < len) {
    if (p->after_cr) {
      p->after_cr = 0;
      if (bytes[i] == '\n') {
        i++;
        continue;
      }
    }
    /* the run of bytes up to the next line end goes into the line at once */
    size_t j = i;
    while (j < len && bytes[j] != '\n' && bytes[j] != '\r') j++;
    mrl_status st = add_to_line(p, bytes + i, j - i);
    if (st) return st;
    if (j == len) break;
    p->after_cr = bytes[j] == '\r';
    i = j + 1;
    if ((st = end_line(p, fn, ud))) return st;
  }
  return MRL_OK;
}

mrl_status mrl_sse_finish(mrl_sse *p, int *dropped) {
  if (!p) return MRL_ERR_NULL;
  if (dropped) *dropped = p->line.len > 0 || p->data.len > 0 || p->type.len > 0 ||
                          (p->at_start && p->bom_seen > 0);
  p->line.len = p->data.len = p->type.len = 0;
  p->after_cr = 0;
  p->at_start = 1;
  p->bom_seen = 0;
  return MRL_OK;
}
