/* serve_json.c - the server's byte strings and JSON writer (on malloc: replies cross threads). */
#include "serve_internal.h"
#include "utf8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mrl__sb_add(srv_buf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->failed = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void mrl__sb_str(srv_buf *b, const char *s) { mrl__sb_add(b, s, strlen(s)); }

void mrl__sb_printf(srv_buf *b, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    mrl__sb_add(b, small, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (!big) {
    b->failed = true;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  mrl__sb_add(b, big, (size_t)n);
  free(big);
}

void mrl__sb_json_str(srv_buf *b, const char *s, size_t n) {
  mrl__sb_add(b, "\"", 1);
  size_t i = 0;
  while (i < n) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      char esc[2] = {'\\', (char)c};
      mrl__sb_add(b, esc, 2);
      i++;
    } else if (c < 0x20) {
      mrl__sb_printf(b, "\\u%04x", c);
      i++;
    } else if (c < 0x80) {
      mrl__sb_add(b, s + i, 1);
      i++;
    } else {
      uint32_t cp;
      size_t k = mrl__utf8_decode((const unsigned char *)s + i, n - i, &cp);
      if (cp == MRL_UTF8_INVALID)
        mrl__sb_str(b, "\xEF\xBF\xBD");
      else
        mrl__sb_add(b, s + i, k);
      i += k;
    }
  }
  mrl__sb_add(b, "\"", 1);
}

void mrl__sb_json_float(srv_buf *b, float x) {
  if (!isfinite(x))
    mrl__sb_str(b, "-9999.0");
  else
    mrl__sb_printf(b, "%.9g", (double)x);
}

void mrl__sb_free(srv_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

void mrl__sb_error(srv_buf *b, const char *message, const char *type, const char *param,
              const char *code) {
  mrl__sb_str(b, "{\"error\":{\"message\":");
  mrl__sb_json_str(b, message, strlen(message));
  mrl__sb_str(b, ",\"type\":");
  mrl__sb_json_str(b, type, strlen(type));
  mrl__sb_str(b, ",\"param\":");
  if (param)
    mrl__sb_json_str(b, param, strlen(param));
  else
    mrl__sb_str(b, "null");
  mrl__sb_str(b, ",\"code\":");
  if (code)
    mrl__sb_json_str(b, code, strlen(code));
  else
    mrl__sb_str(b, "null");
  mrl__sb_str(b, "}}");
}
