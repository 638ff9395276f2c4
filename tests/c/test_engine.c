/* test_engine.c - unit tests of the engine handle: status texts and version, last-error messages,
 * thread count and worker pool, memory accounting and limits, allocation failure at every step,
 * lifetime (engine freed before its objects), the RNG against a reference xoshiro256**, BLAS
 * info, and the script API. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <sched.h>
#include "support.h"
#include "tensor_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- status codes, version, BLAS ---- */

static void test_status_codes_and_version(void) {
  static const mrl_status codes[] = {MRL_OK,           MRL_ERR_INVALID, MRL_ERR_NULL,
                                     MRL_ERR_SHAPE,    MRL_ERR_RANGE,   MRL_ERR_OVERFLOW,
                                     MRL_ERR_NOMEM,    MRL_ERR_IO,      MRL_ERR_LUA,
                                     MRL_ERR_UNSUPPORTED};
  enum { N = sizeof codes / sizeof codes[0] };
  for (int i = 0; i < N; i++) {
    CHECKF((int)codes[i] == -i, "status %d has the number %d (numbers are stable)", i, codes[i]);
    const char *text = mrl_strerror(codes[i]);
    CHECKF(text && *text && strcmp(text, "unknown status") != 0, "mrl_strerror(%d) = \"%s\"",
           codes[i], text ? text : "(null)");
    for (int j = 0; j < i; j++)
      CHECKF(strcmp(text, mrl_strerror(codes[j])) != 0, "statuses %d and %d share the text \"%s\"",
             codes[i], codes[j], text);
  }
  CHECK(strstr(mrl_strerror(MRL_ERR_NOMEM), "memory") != NULL);
  CHECK(strcmp(mrl_strerror((mrl_status)-10), "unknown status") == 0);
  CHECK(strcmp(mrl_strerror((mrl_status)1), "unknown status") == 0);
  CHECK(strcmp(mrl_strerror((mrl_status)-1000), "unknown status") == 0);

  CHECK(strcmp(mrl_version(), MRL_VERSION_STRING) == 0);
  char composed[32];
  snprintf(composed, sizeof composed, "%d.%d.%d", MRL_VERSION_MAJOR, MRL_VERSION_MINOR,
           MRL_VERSION_PATCH);
  CHECK(strcmp(composed, MRL_VERSION_STRING) == 0);
}

static void test_clock_is_monotonic(void) {
  double t0 = mrl_clock();
  struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  double t1 = mrl_clock(), t2 = mrl_clock();
  CHECKF(t1 - t0 >= 0.019 && t1 - t0 < 5.0, "a 20 ms sleep measured %.6f s", t1 - t0);
  CHECK(t2 >= t1);
}

static void test_blas_info(void) {
  const char *core = NULL, *config = NULL, *source = NULL;
  int threads = -1;
  CHECK(mrl_blas_info(&core, &threads, &config, &source) == MRL_OK);
  CHECK(core && *core && config && *config && source && threads >= 1);
  static const char *sources[] = {"moonrl", "user", "preloaded", "openblas", "none"};
  bool known = false;
  for (int i = 0; i < 5; i++) known = known || (source && strcmp(source, sources[i]) == 0);
  CHECKF(known, "source \"%s\"", source ? source : "(null)");
  bool loaded = mrl__blas_sgemm() != NULL;
  CHECK(loaded == (strcmp(source, "none") != 0));
  if (!loaded) CHECK(strcmp(core, "none") == 0);
  check_note("BLAS: core %s, %d threads, source %s, config %s", core, threads, source, config);
  CHECK(mrl_blas_info(NULL, NULL, NULL, NULL) == MRL_OK);

  const char *rec = mrl_blas_recommended_coretype();
  CHECKF(!rec || strcmp(rec, "SkylakeX") == 0 || strcmp(rec, "Haswell") == 0,
         "recommended core type \"%s\"", rec);
  if (strcmp(source, "moonrl") == 0) {
    const char *env = getenv("OPENBLAS_CORETYPE");
    CHECKF(rec && env && strcmp(env, rec) == 0, "moonrl chose the core type but set \"%s\"",
           env ? env : "(unset)");
  }

  CHECK(mrl_blas_set_threads(0) == MRL_ERR_INVALID);
  CHECK(mrl_blas_set_threads(-3) == MRL_ERR_INVALID);
  CHECK(mrl_blas_set_threads(1) == MRL_OK);
  if (loaded && strcmp(source, "preloaded") != 0) {
    CHECK(mrl_blas_info(NULL, &threads, NULL, NULL) == MRL_OK && threads == 1);
  }
}

/* ---- engine handle ---- */

