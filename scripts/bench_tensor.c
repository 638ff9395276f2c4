/* bench_tensor.c - times sgemm through the engine's C API beside a direct cblas_sgemm call on the
 * same OpenBLAS (same core type, same process, alternating runs), and elementwise throughput.
 * Prints tab-separated lines: "blas core source threads", "matmul n direct_gflops engine_gflops"
 * and "elementwise name GB/s" (medians). With the argument "matmul" it skips the elementwise part.
 * With "membw" it only measures memory bandwidth: "membw threads GB/s", a read-streaming sum over a
 * 1 GiB buffer (far larger than any cache) by 1 and by 2 threads, each thread its own half. */
#define _POSIX_C_SOURCE 200809L
#include "bench_common.h"
#include "tensor_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(mrl_engine *e, const char *what) {
  fprintf(stderr, "bench: %s: %s\n", what, mrl_engine_last_error(e));
  exit(1);
}

static void bench_matmul(mrl_engine *e, int64_t n) {
  int64_t shape[2] = {n, n};
  mrl_tensor *a, *b, *c;
  if (mrl_tensor_new(e, 2, shape, &a) || mrl_tensor_new(e, 2, shape, &b) ||
      mrl_tensor_new(e, 2, shape, &c))
    die(e, "allocating matrices");
  mrl_tensor_rand_normal(a, NULL, 0, 1);
  mrl_tensor_rand_normal(b, NULL, 0, 1);
  mrl_sgemm_fn sgemm = mrl__blas_sgemm();
  if (!sgemm) {
    fprintf(stderr, "bench: OpenBLAS is not loadable\n");
    exit(1);
  }
  double flops = 2.0 * (double)n * (double)n * (double)n;
  int reps = bench_reps(flops, 100e9);
  double direct[SAMPLES], engine[SAMPLES];
  float *pa = mrl_tensor_data(a), *pb = mrl_tensor_data(b), *pc = mrl_tensor_data(c);
  sgemm(101, 111, 111, (int)n, (int)n, (int)n, 1.0f, pa, (int)n, pb, (int)n, 0.0f, pc, (int)n);
  for (int s = 0; s < SAMPLES; s++) {
    double t0 = bench_now();
    for (int r = 0; r < reps; r++)
      sgemm(101, 111, 111, (int)n, (int)n, (int)n, 1.0f, pa, (int)n, pb, (int)n, 0.0f, pc,
            (int)n);
    double t1 = bench_now();
    for (int r = 0; r < reps; r++)
      if (mrl_tensor_matmul(&c, a, b, 0)) die(e, "matmul");
    double t2 = bench_now();
    direct[s] = flops * reps / (t1 - t0) / 1e9;
    engine[s] = flops * reps / (t2 - t1) / 1e9;
  }
  printf("matmul\t%lld\t%.1f\t%.1f\n", (long long)n, bench_median(direct, SAMPLES),
         bench_median(engine, SAMPLES));
  mrl_tensor_free(a);
  mrl_tensor_free(b);
  mrl_tensor_free(c);
}

typedef mrl_status (*binary_fn)(mrl_tensor **, const mrl_tensor *, const mrl_tensor *);
typedef mrl_status (*unary_fn)(mrl_tensor **, const mrl_tensor *);

/* GB/s counting each element read and written once. */
static void report(const char *name, double bytes, double *secs) {
  double rates[SAMPLES];
  for (int s = 0; s < SAMPLES; s++) rates[s] = bytes / secs[s] / 1e9;
  printf("elementwise\t%s\t%.1f\n", name, bench_median(rates, SAMPLES));
}

