/* loss.c - policy-gradient losses and their per-token gradients with respect to the current
 * log-probabilities (spec sections 3 and 4, and verl 1dda039's losses): loss aggregation, PPO
 * with clip-higher and dual clip, GSPO, CISPO, SAPO, GPG, GMPO, DPPO (TV and binary KL),
 * clip-cov, kl-cov, DRO, REINFORCE, A2TGPO's turn-level PPO, the clipped value loss and the
 * entropy bonus. Each loss is the sum of aggregation weights times per-token losses, so its
 * gradient is those weights times the per-token derivatives. */
#include "advantage.h"

#include <math.h>

/* ---- aggregation ---- */

mrl_status mrl_agg_loss(mrl_engine *e, mrl_loss_agg mode, double norm, const float *loss,
                        const float *mask, int64_t rows, int64_t cols, double *out) {
  static const char fn[] = "mrl_agg_loss";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_need(e, fn, "loss", loss, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, 1));
  ADV_TRY(mrl__check_agg(e, fn, mode, norm));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "loss", loss, mask, n));
  mrl__scratch s = {.e = e, .fn = fn};
  double *w = mrl__scratch_get(&s, n, sizeof *w);
  double *l = mrl__scratch_get(&s, n, sizeof *l);
  if (!w || !l) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  mrl__agg_weights(mode, norm, mask, rows, cols, w);
  for (int64_t i = 0; i < n; i++) l[i] = mask[i] != 0.0f ? loss[i] : 0.0;
  *out = mrl__agg_sum(w, l, n);
  mrl__scratch_free(&s);
  return MRL_OK;
}

/* ---- policy losses ---- */

void mrl_pg_defaults(mrl_pg_kind kind, mrl_pg_opts *opts) {
  if (!opts) return;
  *opts = (mrl_pg_opts){.agg = MRL_AGG_TOKEN_MEAN,
                        .agg_norm = 0.0,
                        .clip_low = 0.2,
                        .clip_high = 0.2,
                        .clip_c = 3.0,
                        .tau_pos = 1.0,
                        .tau_neg = 1.05,
                        .cov_ratio = 2e-4,
                        .cov_lb = 1.0,
                        .cov_ub = 5.0,
                        .kl_coef = 0.1,
                        .dro_beta = 0.0,
                        .seed = 0};
  switch (kind) {
  case MRL_PG_REINFORCE: opts->agg = MRL_AGG_SEQ_MEAN_TOKEN_SUM; break;
  case MRL_PG_GSPO:
    opts->clip_low = 3e-4;
    opts->clip_high = 4e-4;
    break;
  case MRL_PG_CISPO: opts->clip_low = 10.0; break;
  case MRL_PG_GMPO:
    opts->clip_low = 0.4;
    opts->clip_high = 0.4;
    break;
  default: break;
  }
}