static void test_engine_handle(void) {
  CHECK(mrl_engine_new(NULL) == MRL_ERR_NULL);
  mrl_engine *e = NULL;
  counting_alloc c = {.fail_at = -1};
  CHECK(mrl_engine_new_with_alloc(NULL, &c, &e) == MRL_ERR_NULL && e == NULL);
  CHECK(mrl_engine_new_with_alloc(counting_alloc_fn, &c, NULL) == MRL_ERR_NULL);
  mrl_engine_free(NULL);
  CHECK(strcmp(mrl_engine_last_error(NULL), "") == 0);
  mrl_engine_clear_error(NULL);
  CHECK(mrl_engine_set_memory_limit(NULL, 10) == MRL_ERR_NULL);
  CHECK(mrl_engine_memory_used(NULL) == 0 && mrl_engine_memory_peak(NULL) == 0);
  CHECK(mrl_engine_rng(NULL) == NULL);

  e = new_engine();
  CHECK(strcmp(mrl_engine_last_error(e), "") == 0);
  CHECK(mrl_engine_memory_used(e) == 0 && mrl_engine_memory_peak(e) == 0);
  mrl_tensor *t = NULL;
  CHECK(mrl_tensor_new(e, SHAPE(-1), &t) == MRL_ERR_INVALID && t == NULL);
  const char *msg = mrl_engine_last_error(e);
  CHECKF(strncmp(msg, "mrl_tensor_new: ", 16) == 0 && strstr(msg, "negative"),
         "message \"%s\"", msg);
  mrl_engine_clear_error(e);
  CHECK(strcmp(mrl_engine_last_error(e), "") == 0);
  /* a later failure replaces the message */
  CHECK(mrl_tensor_new(e, 9, DIMS(1, 1, 1, 1, 1, 1, 1, 1, 1), &t) == MRL_ERR_INVALID);
  CHECK(mrl_tensor_new(e, SHAPE(2), NULL) == MRL_ERR_NULL);
  CHECK(strcmp(mrl_engine_last_error(e), "mrl_tensor_new: out is NULL") == 0);
  mrl_engine_free(e);

  MUST(mrl_engine_new_with_alloc(counting_alloc_fn, &c, &e));
  CHECK(c.live == 1); /* the engine itself comes from the allocator too */
  MUST(mrl_tensor_new(e, SHAPE(3), &t));
  CHECK(c.live > 1);
  mrl_tensor_free(t);
  mrl_engine_free(e);
  CHECKF(c.live == 0 && c.bad_frees == 0 && c.resizes == 0,
         "live %ld, bad frees %ld, resizes %ld", c.live, c.bad_frees, c.resizes);
}

/* The engine's thread count: the cores the process may run on (its CPU affinity) by default,
 * 1..1024 or 0 (those cores) when set; a bad count is refused and changes nothing. */
static void test_engine_threads(void) {
  CHECK(mrl_engine_set_threads(NULL, 2) == MRL_ERR_NULL && mrl_engine_threads(NULL) == -1);
  mrl_engine *e = new_engine();
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) online = CPU_COUNT(&set);
  int cores = online < 1 ? 1 : online > 1024 ? 1024 : (int)online;
  CHECKF(mrl_engine_threads(e) == cores, "default %d threads, %d cores to run on",
         mrl_engine_threads(e), cores);
  CHECK(mrl_engine_set_threads(e, 3) == MRL_OK && mrl_engine_threads(e) == 3);
  CHECK_FAILS(e, MRL_ERR_INVALID, "threads must be in 0..1024 (0: the cores the process may run on), got -1",
              mrl_engine_set_threads(e, -1));
  CHECK_FAILS(e, MRL_ERR_INVALID, "got 1025", mrl_engine_set_threads(e, 1025));
  CHECK(mrl_engine_threads(e) == 3);
  CHECK(mrl_engine_set_threads(e, 1) == MRL_OK && mrl_engine_threads(e) == 1);
  CHECK(mrl_engine_set_threads(e, 0) == MRL_OK && mrl_engine_threads(e) == cores);
  mrl_engine_free(e);
}

/* The worker pool (base/pool.c): every unit of a job runs exactly once, on a thread numbered
 * below the count; starting the workers fails cleanly when an allocation fails; a new count
 * joins them, and without started workers the calling thread runs everything. */
typedef struct {
  int count[1000], who[1000];
} pool_probe;

static void probe_unit(void *ctx, int64_t u, int worker) {
  pool_probe *p = ctx;
  p->count[u]++;
  p->who[u] = worker;
}

static void test_pool(void) {
  counting_alloc c;
  mrl_engine *e = new_counting_engine(&c);
  MUST(mrl_engine_set_threads(e, 4));
  e->pool_min_work = 0;
  long before = c.live;
  for (long k = 0; k < 2; k++) {
    counting_alloc_arm(&c, k);
    CHECK_FAILS(e, MRL_ERR_NOMEM, "test: cannot allocate the engine's thread pool",
                mrl__pool_start(e, "test"));
    counting_alloc_arm(&c, -1);
    CHECK(e->pool == NULL && c.live == before);
  }
  MUST(mrl__pool_start(e, "test"));
  MUST(mrl__pool_start(e, "test")); /* running already: nothing to do */
  CHECK(e->pool != NULL && c.live > before);
  static pool_probe p;
  memset(&p, 0, sizeof p);
  for (int job = 0; job < 50; job++) mrl__pool_run(e, 1000, 1e9, probe_unit, &p);
  mrl__pool_run(e, 0, 1e9, probe_unit, &p);
  bool once = true, numbered = true;
  for (int u = 0; u < 1000; u++) {
    once &= p.count[u] == 50;
    numbered &= p.who[u] >= 0 && p.who[u] < 4;
  }
  CHECK(once && numbered);
  MUST(mrl_engine_set_threads(e, 2));
  CHECK(e->pool == NULL && c.live == before);
  memset(&p, 0, sizeof p);
  mrl__pool_run(e, 1000, 1e9, probe_unit, &p); /* not started: the calling thread */
  bool caller = true;
  for (int u = 0; u < 1000; u++) caller &= p.count[u] == 1 && p.who[u] == 0;
  CHECK(caller);
  MUST(mrl__pool_start(e, "test"));
  mrl_engine_free(e); /* joins them */
  CHECKF(c.live == 0 && c.bad_frees == 0, "%ld blocks live, %ld bad frees", c.live, c.bad_frees);
}

