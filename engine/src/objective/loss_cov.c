/* loss_cov.c - the token choices of verl's covariance losses (clip-cov and kl-cov, from "The
 * Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"): which tokens have a
 * large covariance between their advantage and their log-probability. mrl_policy_loss uses them. */
#include "advantage.h"

#include <math.h>
#include <stdlib.h>

/* Masked means as verl's masked_mean takes them: sum over mask-1 tokens / (count + 1e-8). */
static void masked_means(const float *logp, const float *adv, const float *mask, int64_t n,
                         double *mean_logp, double *mean_adv, double *count) {
  double sl = 0.0, sa = 0.0, c = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (mask[i] != 0.0f) {
      sl += logp[i];
      sa += adv[i];
      c += 1.0;
    }
  *mean_logp = sl / (c + 1e-8);
  *mean_adv = sa / (c + 1e-8);
  *count = c;
}

mrl_status mrl__clip_cov_select(mrl__scratch *s, const mrl_pg_opts *o, const float *logp,
                                const double *x, const float *adv, const float *mask, int64_t n,
                                double *sel) {
  double ml, ma, count;
  masked_means(logp, adv, mask, n, &ml, &ma, &count);
  int64_t *cand = mrl__scratch_get(s, n, sizeof *cand), nc = 0;
  if (!cand) return MRL_ERR_NOMEM;
  double lo = 1.0 - o->clip_low, hi = 1.0 + o->clip_high;
  for (int64_t i = 0; i < n; i++) {
    if (mask[i] == 0.0f) continue;
    double r = exp(x[i]), a = adv[i];
    if (-a * fmin(fmax(r, lo), hi) > -a * r) continue; /* the clip already holds it */
    double cov = (a - ma) * ((double)logp[i] - ml);
    if (cov > o->cov_lb && cov < o->cov_ub) cand[nc++] = i;
  }
  int64_t want = (int64_t)(o->cov_ratio * count); /* Python's int(): toward zero */
  if (want < 1) want = 1;
  if (want > nc) want = nc;
  /* a uniform random subset of `want` candidates: the first entries of a partial shuffle */
  struct mrl_rng rng = {0};
  mrl__rng_seed(&rng, o->seed);
  for (int64_t j = 0; j < want; j++) {
    int64_t k = j;
    mrl_rng_int(&rng, j, nc - 1, &k);
    int64_t t = cand[j];
    cand[j] = cand[k];
    cand[k] = t;
    sel[cand[j]] = 1.0;
  }
  return MRL_OK;
}

typedef struct {
  double cov;
  int64_t pos;
} cov_entry;

/* larger covariance first; equal ones in token order */
static int by_cov(const void *a, const void *b) {
  const cov_entry *p = a, *q = b;
  if (p->cov != q->cov) return p->cov > q->cov ? -1 : 1;
  return p->pos < q->pos ? -1 : p->pos > q->pos;
}

mrl_status mrl__kl_cov_select(mrl__scratch *s, const mrl_pg_opts *o, const float *logp,
                              const float *adv, const float *mask, int64_t n, double *sel) {
  cov_entry *v = mrl__scratch_get(s, n, sizeof *v);
  if (!v) return MRL_ERR_NOMEM;
  int64_t nv = 0;
  double sl = 0.0, sa = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (mask[i] != 0.0f) {
      sl += logp[i];
      sa += adv[i];
      v[nv++].pos = i;
    }
  if (nv == 0) return MRL_OK;
  double ml = sl / (double)nv, ma = sa / (double)nv; /* plain means over the valid tokens */
  for (int64_t j = 0; j < nv; j++)
    v[j].cov = ((double)adv[v[j].pos] - ma) * ((double)logp[v[j].pos] - ml);
  qsort(v, (size_t)nv, sizeof *v, by_cov);
  int64_t k = (int64_t)((double)nv * o->cov_ratio);
  if (k < 1) k = 1;
  if (k > nv) k = nv;
  for (int64_t j = 0; j < k; j++) sel[v[j].pos] = 1.0;
  return MRL_OK;
}