/* log ratio clamped as verl does before exponentiating, and whether the clamp let it through */
static double clamp20(double x, bool *through) {
  *through = x >= -20.0 && x <= 20.0;
  return fmin(fmax(x, -20.0), 20.0);
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static mrl_status check_pg_opts(mrl_engine *e, const char *fn, mrl_pg_kind kind,
                                const mrl_pg_opts *o) {
  ADV_TRY(mrl__check_agg(e, fn, o->agg, o->agg_norm));
  ADV_TRY(mrl__adv_range(e, fn, "clip_low", o->clip_low, 0.0, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "clip_high", o->clip_high, 0.0, INFINITY));
  if (kind == MRL_PG_PPO && !(o->clip_c > 1.0))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "clip_c is %g; the dual clip needs a value > 1",
                     o->clip_c);
  if ((kind == MRL_PG_DPPO_TV || kind == MRL_PG_DPPO_KL) && !(o->clip_c > 0.0))
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "clip_c is %g; DPPO truncates the ratio at clip_c, which must be > 0",
                     o->clip_c);
  if ((kind == MRL_PG_CLIP_COV || kind == MRL_PG_KL_COV) &&
      (!(o->cov_ratio > 0.0) || isinf(o->cov_ratio)))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "cov_ratio is %g; it must be positive and finite",
                     o->cov_ratio);
  if (kind == MRL_PG_CLIP_COV && (isnan(o->cov_lb) || isnan(o->cov_ub)))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "cov_lb and cov_ub must be numbers");
  if (kind == MRL_PG_KL_COV) ADV_TRY(mrl__adv_range(e, fn, "kl_coef", o->kl_coef, -INFINITY,
                                                    INFINITY));
  if (kind == MRL_PG_DRO && (!(o->dro_beta > 0.0) || isinf(o->dro_beta)))
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "dro_beta is %g; DRO needs a positive, finite dro_beta (verl has no default)",
                     o->dro_beta);
  if (kind == MRL_PG_SAPO &&
      (!(o->tau_pos > 0.0) || !(o->tau_neg > 0.0) || isinf(o->tau_pos) || isinf(o->tau_neg)))
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "tau_pos and tau_neg are %g and %g; they must be positive and finite",
                     o->tau_pos, o->tau_neg);
  return MRL_OK;
}

/* GMPO works on whole rows: loss = mean over rows of -mean(A) exp(mean clipped log ratio), each
 * row's term times the geometric mean of its IS weights. */
static void gmpo(const mrl_pg_opts *o, const double *x, const float *adv, const float *mask,
                 const float *is_weights, int64_t rows, int64_t cols, mrl_pg_stats *st,
                 double *seq_ratio, double *seq_adv, float *dlogp) {
  double loss = 0.0, upper = 0.0, lower = 0.0, valid = 0.0;
  for (int64_t b = 0; b < rows; b++) {
    double msum = 0.0, xsum = 0.0, asum = 0.0, lwsum = 0.0;
    for (int64_t t = 0; t < cols; t++) {
      int64_t i = b * cols + t;
      if (mask[i] == 0.0f) continue;
      double a = adv[i], sgn = (a > 0) - (a < 0);
      double xc = fmin(fmax(x[i], -o->clip_low), o->clip_high);
      double xs = sgn * fmin(sgn * x[i], sgn * xc); /* clipped only on the side A favours */
      msum += 1.0;
      xsum += xs;
      asum += a;
      if (is_weights) lwsum += log((double)is_weights[i] + 1e-10);
      valid += 1.0;
      upper += x[i] != xc && a > 0;
      lower += x[i] != xc && a < 0;
    }
    double r = exp(xsum / (msum + 1e-8)), abar = asum / (msum + 1e-8);
    if (is_weights) abar *= exp(lwsum / (msum + 1e-8)); /* a constant factor of the row's term */
    loss += -abar * r;
    if (seq_ratio) seq_ratio[b] = r;
    if (seq_adv) seq_adv[b] = asum / (msum + 1e-8);
    if (dlogp)
      for (int64_t t = 0; t < cols; t++) {
        int64_t i = b * cols + t;
        if (mask[i] == 0.0f) continue;
        double a = adv[i], sgn = (a > 0) - (a < 0);
        double xc = fmin(fmax(x[i], -o->clip_low), o->clip_high);
        bool follows = sgn != 0.0 && sgn * x[i] <= sgn * xc; /* x itself, not the bound */
        if (follows) dlogp[i] += (float)(-abar * r / ((msum + 1e-8) * (double)rows));
      }
  }
  st->loss = rows ? loss / (double)rows : 0.0;
  st->clipfrac = upper / (valid + 1e-8);
  st->clipfrac_lower = lower / (valid + 1e-8);
}

