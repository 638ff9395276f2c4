/* advantage.h - helpers shared by the advantage and loss files (advantage*.c, loss*.c): argument
 * checks that name the bad argument, scratch memory, dense group ids, group statistics,
 * token-weighted whitening, the loss-aggregation weights and the covariance losses' choice of
 * tokens. Not installed. */
#ifndef MRL_ADVANTAGE_H
#define MRL_ADVANTAGE_H

#include "internal.h"

/* Returns the status of a failed check from the calling function. */
#define ADV_TRY(call)                                                                              \
  do {                                                                                             \
    mrl_status adv_st_ = (call);                                                                   \
    if (adv_st_ != MRL_OK) return adv_st_;                                                         \
  } while (0)

/* ---- argument checks: each fails through mrl__fail with "fn: name: problem" ---- */

/* e must be set; rows and cols must be >= 0 and rows * cols must fit in memory sizes. */
mrl_status mrl__adv_sizes(mrl_engine *e, const char *fn, int64_t rows, int64_t cols);
/* p may be NULL only when count is 0. */
mrl_status mrl__adv_need(mrl_engine *e, const char *fn, const char *name, const void *p,
                         int64_t count);
/* Every entry is exactly 0 or 1. */
mrl_status mrl__adv_mask(mrl_engine *e, const char *fn, const char *name, const float *mask,
                         int64_t n);
/* Every entry is finite (where mask is 1, when mask is not NULL). */
mrl_status mrl__adv_finite(mrl_engine *e, const char *fn, const char *name, const float *x,
                           const float *mask, int64_t n);
mrl_status mrl__adv_finite_d(mrl_engine *e, const char *fn, const char *name, const double *x,
                             int64_t n);
/* A finite scalar in [lo, hi]. */
mrl_status mrl__adv_range(mrl_engine *e, const char *fn, const char *name, double v, double lo,
                          double hi);

/* ---- scratch memory: blocks from the engine, freed together ---- */
enum { MRL_SCRATCH_MAX = 16 };
typedef struct {
  mrl_engine *e;
  const char *fn;
  void *block[MRL_SCRATCH_MAX];
  size_t size[MRL_SCRATCH_MAX];
  int n;
} mrl__scratch;

/* count zero-filled elements of elem bytes, or NULL (after recording MRL_ERR_NOMEM). */
void *mrl__scratch_get(mrl__scratch *s, int64_t count, size_t elem);
void mrl__scratch_free(mrl__scratch *s);

/* ---- groups ---- */

/* Dense ids of a[i] (or of the pairs (a[i], b[i]) when b is not NULL): equal ids get equal
 * numbers, numbered from 0 in order of first appearance; *count gets the number of groups.
 * Fails only for memory. */
mrl_status mrl__dense_ids(mrl__scratch *s, const int64_t *a, const int64_t *b, int64_t n,
                          int64_t *dense, int64_t *count);

/* Per-group size, mean and standard deviation (sum of squares / (size - ddof); 0 for groups of at
 * most ddof members) of x over dense group ids g. */
void mrl__group_moments(const double *x, const int64_t *g, int64_t n, int64_t groups, int ddof,
                        int64_t *size, double *mean, double *std);

/* The group normalisation most estimators share: out[i] = (x[i] - mean) / (std + eps) when by_std,
 * else x[i] - mean, with the unbiased std of the group. A group of one uses mean 0 and std 1
 * (verl's outcome convention, "stats_verl": the member keeps its raw value) or, when
 * singleton_self, its own value and std 1 (the step-group convention, "stats_self": 0). */
mrl_status mrl__group_norm(mrl__scratch *s, const double *x, const int64_t *g, int64_t n,
                           int64_t groups, bool singleton_self, bool by_std, double eps,
                           double *out);

/* ---- token arrays ---- */

/* Number of mask-1 tokens. */
int64_t mrl__mask_count(const float *mask, int64_t n);
/* Row sums of x (rows x cols), over every position (mask NULL) or over mask-1 positions. */
void mrl__row_sums(const float *x, const float *mask, int64_t rows, int64_t cols, double *out);
/* out[b, t] = v[b] * mask[b, t] as floats. */
void mrl__broadcast_rows(const double *v, const float *mask, int64_t rows, int64_t cols,
                         float *out);
/* verl's masked_whiten over every mask-1 element of x (token-weighted, batch-global):
 * (x - mean) / sqrt(var + 1e-8) with mean = sum / (count + 1e-8) and the Bessel-corrected
 * variance; written at every position. The mask must hold at least 2 tokens. */
void mrl__masked_whiten(const double *x, const float *mask, int64_t n, double *out);
/* Fails with "fn: mask: whitening needs at least 2 tokens ..." unless the mask has 2 or more. */
mrl_status mrl__whiten_count(mrl_engine *e, const char *fn, const float *mask, int64_t n);

/* ---- loss aggregation ---- */

mrl_status mrl__check_agg(mrl_engine *e, const char *fn, mrl_loss_agg mode, double norm);
/* w[i] = d(aggregated loss) / d(loss[i]) under mode: the loss is the sum of w * loss over mask-1
 * tokens (0 when nothing is valid). norm is C of the sum-norm modes (<= 0: cols). */
void mrl__agg_weights(mrl_loss_agg mode, double norm, const float *mask, int64_t rows, int64_t cols,
                      double *w);
/* Sum of w[i] * loss[i] over the tokens with w[i] != 0 (NaN elsewhere does not propagate). */
double mrl__agg_sum(const double *w, const double *loss, int64_t n);
/* verl's masked_mean for metrics: sum over mask-1 tokens / (count + 1e-8). */
double mrl__masked_mean(const double *x, const float *mask, int64_t n);

/* ---- the covariance losses' choice of tokens (loss_cov.c): sel[i] = 1 for a chosen token ---- */

/* clip-cov: a random share cov_ratio (at least 1) of the mask-1 tokens that the PPO clip leaves
 * alone and whose covariance (A - mean A)(logp - mean logp) lies in (cov_lb, cov_ub); x is the
 * log ratio. The choice depends only on opts->seed and the candidates. */
mrl_status mrl__clip_cov_select(mrl__scratch *s, const mrl_pg_opts *o, const float *logp,
                                const double *x, const float *adv, const float *mask, int64_t n,
                                double *sel);
/* kl-cov: the share cov_ratio (at least 1) of the mask-1 tokens with the largest covariance. */
mrl_status mrl__kl_cov_select(mrl__scratch *s, const mrl_pg_opts *o, const float *logp,
                              const float *adv, const float *mask, int64_t n, double *sel);

#endif /* MRL_ADVANTAGE_H */
