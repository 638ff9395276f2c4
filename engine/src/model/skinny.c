/* skinny.c - projections of few rows, y = beta y + x W^T with W (out, in) as the model stores
 * it: what decoding runs at every step (one row per live sequence). OpenBLAS repacks the whole
 * of W on every such call and runs it on the calling thread's team; here W is read straight from
 * the parameter buffer, each of its rows once per call (from memory, at the bandwidth the cores
 * get), its blocks of output rows shared out over the engine's threads.
 *
 * A tile is SK_OUT rows of W by up to 3 rows of x (AVX2 and portable kernels: vectors of 8 lanes)
 * or 6 (AVX-512: 16 lanes), one vector accumulator per pair held in registers through the whole
 * reduction; a block of W rows (a unit of work) stays
 * in L1 while every pair of x rows goes past it. Each output element is computed by that same
 * code whatever n is and wherever it falls in a tile (a tile short of rows repeats its last row
 * and drops the copy), so a row's result does not depend on the other rows of the call: the
 * products are batch-invariant by construction, and independent of the thread count. The
 * reference they are tested against is mrl__gemm (OpenBLAS). */
#include "kernel_math.h"
#include "model.h"

#include <string.h>

/* SK_MAX_ROWS: the most rows of x a tile takes (the AVX-512 kernel's; 8-lane kernels take 3) */
enum { SK_OUT = 4, SK_MAX_ROWS = 6, SK_UNIT = 32 /* W rows per unit of work */ };

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4))); /* unaligned loads */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

/* (macros rather than functions: a vector return value would change the ABI of the baseline
 * build, which gcc warns about) an unaligned load of a vector; the first k floats of one, zeros
 * after; the sum of an 8-lane vector's lanes in one fixed order (16 lanes: sk_reduce16) */
#define LOAD8(p) (*(const v8u *)(p))
#define LOAD16(p) (*(const v16u *)(p))
#define LOAD_PART(v, p, k)                                                                         \
  do {                                                                                             \
    memset(&(v), 0, sizeof(v));                                                                    \
    memcpy(&(v), (p), sizeof(float) * (size_t)(k));                                                \
  } while (0)
#define LANE_SUM(v)                                                                                \
  ((((v)[0] + (v)[1]) + ((v)[2] + (v)[3])) + (((v)[4] + (v)[5]) + ((v)[6] + (v)[7])))

/* The tiles: out[o][r] = sum_j w[o][j] x[r][j] over j < in, each element a LANES-lane chain of
 * multiply-adds over j ascending, then its lanes' sum (FINISH): the same for every tile shape of one kernel, so a row
 * gives the same bits in a tile of 6 rows as in a tile of one. KEEP(v) pins a loaded vector in a
 * register (gcc would otherwise fold each use of it into the multiply-add as a load of its own,
 * which makes the loop load-bound). */
#define SK_TILE_LOOP(VT, LANES, LOADX, FINISH, ROWS, KEEP, LOADW, LOADW_PART, PFW)                 \
  VT acc[SK_OUT][ROWS];                                                                            \
  memset(acc, 0, sizeof acc);                                                                      \
  int64_t whole = in / LANES * LANES;                                                              \
  for (int64_t j = 0; j < whole; j += LANES) {                                                     \
    VT xv[ROWS];                                                                                   \
    _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++) {                                       \
      xv[r] = LOADX(x[r] + j);                                                                     \
      KEEP(xv[r]);                                                                                 \
    }                                                                                              \
    _Pragma("GCC unroll 4") for (int o = 0; o < SK_OUT; o++) {                                     \
      VT wv = LOADW(w[o], j);                                                                      \
      KEEP(wv);                                                                                    \
      __builtin_prefetch(PFW(pf[o], j), 0, 2);                                                     \
      _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++) acc[o][r] += wv * xv[r];              \
    }                                                                                              \
  }                                                                                                \
  if (whole < in) {                                                                                \
    VT xv[ROWS], wv;                                                                               \
    for (int r = 0; r < ROWS; r++) LOAD_PART(xv[r], x[r] + whole, in - whole);                     \
    _Pragma("GCC unroll 4") for (int o = 0; o < SK_OUT; o++) {                                     \
      LOADW_PART(wv, w[o], whole, in - whole);                                                     \
      _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++) acc[o][r] += wv * xv[r];              \
    }                                                                                              \
  }                                                                                                \
  FINISH(acc, ROWS)