static void test_memory_accounting(void) {
  mrl_engine *e = new_engine();
  mrl_tensor *a = NULL, *b = NULL, *v = NULL;
  MUST(mrl_tensor_new(e, SHAPE(1000), &a));
  size_t one = mrl_engine_memory_used(e);
  CHECKF(one >= 4000 && one < 4000 + 1024, "a 1000-float tensor holds %zu bytes", one);
  MUST(mrl_tensor_new(e, SHAPE(10, 100), &b));
  CHECK(mrl_engine_memory_used(e) == 2 * one);
  MUST(mrl_tensor_transpose(b, 0, 1, &v));
  size_t view = mrl_engine_memory_used(e) - 2 * one;
  CHECKF(view > 0 && view < 512, "a view holds %zu bytes", view);
  mrl_tensor_free(b); /* its header goes; its storage stays with the view (a header itself) */
  CHECK(mrl_engine_memory_used(e) == 2 * one);
  CHECK(mrl_engine_memory_peak(e) == 2 * one + view);
  mrl_tensor_free(v);
  CHECK(mrl_engine_memory_used(e) == one);
  mrl_rng *rng = NULL;
  MUST(mrl_rng_new(e, 1, &rng));
  CHECK(mrl_engine_memory_used(e) > one);
  mrl_rng_free(rng);
  mrl_tensor_free(a);
  CHECK(mrl_engine_memory_used(e) == 0 && mrl_engine_memory_peak(e) == 2 * one + view);
  mrl_engine_free(e);
}

static void test_memory_limit(void) {
  mrl_engine *e = new_engine();
  mrl_tensor *t = NULL, *u = NULL, *o = NULL;
  MUST(mrl_tensor_new(e, SHAPE(256), &t));
  size_t cost = mrl_engine_memory_used(e);

  /* exactly one more fits; one byte less does not, and the failure keeps nothing */
  CHECK(mrl_engine_set_memory_limit(e, 2 * cost) == MRL_OK);
  CHECK(mrl_tensor_new(e, SHAPE(256), &u) == MRL_OK);
  mrl_tensor_free(u);
  u = NULL;
  for (size_t short_by = 1; short_by <= sizeof(mrl_tensor) + 1; short_by += sizeof(mrl_tensor)) {
    CHECK(mrl_engine_set_memory_limit(e, 2 * cost - short_by) == MRL_OK);
    CHECK_FAILS(e, MRL_ERR_NOMEM, "mrl_tensor_new: cannot allocate",
                mrl_tensor_new(e, SHAPE(256), &u));
    CHECK(u == NULL && mrl_engine_memory_used(e) == cost);
  }

  /* every allocating call fails cleanly at the cap */
  CHECK(mrl_engine_set_memory_limit(e, cost) == MRL_OK);
  mrl_rng *rng = NULL;
  mrl_script *s = NULL;
  float buf[4] = {0};
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate", mrl_tensor_transpose(t, 0, 0, &u));
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate", mrl_tensor_clone(t, &u));
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate", mrl_tensor_scalar(e, 1, &u));
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate",
              mrl_tensor_wrap(e, SHAPE(4), buf, NULL, NULL, &u));
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate", mrl_tensor_add(&o, t, t));
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate an RNG", mrl_rng_new(e, 1, &rng));
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate a script", mrl_script_new(e, &s));
  CHECK(u == NULL && o == NULL && rng == NULL && s == NULL);
  CHECK(mrl_engine_memory_used(e) == cost);

  /* a matmul whose temporaries do not fit frees what it made */
  CHECK(mrl_engine_set_memory_limit(e, 0) == MRL_OK);
  mrl_tensor *sq = NULL, *step = NULL;
  MUST(mrl_tensor_reshape(t, SHAPE(16, 16), &sq));
  MUST(mrl_tensor_slice(sq, 1, 0, 16, 2, &step)); /* (16, 8) with column stride 2: copied */
  size_t before = mrl_engine_memory_used(e);
  MUST(mrl_tensor_matmul(&o, sq, step, 0));
  size_t with_out = mrl_engine_memory_used(e);
  mrl_tensor_free(o);
  o = NULL;
  CHECK(mrl_engine_set_memory_limit(e, with_out) == MRL_OK);
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate", mrl_tensor_matmul(&o, sq, step, 0));
  CHECK(o == NULL && mrl_engine_memory_used(e) == before);
  o = sq;
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate", mrl_tensor_matmul(&o, sq, sq, 0)); /* overlap */
  CHECK(o == sq && mrl_engine_memory_used(e) == before);

  /* a huge request is refused by the cap, never passed to the allocator */
  CHECK(mrl_engine_set_memory_limit(e, 1 << 20) == MRL_OK);
  o = NULL;
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate",
              mrl_tensor_new(e, SHAPE(INT64_C(1) << 40), &o));
  CHECK(o == NULL);
  /* a cap below the current use refuses new memory, and freeing still works */
  CHECK(mrl_engine_set_memory_limit(e, 1) == MRL_OK);
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate", mrl_tensor_new(e, SHAPE(1), &o));
  mrl_tensor_free(step);
  mrl_tensor_free(sq);
  CHECK(mrl_engine_set_memory_limit(e, 0) == MRL_OK);
  CHECK(mrl_tensor_new(e, SHAPE(100000), &o) == MRL_OK);
  mrl_tensor_free(o);
  mrl_tensor_free(t);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

/* Touches every allocation site: tensors, views, copies, matmul temporaries, an RNG, and a script
 * that makes tensors in Lua. Returns the first failing status (MRL_OK when all succeeded) with
 * the engine's message in msg; frees everything it made either way. */