mrl_status mrl_policy_loss(mrl_engine *e, mrl_pg_kind kind, const mrl_pg_opts *opts,
                           const float *logp, const float *old_logp, const float *adv,
                           const float *mask, const float *is_weights, int64_t rows, int64_t cols,
                           mrl_pg_stats *stats, float *token_loss, double *seq_ratio,
                           double *seq_adv, float *dlogp) {
  static const char fn[] = "mrl_policy_loss";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  if ((int)kind < MRL_PG_PPO || (int)kind > MRL_PG_REINFORCE)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "unknown policy loss %d", (int)kind);
  mrl_pg_opts o;
  mrl_pg_defaults(kind, &o);
  if (opts) o = *opts;
  ADV_TRY(check_pg_opts(e, fn, kind, &o));
  ADV_TRY(mrl__adv_need(e, fn, "logp", logp, n));
  if (kind != MRL_PG_GPG && kind != MRL_PG_REINFORCE)
    ADV_TRY(mrl__adv_need(e, fn, "old_logp", old_logp, n));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "logp", logp, mask, n));
  if (old_logp) ADV_TRY(mrl__adv_finite(e, fn, "old_logp", old_logp, mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "adv", adv, mask, n));
  if (is_weights) ADV_TRY(mrl__adv_finite(e, fn, "is_weights", is_weights, mask, n));
  if (kind == MRL_PG_GMPO && is_weights)
    for (int64_t i = 0; i < n; i++)
      if (mask[i] != 0.0f && is_weights[i] < 0.0f)
        return mrl__fail(e, MRL_ERR_INVALID, fn,
                         "is_weights[%lld] is %g; GMPO takes the log of IS weights, which are >= 0",
                         (long long)i, (double)is_weights[i]);
  if (kind == MRL_PG_GMPO && token_loss)
    return mrl__fail(e, MRL_ERR_UNSUPPORTED, fn,
                     "GMPO has no per-token loss: token_loss must be NULL");
  if (seq_ratio && kind != MRL_PG_GSPO && kind != MRL_PG_GMPO)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "seq_ratio: only GSPO and GMPO have one");
  if (seq_adv && kind != MRL_PG_GMPO)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "seq_adv: only GMPO has one");

  mrl__scratch s = {.e = e, .fn = fn};
  double *x = mrl__scratch_get(&s, n, sizeof *x);      /* log ratio */
  double *l = mrl__scratch_get(&s, n, sizeof *l);      /* per-token loss */
  double *g = mrl__scratch_get(&s, n, sizeof *g);      /* d l / d logp */
  double *w = mrl__scratch_get(&s, n, sizeof *w);      /* aggregation weights */
  double *sr = mrl__scratch_get(&s, rows, sizeof *sr); /* GSPO: per-row log ratio */
  double *sel = mrl__scratch_get(&s, n, sizeof *sel);  /* clip-cov, kl-cov: chosen tokens */
  if (!x || !l || !g || !w || !sr || !sel) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  for (int64_t i = 0; i < n; i++) x[i] = old_logp ? (double)logp[i] - old_logp[i] : 0.0;
  mrl_status chosen = MRL_OK;
  if (kind == MRL_PG_CLIP_COV) chosen = mrl__clip_cov_select(&s, &o, logp, x, adv, mask, n, sel);
  if (kind == MRL_PG_KL_COV) chosen = mrl__kl_cov_select(&s, &o, logp, adv, mask, n, sel);
  if (chosen) {
    mrl__scratch_free(&s);
    return chosen;
  }
  mrl_pg_stats st = {0};
  /* the metrics are verl's masked means: sums over mask-1 tokens / (their count + 1e-8) */
  double valid = 0.0, clipped = 0.0, lowered = 0.0, kl = 0.0;

  if (kind == MRL_PG_GMPO) {
    for (int64_t i = 0; i < n; i++)
      if (mask[i] != 0.0f) {
        valid += 1.0;
        kl -= x[i];
      }
    st.ppo_kl = kl / (valid + 1e-8);
    gmpo(&o, x, adv, mask, is_weights, rows, cols, &st, seq_ratio, seq_adv, dlogp);
    if (stats) *stats = st;
    mrl__scratch_free(&s);
    return MRL_OK;
  }

  if (kind == MRL_PG_GSPO)
    for (int64_t b = 0; b < rows; b++) {
      double msum = 0.0, xsum = 0.0;
      for (int64_t t = 0; t < cols; t++)
        if (mask[b * cols + t] != 0.0f) {
          msum += 1.0;
          xsum += x[b * cols + t];
        }
      sr[b] = xsum / fmax(msum, 1.0);
      if (seq_ratio) seq_ratio[b] = exp(fmin(sr[b], 10.0));
    }
  double lo = 1.0 - o.clip_low, hi = 1.0 + o.clip_high;
  for (int64_t i = 0; i < n; i++) {
    double a = adv[i], through_x = 1.0;
    bool through;
    double xc = clamp20(x[i], &through);
    if (!through) through_x = 0.0;
    double r = exp(xc), token_kl = -xc;
    bool clip = false, low = false;
    switch (kind) {
    case MRL_PG_PPO: {
      double l1 = -a * r, l2 = -a * fmin(fmax(r, lo), hi), lc = fmax(l1, l2), l3 = -a * o.clip_c;
      clip = l2 > l1;
      if (a < 0 && l3 < lc) { /* dual clip: a very negative-advantage token's loss is capped */
        low = true;
        l[i] = l3;
        g[i] = 0.0;
      } else {
        l[i] = lc;
        g[i] = l2 > l1 ? 0.0 : -a * r * through_x;
      }
      break;
    }
    case MRL_PG_GSPO: {
      int64_t b = i / cols;
      double sratio = exp(fmin(sr[b], 10.0));
      double l1 = -a * sratio, l2 = -a * fmin(fmax(sratio, lo), hi);
      token_kl = -x[i]; /* GSPO does not clamp the token log ratios */
      clip = l2 > l1;
      l[i] = fmax(l1, l2);
      g[i] = l2 > l1 || sr[b] > 10.0 ? 0.0 : -a * sratio;
      break;
    }
    case MRL_PG_CISPO: {
      double rc = fmin(fmax(r, lo), hi);
      clip = r != rc;
      l[i] = -rc * a * logp[i];
      g[i] = -rc * a;
      break;
    }
    case MRL_PG_SAPO: {
      double tau = a > 0 ? o.tau_pos : o.tau_neg, sg = sigmoid(tau * (r - 1.0));
      l[i] = -sg * 4.0 / tau * a;
      g[i] = -a * 4.0 * sg * (1.0 - sg) * r * through_x;
      break;
    }
    case MRL_PG_GPG:
    case MRL_PG_REINFORCE:
      token_kl = -x[i];
      l[i] = -(double)logp[i] * a;
      g[i] = -a;
      break;
    case MRL_PG_DPPO_TV:
    case MRL_PG_DPPO_KL: {
      /* the truncated ratio is a constant weight; the trust region decides which tokens count */
      double tr = fmin(r, o.clip_c), p = exp((double)logp[i]), q = exp((double)old_logp[i]);
      bool inside;
      if (kind == MRL_PG_DPPO_TV) {
        inside = a > 0 ? p - q <= o.clip_high : p - q >= -o.clip_low;
      } else {
        double k = q * ((double)old_logp[i] - logp[i]) +
                   (1.0 - q) * log((1.0 - q + 1e-8) / (1.0 - p + 1e-8));
        inside = a > 0 ? k <= o.clip_high || p <= q : k <= o.clip_low || p >= q;
      }
      clip = !inside;
      low = inside && r > o.clip_c;
      l[i] = inside ? -a * tr * logp[i] : 0.0;
      g[i] = inside ? -a * tr : 0.0;
      break;
    }
    case MRL_PG_CLIP_COV: {
      double ru = exp(x[i]); /* verl's clip-cov does not clamp the log ratio */
      double l1 = -a * ru, l2 = -a * fmin(fmax(ru, lo), hi);
      token_kl = -x[i];
      clip = sel[i] != 0.0;
      l[i] = clip ? 0.0 : fmax(l1, l2);
      g[i] = clip || l2 > l1 ? 0.0 : -a * ru;
      break;
    }
    case MRL_PG_KL_COV: {
      double ru = exp(x[i]), sgn = (x[i] > 0) - (x[i] < 0);
      token_kl = fabs(x[i]);
      clip = sel[i] != 0.0;
      l[i] = -a * ru + (clip ? o.kl_coef * fabs(x[i]) : 0.0);
      g[i] = -a * ru + (clip ? o.kl_coef * sgn : 0.0);
      break;
    }
    case MRL_PG_DRO:
      token_kl = -x[i];
      l[i] = -(double)logp[i] * a + 0.5 * o.dro_beta * x[i] * x[i];
      g[i] = -a + o.dro_beta * x[i];
      break;
    case MRL_PG_GMPO: break;
    }
    if (is_weights) {
      l[i] *= is_weights[i];
      g[i] *= is_weights[i];
    }
    if (mask[i] != 0.0f) {
      valid += 1.0;
      clipped += clip;
      lowered += low;
      kl += token_kl;
    }
  }
  mrl_loss_agg mode =
      kind == MRL_PG_GSPO || kind == MRL_PG_SAPO ? MRL_AGG_SEQ_MEAN_TOKEN_MEAN : o.agg;
  mrl__agg_weights(mode, o.agg_norm, mask, rows, cols, w);
  st.loss = mrl__agg_sum(w, l, n);
  st.clipfrac = clipped / (valid + 1e-8);
  st.clipfrac_lower = lowered / (valid + 1e-8);
  st.ppo_kl = old_logp ? kl / (valid + 1e-8) : 0.0;
  if (stats) *stats = st;
  if (token_loss)
    for (int64_t i = 0; i < n; i++) token_loss[i] = (float)l[i];
  if (dlogp)
    for (int64_t i = 0; i < n; i++)
      if (w[i] != 0.0) dlogp[i] += (float)(w[i] * g[i]);
  mrl__scratch_free(&s);
  return MRL_OK;
}

