/* json.c - strict JSON reader into one arena (see json.h). Built for untrusted files: every read
 * is bounds-checked, nesting is limited, numbers that overflow are still parsed as doubles, and
 * errors carry the line and column. */
#include "json.h"
#include "utf8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_DEPTH = 512, CHUNK = 1 << 16 };

typedef struct chunk {
  struct chunk *next;
  size_t size, used;
} chunk;

struct mrl_json_doc {
  mrl_engine *engine;
  chunk *chunks;
  mrl_json root;
};

/* Children of the arrays and objects being parsed: one stack shared by every level. */
typedef struct {
  mrl_json *nodes;
  const char **keys;
  size_t *key_lengths;
  size_t n, cap;
} child_stack;

typedef struct {
  mrl_engine *e;
  const char *fn, *what;
  const char *p, *start, *end;
  mrl_json_doc *doc;
  child_stack stack;
  mrl_status status;
} parser;

static void *arena_alloc(parser *ps, size_t size) {
  size = (size + 15) & ~(size_t)15;
  chunk *c = ps->doc->chunks;
  if (!c || c->size - c->used < size) {
    size_t want = size > CHUNK ? size : CHUNK;
    if (want > SIZE_MAX - sizeof(chunk) - 16) return NULL;
    c = mrl__alloc(ps->e, sizeof(chunk) + 16 + want);
    if (!c) return NULL;
    c->size = want;
    c->used = 0;
    c->next = ps->doc->chunks;
    ps->doc->chunks = c;
  }
  char *base = (char *)c + ((sizeof(chunk) + 15) & ~(size_t)15);
  void *p = base + c->used;
  c->used += size;
  return p;
}

/* Records the first error with its position; returns false so callers can `return fail(...)`. */
static bool fail(parser *ps, mrl_status st, const char *msg) {
  if (ps->status) return false;
  int line = 1, col = 1;
  for (const char *q = ps->start; q < ps->p && q < ps->end; q++) {
    if (*q == '\n') {
      line++;
      col = 1;
    } else {
      col++;
    }
  }
  ps->status = mrl__fail(ps->e, st, ps->fn, "%s: %s at line %d, column %d", ps->what, msg, line,
                         col);
  return false;
}

static bool oom(parser *ps) { return fail(ps, MRL_ERR_NOMEM, "out of memory"); }

static void skip_space(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

static bool push_child(parser *ps, const mrl_json *node, const char *key, size_t key_len) {
  child_stack *s = &ps->stack;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    mrl_json *nodes = mrl__alloc(ps->e, cap * sizeof *nodes);
    const char **keys = mrl__alloc(ps->e, cap * sizeof *keys);
    size_t *lens = mrl__alloc(ps->e, cap * sizeof *lens);
    if (!nodes || !keys || !lens) {
      mrl__free(ps->e, nodes, cap * sizeof *nodes);
      mrl__free(ps->e, keys, cap * sizeof *keys);
      mrl__free(ps->e, lens, cap * sizeof *lens);
      return oom(ps);
    }
    if (s->n) {
      memcpy(nodes, s->nodes, s->n * sizeof *nodes);
      memcpy(keys, s->keys, s->n * sizeof *keys);
      memcpy(lens, s->key_lengths, s->n * sizeof *lens);
    }
    mrl__free(ps->e, s->nodes, s->cap * sizeof *s->nodes);
    mrl__free(ps->e, s->keys, s->cap * sizeof *s->keys);
    mrl__free(ps->e, s->key_lengths, s->cap * sizeof *s->key_lengths);
    s->nodes = nodes;
    s->keys = keys;
    s->key_lengths = lens;
    s->cap = cap;
  }
  s->nodes[s->n] = *node;
  s->keys[s->n] = key;
  s->key_lengths[s->n] = key_len;
  s->n++;
  return true;
}

/* Moves the children above `base` into the arena as node's items (and keys). */
static bool pop_children(parser *ps, size_t base, mrl_json *node, bool object) {
  child_stack *s = &ps->stack;
  size_t n = s->n - base;
  node->length = n;
  if (n == 0) return true;
  node->items = arena_alloc(ps, n * sizeof *node->items);
  if (!node->items) return oom(ps);
  memcpy(node->items, s->nodes + base, n * sizeof *node->items);
  if (object) {
    node->keys = arena_alloc(ps, n * sizeof *node->keys);
    node->key_lengths = arena_alloc(ps, n * sizeof *node->key_lengths);
    if (!node->keys || !node->key_lengths) return oom(ps);
    memcpy(node->keys, s->keys + base, n * sizeof *node->keys);
    memcpy(node->key_lengths, s->key_lengths + base, n * sizeof *node->key_lengths);
  }
  s->n = base;
  return true;
}

