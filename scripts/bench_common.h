/* bench_common.h - timing helpers shared by the benchmark programs (header-only: the stock
 * OpenBLAS baseline does not link libmoonrl). */
#ifndef MRL_BENCH_COMMON_H
#define MRL_BENCH_COMMON_H

#include <stdlib.h>
#include <time.h>

enum { SAMPLES = 9 }; /* samples per figure; the median is reported */

static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v in place and returns its median. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Repetitions so that one sample takes about 50 ms at the expected rate. */
static inline int bench_reps(double work, double expected_rate) {
  int r = (int)(0.05 * expected_rate / work);
  return r < 1 ? 1 : r;
}

#endif /* MRL_BENCH_COMMON_H */
