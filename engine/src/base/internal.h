/* internal.h - the base layer shared by every engine source file: the engine handle (allocator,
 * memory accounting, last error, worker threads), RNG state, and the failure helper. Not
 * installed. */
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
  int threads;            /* mrl_engine_threads: the calling thread plus the pool's workers */
  struct mrl_pool *pool;  /* the workers, once started (pool.c) */
  double pool_min_work;   /* MRL_POOL_MIN_WORK; tests set 0 so that every job reaches the workers */
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

/* ---- pool.c: the engine's worker threads ---- */
/* One unit of a job: `worker` (0 .. mrl_engine_threads - 1; 0 is the calling thread) says whose
 * scratch to use. */
typedef void (*mrl_pool_task)(void *ctx, int64_t unit, int worker);
/* Jobs of less work than this (in floating-point operations, roughly) run on the calling thread:
 * waking the workers would cost more than they save. (Each unit is computed the same way either
 * way, so this changes no result.) */
#define MRL_POOL_MIN_WORK 2.0e5
/* Starts the workers for the current thread count unless they run already; the one fallible step
 * of using them, so callers do it before they change any state. Fails with MRL_ERR_NOMEM and a
 * message naming fn. */
mrl_status mrl__pool_start(mrl_engine *e, const char *fn);
/* Runs task(ctx, u, worker) for every u in [0, units), each unit by one thread, and returns when
 * all are done. Without started workers (or for little work) the calling thread runs them all. */
void mrl__pool_run(mrl_engine *e, int64_t units, double work, mrl_pool_task task, void *ctx);
/* Joins the workers (mrl_engine_set_threads, and the engine's release). */
void mrl__pool_stop(mrl_engine *e);

/* ---- rng.c ---- */
void mrl__rng_seed(struct mrl_rng *r, uint64_t seed);
uint64_t mrl__rng_u64(struct mrl_rng *r);
double mrl__rng_uniform(struct mrl_rng *r);
double mrl__rng_normal(struct mrl_rng *r);

#endif /* MRL_INTERNAL_H */
