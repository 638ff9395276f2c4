/* skinny.c - projections of few rows, y = beta y + x W^T with W (out, in) as the model stores
 * it: what decoding runs at every step (one row per live sequence). OpenBLAS repacks the whole
 * of W on every such call and runs it on the calling thread's team; here W is read straight from
 * the parameter buffer, each of its rows once per call (from memory, at the bandwidth the cores
 * get), its blocks of output rows shared out over the engine's threads.
 *
 * A tile is SK_OUT rows of W by SK_ROWS rows of x, SK_OUT x SK_ROWS vector accumulators of 8
 * lanes held in registers through the whole reduction; a block of W rows (a unit of work) stays
 * in L1 while every pair of x rows goes past it. Each output element is computed by that same
 * code whatever n is and wherever it falls in a tile (a tile short of rows repeats its last row
 * and drops the copy), so a row's result does not depend on the other rows of the call: the
 * products are batch-invariant by construction, and independent of the thread count. The
 * reference they are tested against is mrl__gemm (OpenBLAS). */
#include "kernel_math.h"
#include "model.h"

#include <string.h>

enum { SK_OUT = 4, SK_ROWS = 3, SK_LANES = 8, SK_UNIT = 16 /* W rows per unit of work */ };

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4))); /* unaligned loads */

/* (macros rather than functions: a vector return value would change the ABI of the baseline
 * build, which gcc warns about) an unaligned load of 8 floats; the first k < 8 floats, zeros
 * after; the sum of a vector's lanes in one fixed order */
#define LOAD8(p) (*(const v8u *)(p))
#define LOAD_PART(v, p, k)                                                                         \
  do {                                                                                             \
    memset(&(v), 0, sizeof(v));                                                                    \
    memcpy(&(v), (p), sizeof(float) * (size_t)(k));                                                \
  } while (0)
#define LANE_SUM(v)                                                                                \
  ((((v)[0] + (v)[1]) + ((v)[2] + (v)[3])) + (((v)[4] + (v)[5]) + ((v)[6] + (v)[7])))

/* The tiles: out[o][r] = sum_j w[o][j] x[r][j] over j < in, each element an 8-lane chain of
 * multiply-adds over j ascending, then LANE_SUM: the same for every tile shape, so a row gives
 * the same bits in a tile of 3 rows as in a tile of one. SK_TILE(r) is the chain of row r;
 * KEEP(v) pins a loaded vector in a register (gcc would otherwise fold each use of it into the
 * multiply-add as a load of its own, which makes the loop load-bound). */
#define SK_TILE_LOOP(ROWS, KEEP)                                                                   \
  v8 acc[SK_OUT][ROWS];                                                                            \
  memset(acc, 0, sizeof acc);                                                                      \
  int64_t whole = in / SK_LANES * SK_LANES;                                                        \
  for (int64_t j = 0; j < whole; j += SK_LANES) {                                                  \
    v8 xv[ROWS];                                                                                   \
    _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; r++) {                                       \
      xv[r] = LOAD8(x[r] + j);                                                                     \
      KEEP(xv[r]);                                                                                 \
    }                                                                                              \
    _Pragma("GCC unroll 4") for (int o = 0; o < SK_OUT; o++) {                                     \
      v8 wv = LOAD8(w[o] + j);                                                                     \
      KEEP(wv);                                                                                    \
      _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; r++) acc[o][r] += wv * xv[r];              \
    }                                                                                              \
  }                                                                                                \
  if (whole < in) {                                                                                \
    v8 xv[ROWS], wv;                                                                               \
    for (int r = 0; r < ROWS; r++) LOAD_PART(xv[r], x[r] + whole, in - whole);                     \
    _Pragma("GCC unroll 4") for (int o = 0; o < SK_OUT; o++) {                                     \
      LOAD_PART(wv, w[o] + whole, in - whole);                                                     \
      _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; r++) acc[o][r] += wv * xv[r];              \
    }                                                                                              \
  }                                                                                                \
  for (int o = 0; o < SK_OUT; o++)                                                                 \
    for (int r = 0; r < ROWS; r++) out[o * SK_ROWS + r] = LANE_SUM(acc[o][r]);

#define NO_KEEP(v) ((void)0)
typedef void sk_tile_fn(float *out, const float *const *w, const float *const *x, int64_t in);

