/* blas.c - loads OpenBLAS at first use with a core type that runs at full speed, and keeps the
 * portable reference sgemm used when OpenBLAS is missing and as the test oracle.
 *
 * Why dlopen: OpenBLAS 0.3.21 picks its kernels in a library constructor, from
 * OPENBLAS_CORETYPE or its own CPU detection, which reports recent CPUs as "Prescott" (about 5x
 * slower sgemm). Linking it normally would run that constructor before any of our code. Loading
 * it ourselves lets every host (the moonrl command, lua5.4, LuaJIT, an embedding C program) get
 * the right core type with no action from the user. The loaded library is process-wide state by
 * nature; it is written once under pthread_once and only read afterwards.
 *
 * MOONRL_BLAS names the library to load instead of libopenblas.so.0 (a file name or a path).
 * When no library with cblas_sgemm loads, matmul uses the naive kernel below; that is said once
 * per process on stderr, because it is many times slower, and mrl_blas_info reports it. */
#define _POSIX_C_SOURCE 200809L
#include "tensor_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static struct {
  mrl_sgemm_fn sgemm;
  char *(*get_corename)(void);
  char *(*get_config)(void);
  int (*get_num_threads)(void);
  void (*set_num_threads)(int);
  const char *source;
  char config[384]; /* mrl_blas_info's config when the library has none to give */
} blas;

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

const char *mrl_blas_recommended_coretype(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return NULL;
  const unsigned osxsave = 1u << 27, avx = 1u << 28, fma = 1u << 12;
  if (!(c & osxsave) || !(c & avx) || !(c & fma)) return NULL;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  (void)xcr0_hi;
  if ((xcr0_lo & 0x6) != 0x6) return NULL; /* the OS does not save SSE and AVX state */
  if (__get_cpuid_max(0, NULL) < 7) return NULL;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned avx2 = 1u << 5, avx512f = 1u << 16, avx512dq = 1u << 17, avx512cd = 1u << 28,
                 avx512bw = 1u << 30, avx512vl = 1u << 31;
  const unsigned skx = avx512f | avx512dq | avx512cd | avx512bw | avx512vl;
  if ((b & skx) == skx && (xcr0_lo & 0xe6) == 0xe6) return "SkylakeX";
  if (b & avx2) return "Haswell";
#endif
  return NULL;
}

/* No BLAS: the naive kernel runs; say why, once (blas_load runs once per process). */
static void blas_missing(const char *why) {
  snprintf(blas.config, sizeof blas.config, "naive reference kernel (no BLAS: %s)", why);
  blas.source = "none";
  blas.sgemm = NULL;
  fprintf(stderr, "moonrl: %s; matrix products use the naive reference kernel, many times "
                  "slower (install OpenBLAS, or set MOONRL_BLAS to its library)\n", why);
}

static void blas_load(void) {
  static const char *names[] = {"libopenblas.so.0", "libopenblas.so"};
  const char *user_lib = getenv("MOONRL_BLAS");
  const char *const *tried = names;
  size_t count = sizeof names / sizeof *names;
  if (user_lib && *user_lib) {
    tried = &user_lib;
    count = 1;
  }
  void *h = NULL;
  for (size_t i = 0; i < count && !h; i++)
    h = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (h) {
    blas.source = "preloaded";
  } else {
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *choice = NULL;
    if (user && *user) {
      blas.source = "user";
    } else if ((choice = mrl_blas_recommended_coretype()) != NULL) {
      setenv("OPENBLAS_CORETYPE", choice, 0);
      blas.source = "moonrl";
    } else {
      blas.source = "openblas";
    }
    for (size_t i = 0; i < count && !h; i++) h = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
  }
  if (!h) {
    const char *err = dlerror();
    blas_missing(err ? err : tried[0]);
    return;
  }
  /* POSIX allows converting dlsym's object pointer to a function pointer; ISO C does not, so the
   * conversion goes through memcpy. */
  void *sym;
#define MRL_LOOKUP(field, name)                                                                    \
  if ((sym = dlsym(h, name)) != NULL) memcpy(&blas.field, &sym, sizeof sym);
  MRL_LOOKUP(sgemm, "cblas_sgemm")
  MRL_LOOKUP(get_corename, "openblas_get_corename")
  MRL_LOOKUP(get_config, "openblas_get_config")
  MRL_LOOKUP(get_num_threads, "openblas_get_num_threads")
  MRL_LOOKUP(set_num_threads, "openblas_set_num_threads")
#undef MRL_LOOKUP
  if (!blas.sgemm) {
    char why[256];
    snprintf(why, sizeof why, "%s has no cblas_sgemm", tried[0]);
    blas_missing(why);
    return;
  }
  snprintf(blas.config, sizeof blas.config, "%s (no openblas_get_config)", tried[0]);
}

mrl_sgemm_fn mrl__blas_sgemm(void) {
  pthread_once(&blas_once, blas_load);
  return blas.sgemm;
}

mrl_status mrl_blas_info(const char **core, int *threads, const char **config,
                         const char **source) {
  bool have = mrl__blas_sgemm() != NULL;
  if (core) *core = have && blas.get_corename ? blas.get_corename() : "none";
  if (threads) *threads = have && blas.get_num_threads ? blas.get_num_threads() : 1;
  if (config) *config = have && blas.get_config ? blas.get_config() : blas.config;
  if (source) *source = blas.source;
  return MRL_OK;
}

mrl_status mrl_blas_set_threads(int threads) {
  if (threads < 1) return MRL_ERR_INVALID;
  if (mrl__blas_sgemm() && blas.set_num_threads) blas.set_num_threads(threads);
  return MRL_OK;
}

void mrl__sgemm_naive(bool transa, bool transb, int m, int n, int k, float alpha, const float *a,
                      int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      double acc = 0.0;
      for (int p = 0; p < k; p++) {
        float av = transa ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
        float bv = transb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j];
        acc += (double)av * bv;
      }
      float *cij = &c[(size_t)i * ldc + j];
      *cij = (float)(alpha * acc + (beta == 0.0f ? 0.0 : (double)beta * *cij));
    }
  }
}
