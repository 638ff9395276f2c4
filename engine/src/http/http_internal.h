/* http_internal.h - what the HTTP layer's files share: a growing byte buffer on the engine's
 * allocator. Not installed. */
#ifndef MRL_HTTP_INTERNAL_H
#define MRL_HTTP_INTERNAL_H

#include "internal.h"

/* Bytes p[0..len), always followed by a NUL once anything was added; cap bytes allocated. */
typedef struct {
  char *p;
  size_t len, cap;
} mrl__buf;

/* Appends n bytes; returns nonzero (and changes nothing) when memory runs out. */
int mrl__buf_add(mrl_engine *e, mrl__buf *b, const char *s, size_t n);
void mrl__buf_free(mrl_engine *e, mrl__buf *b);
/* A NUL-terminated copy of s[0..n) on the engine's allocator (free with mrl__free, n + 1). */
char *mrl__strndup(mrl_engine *e, const char *s, size_t n);

#endif /* MRL_HTTP_INTERNAL_H */