static int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static bool read_hex4(parser *ps, unsigned *out) {
  if (ps->end - ps->p < 4) return fail(ps, MRL_ERR_INVALID, "truncated \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hex(ps->p[i]);
    if (h < 0) return fail(ps, MRL_ERR_INVALID, "bad \\u escape");
    v = v * 16 + (unsigned)h;
  }
  ps->p += 4;
  *out = v;
  return true;
}

/* Reads a string (ps->p at the opening quote) into the arena. Escapes never grow the text, so
 * the raw length bounds the decoded one. Raw UTF-8 is copied as it is. */
static bool parse_string(parser *ps, const char **out, size_t *out_len) {
  ps->p++; /* the quote */
  const char *q = ps->p;
  while (q < ps->end && *q != '"') q += (*q == '\\' && q + 1 < ps->end) ? 2 : 1;
  if (q >= ps->end) return fail(ps, MRL_ERR_INVALID, "unterminated string");
  char *dst = arena_alloc(ps, (size_t)(q - ps->p) + 1);
  if (!dst) return oom(ps);
  size_t n = 0;
  while (*ps->p != '"') {
    unsigned char c = (unsigned char)*ps->p;
    if (c < 0x20) return fail(ps, MRL_ERR_INVALID, "control character in string");
    if (c != '\\') {
      dst[n++] = (char)c;
      ps->p++;
      continue;
    }
    ps->p++;
    char esc = *ps->p++;
    switch (esc) {
    case '"': dst[n++] = '"'; break;
    case '\\': dst[n++] = '\\'; break;
    case '/': dst[n++] = '/'; break;
    case 'b': dst[n++] = '\b'; break;
    case 'f': dst[n++] = '\f'; break;
    case 'n': dst[n++] = '\n'; break;
    case 'r': dst[n++] = '\r'; break;
    case 't': dst[n++] = '\t'; break;
    case 'u': {
      unsigned cp;
      if (!read_hex4(ps, &cp)) return false;
      if (cp >= 0xD800 && cp <= 0xDBFF && ps->end - ps->p >= 6 && ps->p[0] == '\\' &&
          ps->p[1] == 'u') {
        const char *save = ps->p;
        ps->p += 2;
        unsigned lo;
        if (!read_hex4(ps, &lo)) return false;
        if (lo >= 0xDC00 && lo <= 0xDFFF)
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        else
          ps->p = save; /* a lone high surrogate: kept as it is (WTF-8), like the pair's half */
      }
      /* 6 escaped bytes (or 12 for a pair) always hold the 3 (or 4) UTF-8 bytes */
      n += mrl__utf8_encode(dst + n, cp);
      break;
    }
    default: return fail(ps, MRL_ERR_INVALID, "bad escape in string");
    }
  }
  ps->p++; /* closing quote */
  dst[n] = '\0';
  *out = dst;
  *out_len = n;
  return true;
}

static bool parse_number(parser *ps, mrl_json *node) {
  const char *s = ps->p, *q = s;
  if (q < ps->end && *q == '-') q++;
  if (q >= ps->end || !(*q >= '0' && *q <= '9')) return fail(ps, MRL_ERR_INVALID, "bad number");
  if (*q == '0') {
    q++;
  } else {
    while (q < ps->end && *q >= '0' && *q <= '9') q++;
  }
  bool integral = true;
  if (q < ps->end && *q == '.') {
    integral = false;
    q++;
    if (q >= ps->end || !(*q >= '0' && *q <= '9')) return fail(ps, MRL_ERR_INVALID, "bad number");
    while (q < ps->end && *q >= '0' && *q <= '9') q++;
  }
  if (q < ps->end && (*q == 'e' || *q == 'E')) {
    integral = false;
    q++;
    if (q < ps->end && (*q == '+' || *q == '-')) q++;
    if (q >= ps->end || !(*q >= '0' && *q <= '9')) return fail(ps, MRL_ERR_INVALID, "bad number");
    while (q < ps->end && *q >= '0' && *q <= '9') q++;
  }
  size_t len = (size_t)(q - s);
  char buf[64];
  char *text = len < sizeof buf ? buf : arena_alloc(ps, len + 1);
  if (!text) return oom(ps);
  memcpy(text, s, len);
  text[len] = '\0';
  node->type = MRL_JSON_NUMBER;
  node->number = strtod(text, NULL);
  node->is_integer = false;
  if (integral) {
    /* exact int64 when it fits */
    const char *d = text + (text[0] == '-');
    uint64_t v = 0;
    bool fits = true;
    for (; *d; d++) {
      unsigned digit = (unsigned)(*d - '0');
      if (v > (UINT64_MAX - digit) / 10) {
        fits = false;
        break;
      }
      v = v * 10 + digit;
    }
    if (fits && text[0] == '-' && v <= (uint64_t)INT64_MAX + 1) {
      node->integer = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
      node->is_integer = true;
    } else if (fits && text[0] != '-' && v <= (uint64_t)INT64_MAX) {
      node->integer = (int64_t)v;
      node->is_integer = true;
    }
  }
  ps->p = q;
  return true;
}