/* 8 lanes: each accumulator summed on its own */
#define SK_FINISH8(acc, ROWS)                                                                      \
  for (int o = 0; o < SK_OUT; o++)                                                                 \
    for (int r = 0; r < ROWS; r++) out[o * SK_MAX_ROWS + r] = LANE_SUM(acc[o][r]);

#define NO_KEEP(v) ((void)0)
/* pf: SK_OUT rows whose columns the tile prefetches as it goes through its own (the next tile's
 * rows of W, or its own again when there is nothing to fetch) */
typedef void sk_tile_fn(float *out, const void *const *w, const float *const *x, int64_t in,
                        const void *const *pf);

/* W's rows as float32, or as bfloat16 (the high half of a float32's bits): 8 or 16 of them
 * widened to floats by a shift */
typedef uint16_t h8 __attribute__((vector_size(16)));
typedef uint16_t h8u __attribute__((vector_size(16), aligned(2)));
typedef uint32_t u8 __attribute__((vector_size(32)));
typedef uint16_t h16 __attribute__((vector_size(32)));
typedef uint16_t h16u __attribute__((vector_size(32), aligned(2)));
typedef uint32_t u16 __attribute__((vector_size(64)));
#define PFW_F32(w, j) ((const float *)(w) + (j))
#define PFW_BF16(w, j) ((const uint16_t *)(w) + (j))
#define LOADW_F32(w, j) LOAD8((const float *)(w) + (j))
#define LOADW16_F32(w, j) LOAD16((const float *)(w) + (j))
#define LOADW_F32_PART(v, w, j, k) LOAD_PART(v, (const float *)(w) + (j), k)
#define LOADW_BF16(w, j) ((v8)(__builtin_convertvector(*(const h8u *)((const uint16_t *)(w) + (j)), u8) << 16))
#define LOADW16_BF16(w, j) ((v16)(__builtin_convertvector(*(const h16u *)((const uint16_t *)(w) + (j)), u16) << 16))
#define LOADW_BF16_PART_AS(HT, UT, VT, v, w, j, k)                                                 \
  do {                                                                                             \
    HT h_ = {0};                                                                                   \
    memcpy(&h_, (const uint16_t *)(w) + (j), sizeof(uint16_t) * (size_t)(k));                     \
    (v) = (VT)(__builtin_convertvector(h_, UT) << 16);                                             \
  } while (0)
#define LOADW_BF16_PART(v, w, j, k) LOADW_BF16_PART_AS(h8, u8, v8, v, w, j, k)
#define LOADW16_BF16_PART(v, w, j, k) LOADW_BF16_PART_AS(h16, u16, v16, v, w, j, k)

/* 8-lane tiles (portable: gcc lowers the vectors to what the target has) */
#define SK_TILE_FN(NAME, ATTR, ROWS, KEEP, LOADW, LOADW_PART, PFW)                                 \
  ATTR MRL_MATH static void NAME(float *out, const void *const *w, const float *const *x,          \
                                 int64_t in, const void *const *pf) {                              \
    SK_TILE_LOOP(v8, 8, LOAD8, SK_FINISH8, ROWS, KEEP, LOADW, LOADW_PART, PFW)                     \
  }
SK_TILE_FN(tile3_plain, , 3, NO_KEEP, LOADW_F32, LOADW_F32_PART, PFW_F32)
SK_TILE_FN(tile2_plain, , 2, NO_KEEP, LOADW_F32, LOADW_F32_PART, PFW_F32)
SK_TILE_FN(tile1_plain, , 1, NO_KEEP, LOADW_F32, LOADW_F32_PART, PFW_F32)
SK_TILE_FN(tile3_plain_bf16, , 3, NO_KEEP, LOADW_BF16, LOADW_BF16_PART, PFW_BF16)
SK_TILE_FN(tile2_plain_bf16, , 2, NO_KEEP, LOADW_BF16, LOADW_BF16_PART, PFW_BF16)
SK_TILE_FN(tile1_plain_bf16, , 1, NO_KEEP, LOADW_BF16, LOADW_BF16_PART, PFW_BF16)