/* portable: gcc lowers the vectors to what the target has */
MRL_MATH static void tile3_plain(float *out, const float *const *w, const float *const *x,
                                 int64_t in) {
  SK_TILE_LOOP(3, NO_KEEP)
}
MRL_MATH static void tile1_plain(float *out, const float *const *w, const float *const *x,
                                 int64_t in) {
  SK_TILE_LOOP(1, NO_KEEP)
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* AVX2 + FMA (x86-64-v3, also what runs on v4: 12 accumulators and 4 operands fit its 16 ymm
 * registers) */
#define SK_HAVE_V3 1
#define KEEP_YMM(v) __asm__("" : "+x"(v))
__attribute__((target("arch=x86-64-v3"))) MRL_MATH static void tile3_v3(
    float *out, const float *const *w, const float *const *x, int64_t in) {
  SK_TILE_LOOP(3, KEEP_YMM)
}
__attribute__((target("arch=x86-64-v3"))) MRL_MATH static void tile1_v3(
    float *out, const float *const *w, const float *const *x, int64_t in) {
  SK_TILE_LOOP(1, KEEP_YMM)
}
#endif

typedef struct {
  int64_t n, out, in, ldx, ldw, ldy;
  const float *x, *w;
  float *y;
  float beta;
  sk_tile_fn *tile3, *tile1;
} skinny_job;

/* One unit: output columns [u SK_UNIT, (u + 1) SK_UNIT) of every row. */
static void skinny_unit(void *ctx, int64_t u, int worker) {
  (void)worker;
  const skinny_job *job = ctx;
  int64_t o_end = (u + 1) * SK_UNIT < job->out ? (u + 1) * SK_UNIT : job->out;
  for (int64_t o0 = u * SK_UNIT; o0 < o_end; o0 += SK_OUT) {
    const float *w[SK_OUT];
    for (int o = 0; o < SK_OUT; o++) /* short of rows: the last one again, its copy dropped */
      w[o] = job->w + (o0 + o < o_end ? o0 + o : o_end - 1) * job->ldw;
    /* the next tile's rows of W on their way into the cache while this one computes: each new
     * row would otherwise start with a wait on memory before the prefetcher has caught on */
    for (int64_t o = o0 + 2 * SK_OUT; o < o0 + 3 * SK_OUT && o < job->out; o++)
      for (int64_t j = 0; j < job->in; j += 16) __builtin_prefetch(job->w + o * job->ldw + j, 0, 2);
    for (int64_t r0 = 0; r0 < job->n;) {
      int rows = job->n - r0 >= SK_ROWS ? SK_ROWS : 1;
      const float *x[SK_ROWS];
      for (int r = 0; r < rows; r++) x[r] = job->x + (r0 + r) * job->ldx;
      float t[SK_OUT * SK_ROWS];
      (rows == SK_ROWS ? job->tile3 : job->tile1)(t, w, x, job->in);
      for (int r = 0; r < rows; r++) {
        float *y = job->y + (r0 + r) * job->ldy;
        for (int o = 0; o < SK_OUT && o0 + o < o_end; o++)
          y[o0 + o] = job->beta == 0.0f ? t[o * SK_ROWS + r]
                                        : job->beta * y[o0 + o] + t[o * SK_ROWS + r];
      }
      r0 += rows;
    }
  }
}

void mrl__skinny_gemm(mrl_engine *e, float *y, int64_t ldy, const float *x, int64_t ldx,
                      const float *w, int64_t ldw, int64_t n, int64_t out, int64_t in,
                      float beta) {
  if (n <= 0 || out <= 0) return;
  skinny_job job = {n, out, in, ldx, ldw, ldy, x, w, y, beta, tile3_plain, tile1_plain};
#ifdef SK_HAVE_V3
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    job.tile3 = tile3_v3;
    job.tile1 = tile1_v3;
  }
#endif
  mrl__pool_run(e, (out + SK_UNIT - 1) / SK_UNIT, 2.0 * (double)n * (double)out * (double)in,
                skinny_unit, &job);
}

void mrl__project(mrl_model *m, bool apart, float *y, int64_t ldy, const float *x, int64_t ldx,
                  int64_t w_offset, int64_t n, int64_t out, int64_t in, float beta) {
  const float *w = m->weights + w_offset;
  if (!m->reference_projections && (apart || n <= MRL_SKINNY_ROWS))
    mrl__skinny_gemm(m->engine, y, ldy, x, ldx, w, in, n, out, in, beta);
  else
    mrl__gemm_rows(apart, true, n, out, in, 1.0f, x, ldx, w, in, beta, y, ldy);
}
