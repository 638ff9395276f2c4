/* advantage_common.c - the helpers of advantage.h: argument checks, scratch blocks, dense group
 * ids, group statistics, whitening and the loss-aggregation weights. */
#include "advantage.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- argument checks ---- */

mrl_status mrl__adv_sizes(mrl_engine *e, const char *fn, int64_t rows, int64_t cols) {
  if (!e) return MRL_ERR_NULL;
  if (rows < 0 || cols < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "sizes must be >= 0 (got %lld rows, %lld cols)",
                     (long long)rows, (long long)cols);
  /* every array is indexed with int64_t and scratch holds up to 8-byte elements of it */
  if (cols > 0 && rows > (int64_t)(SIZE_MAX / 16) / cols)
    return mrl__fail(e, MRL_ERR_OVERFLOW, fn, "%lld x %lld elements is too many", (long long)rows,
                     (long long)cols);
  return MRL_OK;
}

mrl_status mrl__adv_need(mrl_engine *e, const char *fn, const char *name, const void *p,
                         int64_t count) {
  if (!p && count > 0) return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", name);
  return MRL_OK;
}

mrl_status mrl__adv_mask(mrl_engine *e, const char *fn, const char *name, const float *mask,
                         int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (mask[i] != 0.0f && mask[i] != 1.0f)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s[%lld] is %g; a mask holds only 0 and 1", name,
                       (long long)i, (double)mask[i]);
  return MRL_OK;
}

mrl_status mrl__adv_finite(mrl_engine *e, const char *fn, const char *name, const float *x,
                           const float *mask, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if ((!mask || mask[i] != 0.0f) && !isfinite(x[i]))
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s[%lld] is %g; it must be finite", name,
                       (long long)i, (double)x[i]);
  return MRL_OK;
}

mrl_status mrl__adv_finite_d(mrl_engine *e, const char *fn, const char *name, const double *x,
                             int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i]))
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s[%lld] is %g; it must be finite", name,
                       (long long)i, x[i]);
  return MRL_OK;
}

mrl_status mrl__adv_range(mrl_engine *e, const char *fn, const char *name, double v, double lo,
                          double hi) {
  if (!(v >= lo && v <= hi) || isnan(v))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s is %g; expected a number in [%g, %g]", name, v, lo,
                     hi);
  return MRL_OK;
}

/* ---- scratch ---- */

void *mrl__scratch_get(mrl__scratch *s, int64_t count, size_t elem) {
  if (s->n == MRL_SCRATCH_MAX || count < 0 || (uint64_t)count > SIZE_MAX / elem) {
    mrl__fail(s->e, MRL_ERR_NOMEM, s->fn, "scratch memory: too many or too large blocks");
    return NULL;
  }
  size_t size = (size_t)count * elem;
  void *p = mrl__alloc(s->e, size);
  if (!p) {
    mrl__fail(s->e, MRL_ERR_NOMEM, s->fn, "cannot allocate %zu bytes of scratch memory", size);
    return NULL;
  }
  memset(p, 0, size ? size : 1);
  s->block[s->n] = p;
  s->size[s->n] = size;
  s->n++;
  return p;
}

void mrl__scratch_free(mrl__scratch *s) {
  while (s->n > 0) {
    s->n--;
    mrl__free(s->e, s->block[s->n], s->size[s->n]);
  }
}

/* ---- dense group ids ---- */

typedef struct {
  int64_t a, b, pos;
} keyed_row;

static int compare_keyed(const void *x, const void *y) {
  const keyed_row *p = x, *q = y;
  if (p->a != q->a) return p->a < q->a ? -1 : 1;
  if (p->b != q->b) return p->b < q->b ? -1 : 1;
  return p->pos < q->pos ? -1 : p->pos > q->pos;
}

/* Sorting by (key, position) puts each group's first row at the start of its run; numbering the
 * runs by the position of that first row gives first-appearance order in O(n log n). */
