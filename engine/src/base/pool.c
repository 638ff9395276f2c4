/* pool.c - the engine's own worker threads: a team of mrl_engine_threads(e) - 1 pthreads started
 * by the first call that needs it, which runs the units of one job at a time together with the
 * calling thread, and is joined when the engine goes (or its thread count changes).
 *
 * Each unit is done entirely by one thread; which thread does it depends on timing, so the work
 * handed out must write each result in one place, computed the same way by whichever thread, for
 * results that do not depend on the thread count. The calling thread claims units too and, once
 * none is left, closes the job and waits only for the workers that joined it: a worker that has
 * not woken up by then (a busy machine, more threads than cores) is not waited for. The team's
 * few bytes come from the engine's allocator (so allocation failures reach it) but are not
 * counted in mrl_engine_memory_used: they belong to the engine, not to the objects whose memory
 * that figure reports. */
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

struct mrl_pool_worker {
  struct mrl_pool *pool;
  int index; /* 1 .. threads - 1; the calling thread is 0 */
  pthread_t thread;
};

struct mrl_pool {
  int threads;
  struct mrl_pool_worker *workers; /* threads - 1 */
  pthread_mutex_t lock;
  pthread_cond_t wake;  /* a job was posted, or stop */
  pthread_cond_t idle;  /* the last worker left a closed job */
  unsigned long job;    /* bumped for each job; a worker waits until it changes */
  bool open;            /* workers may still join the current job */
  int active;           /* workers inside the current job */
  bool stop;
  mrl_pool_task task;
  void *ctx;
  int64_t units;
  _Atomic int64_t next; /* the next unit to hand out */
};

static void run_units(struct mrl_pool *p, int worker) {
  for (;;) {
    int64_t u = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
    if (u >= p->units) return;
    p->task(p->ctx, u, worker);
  }
}

static void *worker_main(void *arg) {
  struct mrl_pool_worker *w = arg;
  struct mrl_pool *p = w->pool;
  unsigned long seen = 0;
  pthread_mutex_lock(&p->lock);
  for (;;) {
    while (p->job == seen && !p->stop) pthread_cond_wait(&p->wake, &p->lock);
    if (p->stop) break;
    seen = p->job;
    if (!p->open) continue; /* done without this worker */
    p->active++;
    pthread_mutex_unlock(&p->lock);
    run_units(p, w->index);
    pthread_mutex_lock(&p->lock);
    if (--p->active == 0 && !p->open) pthread_cond_signal(&p->idle);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

static void *raw_alloc(mrl_engine *e, size_t size) { return e->alloc(e->alloc_ud, NULL, 0, size); }
static void raw_free(mrl_engine *e, void *p, size_t size) {
  if (p) e->alloc(e->alloc_ud, p, size, 0);
}

/* Stops and joins the first `started` workers and frees the team. */
static void pool_destroy(mrl_engine *e, struct mrl_pool *p, int started, bool sync_made) {
  if (started > 0) {
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < started; i++) pthread_join(p->workers[i].thread, NULL);
  }
  if (sync_made) {
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
  }
  raw_free(e, p->workers, sizeof *p->workers * (size_t)(p->threads - 1));
  raw_free(e, p, sizeof *p);
}

mrl_status mrl__pool_start(mrl_engine *e, const char *fn) {
  if (e->threads <= 1 || (e->pool && e->pool->threads == e->threads)) return MRL_OK;
  mrl__pool_stop(e);
  struct mrl_pool *p = raw_alloc(e, sizeof *p);
  if (!p) return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate the engine's thread pool");
  memset(p, 0, sizeof *p);
  p->threads = e->threads;
  p->workers = raw_alloc(e, sizeof *p->workers * (size_t)(p->threads - 1));
  if (!p->workers) {
    raw_free(e, p, sizeof *p);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate the engine's thread pool");
  }
  atomic_init(&p->next, 0);
  if (pthread_mutex_init(&p->lock, NULL) != 0 || pthread_cond_init(&p->wake, NULL) != 0 ||
      pthread_cond_init(&p->idle, NULL) != 0) {
    /* on Linux these never fail; a partial init would need undoing field by field */
    pool_destroy(e, p, 0, false);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot initialise the engine's thread pool");
  }
  for (int i = 0; i < p->threads - 1; i++) {
    p->workers[i].pool = p;
    p->workers[i].index = i + 1;
    if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0) {
      pool_destroy(e, p, i, true);
      return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot start %d worker threads (started %d)",
                       e->threads - 1, i);
    }
  }
  e->pool = p;
  return MRL_OK;
}

void mrl__pool_run(mrl_engine *e, int64_t units, double work, mrl_pool_task task, void *ctx) {
  struct mrl_pool *p = e->pool;
  if (!p || p->threads != e->threads || units <= 1 || work < e->pool_min_work) {
    for (int64_t u = 0; u < units; u++) task(ctx, u, 0);
    return;
  }
  pthread_mutex_lock(&p->lock);
  p->task = task;
  p->ctx = ctx;
  p->units = units;
  atomic_store_explicit(&p->next, 0, memory_order_relaxed);
  p->open = true;
  p->job++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);
  run_units(p, 0);
  /* every unit is claimed: close the job, then wait for the units still running */
  pthread_mutex_lock(&p->lock);
  p->open = false;
  while (p->active > 0) pthread_cond_wait(&p->idle, &p->lock);
  pthread_mutex_unlock(&p->lock);
}

void mrl__pool_stop(mrl_engine *e) {
  if (!e->pool) return;
  pool_destroy(e, e->pool, e->pool->threads - 1, true);
  e->pool = NULL;
}
