/* engine.c - the engine handle: allocator, memory accounting, last-error message, thread count,
 * status text. */
#ifdef __linux__
#define _GNU_SOURCE /* sched_getaffinity */
#include <sched.h>
#endif
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MRL_MAX_THREADS = 1024 };

const char *mrl_version(void) { return MRL_VERSION_STRING; }

const char *mrl_strerror(mrl_status status) {
  switch (status) {
  case MRL_OK: return "ok";
  case MRL_ERR_INVALID: return "invalid argument";
  case MRL_ERR_NULL: return "NULL argument";
  case MRL_ERR_SHAPE: return "shape mismatch";
  case MRL_ERR_RANGE: return "index or dimension out of range";
  case MRL_ERR_OVERFLOW: return "size overflow";
  case MRL_ERR_NOMEM: return "out of memory";
  case MRL_ERR_IO: return "input/output error";
  case MRL_ERR_LUA: return "Lua error";
  case MRL_ERR_UNSUPPORTED: return "unsupported operation";
  }
  return "unknown status";
}

double mrl_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *default_alloc(void *ud, void *ptr, size_t old_size, size_t new_size) {
  (void)ud;
  (void)old_size;
  if (new_size == 0) {
    free(ptr);
    return NULL;
  }
  return realloc(ptr, new_size);
}

/* The cores this process may run on: its CPU affinity where the system tells it (so that a rank
 * that mpirun or srun bound to one core does not run two threads there), else the online ones. */
static int usable_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) n = CPU_COUNT(&set);
#endif
  return n < 1 ? 1 : n > MRL_MAX_THREADS ? MRL_MAX_THREADS : (int)n;
}

mrl_status mrl_engine_new_with_alloc(mrl_alloc_fn alloc, void *ud, mrl_engine **out) {
  if (!out || !alloc) return MRL_ERR_NULL;
  mrl_engine *e = alloc(ud, NULL, 0, sizeof *e);
  if (!e) return MRL_ERR_NOMEM;
  memset(e, 0, sizeof *e);
  e->refs = 1;
  e->alloc = alloc;
  e->alloc_ud = ud;
  mrl__rng_seed(&e->rng, 0);
  e->threads = usable_cores();
  e->pool_min_work = MRL_POOL_MIN_WORK;
  *out = e;
  return MRL_OK;
}

mrl_status mrl_engine_new(mrl_engine **out) {
  return mrl_engine_new_with_alloc(default_alloc, NULL, out);
}

void mrl__engine_retain(mrl_engine *e) { e->refs++; }

void mrl__engine_release(mrl_engine *e) {
  if (--e->refs > 0) return;
  mrl__pool_stop(e);
  e->alloc(e->alloc_ud, e, sizeof *e, 0);
}

void mrl_engine_free(mrl_engine *e) {
  if (!e || e->user_freed) return;
  e->user_freed = 1;
  mrl__engine_release(e);
}

const char *mrl_engine_last_error(const mrl_engine *e) { return e ? e->err : ""; }

void mrl_engine_clear_error(mrl_engine *e) {
  if (e) e->err[0] = '\0';
}

mrl_status mrl_engine_set_memory_limit(mrl_engine *e, size_t bytes) {
  if (!e) return MRL_ERR_NULL;
  e->mem_limit = bytes;
  return MRL_OK;
}

size_t mrl_engine_memory_used(const mrl_engine *e) { return e ? e->mem_used : 0; }
size_t mrl_engine_memory_peak(const mrl_engine *e) { return e ? e->mem_peak : 0; }

mrl_status mrl_engine_set_threads(mrl_engine *e, int threads) {
  if (!e) return MRL_ERR_NULL;
  if (threads < 0 || threads > MRL_MAX_THREADS)
    return mrl__fail(e, MRL_ERR_INVALID, "mrl_engine_set_threads",
                     "threads must be in 0..%d (0: the cores the process may run on), got %d", MRL_MAX_THREADS,
                     threads);
  int n = threads == 0 ? usable_cores() : threads;
  if (n != e->threads) mrl__pool_stop(e); /* the next call that needs workers starts n - 1 */
  e->threads = n;
  return MRL_OK;
}

int mrl_engine_threads(const mrl_engine *e) { return e ? e->threads : -1; }

mrl_rng *mrl_engine_rng(mrl_engine *e) { return e ? &e->rng : NULL; }

mrl_status mrl__fail(mrl_engine *e, mrl_status status, const char *fn, const char *fmt, ...) {
  if (!e) return status;
  int n = snprintf(e->err, sizeof e->err, "%s: ", fn);
  if (n < 0 || (size_t)n >= sizeof e->err) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->err + n, sizeof e->err - (size_t)n, fmt, ap);
  va_end(ap);
  return status;
}

void *mrl__alloc(mrl_engine *e, size_t size) {
  if (size == 0) size = 1;
  if (e->mem_limit && (size > e->mem_limit || e->mem_used > e->mem_limit - size)) return NULL;
  void *p = e->alloc(e->alloc_ud, NULL, 0, size);
  if (!p) return NULL;
  e->mem_used += size;
  if (e->mem_used > e->mem_peak) e->mem_peak = e->mem_used;
  return p;
}

void mrl__free(mrl_engine *e, void *p, size_t size) {
  if (!p) return;
  if (size == 0) size = 1;
  e->alloc(e->alloc_ud, p, size, 0);
  e->mem_used -= size;
}