static mrl_status allocation_sequence(mrl_engine *e, char *msg, size_t cap) {
  enum { N = 13 };
  mrl_tensor *t[N] = {NULL}, *o;
  mrl_rng *rng = NULL;
  mrl_script *s = NULL;
  float buf[6] = {1, 2, 3, 4, 5, 6};
  mrl_status st;
  if ((st = mrl_tensor_new(e, SHAPE(6, 4), &t[0]))) goto done;
  if ((st = mrl_tensor_from_data(e, SHAPE(6, 1), buf, 6, &t[1]))) goto done;
  if ((st = mrl_tensor_wrap(e, SHAPE(6), buf, NULL, NULL, &t[2]))) goto done;
  if ((st = mrl_tensor_transpose(t[0], 0, 1, &t[3]))) goto done;   /* (4, 6) view */
  if ((st = mrl_tensor_slice(t[0], 1, 0, 4, 2, &t[4]))) goto done; /* (6, 2), column stride 2 */
  if ((st = mrl_tensor_matmul(&t[5], t[3], t[4], 0))) goto done;   /* copies t[4] */
  if ((st = mrl_tensor_matmul(&t[6], t[5], t[5], MRL_TRANS_B))) goto done; /* (4, 4) */
  o = t[6];
  if ((st = mrl_tensor_matmul(&o, t[6], t[6], 0))) goto done; /* in place: a temporary out */
  if ((st = mrl_tensor_clone(t[3], &t[7]))) goto done;
  if ((st = mrl_tensor_reshape(t[3], SHAPE(-1), &t[8]))) goto done; /* copies */
  if ((st = mrl_tensor_add(&t[9], t[0], t[1]))) goto done;
  if ((st = mrl_tensor_softmax(&t[10], t[9]))) goto done;
  if ((st = mrl_tensor_sum(&t[11], t[10], 0, 1))) goto done;
  if ((st = mrl_rng_new(e, 7, &rng))) goto done;
  if ((st = mrl_script_new(e, &s))) goto done;
  if ((st = mrl_script_set_tensor(s, "x", t[0]))) goto done;
  if ((st = mrl_script_run(s,
                           "local rl = require 'moonrl'\n"
                           "y = x:matmul(rl.tensor.ones({4, 3})):sum(1)\n",
                           "=sequence")))
    goto done;
  st = mrl_script_get_tensor(s, "y", &t[12]);
done:
  if (st) snprintf(msg, cap, "%s", mrl_engine_last_error(e));
  mrl_script_free(s);
  mrl_rng_free(rng);
  for (int i = 0; i < N; i++) mrl_tensor_free(t[i]);
  return st;
}

static void test_allocation_failure_at_every_step(void) {
  long k, failures = 0, in_lua = 0;
  for (k = 0; k <= 1000; k++) {
    counting_alloc c = {.fail_at = k};
    mrl_engine *e = NULL;
    char msg[MRL_ERRMSG_CAP] = "";
    mrl_status st = mrl_engine_new_with_alloc(counting_alloc_fn, &c, &e);
    if (st == MRL_OK) {
      st = allocation_sequence(e, msg, sizeof msg);
      CHECKF(mrl_engine_memory_used(e) == 0, "request %ld failing: %zu bytes held at the end", k,
             mrl_engine_memory_used(e));
      mrl_engine_free(e);
    }
    CHECKF(c.live == 0 && c.bad_frees == 0 && c.resizes == 0,
           "request %ld failing: %ld blocks live at the end, %ld bad frees, %ld resizes", k,
           c.live, c.bad_frees, c.resizes);
    if (st == MRL_OK) break;
    failures++;
    in_lua += st == MRL_ERR_LUA;
    CHECKF(st == MRL_ERR_NOMEM || st == MRL_ERR_LUA, "request %ld failing: status %d (%s)", k, st,
           mrl_strerror(st));
    CHECKF(k == 0 || strstr(msg, "allocate") != NULL, "request %ld failing: message \"%s\"", k,
           msg);
  }
  CHECKF(k <= 1000, "the sequence never succeeded");
  CHECKF(failures == k && k > 30, "%ld failing runs for %ld allocation requests", failures, k);
  CHECKF(in_lua > 0, "no allocation failed inside Lua");
  check_note("the sequence makes %ld allocations; failing each in turn was handled (%ld in Lua)",
             k, in_lua);
}

/* Freeing the engine first is safe: its objects keep working and the engine's memory goes with
 * the last of them, whichever that is. */
static void test_engine_freed_before_its_objects(void) {
  for (int last = 0; last < 3; last++) {
    counting_alloc c = {.fail_at = -1};
    mrl_engine *e = NULL;
    MUST(mrl_engine_new_with_alloc(counting_alloc_fn, &c, &e));
    mrl_tensor *t = NULL, *v = NULL, *o = NULL;
    mrl_rng *rng = NULL;
    mrl_script *s = NULL;
    MUST(mrl_tensor_new(e, SHAPE(2, 3), &t));
    MUST(mrl_rng_new(e, 5, &rng));
    MUST(mrl_script_new(e, &s));
    mrl_engine_free(e);

    CHECK(mrl_tensor_engine(t) == e && mrl_tensor_fill(t, 2.0f) == MRL_OK);
    CHECK(mrl_tensor_transpose(t, 0, 1, &v) == MRL_OK);
    CHECK(mrl_tensor_matmul(&o, t, v, 0) == MRL_OK && mrl_tensor_data(o)[3] == 12.0f);
    mrl_tensor_free(o);
    o = NULL;
    CHECK_FAILS(mrl_tensor_engine(t), MRL_ERR_RANGE, "dim 5", mrl_tensor_narrow(t, 5, 0, 1, &o));
    uint64_t x = 0;
    CHECK(mrl_rng_u64(rng, &x) == MRL_OK);
    double sum = 0;
    CHECK(mrl_script_set_tensor(s, "t", t) == MRL_OK);
    CHECK(mrl_script_run(s, "total = t:sum() + require('moonrl').tensor.ones({2}):sum()", NULL) ==
          MRL_OK);
    CHECK(mrl_script_get_number(s, "total", &sum) == MRL_OK && sum == 14.0);
    mrl_tensor_free(t); /* v keeps the storage */

    if (last != 0) mrl_tensor_free(v);
    if (last != 1) mrl_rng_free(rng);
    if (last != 2) mrl_script_free(s);
    CHECKF(c.live > 0, "the engine went before its last object (%d)", last);
    if (last == 0) {
      float got = 0;
      CHECK(mrl_tensor_get(v, DIMS(2, 1), &got) == MRL_OK && got == 2.0f);
      mrl_tensor_free(v);
    }
    if (last == 1) mrl_rng_free(rng);
    if (last == 2) mrl_script_free(s);
    CHECKF(c.live == 0 && c.bad_frees == 0, "last object %d: %ld blocks live, %ld bad frees", last,
           c.live, c.bad_frees);
  }
}

