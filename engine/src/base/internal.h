/* internal.h - the base layer shared by every engine source file: the engine handle (allocator,
 * memory accounting, last error), RNG state, and the failure helper. Not installed. */
#ifndef MRL_INTERNAL_H
#define MRL_INTERNAL_H

#include "moonrl.h"

#include <stdarg.h>
#include <stdbool.h>

#define MRL_ERRMSG_CAP 4096

struct mrl_rng {
  uint64_t s[4];
  double spare;     /* second Box-Muller variate, valid when has_spare */
  int has_spare;
  mrl_engine *engine; /* NULL for the engine's embedded default RNG */
};

struct mrl_engine {
  long refs;            /* the user's reference plus one per live object made from it */
  int user_freed;       /* mrl_engine_free has been called */
  mrl_alloc_fn alloc;
  void *alloc_ud;
  size_t mem_used, mem_peak, mem_limit;
  struct mrl_rng rng;
  char err[MRL_ERRMSG_CAP];
};

/* ---- engine.c ---- */
/* Records a message "fn: detail" as the engine's last error and returns status. e may be NULL. */
mrl_status mrl__fail(mrl_engine *e, mrl_status status, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void *mrl__alloc(mrl_engine *e, size_t size);       /* counts toward the limit; NULL on failure */
void mrl__free(mrl_engine *e, void *p, size_t size); /* p may be NULL */
void mrl__engine_retain(mrl_engine *e);
void mrl__engine_release(mrl_engine *e);

/* ---- rng.c ---- */
void mrl__rng_seed(struct mrl_rng *r, uint64_t seed);
uint64_t mrl__rng_u64(struct mrl_rng *r);
double mrl__rng_uniform(struct mrl_rng *r);
double mrl__rng_normal(struct mrl_rng *r);

#endif /* MRL_INTERNAL_H */