mrl_status mrl__dense_ids(mrl__scratch *s, const int64_t *a, const int64_t *b, int64_t n,
                          int64_t *dense, int64_t *count) {
  int used = s->n;
  keyed_row *rows = mrl__scratch_get(s, n, sizeof *rows);
  int64_t *rank = mrl__scratch_get(s, n, sizeof *rank); /* 1 + dense id at a group's first row */
  if (!rows || !rank) return MRL_ERR_NOMEM;
  for (int64_t i = 0; i < n; i++) rows[i] = (keyed_row){a[i], b ? b[i] : 0, i};
  qsort(rows, (size_t)n, sizeof *rows, compare_keyed);
  int64_t runs = 0;
  for (int64_t i = 0; i < n; i++)
    if (i == 0 || rows[i].a != rows[i - 1].a || rows[i].b != rows[i - 1].b) {
      rank[rows[i].pos] = 1;
      runs++;
    }
  int64_t next = 0;
  for (int64_t i = 0; i < n; i++)
    if (rank[i]) rank[i] = ++next;
  int64_t first = 0;
  for (int64_t i = 0; i < n; i++) {
    if (i == 0 || rows[i].a != rows[i - 1].a || rows[i].b != rows[i - 1].b) first = rows[i].pos;
    dense[rows[i].pos] = rank[first] - 1;
  }
  *count = runs;
  while (s->n > used) { /* the two blocks are the last ones taken: give them back now */
    s->n--;
    mrl__free(s->e, s->block[s->n], s->size[s->n]);
  }
  return MRL_OK;
}

/* ---- statistics ---- */

void mrl__group_moments(const double *x, const int64_t *g, int64_t n, int64_t groups, int ddof,
                        int64_t *size, double *mean, double *std) {
  for (int64_t k = 0; k < groups; k++) {
    size[k] = 0;
    mean[k] = 0.0;
    std[k] = 0.0;
  }
  for (int64_t i = 0; i < n; i++) {
    size[g[i]]++;
    mean[g[i]] += x[i];
  }
  for (int64_t k = 0; k < groups; k++)
    if (size[k] > 0) mean[k] /= (double)size[k];
  for (int64_t i = 0; i < n; i++) {
    double d = x[i] - mean[g[i]];
    std[g[i]] += d * d;
  }
  for (int64_t k = 0; k < groups; k++)
    std[k] = size[k] > ddof ? sqrt(std[k] / (double)(size[k] - ddof)) : 0.0;
}

mrl_status mrl__group_norm(mrl__scratch *s, const double *x, const int64_t *g, int64_t n,
                           int64_t groups, bool singleton_self, bool by_std, double eps,
                           double *out) {
  int64_t *size = mrl__scratch_get(s, groups, sizeof *size);
  double *mean = mrl__scratch_get(s, groups, sizeof *mean);
  double *std = mrl__scratch_get(s, groups, sizeof *std);
  if (!size || !mean || !std) return MRL_ERR_NOMEM;
  mrl__group_moments(x, g, n, groups, 1, size, mean, std);
  for (int64_t i = 0; i < n; i++) {
    int64_t k = g[i];
    double mu = mean[k], sigma = std[k];
    if (size[k] == 1) {
      mu = singleton_self ? x[i] : 0.0;
      sigma = 1.0;
    }
    out[i] = by_std ? (x[i] - mu) / (sigma + eps) : x[i] - mu;
  }
  return MRL_OK;
}

/* ---- token arrays ---- */

int64_t mrl__mask_count(const float *mask, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; i++) c += mask[i] != 0.0f;
  return c;
}

void mrl__row_sums(const float *x, const float *mask, int64_t rows, int64_t cols, double *out) {
  for (int64_t b = 0; b < rows; b++) {
    double s = 0.0;
    for (int64_t t = 0; t < cols; t++)
      if (!mask || mask[b * cols + t] != 0.0f) s += x[b * cols + t];
    out[b] = s;
  }
}