static void bench_elementwise(mrl_engine *e) {
  const int64_t n = 1 << 24, rows = 4096, cols = n / rows;
  int64_t flat[1] = {n}, mat[2] = {rows, cols}, row[1] = {cols};
  mrl_tensor *x, *y, *out, *xm, *bias, *outm, *xt;
  if (mrl_tensor_new(e, 1, flat, &x) || mrl_tensor_new(e, 1, flat, &y) ||
      mrl_tensor_new(e, 1, flat, &out) || mrl_tensor_new(e, 1, row, &bias))
    die(e, "allocating vectors");
  mrl_tensor_rand_uniform(x, NULL, -1, 1);
  mrl_tensor_rand_uniform(y, NULL, 0.5f, 1);
  if (mrl_tensor_reshape(x, 2, mat, &xm) || mrl_tensor_reshape(out, 2, mat, &outm))
    die(e, "reshape");
  if (mrl_tensor_transpose(xm, 0, 1, &xt)) die(e, "transpose");
  int64_t tshape[2] = {cols, rows};
  mrl_tensor *outt;
  if (mrl_tensor_new(e, 2, tshape, &outt)) die(e, "allocating");

  struct {
    const char *name;
    binary_fn bin;
    unary_fn un;
    int arrays;
  } cases[] = {{"add", mrl_tensor_add, NULL, 3}, {"mul", mrl_tensor_mul, NULL, 3},
               {"div", mrl_tensor_div, NULL, 3}, {"exp", NULL, mrl_tensor_exp, 2},
               {"tanh", NULL, mrl_tensor_tanh, 2}, {"silu", NULL, mrl_tensor_silu, 2}};
  double secs[SAMPLES];
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    for (int s = 0; s < SAMPLES; s++) {
      double t0 = bench_now();
      mrl_status st = cases[k].bin ? cases[k].bin(&out, x, y) : cases[k].un(&out, x);
      if (st) die(e, cases[k].name);
      secs[s] = bench_now() - t0;
    }
    report(cases[k].name, (double)cases[k].arrays * (double)n * sizeof(float), secs);
  }
  for (int s = 0; s < SAMPLES; s++) {
    double t0 = bench_now();
    if (mrl_tensor_add(&outm, xm, bias)) die(e, "broadcast add");
    secs[s] = bench_now() - t0;
  }
  report("add_row_broadcast", 2.0 * (double)n * sizeof(float), secs);
  for (int s = 0; s < SAMPLES; s++) {
    double t0 = bench_now();
    if (mrl_tensor_copy(outt, xt)) die(e, "transposed copy");
    secs[s] = bench_now() - t0;
  }
  report("copy_transposed", 2.0 * (double)n * sizeof(float), secs);
  for (int s = 0; s < SAMPLES; s++) {
    double t0 = bench_now();
    double sum;
    mrl_tensor_sum_all(x, &sum);
    secs[s] = bench_now() - t0;
  }
  report("sum_all", (double)n * sizeof(float), secs);
  mrl_tensor *xs = NULL;
  if (mrl_tensor_reshape(x, 2, mat, &xs)) die(e, "reshape");
  mrl_tensor *sm = NULL;
  for (int s = 0; s < SAMPLES; s++) {
    double t0 = bench_now();
    if (mrl_tensor_softmax(&sm, xs)) die(e, "softmax");
    secs[s] = bench_now() - t0;
  }
  report("softmax_rows", 2.0 * (double)n * sizeof(float), secs);
  mrl_tensor *all[] = {x, y, out, xm, bias, outm, xt, outt, xs, sm};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) mrl_tensor_free(all[i]);
}

/* ---- memory bandwidth: the rate at which a core streams a buffer that no cache holds ---- */

typedef struct {
  const uint64_t *p;
  size_t n;
  uint64_t sum;
} stream_job;

/* Four independent sums so that the loads, not the adds, set the pace. */
static void *stream_read(void *arg) {
  stream_job *j = arg;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= j->n; i += 4) {
    s0 += j->p[i];
    s1 += j->p[i + 1];
    s2 += j->p[i + 2];
    s3 += j->p[i + 3];
  }
  for (; i < j->n; i++) s0 += j->p[i];
  j->sum = s0 + s1 + s2 + s3;
  return NULL;
}

static void bench_membw(void) {
  const size_t bytes = (size_t)1 << 30, n = bytes / sizeof(uint64_t);
  uint64_t *buf = malloc(bytes);
  if (!buf) {
    fprintf(stderr, "bench: cannot allocate 1 GiB for the bandwidth test\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) buf[i] = i; /* touches every page */
  volatile uint64_t sink = 0;
  for (int threads = 1; threads <= 2; threads++) {
    double rates[SAMPLES];
    for (int s = 0; s < SAMPLES; s++) {
      stream_job jobs[2];
      pthread_t tid[2];
      size_t per = n / (size_t)threads;
      double t0 = bench_now();
      for (int t = 0; t < threads; t++) {
        jobs[t] = (stream_job){buf + (size_t)t * per, t == threads - 1 ? n - (size_t)t * per : per, 0};
        if (t > 0 && pthread_create(&tid[t], NULL, stream_read, &jobs[t])) {
          fprintf(stderr, "bench: pthread_create failed\n");
          exit(1);
        }
      }
      stream_read(&jobs[0]);
      for (int t = 1; t < threads; t++) pthread_join(tid[t], NULL);
      double dt = bench_now() - t0;
      for (int t = 0; t < threads; t++) sink += jobs[t].sum;
      rates[s] = (double)bytes / dt / 1e9;
    }
    printf("membw\t%d\t%.2f\n", threads, bench_median(rates, SAMPLES));
  }
  (void)sink;
  free(buf);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "membw") == 0) {
    bench_membw();
    return 0;
  }
  mrl_engine *e;
  if (mrl_engine_new(&e)) return 1;
  const char *core, *source;
  int threads;
  mrl_blas_info(&core, &threads, NULL, &source);
  printf("blas\t%s\t%s\t%d\n", core, source, threads);
  bool only_matmul = argc > 1 && strcmp(argv[1], "matmul") == 0;
  const int64_t sizes[] = {256, 512, 1024, 2048};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) bench_matmul(e, sizes[i]);
  if (!only_matmul) bench_elementwise(e);
  mrl_engine_free(e);
  return 0;
}
