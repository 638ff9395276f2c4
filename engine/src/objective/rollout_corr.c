/* rollout_corr.c - verl's rollout correction (rollout_corr_helper): importance-sampling weights
 * between the policy that sampled a batch and the one trained on it, truncated ("TIS") or masked
 * outside a band ("IcePop"), per token or per sequence, and rejection of tokens or whole rows
 * whose divergence estimate (k1, k2, k3, binary KL) is too large. */
#include "advantage.h"

#include <math.h>

static mrl_status check_opts(mrl_engine *e, const char *fn, const mrl_rollout_corr_opts *o) {
  if ((int)o->is < MRL_ROLLOUT_IS_NONE || (int)o->is > MRL_ROLLOUT_IS_SEQUENCE)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "unknown IS level %d", (int)o->is);
  if (o->is != MRL_ROLLOUT_IS_NONE) {
    if (!(o->is_upper > 0.0) || isinf(o->is_upper))
      return mrl__fail(e, MRL_ERR_INVALID, fn, "is_upper is %g; it must be positive and finite",
                       o->is_upper);
    if (!(o->is_lower >= 0.0) || o->is_lower > o->is_upper)
      return mrl__fail(e, MRL_ERR_INVALID, fn,
                       "is_lower is %g; it must be 0 (truncate) or in (0, is_upper = %g]",
                       o->is_lower, o->is_upper);
  }
  if (o->n_rs < 0 || (o->n_rs > 0 && !o->rs))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "rs: %lld criteria without a list",
                     (long long)o->n_rs);
  for (int64_t k = 0; k < o->n_rs; k++) {
    const mrl_rollout_rs *r = &o->rs[k];
    if ((int)r->kind < MRL_RS_TOKEN_K1 || (int)r->kind > MRL_RS_BINARY_KL)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "rs[%lld]: unknown criterion %d", (long long)k,
                       (int)r->kind);
    if (!(r->upper > 0.0) || isinf(r->upper))
      return mrl__fail(e, MRL_ERR_INVALID, fn, "rs[%lld]: upper is %g; it must be positive",
                       (long long)k, r->upper);
    bool k1 = r->kind == MRL_RS_TOKEN_K1 || r->kind == MRL_RS_SEQ_SUM_K1 ||
              r->kind == MRL_RS_SEQ_MEAN_K1;
    if (k1 && (isnan(r->lower) || r->lower > r->upper))
      return mrl__fail(e, MRL_ERR_INVALID, fn,
                       "rs[%lld]: lower is %g; a k1 criterion needs lower <= upper (%g), or <= 0 "
                       "for 1 / upper",
                       (long long)k, r->lower, r->upper);
  }
  return MRL_OK;
}

static double clamp_log(double x) { return fmin(fmax(x, -20.0), 20.0); }

/* KL between Bernoulli(p) and Bernoulli(q), both clamped to [1e-6, 1 - 1e-6] */
static double binary_kl(double p, double q) {
  p = fmin(fmax(p, 1e-6), 1.0 - 1e-6);
  q = fmin(fmax(q, 1e-6), 1.0 - 1e-6);
  return p * log(p / q) + (1.0 - p) * log((1.0 - p) / (1.0 - q));
}

/* The statistic of criterion r at token i (x its clamped log ratio), before any row reduction. */
static double token_stat(mrl_rollout_rs_kind kind, double x, double logp, double rollout_logp) {
  switch (kind) {
  case MRL_RS_TOKEN_K1:
  case MRL_RS_SEQ_SUM_K1:
  case MRL_RS_SEQ_MEAN_K1: return -x;
  case MRL_RS_TOKEN_K2:
  case MRL_RS_SEQ_SUM_K2:
  case MRL_RS_SEQ_MEAN_K2:
  case MRL_RS_SEQ_MAX_K2: return 0.5 * x * x;
  case MRL_RS_BINARY_KL: {
    double p = exp(logp), q = exp(rollout_logp);
    return fmax(binary_kl(p, q), binary_kl(q, p));
  }
  default: return exp(x) - 1.0 - x;
  }
}

