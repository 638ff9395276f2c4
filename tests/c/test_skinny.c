/* test_skinny.c - the few-row projections of skinny.c against mrl__gemm (OpenBLAS): odd sizes of
 * every dimension, padded strides, beta 0 and 1; a row's result the same bits alone as among
 * others (batch invariance) and on 1 and 3 threads; each at every kernel level the CPU runs. */
#include "model.h"
#include "support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float *random_floats(struct mrl_rng *r, int64_t count) {
  float *p = malloc(sizeof(float) * (size_t)(count > 0 ? count : 1));
  for (int64_t i = 0; i < count; i++) p[i] = (float)mrl__rng_normal(r);
  return p;
}

static mrl_engine *engine_with(int threads) {
  mrl_engine *e = new_engine();
  MUST(mrl_engine_set_threads(e, threads));
  e->pool_min_work = 0;
  MUST(mrl__pool_start(e, "test"));
  return e;
}

/* y = beta y0 + x W^T by the kernel and by mrl__gemm, for one set of sizes and strides */
static double one_case(mrl_engine *e, struct mrl_rng *r, int64_t n, int64_t out, int64_t in,
                       float beta) {
  int64_t ldx = in + 3, ldw = in + 1, ldy = out + 2;
  float *x = random_floats(r, n * ldx), *w = random_floats(r, out * ldw);
  float *y = random_floats(r, n * ldy), *want = malloc(sizeof(float) * (size_t)(n * ldy));
  memcpy(want, y, sizeof(float) * (size_t)(n * ldy));
  mrl__skinny_gemm(e, y, ldy, x, ldx, w, ldw, n, out, in, beta);
  mrl__gemm(false, true, n, out, in, 1.0f, x, ldx, w, ldw, beta, want, ldy);
  double worst = 0.0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < ldy; j++) {
      double d = fabs((double)y[i * ldy + j] - want[i * ldy + j]);
      if (j >= out) CHECKF(d == 0.0, "padding column %lld of row %lld changed", (long long)j,
                           (long long)i);
      worst = fmax(worst, d / sqrt((double)in + 1.0));
    }
  free(x);
  free(w);
  free(y);
  free(want);
  return worst;
}

static void matches_gemm(int level) {
  const char *name = mrl__skinny_use(level);
  mrl_engine *e = engine_with(3);
  struct mrl_rng r;
  mrl__rng_seed(&r, 3);
  /* up to 40 rows (past 16, where decode switches to OpenBLAS), columns past the 8-lane tail */
  const int64_t ns[] = {1, 2, 3, 5, 16, 17, 19, 40}, outs[] = {1, 3, 4, 5, 17, 64, 130},
                ins[] = {1, 7, 8, 9, 100, 257, 520, 601};
  double worst = 0.0;
  int cases = 0;
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
    for (size_t b = 0; b < sizeof outs / sizeof *outs; b++)
      for (size_t c = 0; c < sizeof ins / sizeof *ins; c++)
        for (int beta = 0; beta <= 1; beta++) {
          worst = fmax(worst, one_case(e, &r, ns[a], outs[b], ins[c], (float)beta));
          cases++;
        }
  check_note("%s: %d cases: max |kernel - OpenBLAS| / sqrt(in + 1) = %.2e", name, cases, worst);
  CHECKF(worst < 1e-5, "%s", name); /* float rounding of sums of `in` products of N(0, 1) */
  mrl_engine_free(e);
}

/* every kernel level this CPU runs (AVX-512, AVX2, portable), then the best again */
static void test_matches_gemm(void) {
  int levels = 0;
  for (; mrl__skinny_use(levels); levels++) matches_gemm(levels);
  mrl__skinny_use(-1);
  check_note("%d kernel levels on this CPU, best: %s", levels, mrl__skinny_use(-1));
  CHECK(levels >= 1);
}

/* Each row of a 41-row product equals that row alone, and 1 thread gives what 3 give. */
static void rows_independent_and_threads(int level) {
  enum { N = 41, OUT = 75, IN = 601 };
  const char *name = mrl__skinny_use(level);
  struct mrl_rng r;
  mrl__rng_seed(&r, 5);
  float *x = random_floats(&r, N * IN), *w = random_floats(&r, OUT * IN);
  float together[N * OUT], alone[OUT], single[N * OUT];
  mrl_engine *e3 = engine_with(3), *e1 = engine_with(1);
  mrl__skinny_gemm(e3, together, OUT, x, IN, w, IN, N, OUT, IN, 0.0f);
  mrl__skinny_gemm(e1, single, OUT, x, IN, w, IN, N, OUT, IN, 0.0f);
  CHECKF(memcmp(together, single, sizeof together) == 0, "%s: 1 thread differs from 3", name);
  for (int i = 0; i < N; i++) {
    mrl__skinny_gemm(e3, alone, OUT, x + i * IN, IN, w, IN, 1, OUT, IN, 0.0f);
    CHECKF(memcmp(alone, together + i * OUT, sizeof alone) == 0, "%s: row %d alone differs", name,
           i);
  }
  free(x);
  free(w);
  mrl_engine_free(e3);
  mrl_engine_free(e1);
}

static void test_rows_independent_and_threads(void) {
  for (int level = 0; mrl__skinny_use(level); level++) rows_independent_and_threads(level);
  mrl__skinny_use(-1);
}

static const test_case tests[] = {{"matches_gemm", test_matches_gemm},
                                  {"rows_independent_and_threads", test_rows_independent_and_threads},
                                  {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