/* ---- A2TGPO ---- */

mrl_status mrl_a2tgpo_loss(mrl_engine *e, const mrl_pg_opts *opts, int turn_level,
                           const float *logp, const float *old_logp, const float *adv,
                           const float *mask, const int32_t *turn, const float *clip_scale,
                           int64_t rows, int64_t cols, mrl_pg_stats *stats, float *token_loss,
                           float *ratio, float *dlogp) {
  static const char fn[] = "mrl_a2tgpo_loss";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  mrl_pg_opts o;
  mrl_pg_defaults(MRL_PG_PPO, &o);
  if (opts) o = *opts;
  ADV_TRY(check_pg_opts(e, fn, MRL_PG_CISPO, &o)); /* everything but PPO's dual clip */
  ADV_TRY(mrl__adv_need(e, fn, "logp", logp, n));
  ADV_TRY(mrl__adv_need(e, fn, "old_logp", old_logp, n));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "clip_scale", clip_scale, n));
  if (turn_level) ADV_TRY(mrl__adv_need(e, fn, "turn", turn, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "logp", logp, mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "old_logp", old_logp, mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "adv", adv, mask, n));
  for (int64_t i = 0; i < n; i++)
    if (mask[i] != 0.0f && !(clip_scale[i] >= 0.0f && isfinite(clip_scale[i])))
      return mrl__fail(e, MRL_ERR_INVALID, fn, "clip_scale[%lld] is %g; it must be finite and >= 0",
                       (long long)i, (double)clip_scale[i]);
  if (turn_level)
    for (int64_t i = 0; i < n; i++)
      if (turn[i] < -1)
        return mrl__fail(e, MRL_ERR_INVALID, fn, "turn[%lld] is %d; turns are >= 0, or -1",
                         (long long)i, (int)turn[i]);

  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status status = MRL_ERR_NOMEM;
  double *x = mrl__scratch_get(&s, n, sizeof *x);
  double *through = mrl__scratch_get(&s, n, sizeof *through);
  double *r = mrl__scratch_get(&s, n, sizeof *r);
  double *l = mrl__scratch_get(&s, n, sizeof *l);
  double *dr = mrl__scratch_get(&s, n, sizeof *dr); /* w * d l / d ratio */
  double *w = mrl__scratch_get(&s, n, sizeof *w);
  double *clip = mrl__scratch_get(&s, n, sizeof *clip);
  double *kl = mrl__scratch_get(&s, n, sizeof *kl);
  int64_t *key = mrl__scratch_get(&s, n, sizeof *key), keys = 0;
  if (!x || !through || !r || !l || !dr || !w || !clip || !kl || !key) goto done;
  for (int64_t i = 0; i < n; i++) {
    bool t;
    x[i] = clamp20((double)logp[i] - old_logp[i], &t);
    through[i] = t;
    kl[i] = -x[i];
  }
  double *ksum = NULL, *kcount = NULL, *kgrad = NULL;
  if (turn_level) {
    /* one ratio per (row, turn): keys number the pairs; tokens outside turns share a key per row
     * that is never used */
    int64_t *rowid = mrl__scratch_get(&s, n, sizeof *rowid),
            *tid = mrl__scratch_get(&s, n, sizeof *tid);
    if (!rowid || !tid) goto done;
    for (int64_t i = 0; i < n; i++) {
      rowid[i] = i / cols;
      tid[i] = turn[i];
    }
    if (mrl__dense_ids(&s, rowid, tid, n, key, &keys)) goto done;
    ksum = mrl__scratch_get(&s, keys, sizeof *ksum);
    kcount = mrl__scratch_get(&s, keys, sizeof *kcount);
    kgrad = mrl__scratch_get(&s, keys, sizeof *kgrad);
    if (!ksum || !kcount || !kgrad) goto done;
    for (int64_t i = 0; i < n; i++)
      if (turn[i] >= 0 && mask[i] != 0.0f) {
        ksum[key[i]] += x[i];
        kcount[key[i]] += 1.0;
      }
    for (int64_t i = 0; i < n; i++)
      r[i] = turn[i] >= 0 && kcount[key[i]] > 0 ? exp(ksum[key[i]] / kcount[key[i]]) : 1.0;
  } else {
    for (int64_t i = 0; i < n; i++) r[i] = exp(x[i]);
  }
  mrl__agg_weights(o.agg, o.agg_norm, mask, rows, cols, w);
  for (int64_t i = 0; i < n; i++) {
    double a = adv[i], c = clip_scale[i];
    double l1 = -a * r[i], l2 = -a * fmin(fmax(r[i], 1.0 - o.clip_low * c), 1.0 + o.clip_high * c);
    clip[i] = l2 > l1;
    l[i] = fmax(l1, l2);
    dr[i] = l2 > l1 ? 0.0 : -a * w[i];
  }
  if (dlogp) {
    if (turn_level) {
      /* ratio_k = exp(mean of x over the turn's mask-1 tokens): each of them receives
       * ratio_k / count_k times the turn's summed w * d l / d ratio */
      for (int64_t i = 0; i < n; i++)
        if (turn[i] >= 0) kgrad[key[i]] += dr[i];
      for (int64_t i = 0; i < n; i++)
        if (turn[i] >= 0 && mask[i] != 0.0f)
          dlogp[i] += (float)(kgrad[key[i]] * r[i] / kcount[key[i]] * through[i]);
    } else {
      for (int64_t i = 0; i < n; i++)
        if (w[i] != 0.0) dlogp[i] += (float)(dr[i] * r[i] * through[i]);
    }
  }
  mrl_pg_stats st = {.loss = mrl__agg_sum(w, l, n),
                     .clipfrac = mrl__masked_mean(clip, mask, n),
                     .clipfrac_lower = 0.0,
                     .ppo_kl = mrl__masked_mean(kl, mask, n)};
  if (stats) *stats = st;
  for (int64_t i = 0; i < n; i++) {
    if (token_loss) token_loss[i] = (float)l[i];
    if (ratio) ratio[i] = (float)r[i];
  }
  status = MRL_OK;