/* ---- random numbers: the published algorithms, written out independently ---- */

static uint64_t ref_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t ref_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

typedef struct {
  uint64_t s[4];
} ref_xoshiro;

static ref_xoshiro ref_seeded(uint64_t seed) {
  ref_xoshiro r;
  for (int i = 0; i < 4; i++) r.s[i] = ref_splitmix64(&seed);
  return r;
}

/* xoshiro256** 1.0 (Blackman and Vigna). */
static uint64_t ref_next(ref_xoshiro *r) {
  uint64_t *s = r->s;
  const uint64_t result = ref_rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = ref_rotl(s[3], 45);
  return result;
}

static void test_rng_matches_reference(void) {
  /* splitmix64's published first outputs for seed 0 pin the reference itself */
  uint64_t x = 0;
  CHECK(ref_splitmix64(&x) == 0xe220a8397b1dcdafULL);
  CHECK(ref_splitmix64(&x) == 0x6e789e6aa1b965f4ULL);
  CHECK(ref_splitmix64(&x) == 0x06c45d188009454fULL);

  mrl_engine *e = new_engine();
  static const uint64_t seeds[] = {0, 1, 42, 0xdeadbeefULL, UINT64_MAX};
  for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
    mrl_rng *rng = NULL;
    MUST(mrl_rng_new(e, seeds[i], &rng));
    ref_xoshiro ref = ref_seeded(seeds[i]);
    int mismatches = 0;
    for (int k = 0; k < 1000; k++) {
      uint64_t got = 0;
      CHECK(mrl_rng_u64(rng, &got) == MRL_OK);
      mismatches += got != ref_next(&ref);
    }
    CHECKF(mismatches == 0, "seed %llu: %d of 1000 draws differ from xoshiro256**",
           (unsigned long long)seeds[i], mismatches);
    /* reseeding restarts the stream */
    MUST(mrl_rng_seed(rng, seeds[i]));
    ref = ref_seeded(seeds[i]);
    uint64_t got = 0;
    CHECK(mrl_rng_u64(rng, &got) == MRL_OK && got == ref_next(&ref));
    mrl_rng_free(rng);
  }
  /* the engine's own generator starts from seed 0 */
  ref_xoshiro ref = ref_seeded(0);
  bool same = true;
  for (int k = 0; k < 100; k++) {
    uint64_t got = 0;
    MUST(mrl_rng_u64(mrl_engine_rng(e), &got));
    same = same && got == ref_next(&ref);
  }
  CHECK(same);
  mrl_engine_free(e);
}

static void test_rng_uniform_and_normal(void) {
  enum { N = 100000 };
  mrl_engine *e = new_engine();
  mrl_rng *a = NULL, *b = NULL;
  MUST(mrl_rng_new(e, 11, &a));
  MUST(mrl_rng_new(e, 11, &b));
  double sum = 0, lo = 1, hi = 0;
  bool same = true;
  for (int i = 0; i < N; i++) {
    double u = -1, w = -1;
    MUST(mrl_rng_uniform(a, &u));
    MUST(mrl_rng_uniform(b, &w));
    same = same && u == w;
    sum += u;
    lo = u < lo ? u : lo;
    hi = u > hi ? u : hi;
  }
  CHECK(same);
  CHECKF(lo >= 0.0 && hi < 1.0 && lo < 1e-3 && hi > 1 - 1e-3, "uniform range [%g, %g]", lo, hi);
  CHECKF(fabs(sum / N - 0.5) < 0.005, "uniform mean %g", sum / N);
  check_note("uniform over %d draws: mean %.5f, min %.2g, max %.6f", N, sum / N, lo, hi);

  double s1 = 0, s2 = 0;
  for (int i = 0; i < N; i++) {
    double z;
    MUST(mrl_rng_normal(a, &z));
    s1 += z;
    s2 += z * z;
  }
  double mean = s1 / N, std = sqrt(s2 / N - mean * mean);
  CHECKF(fabs(mean) < 0.02 && fabs(std - 1.0) < 0.015, "normal mean %g, std %g", mean, std);
  check_note("normal over %d draws: mean %.4f, std %.4f", N, mean, std);

  /* reseeding drops a cached second Box-Muller variate */
  double z1, z2, y1, y2;
  MUST(mrl_rng_seed(a, 99));
  MUST(mrl_rng_normal(a, &z1));
  MUST(mrl_rng_seed(a, 99));
  MUST(mrl_rng_normal(a, &y1));
  MUST(mrl_rng_normal(a, &y2));
  MUST(mrl_rng_seed(b, 99));
  MUST(mrl_rng_normal(b, &z1));
  MUST(mrl_rng_normal(b, &z2));
  CHECK(y1 == z1 && y2 == z2 && z1 != z2);

  /* other seeds, other numbers */
  MUST(mrl_rng_seed(a, 1));
  MUST(mrl_rng_seed(b, 2));
  int equal = 0;
  for (int i = 0; i < 100; i++) {
    uint64_t p, q;
    MUST(mrl_rng_u64(a, &p));
    MUST(mrl_rng_u64(b, &q));
    equal += p == q;
  }
  CHECK(equal == 0);
  mrl_rng_free(a);
  mrl_rng_free(b);
  mrl_engine_free(e);
}