static bool literal(parser *ps, const char *word, mrl_json_type type, mrl_json *node) {
  size_t n = strlen(word);
  if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
    return fail(ps, MRL_ERR_INVALID, "unexpected character");
  ps->p += n;
  node->type = type;
  return true;
}

static bool parse_value(parser *ps, mrl_json *node, int depth) {
  memset(node, 0, sizeof *node);
  skip_space(ps);
  if (ps->p >= ps->end) return fail(ps, MRL_ERR_INVALID, "unexpected end of input");
  char c = *ps->p;
  if (c == '"') {
    node->type = MRL_JSON_STRING;
    return parse_string(ps, &node->string, &node->length);
  }
  if (c == '-' || (c >= '0' && c <= '9')) return parse_number(ps, node);
  if (c == 't') return literal(ps, "true", MRL_JSON_TRUE, node);
  if (c == 'f') return literal(ps, "false", MRL_JSON_FALSE, node);
  if (c == 'n') return literal(ps, "null", MRL_JSON_NULL, node);
  if (c != '[' && c != '{') return fail(ps, MRL_ERR_INVALID, "unexpected character");
  if (depth >= MAX_DEPTH) return fail(ps, MRL_ERR_INVALID, "nested too deeply");
  bool object = c == '{';
  node->type = object ? MRL_JSON_OBJECT : MRL_JSON_ARRAY;
  char close = object ? '}' : ']';
  ps->p++;
  size_t base = ps->stack.n;
  skip_space(ps);
  if (ps->p < ps->end && *ps->p == close) {
    ps->p++;
    return true;
  }
  for (;;) {
    const char *key = NULL;
    size_t key_len = 0;
    if (object) {
      skip_space(ps);
      if (ps->p >= ps->end || *ps->p != '"') return fail(ps, MRL_ERR_INVALID, "expected a key");
      if (!parse_string(ps, &key, &key_len)) return false;
      skip_space(ps);
      if (ps->p >= ps->end || *ps->p != ':') return fail(ps, MRL_ERR_INVALID, "expected ':'");
      ps->p++;
    }
    mrl_json child;
    if (!parse_value(ps, &child, depth + 1)) return false;
    if (!push_child(ps, &child, key, key_len)) return false;
    skip_space(ps);
    if (ps->p >= ps->end) return fail(ps, MRL_ERR_INVALID, "unexpected end of input");
    if (*ps->p == ',') {
      ps->p++;
      continue;
    }
    if (*ps->p == close) {
      ps->p++;
      return pop_children(ps, base, node, object);
    }
    return fail(ps, MRL_ERR_INVALID, object ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

void mrl__json_free(mrl_json_doc *doc) {
  if (!doc) return;
  mrl_engine *e = doc->engine;
  for (chunk *c = doc->chunks, *next; c; c = next) {
    next = c->next;
    mrl__free(e, c, sizeof(chunk) + 16 + c->size);
  }
  mrl__free(e, doc, sizeof *doc);
}

mrl_status mrl__json_parse(mrl_engine *e, const char *fn, const char *what, const char *text,
                           size_t len, mrl_json_doc **doc) {
  if (!text && len) return mrl__fail(e, MRL_ERR_NULL, fn, "%s: text is NULL", what);
  mrl_json_doc *d = mrl__alloc(e, sizeof *d);
  if (!d) return mrl__fail(e, MRL_ERR_NOMEM, fn, "%s: out of memory", what);
  memset(d, 0, sizeof *d);
  d->engine = e;
  parser ps = {.e = e, .fn = fn, .what = what, .p = text, .start = text, .end = text + len,
               .doc = d};
  if (parse_value(&ps, &d->root, 0)) {
    skip_space(&ps);
    if (ps.p != ps.end) fail(&ps, MRL_ERR_INVALID, "trailing characters after the value");
  }
  child_stack *s = &ps.stack;
  mrl__free(e, s->nodes, s->cap * sizeof *s->nodes);
  mrl__free(e, s->keys, s->cap * sizeof *s->keys);
  mrl__free(e, s->key_lengths, s->cap * sizeof *s->key_lengths);
  if (ps.status) {
    mrl__json_free(d);
    return ps.status;
  }
  *doc = d;
  return MRL_OK;
}

const mrl_json *mrl__json_root(const mrl_json_doc *doc) { return &doc->root; }

const mrl_json *mrl__json_get(const mrl_json *obj, const char *key) {
  if (!obj || obj->type != MRL_JSON_OBJECT) return NULL;
  size_t n = strlen(key);
  for (size_t i = obj->length; i-- > 0;)
    if (obj->key_lengths[i] == n && memcmp(obj->keys[i], key, n) == 0) return &obj->items[i];
  return NULL;
}
