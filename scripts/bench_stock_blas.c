/* bench_stock_blas.c - sgemm GFLOPS of OpenBLAS linked the usual way, so that it picks its kernels
 * in its own constructor before main: the baseline moonrl's core-type choice is measured against.
 * Prints "stock core" and "stock n gflops" lines (medians). */
#define _POSIX_C_SOURCE 200809L
#include "bench_common.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

char *openblas_get_corename(void);

int main(void) {
  printf("stock\tcore\t%s\n", openblas_get_corename());
  const int sizes[] = {256, 512, 1024, 2048};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    int n = sizes[i];
    float *a = malloc(sizeof(float) * (size_t)n * (size_t)n);
    float *b = malloc(sizeof(float) * (size_t)n * (size_t)n);
    float *c = malloc(sizeof(float) * (size_t)n * (size_t)n);
    if (!a || !b || !c) return 1;
    for (size_t k = 0; k < (size_t)n * (size_t)n; k++) {
      a[k] = (float)(k % 7) * 0.1f;
      b[k] = (float)(k % 5) * 0.1f;
    }
    double flops = 2.0 * n * (double)n * n;
    int reps = bench_reps(flops, 30e9);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    double rates[SAMPLES];
    for (int s = 0; s < SAMPLES; s++) {
      double t0 = bench_now();
      for (int r = 0; r < reps; r++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
      rates[s] = flops * reps / (bench_now() - t0) / 1e9;
    }
    printf("stock\t%d\t%.1f\n", n, bench_median(rates, SAMPLES));
    free(a);
    free(b);
    free(c);
  }
  return 0;
}
