/* buffer.c - the HTTP layer's growing byte buffer and string copies (http_internal.h). */
#include "http_internal.h"

#include <string.h>

int mrl__buf_add(mrl_engine *e, mrl__buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    if (n > SIZE_MAX / 2 - b->len) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = mrl__alloc(e, cap);
    if (!p) return 1;
    if (b->len) memcpy(p, b->p, b->len);
    mrl__free(e, b->p, b->cap);
    b->p = p;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
  return 0;
}

void mrl__buf_free(mrl_engine *e, mrl__buf *b) {
  mrl__free(e, b->p, b->cap);
  b->p = NULL;
  b->len = b->cap = 0;
}

char *mrl__strndup(mrl_engine *e, const char *s, size_t n) {
  char *p = mrl__alloc(e, n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}