done:
  mrl__scratch_free(&s);
  return status;
}

/* ---- value loss and entropy bonus ---- */

mrl_status mrl_value_loss(mrl_engine *e, mrl_loss_agg mode, double norm, double clip,
                          const float *vpred, const float *values, const float *returns,
                          const float *mask, int64_t rows, int64_t cols, double *loss,
                          double *clipfrac, float *dvpred) {
  static const char fn[] = "mrl_value_loss";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__check_agg(e, fn, mode, norm));
  ADV_TRY(mrl__adv_range(e, fn, "clip", clip, 0.0, INFINITY));
  ADV_TRY(mrl__adv_need(e, fn, "vpred", vpred, n));
  ADV_TRY(mrl__adv_need(e, fn, "values", values, n));
  ADV_TRY(mrl__adv_need(e, fn, "returns", returns, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "loss", loss, 1));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "vpred", vpred, mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "values", values, mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "returns", returns, mask, n));
  mrl__scratch s = {.e = e, .fn = fn};
  double *w = mrl__scratch_get(&s, n, sizeof *w);
  double *l = mrl__scratch_get(&s, n, sizeof *l);
  double *clipped = mrl__scratch_get(&s, n, sizeof *clipped);
  if (!w || !l || !clipped) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  mrl__agg_weights(mode, norm, mask, rows, cols, w);
  for (int64_t i = 0; i < n; i++) {
    if (mask[i] == 0.0f) continue;
    double v = vpred[i], vc = fmin(fmax(v, (double)values[i] - clip), (double)values[i] + clip);
    double l1 = (v - returns[i]) * (v - returns[i]), l2 = (vc - returns[i]) * (vc - returns[i]);
    clipped[i] = l2 > l1;
    l[i] = 0.5 * fmax(l1, l2);
    if (dvpred && l2 <= l1) dvpred[i] += (float)(w[i] * (v - returns[i]));
  }
  *loss = mrl__agg_sum(w, l, n);
  if (clipfrac) *clipfrac = mrl__masked_mean(clipped, mask, n);
  mrl__scratch_free(&s);
  return MRL_OK;
}

mrl_status mrl_entropy_bonus(mrl_engine *e, mrl_loss_agg mode, double norm, double coef,
                             const float *entropy, const float *mask, int64_t rows, int64_t cols,
                             double *loss, float *dentropy) {
  static const char fn[] = "mrl_entropy_bonus";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__check_agg(e, fn, mode, norm));
  ADV_TRY(mrl__adv_range(e, fn, "coef", coef, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_need(e, fn, "entropy", entropy, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "loss", loss, 1));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "entropy", entropy, mask, n));
  mrl__scratch s = {.e = e, .fn = fn};
  double *w = mrl__scratch_get(&s, n, sizeof *w);
  double *h = mrl__scratch_get(&s, n, sizeof *h);
  if (!w || !h) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  mrl__agg_weights(mode, norm, mask, rows, cols, w);
  for (int64_t i = 0; i < n; i++) h[i] = mask[i] != 0.0f ? entropy[i] : 0.0;
  *loss = -coef * mrl__agg_sum(w, h, n);
  if (dentropy)
    for (int64_t i = 0; i < n; i++)
      if (w[i] != 0.0) dentropy[i] += (float)(-coef * w[i]);
  mrl__scratch_free(&s);
  return MRL_OK;
}