void mrl__broadcast_rows(const double *v, const float *mask, int64_t rows, int64_t cols,
                         float *out) {
  for (int64_t b = 0; b < rows; b++)
    for (int64_t t = 0; t < cols; t++) out[b * cols + t] = (float)(v[b] * mask[b * cols + t]);
}

void mrl__masked_whiten(const double *x, const float *mask, int64_t n, double *out) {
  double count = 0.0, sum = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (mask[i] != 0.0f) {
      count += 1.0;
      sum += x[i];
    }
  double mean = sum / (count + 1e-8), sq = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (mask[i] != 0.0f) sq += (x[i] - mean) * (x[i] - mean);
  double var = sq / (count + 1e-8) * (count / (count - 1.0));
  double scale = 1.0 / sqrt(var + 1e-8);
  for (int64_t i = 0; i < n; i++) out[i] = (x[i] - mean) * scale;
}

mrl_status mrl__whiten_count(mrl_engine *e, const char *fn, const float *mask, int64_t n) {
  int64_t c = mrl__mask_count(mask, n);
  if (c < 2)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "mask: whitening needs at least 2 valid tokens (the variance of %s is "
                     "undefined)",
                     c == 0 ? "no token" : "a single token");
  return MRL_OK;
}

/* ---- loss aggregation ---- */

mrl_status mrl__check_agg(mrl_engine *e, const char *fn, mrl_loss_agg mode, double norm) {
  if ((int)mode < MRL_AGG_TOKEN_MEAN || (int)mode > MRL_AGG_TOKEN_SUM)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "unknown aggregation mode %d", (int)mode);
  if (isnan(norm) || isinf(norm))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "the aggregation norm is %g; it must be finite", norm);
  return MRL_OK;
}

void mrl__agg_weights(mrl_loss_agg mode, double norm, const float *mask, int64_t rows, int64_t cols,
                      double *w) {
  double c = norm > 0.0 ? norm : (double)(cols > 0 ? cols : 1);
  int64_t tokens = mrl__mask_count(mask, rows * cols), rows_with_tokens = 0;
  for (int64_t b = 0; b < rows; b++)
    if (mrl__mask_count(mask + b * cols, cols) > 0) rows_with_tokens++;
  for (int64_t b = 0; b < rows; b++) {
    double row_tokens = (double)mrl__mask_count(mask + b * cols, cols), v = 0.0;
    switch (mode) {
    case MRL_AGG_TOKEN_MEAN: v = tokens ? 1.0 / (double)tokens : 0.0; break;
    case MRL_AGG_SEQ_MEAN_TOKEN_SUM:
      v = rows_with_tokens ? 1.0 / (double)rows_with_tokens : 0.0;
      break;
    case MRL_AGG_SEQ_MEAN_TOKEN_MEAN:
      v = rows_with_tokens ? 1.0 / ((row_tokens + 1e-8) * (double)rows_with_tokens) : 0.0;
      break;
    case MRL_AGG_SEQ_MEAN_TOKEN_SUM_NORM:
      v = rows_with_tokens ? 1.0 / (c * (double)rows_with_tokens) : 0.0;
      break;
    case MRL_AGG_OAT_DRGRPO: v = 1.0 / (c * (double)rows); break;
    case MRL_AGG_TOKEN_SUM: v = 1.0; break;
    }
    for (int64_t t = 0; t < cols; t++) w[b * cols + t] = mask[b * cols + t] != 0.0f ? v : 0.0;
  }
}

double mrl__agg_sum(const double *w, const double *loss, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (w[i] != 0.0) s += w[i] * loss[i];
  return s;
}

double mrl__masked_mean(const double *x, const float *mask, int64_t n) {
  double s = 0.0, c = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (mask[i] != 0.0f) {
      s += x[i];
      c += 1.0;
    }
  return s / (c + 1e-8);
}