/* A kernel: tiles[r] takes r rows of x, 1 <= r <= max_rows (every r in between present: a call's
 * rows are cut into tiles of max_rows and one of what is left) */
typedef struct {
  const char *name;
  int max_rows;
  sk_tile_fn *tiles[SK_MAX_ROWS + 1], *tiles_bf16[SK_MAX_ROWS + 1];
} sk_kernel;

static const sk_kernel sk_plain = {
    "portable", 3,
    {NULL, tile1_plain, tile2_plain, tile3_plain},
    {NULL, tile1_plain_bf16, tile2_plain_bf16, tile3_plain_bf16}};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* AVX2 + FMA (x86-64-v3: 12 accumulators and 4 operands fit its 16 ymm registers) */
#define SK_HAVE_X86 1
#define KEEP_YMM(v) __asm__("" : "+x"(v))
#define V3 __attribute__((target("arch=x86-64-v3")))
SK_TILE_FN(tile3_v3, V3, 3, KEEP_YMM, LOADW_F32, LOADW_F32_PART, PFW_F32)
SK_TILE_FN(tile2_v3, V3, 2, KEEP_YMM, LOADW_F32, LOADW_F32_PART, PFW_F32)
SK_TILE_FN(tile1_v3, V3, 1, KEEP_YMM, LOADW_F32, LOADW_F32_PART, PFW_F32)
SK_TILE_FN(tile3_v3_bf16, V3, 3, KEEP_YMM, LOADW_BF16, LOADW_BF16_PART, PFW_BF16)
SK_TILE_FN(tile2_v3_bf16, V3, 2, KEEP_YMM, LOADW_BF16, LOADW_BF16_PART, PFW_BF16)
SK_TILE_FN(tile1_v3_bf16, V3, 1, KEEP_YMM, LOADW_BF16, LOADW_BF16_PART, PFW_BF16)
static const sk_kernel sk_v3 = {"avx2", 3,
                                {NULL, tile1_v3, tile2_v3, tile3_v3},
                                {NULL, tile1_v3_bf16, tile2_v3_bf16, tile3_v3_bf16}};

/* AVX-512 (x86-64-v4): 16 lanes, tiles of 4 W rows by up to 6 x rows (24 accumulators and 7
 * operands in its 32 zmm registers), twice the multiply-adds per instruction of AVX2 */
#define KEEP_ZMM(v) __asm__("" : "+v"(v))
#define V4 __attribute__((target("arch=x86-64-v4")))

/* The lane sums of 16 accumulators at once, a transposed tree: four rounds, each adding two
 * halves of every accumulator's remaining lanes, two accumulators' halves packed per vector, so a
 * round costs two two-source shuffles and one add for 16 lanes of work. Whatever the other
 * accumulators, an accumulator a's sum is ((a'0 + a'4) + (a'2 + a'6)) + ((a'1 + a'5) + (a'3 +
 * a'7)) with a'k = a[k] + a[k + 8]: the same bits for it alone as among others. Lane e of the
 * result is the sum of a[e]. */