static void test_rng_errors(void) {
  mrl_engine *e = new_engine();
  mrl_rng *rng = NULL;
  uint64_t x = 5;
  double d = 5;
  CHECK(mrl_rng_new(NULL, 1, &rng) == MRL_ERR_NULL);
  CHECK_FAILS(e, MRL_ERR_NULL, "mrl_rng_new: out is NULL", mrl_rng_new(e, 1, NULL));
  MUST(mrl_rng_new(e, 1, &rng));
  CHECK(mrl_rng_u64(NULL, &x) == MRL_ERR_NULL && mrl_rng_u64(rng, NULL) == MRL_ERR_NULL);
  CHECK(mrl_rng_uniform(NULL, &d) == MRL_ERR_NULL && mrl_rng_uniform(rng, NULL) == MRL_ERR_NULL);
  CHECK(mrl_rng_normal(NULL, &d) == MRL_ERR_NULL && mrl_rng_normal(rng, NULL) == MRL_ERR_NULL);
  CHECK(mrl_rng_seed(NULL, 1) == MRL_ERR_NULL);
  CHECK(x == 5 && d == 5);
  mrl_rng_free(NULL);
  mrl_rng_free(mrl_engine_rng(e)); /* the engine's own generator is not freed separately */
  CHECK(mrl_rng_u64(mrl_engine_rng(e), &x) == MRL_OK);
  mrl_rng_free(rng);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

/* mrl_rng_int against the definition with 128-bit arithmetic (a GCC/Clang type, in the test only):
 * k = lo + floor(x * count / 2^64) for the generator's next draw x, drawn again while
 * x * count mod 2^64 < 2^64 mod count. */
static void test_rng_int(void) {
  mrl_engine *e = new_engine();
  mrl_rng *rng = NULL, *twin = NULL;
  MUST(mrl_rng_new(e, 21, &rng));
  MUST(mrl_rng_new(e, 21, &twin));
  static const int64_t bounds[][2] = {{1, 6},
                                      {-3, 3},
                                      {0, (INT64_C(1) << 62) - 1},
                                      {0, INT64_C(1) << 62},
                                      {0, INT64_MAX},
                                      {-(INT64_C(1) << 62) - 1, INT64_C(1) << 62},
                                      {INT64_MIN + 1, INT64_MAX},
                                      {INT64_MIN, INT64_MAX},
                                      {INT64_MIN, INT64_MIN},
                                      {7, 7}};
  int redraws = 0;
  for (size_t b = 0; b < sizeof bounds / sizeof *bounds; b++)
    for (int i = 0; i < 200; i++) {
      int64_t lo = bounds[b][0], hi = bounds[b][1], k = 0;
      MUST(mrl_rng_int(rng, lo, hi, &k));
      uint64_t count = (uint64_t)hi - (uint64_t)lo + 1, x = 0, r;
      MUST(mrl_rng_u64(twin, &x));
      if (count == 0) {
        r = x;
      } else {
        unsigned __int128 p = (unsigned __int128)x * count;
        while ((uint64_t)p < (0 - count) % count) {
          MUST(mrl_rng_u64(twin, &x));
          p = (unsigned __int128)x * count;
          redraws++;
        }
        r = (uint64_t)(p >> 64);
      }
      CHECKF((uint64_t)k == (uint64_t)lo + r && lo <= k && k <= hi,
             "[%lld, %lld]: %lld, expected %lld", (long long)lo, (long long)hi, (long long)k,
             (long long)((uint64_t)lo + r));
    }
  check_note("%d redraws", redraws);
  CHECK(redraws > 50); /* the intervals past 2^63 integers reject about half their draws */
  int64_t k = 5;
  CHECK_FAILS(e, MRL_ERR_INVALID, "mrl_rng_int: the interval [2, 1] is empty",
              mrl_rng_int(rng, 2, 1, &k));
  CHECK(k == 5 && mrl_rng_int(NULL, 1, 2, &k) == MRL_ERR_NULL);
  CHECK(mrl_rng_int(rng, 1, 2, NULL) == MRL_ERR_NULL);
  CHECK(mrl_rng_int(mrl_engine_rng(e), 3, 1, &k) == MRL_ERR_INVALID && k == 5);
  mrl_rng_free(twin);
  mrl_rng_free(rng);
  mrl_engine_free(e);
}

/* ---- scripts ---- */

static void test_script_runs_a_tensor_chunk(void) {
  mrl_engine *e = new_engine();
  mrl_script *s = NULL;
  CHECK(mrl_script_new(e, &s) == MRL_OK);
  char chunk[512];
  snprintf(chunk, sizeof chunk,
           "local rl = require \"moonrl\"\n"
           "local a = rl.tensor.from({{1, 2, 3}, {4, 5, 6}})\n"
           "product = a:matmul(a, {trans_b = true})\n"
           "total = a:sum()\n"
           "version_ok = rl.version == \"%s\" and 1 or 0\n"
           "name = 'moonrl'\n",
           mrl_version());
  CHECKF(mrl_script_run(s, chunk, "=chunk") == MRL_OK, "%s", mrl_engine_last_error(e));
  double total = 0, version_ok = 0;
  CHECK(mrl_script_get_number(s, "total", &total) == MRL_OK && total == 21.0);
  CHECK(mrl_script_get_number(s, "version_ok", &version_ok) == MRL_OK && version_ok == 1.0);
  mrl_tensor *p = NULL;
  CHECK(mrl_script_get_tensor(s, "product", &p) == MRL_OK);
  if (p) {
    const float want[4] = {14, 32, 32, 77};
    CHECK(mrl_tensor_rank(p) == 2 && mrl_tensor_shape(p)[0] == 2 && mrl_tensor_shape(p)[1] == 2);
    float got[4] = {0};
    CHECK(mrl_tensor_read(p, got, 4) == MRL_OK && memcmp(got, want, sizeof want) == 0);
    CHECK(mrl_tensor_engine(p) == e);
  }
  CHECK(mrl_engine_memory_used(e) > 0); /* Lua's tensors live in the engine */
  double d = 42;
  CHECK_FAILS(e, MRL_ERR_INVALID, "global 'name' is string, not a number",
              mrl_script_get_number(s, "name", &d));
  CHECK_FAILS(e, MRL_ERR_INVALID, "global 'product' is userdata, not a number",
              mrl_script_get_number(s, "product", &d));
  CHECK_FAILS(e, MRL_ERR_INVALID, "global 'missing' is nil",
              mrl_script_get_number(s, "missing", &d));
  CHECK(d == 42);
  mrl_script_free(s);
  mrl_tensor_free(p);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static void test_script_errors(void) {
  mrl_engine *e = new_engine();
  mrl_script *s = NULL;
  MUST(mrl_script_new(e, &s));
  CHECK_FAILS(e, MRL_ERR_LUA, "bad_syntax:1:", mrl_script_run(s, "x = = 1", "=bad_syntax"));
  CHECK(strstr(mrl_engine_last_error(e), "mrl_script_run") != NULL);
  CHECK(strstr(mrl_engine_last_error(e), "unexpected symbol") != NULL);

  const char *failing = "local function inner() error('boom') end\n"
                        "local function outer() inner() end\n"
                        "outer()\n";
  CHECK_FAILS(e, MRL_ERR_LUA, "runtime:1: boom", mrl_script_run(s, failing, "=runtime"));
  const char *msg = mrl_engine_last_error(e);
  CHECKF(strstr(msg, "stack traceback") && strstr(msg, "inner") && strstr(msg, "outer"),
         "no traceback in \"%s\"", msg);
  CHECK_FAILS(e, MRL_ERR_LUA, "(embedded)", mrl_script_run(s, "error('x')", NULL));
  CHECK_FAILS(e, MRL_ERR_LUA, "error object is a table value",
              mrl_script_run(s, "error({})", NULL));
  /* an engine error inside Lua comes back with the engine's words; the tensors the chunk made
   * are garbage until the collector runs */
  size_t used_before = mrl_engine_memory_used(e);
  CHECK(mrl_script_run(s,
                       "local rl = require 'moonrl'\n"
                       "rl.tensor.zeros({2}):matmul(rl.tensor.zeros({2, 2}))",
                       "=engine_error") == MRL_ERR_LUA);
  CHECK(strstr(mrl_engine_last_error(e), "needs rank >= 2 operands") != NULL);
  CHECK(mrl_script_run(s, "collectgarbage()", NULL) == MRL_OK);
  CHECK(mrl_engine_memory_used(e) == used_before);
  /* the state is still usable */
  double y = 0;
  CHECK(mrl_script_run(s, "y = 1 + 1", NULL) == MRL_OK);
  CHECK(mrl_script_get_number(s, "y", &y) == MRL_OK && y == 2);

  mrl_tensor *t = NULL;
  MUST(mrl_tensor_new(e, SHAPE(2), &t));
  mrl_script *none = NULL;
  CHECK(mrl_script_new(NULL, &none) == MRL_ERR_NULL && none == NULL);
  CHECK_FAILS(e, MRL_ERR_NULL, "out is NULL", mrl_script_new(e, NULL));
  CHECK(mrl_script_run(NULL, "x = 1", NULL) == MRL_ERR_NULL);
  CHECK_FAILS(e, MRL_ERR_NULL, "code is NULL", mrl_script_run(s, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "path is NULL", mrl_script_run_file(s, NULL, 0, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "argc/argv", mrl_script_run_file(s, "x.lua", -1, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "argc/argv", mrl_script_run_file(s, "x.lua", 2, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "name is NULL", mrl_script_set_tensor(s, NULL, t));
  CHECK_FAILS(e, MRL_ERR_NULL, "t is NULL", mrl_script_set_tensor(s, "t", NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "name is NULL", mrl_script_get_tensor(s, NULL, &t));
  CHECK_FAILS(e, MRL_ERR_NULL, "out is NULL", mrl_script_get_tensor(s, "t", NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "name is NULL", mrl_script_get_number(s, NULL, &y));
  CHECK_FAILS(e, MRL_ERR_NULL, "out is NULL", mrl_script_get_number(s, "y", NULL));
  CHECK(mrl_script_set_tensor(NULL, "t", t) == MRL_ERR_NULL);
  CHECK(mrl_script_get_tensor(NULL, "t", &t) == MRL_ERR_NULL);
  CHECK(mrl_script_get_number(NULL, "y", &y) == MRL_ERR_NULL);
  CHECK(mrl_script_run_file(NULL, "x.lua", 0, NULL) == MRL_ERR_NULL);
  mrl_script_free(NULL);
  mrl_tensor_free(t);
  mrl_script_free(s);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

/* Writes text to a new temporary file; returns its path in buf. */
static bool write_temp_file(char *buf, size_t cap, const char *text) {
  snprintf(buf, cap, "/tmp/moonrl_test_XXXXXX");
  int fd = mkstemp(buf);
  if (fd < 0) return false;
  size_t n = strlen(text);
  bool ok = write(fd, text, n) == (ssize_t)n;
  close(fd);
  return ok;
}

static void test_script_run_file(void) {
  mrl_engine *e = new_engine();
  mrl_script *s = NULL;
  MUST(mrl_script_new(e, &s));
  char path[64], bad[64];
  CHECK(write_temp_file(path, sizeof path,
                        "local first, second = ...\n"
                        "count = #arg\n"
                        "path_length = #arg[0]\n"
                        "sum = tonumber(first) + tonumber(second) + tonumber(arg[2])\n"));
  const char *argv[] = {"3", "4"};
  CHECKF(mrl_script_run_file(s, path, 2, argv) == MRL_OK, "%s", mrl_engine_last_error(e));
  double count = 0, len = 0, sum = 0;
  CHECK(mrl_script_get_number(s, "count", &count) == MRL_OK && count == 2);
  CHECK(mrl_script_get_number(s, "path_length", &len) == MRL_OK && len == (double)strlen(path));
  CHECK(mrl_script_get_number(s, "sum", &sum) == MRL_OK && sum == 11);
  CHECK(mrl_script_run_file(s, path, 0, NULL) == MRL_ERR_LUA); /* no arguments: nil + nil */

  CHECK(write_temp_file(bad, sizeof bad, "return = 1\n"));
  CHECK_FAILS(e, MRL_ERR_LUA, "unexpected symbol", mrl_script_run_file(s, bad, 0, NULL));
  CHECK_FAILS(e, MRL_ERR_IO, "cannot open /nonexistent/moonrl.lua",
              mrl_script_run_file(s, "/nonexistent/moonrl.lua", 0, NULL));
  unlink(path);
  unlink(bad);
  mrl_script_free(s);
  mrl_engine_free(e);
}

static void test_script_shares_tensors(void) {
  mrl_engine *e = new_engine();
  mrl_script *s = NULL;
  MUST(mrl_script_new(e, &s));
  mrl_tensor *t = NULL;
  MUST(mrl_tensor_new(e, SHAPE(2, 3), &t));
  CHECK(mrl_script_set_tensor(s, "t", t) == MRL_OK);
  CHECKF(mrl_script_run(s, "t:set(2, 3, 42); t[1] = 7", NULL) == MRL_OK, "%s",
         mrl_engine_last_error(e));
  const float *d = mrl_tensor_data(t);
  CHECK(d[5] == 42 && d[0] == 7 && d[1] == 7 && d[2] == 7 && d[3] == 0);
  mrl_tensor_data(t)[3] = -1;
  double seen = 0;
  CHECK(mrl_script_run(s, "seen = t:get(2, 1)", NULL) == MRL_OK);
  CHECK(mrl_script_get_number(s, "seen", &seen) == MRL_OK && seen == -1);
  /* Lua closing its view leaves the C tensor alone */
  CHECK(mrl_script_run(s, "t:free(); collectgarbage()", NULL) == MRL_OK);
  CHECK(mrl_tensor_data(t)[5] == 42);
  /* and the C side freeing first leaves Lua's view working */
  CHECK(mrl_script_set_tensor(s, "t2", t) == MRL_OK);
  mrl_tensor_free(t);
  CHECK(mrl_script_run(s, "seen = t2:sum()", NULL) == MRL_OK);
  CHECK(mrl_script_get_number(s, "seen", &seen) == MRL_OK && seen == 7 * 3 - 1 + 0 + 42);

  /* get_tensor returns a view of the Lua tensor */
  CHECK(mrl_script_run(s, "u = require('moonrl').tensor.arange(6):reshape(2, 3)", NULL) == MRL_OK);
  mrl_tensor *u = NULL;
  CHECK(mrl_script_get_tensor(s, "u", &u) == MRL_OK);
  if (u) {
    CHECK(mrl_tensor_rank(u) == 2 && mrl_tensor_shape(u)[0] == 2 && mrl_tensor_shape(u)[1] == 3);
    CHECK(mrl_tensor_data(u)[4] == 4);
    mrl_tensor_data(u)[5] = 100;
    CHECK(mrl_script_run(s, "seen = u:get(2, 3)", NULL) == MRL_OK);
    CHECK(mrl_script_get_number(s, "seen", &seen) == MRL_OK && seen == 100);
    CHECK(mrl_script_run(s, "u:free(); u = nil; collectgarbage()", NULL) == MRL_OK);
    CHECK(mrl_tensor_data(u)[4] == 4); /* the C view outlives Lua's */
    mrl_tensor_free(u);
  }

  mrl_tensor *o = NULL;
  CHECK(mrl_script_run(s, "n = 5; c = require('moonrl').tensor.zeros({2}); c:free()", NULL) ==
        MRL_OK);
  CHECK_FAILS(e, MRL_ERR_INVALID, "global 'n' is number, not an open tensor",
              mrl_script_get_tensor(s, "n", &o));
  CHECK_FAILS(e, MRL_ERR_INVALID, "global 'nothing' is nil",
              mrl_script_get_tensor(s, "nothing", &o));
  CHECK_FAILS(e, MRL_ERR_INVALID, "global 'c' is userdata, not an open tensor",
              mrl_script_get_tensor(s, "c", &o));
  CHECK(o == NULL);
  mrl_script_free(s);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static const test_case tests[] = {
    {"status_codes_and_version", test_status_codes_and_version},
    {"clock_is_monotonic", test_clock_is_monotonic},
    {"blas_info", test_blas_info},
    {"engine_handle", test_engine_handle},
    {"engine_threads", test_engine_threads},
    {"pool", test_pool},
    {"memory_accounting", test_memory_accounting},
    {"memory_limit", test_memory_limit},
    {"allocation_failure_at_every_step", test_allocation_failure_at_every_step},
    {"engine_freed_before_its_objects", test_engine_freed_before_its_objects},
    {"rng_matches_reference", test_rng_matches_reference},
    {"rng_uniform_and_normal", test_rng_uniform_and_normal},
    {"rng_errors", test_rng_errors},
    {"rng_int", test_rng_int},
    {"script_runs_a_tensor_chunk", test_script_runs_a_tensor_chunk},
    {"script_errors", test_script_errors},
    {"script_run_file", test_script_run_file},
    {"script_shares_tensors", test_script_shares_tensors},
    {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