mrl_status mrl_rollout_correction(mrl_engine *e, const mrl_rollout_corr_opts *opts,
                                  const float *logp, const float *rollout_logp, const float *mask,
                                  int64_t rows, int64_t cols, float *weights, float *mask_out,
                                  mrl_rollout_corr_stats *stats) {
  static const char fn[] = "mrl_rollout_correction";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  if (!opts) return mrl__fail(e, MRL_ERR_NULL, fn, "opts is NULL");
  ADV_TRY(check_opts(e, fn, opts));
  ADV_TRY(mrl__adv_need(e, fn, "logp", logp, n));
  ADV_TRY(mrl__adv_need(e, fn, "rollout_logp", rollout_logp, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask_out", mask_out, n));
  if (opts->is != MRL_ROLLOUT_IS_NONE) ADV_TRY(mrl__adv_need(e, fn, "weights", weights, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "logp", logp, mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "rollout_logp", rollout_logp, mask, n));
  int64_t tokens = mrl__mask_count(mask, n);
  if (tokens == 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "mask: rollout correction needs at least one valid "
                                             "token (verl refuses an empty mask too)");
  mrl__scratch s = {.e = e, .fn = fn};
  double *x = mrl__scratch_get(&s, n, sizeof *x);       /* raw log ratio at mask-1 tokens */
  double *keep = mrl__scratch_get(&s, n, sizeof *keep); /* 1: passes every criterion */
  double *w = mrl__scratch_get(&s, n, sizeof *w);
  double *raw = mrl__scratch_get(&s, n, sizeof *raw);
  double *stat = mrl__scratch_get(&s, n, sizeof *stat);
  if (!x || !keep || !w || !raw || !stat) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  mrl_rollout_corr_stats st = {.is_norm_factor = 1.0};
  for (int64_t i = 0; i < n; i++) {
    keep[i] = 1.0;
    if (mask[i] == 0.0f) continue;
    x[i] = (double)logp[i] - rollout_logp[i];
    st.kl -= x[i];
    st.k3_kl += exp(x[i]) - x[i] - 1.0;
  }
  st.kl /= (double)tokens + 1e-8;
  st.k3_kl /= (double)tokens + 1e-8;

  /* ---- importance weights ---- */
  if (opts->is != MRL_ROLLOUT_IS_NONE) {
    double upper = opts->is_upper, lower = opts->is_lower;
    double band_low = lower > 0.0 ? lower : 1.0 / upper; /* what "too low" means in the stats */
    double high = 0.0, low = 0.0, seqs = 0.0;
    for (int64_t b = 0; b < rows; b++) {
      double sum = 0.0, count = 0.0;
      for (int64_t t = 0; t < cols; t++)
        if (mask[b * cols + t] != 0.0f) {
          sum += x[b * cols + t];
          count += 1.0;
        }
      double seq = exp(clamp_log(sum));
      for (int64_t t = 0; t < cols; t++) {
        int64_t i = b * cols + t;
        if (mask[i] == 0.0f) continue;
        raw[i] = opts->is == MRL_ROLLOUT_IS_TOKEN ? exp(clamp_log(x[i])) : seq;
        if (lower > 0.0)
          w[i] = raw[i] >= lower && raw[i] <= upper ? raw[i] : 0.0;
        else
          w[i] = fmin(raw[i], upper);
        if (opts->is == MRL_ROLLOUT_IS_TOKEN) {
          high += raw[i] > upper;
          low += raw[i] < band_low;
        }
      }
      if (opts->is == MRL_ROLLOUT_IS_SEQUENCE && count > 0) { /* judged in log space */
        high += sum > log(upper);
        low += sum < log(band_low);
      }
      seqs += 1.0;
    }
    double denom = opts->is == MRL_ROLLOUT_IS_TOKEN ? (double)tokens + 1e-8 : seqs;
    st.is_fraction_high = high / denom;
    st.is_fraction_low = low / denom;
    st.is_mean = mrl__masked_mean(w, mask, n);
    if (opts->is_batch_normalize) {
      double mean = st.is_mean;
      if (opts->is == MRL_ROLLOUT_IS_SEQUENCE) { /* over rows with a token, one weight each */
        double sum = 0.0, used = 0.0;
        for (int64_t b = 0; b < rows; b++) {
          double ws = 0.0, c = 0.0;
          for (int64_t t = 0; t < cols; t++)
            if (mask[b * cols + t] != 0.0f) {
              ws += w[b * cols + t];
              c += 1.0;
            }
          if (c > 0) {
            sum += ws / (c + 1e-8);
            used += 1.0;
          }
        }
        mean = sum / fmax(used, 1e-8);
      }
      if (mean > 1e-8) {
        for (int64_t i = 0; i < n; i++) w[i] /= mean;
        st.is_norm_factor = mean;
      }
    }
  }

  /* ---- rejection ---- */
  for (int64_t k = 0; k < opts->n_rs; k++) {
    const mrl_rollout_rs *r = &opts->rs[k];
    bool k1 = r->kind == MRL_RS_TOKEN_K1 || r->kind == MRL_RS_SEQ_SUM_K1 ||
              r->kind == MRL_RS_SEQ_MEAN_K1;
    double lo = k1 ? log(r->lower > 0.0 ? r->lower : 1.0 / r->upper) : -INFINITY;
    double hi = k1 ? log(r->upper) : r->upper;
    bool token = r->kind == MRL_RS_TOKEN_K1 || r->kind == MRL_RS_TOKEN_K2 ||
                 r->kind == MRL_RS_TOKEN_K3 || r->kind == MRL_RS_BINARY_KL;
    for (int64_t i = 0; i < n; i++)
      stat[i] = mask[i] != 0.0f ? token_stat(r->kind, clamp_log(x[i]), logp[i], rollout_logp[i])
                                : 0.0;
    for (int64_t b = 0; b < rows; b++) {
      double v = 0.0, count = 0.0, best = -INFINITY;
      for (int64_t t = 0; t < cols; t++) {
        int64_t i = b * cols + t;
        if (mask[i] == 0.0f) continue;
        if (token) {
          if (!(stat[i] >= lo && stat[i] <= hi)) keep[i] = 0.0;
          continue;
        }
        v += stat[i];
        count += 1.0;
        best = fmax(best, stat[i]);
      }
      if (token) continue;
      if (r->kind == MRL_RS_SEQ_MEAN_K1 || r->kind == MRL_RS_SEQ_MEAN_K2 ||
          r->kind == MRL_RS_SEQ_MEAN_K3)
        v /= count + 1e-8;
      if (r->kind == MRL_RS_SEQ_MAX_K2 || r->kind == MRL_RS_SEQ_MAX_K3)
        v = count > 0 ? best : 0.0;
      if (!(v >= lo && v <= hi))
        for (int64_t t = 0; t < cols; t++) keep[b * cols + t] = 0.0;
    }
  }
  double rejected = 0.0, rows_hit = 0.0;
  for (int64_t b = 0; b < rows; b++) {
    bool hit = false;
    for (int64_t t = 0; t < cols; t++) {
      int64_t i = b * cols + t;
      if (mask[i] != 0.0f && keep[i] == 0.0) {
        rejected += 1.0;
        hit = true;
      }
    }
    rows_hit += hit;
  }
  st.rs_masked_fraction = rejected / ((double)tokens + 1e-8);
  st.rs_seq_masked_fraction = rows ? rows_hit / (double)rows : 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (weights) weights[i] = opts->is != MRL_ROLLOUT_IS_NONE ? (float)w[i] : 0.0f;
    mask_out[i] = mask[i] != 0.0f && keep[i] != 0.0 ? 1.0f : 0.0f;
  }
  if (stats) *stats = st;
  mrl__scratch_free(&s);
  return MRL_OK;
}