#define SK_PAIR16(x, y, ...) (__builtin_shufflevector(x, y, __VA_ARGS__))
static inline __attribute__((always_inline)) V4 MRL_MATH v16 *sk_reduce16(v16 *a) {
  v16 t[8], u[4], v[2];
  for (int i = 0; i < 8; i++)
    t[i] = SK_PAIR16(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22,
                     23) +
           SK_PAIR16(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                     30, 31);
  for (int i = 0; i < 4; i++)
    u[i] = SK_PAIR16(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                     26, 27) +
           SK_PAIR16(t[2 * i], t[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29,
                     30, 31);
  for (int i = 0; i < 2; i++)
    v[i] = SK_PAIR16(u[2 * i], u[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25,
                     28, 29) +
           SK_PAIR16(u[2 * i], u[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27,
                     30, 31);
  a[0] = SK_PAIR16(v[0], v[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         SK_PAIR16(v[0], v[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return a;
}

/* the 4 x ROWS accumulators (at most 24) in groups of 16, zeros after the last */
#define SK_FINISH16(acc, ROWS)                                                                     \
  _Pragma("GCC unroll 2") for (int g = 0; g * 16 < SK_OUT * ROWS; g++) {                           \
    v16 a[16];                                                                                     \
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {                                        \
      int e = g * 16 + i;                                                                          \
      a[i] = e < SK_OUT * ROWS ? acc[e / ROWS][e % ROWS] : (v16){0};                               \
    }                                                                                              \
    v16 s = *sk_reduce16(a);                                                                       \
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {                                        \
      int e = g * 16 + i;                                                                          \
      if (e < SK_OUT * ROWS) out[e / ROWS * SK_MAX_ROWS + e % ROWS] = s[i];                        \
    }                                                                                              \
  }

#define SK_TILE16_FN(NAME, ROWS, LOADW, LOADW_PART, PFW)                                           \
  V4 MRL_MATH static void NAME(float *out, const void *const *w, const float *const *x,            \
                               int64_t in, const void *const *pf) {                                \
    SK_TILE_LOOP(v16, 16, LOAD16, SK_FINISH16, ROWS, KEEP_ZMM, LOADW, LOADW_PART, PFW)             \
  }
#define SK_TILES16(SUFFIX, LOADW, LOADW_PART, PFW)                                                 \
  SK_TILE16_FN(tile1_v4##SUFFIX, 1, LOADW, LOADW_PART, PFW)                                        \
  SK_TILE16_FN(tile2_v4##SUFFIX, 2, LOADW, LOADW_PART, PFW)                                        \
  SK_TILE16_FN(tile3_v4##SUFFIX, 3, LOADW, LOADW_PART, PFW)                                        \
  SK_TILE16_FN(tile4_v4##SUFFIX, 4, LOADW, LOADW_PART, PFW)                                        \
  SK_TILE16_FN(tile5_v4##SUFFIX, 5, LOADW, LOADW_PART, PFW)                                        \
  SK_TILE16_FN(tile6_v4##SUFFIX, 6, LOADW, LOADW_PART, PFW)
SK_TILES16(, LOADW16_F32, LOADW_F32_PART, PFW_F32)
SK_TILES16(_bf16, LOADW16_BF16, LOADW16_BF16_PART, PFW_BF16)
static const sk_kernel sk_v4 = {
    "avx512", 6,
    {NULL, tile1_v4, tile2_v4, tile3_v4, tile4_v4, tile5_v4, tile6_v4},
    {NULL, tile1_v4_bf16, tile2_v4_bf16, tile3_v4_bf16, tile4_v4_bf16, tile5_v4_bf16,
     tile6_v4_bf16}};
#endif

/* The kernels this CPU runs, best first (the portable one last, always there). */
static int sk_kernels(const sk_kernel **out) {
  int n = 0;
#ifdef SK_HAVE_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    out[n++] = &sk_v4;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out[n++] = &sk_v3;
#endif
  out[n++] = &sk_plain;
  return n;
}

/* the kernel in use: the best one, or the one a test chose (mrl__skinny_use) */
static _Atomic(const sk_kernel *) sk_chosen;

static const sk_kernel *sk_kernel_now(void) {
  const sk_kernel *k = sk_chosen;
  if (!k) {
    const sk_kernel *all[3];
    sk_kernels(all);
    k = all[0];
    sk_chosen = k;
  }
  return k;
}

const char *mrl__skinny_use(int which) {
  const sk_kernel *all[3];
  int n = sk_kernels(all);
  if (which < 0) {
    sk_chosen = NULL;
    return sk_kernel_now()->name;
  }
  if (which >= n) return NULL;
  sk_chosen = all[which];
  return all[which]->name;
}

typedef struct {
  int64_t n, out, in, ldx, ldw, ldy;
  const float *x;
  const void *w;    /* float or uint16_t (bf16) rows */
  size_t w_size;    /* bytes per element of w */
  float *y;
  float beta;
  int max_rows;
  sk_tile_fn *const *tiles;
} skinny_job;

/* One unit: output columns [u SK_UNIT, (u + 1) SK_UNIT) of every row. */
static void skinny_unit(void *ctx, int64_t u, int worker) {
  (void)worker;
  const skinny_job *job = ctx;
  int64_t o_end = (u + 1) * SK_UNIT < job->out ? (u + 1) * SK_UNIT : job->out;
  for (int64_t o0 = u * SK_UNIT; o0 < o_end; o0 += SK_OUT) {
    const char *base = job->w;
    const void *w[SK_OUT];
    for (int o = 0; o < SK_OUT; o++) /* short of rows: the last one again, its copy dropped */
      w[o] = base + (size_t)((o0 + o < o_end ? o0 + o : o_end - 1) * job->ldw) * job->w_size;
    /* the next tile's rows of W come into the cache while this one's first pass computes, a
     * line per row per step of its loop (a burst of prefetches at the tile's start would fill
     * the core's miss buffers and stall it); the unit's first tile is fetched as it is read */
    const void *next[SK_OUT];
    for (int o = 0; o < SK_OUT; o++)
      next[o] = o0 + SK_OUT < o_end
                    ? base + (size_t)((o0 + SK_OUT + o < o_end ? o0 + SK_OUT + o : o_end - 1) *
                                      job->ldw) * job->w_size
                    : w[o];
    for (int64_t r0 = 0; r0 < job->n;) {
      int rows = job->n - r0 >= job->max_rows ? job->max_rows : (int)(job->n - r0);
      const float *x[SK_MAX_ROWS];
      for (int r = 0; r < rows; r++) x[r] = job->x + (r0 + r) * job->ldx;
      float t[SK_OUT * SK_MAX_ROWS];
      job->tiles[rows](t, w, x, job->in, r0 == 0 ? next : w);
      for (int r = 0; r < rows; r++) {
        float *y = job->y + (r0 + r) * job->ldy;
        for (int o = 0; o < SK_OUT && o0 + o < o_end; o++)
          y[o0 + o] = job->beta == 0.0f ? t[o * SK_MAX_ROWS + r]
                                        : job->beta * y[o0 + o] + t[o * SK_MAX_ROWS + r];
      }
      r0 += rows;
    }
  }
}

static void skinny_run(mrl_engine *e, float *y, int64_t ldy, const float *x, int64_t ldx,
                       const void *w, size_t w_size, int64_t ldw, int64_t n, int64_t out,
                       int64_t in, float beta) {
  if (n <= 0 || out <= 0) return;
  bool bf16 = w_size == sizeof(uint16_t);
  const sk_kernel *k = sk_kernel_now();
  skinny_job job = {n, out, in, ldx, ldw, ldy, x, w, w_size, y, beta,
                    k->max_rows, bf16 ? k->tiles_bf16 : k->tiles};
  mrl__pool_run(e, (out + SK_UNIT - 1) / SK_UNIT, 2.0 * (double)n * (double)out * (double)in,
                skinny_unit, &job);
}

void mrl__skinny_gemm(mrl_engine *e, float *y, int64_t ldy, const float *x, int64_t ldx,
                      const float *w, int64_t ldw, int64_t n, int64_t out, int64_t in,
                      float beta) {
  skinny_run(e, y, ldy, x, ldx, w, sizeof(float), ldw, n, out, in, beta);
}

void mrl__skinny_gemm_bf16(mrl_engine *e, float *y, int64_t ldy, const float *x, int64_t ldx,
                           const uint16_t *w, int64_t ldw, int64_t n, int64_t out, int64_t in,
                           float beta) {
  skinny_run(e, y, ldy, x, ldx, w, sizeof(uint16_t), ldw, n, out, in, beta);
}

uint16_t mrl__bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

void mrl__model_refresh_bf16(mrl_model *m) {
  if (!m->decode_bf16) return;
  for (int64_t i = 0; i < m->numel; i++) m->decode_bf16[i] = mrl__bf16_round(m->weights[i]);
}

void mrl__project(mrl_model *m, bool apart, bool bf16, float *y, int64_t ldy, const float *x,
                  int64_t ldx, int64_t w_offset, int64_t n, int64_t out, int64_t in, float beta) {
  if (bf16 && m->decode_bf16)
    mrl__skinny_gemm_bf16(m->engine, y, ldy, x, ldx, m->decode_bf16 + w_offset, in, n, out, in,
                          beta);
  else if (!m->reference_projections && (apart || n <= MRL_SKINNY_ROWS))
    mrl__skinny_gemm(m->engine, y, ldy, x, ldx, m->weights + w_offset, in, n, out, in, beta);
  else
    mrl__gemm_rows(apart, true, n, out, in, 1.0f, x, ldx, m->weights + w_offset, in, beta, y,
                   ldy);
}
