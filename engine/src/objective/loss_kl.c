/* loss_kl.c - KL divergence to a reference policy (spec section 2): the k1/abs/k2/k3 estimators
 * and their straight-through "+" variants (the estimator's value, k2's gradient) with gradients,
 * KL as a loss term and in the reward, the adaptive KL controller, TT-OPD's turn-level KL to a
 * teacher (6.12) and the teacher's EMA. */
#include "advantage.h"

#include <math.h>

static mrl_status check_kind(mrl_engine *e, const char *fn, mrl_kl_kind kind) {
  if ((int)kind < MRL_KL_K1 || (int)kind > MRL_KL_ABS_PLUS)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "unknown KL estimator %d", (int)kind);
  return MRL_OK;
}

/* value and d value / d logp of one estimator at d = logp - ref_logp */
static double kl_at(mrl_kl_kind kind, double d, double *grad) {
  switch (kind) {
  case MRL_KL_ABS: *grad = (d > 0) - (d < 0); return fabs(d);
  case MRL_KL_K2: *grad = d; return 0.5 * d * d;
  case MRL_KL_K3:
  case MRL_KL_K3_PLUS: {
    /* both clamps are verl's guards against overflow; where one bites the gradient is 0 */
    double x = fmin(fmax(-d, -20.0), 20.0), v = exp(x) - x - 1.0;
    double vc = fmin(fmax(v, -10.0), 10.0);
    bool through = -d >= -20.0 && -d <= 20.0 && v >= -10.0 && v <= 10.0;
    *grad = kind == MRL_KL_K3_PLUS ? d : through ? 1.0 - exp(x) : 0.0;
    return vc;
  }
  case MRL_KL_K1_PLUS: *grad = d; return d;
  case MRL_KL_ABS_PLUS: *grad = d; return fabs(d);
  case MRL_KL_K1: break;
  }
  *grad = 1.0;
  return d;
}

mrl_status mrl_kl(mrl_engine *e, mrl_kl_kind kind, const float *logp, const float *ref_logp,
                  int64_t n, float *kl, float *grad) {
  static const char fn[] = "mrl_kl";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(check_kind(e, fn, kind));
  ADV_TRY(mrl__adv_need(e, fn, "logp", logp, n));
  ADV_TRY(mrl__adv_need(e, fn, "ref_logp", ref_logp, n));
  ADV_TRY(mrl__adv_finite(e, fn, "logp", logp, NULL, n));
  ADV_TRY(mrl__adv_finite(e, fn, "ref_logp", ref_logp, NULL, n));
  for (int64_t i = 0; i < n; i++) {
    double g, v = kl_at(kind, (double)logp[i] - ref_logp[i], &g);
    if (kl) kl[i] = (float)v;
    if (grad) grad[i] = (float)g;
  }
  return MRL_OK;
}

/* the checks of the masked (rows, cols) KL functions */
static mrl_status check_masked(mrl_engine *e, const char *fn, mrl_kl_kind kind, const char *pname,
                               const float *p, const char *qname, const float *q, const float *mask,
                               int64_t rows, int64_t cols) {
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(check_kind(e, fn, kind));
  ADV_TRY(mrl__adv_need(e, fn, pname, p, n));
  ADV_TRY(mrl__adv_need(e, fn, qname, q, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, pname, p, mask, n));
  return mrl__adv_finite(e, fn, qname, q, mask, n);
}

mrl_status mrl_kl_loss(mrl_engine *e, mrl_kl_kind kind, mrl_loss_agg mode, double norm, double coef,
                       const float *logp, const float *ref_logp, const float *mask, int64_t rows,
                       int64_t cols, double *loss, float *dlogp) {
  static const char fn[] = "mrl_kl_loss";
  ADV_TRY(check_masked(e, fn, kind, "logp", logp, "ref_logp", ref_logp, mask, rows, cols));
  ADV_TRY(mrl__check_agg(e, fn, mode, norm));
  ADV_TRY(mrl__adv_range(e, fn, "coef", coef, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_need(e, fn, "loss", loss, 1));
  int64_t n = rows * cols;
  mrl__scratch s = {.e = e, .fn = fn};
  double *w = mrl__scratch_get(&s, n, sizeof *w);
  double *v = mrl__scratch_get(&s, n, sizeof *v);
  double *g = mrl__scratch_get(&s, n, sizeof *g);
  if (!w || !v || !g) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  mrl__agg_weights(mode, norm, mask, rows, cols, w);
  for (int64_t i = 0; i < n; i++)
    if (mask[i] != 0.0f) v[i] = kl_at(kind, (double)logp[i] - ref_logp[i], &g[i]);
  *loss = coef * mrl__agg_sum(w, v, n);
  if (dlogp)
    for (int64_t i = 0; i < n; i++)
      if (w[i] != 0.0) dlogp[i] += (float)(coef * w[i] * g[i]);
  mrl__scratch_free(&s);
  return MRL_OK;
}

mrl_status mrl_kl_reward(mrl_engine *e, mrl_kl_kind kind, double beta, const float *scores,
                         const float *old_logp, const float *ref_logp, const float *mask,
                         int64_t rows, int64_t cols, float *rewards, double *current_kl) {
  static const char fn[] = "mrl_kl_reward";
  ADV_TRY(check_masked(e, fn, kind, "old_logp", old_logp, "ref_logp", ref_logp, mask, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_range(e, fn, "beta", beta, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_need(e, fn, "scores", scores, n));
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, n));
  ADV_TRY(mrl__adv_finite(e, fn, "scores", scores, NULL, n));
  double rows_kl = 0.0;
  for (int64_t b = 0; b < rows; b++) {
    double sum = 0.0, count = 0.0;
    for (int64_t t = 0; t < cols; t++) {
      int64_t i = b * cols + t;
      double g, kl = mask[i] != 0.0f ? kl_at(kind, (double)old_logp[i] - ref_logp[i], &g) : 0.0;
      rewards[i] = (float)(scores[i] - beta * kl);
      sum += kl;
      count += mask[i];
    }
    rows_kl += sum / (count + 1e-8);
  }
  if (current_kl) *current_kl = rows ? rows_kl / (double)rows : 0.0;
  return MRL_OK;
}

mrl_status mrl_kl_adaptive(mrl_engine *e, double value, double current_kl, int64_t n_steps,
                           double target, double horizon, double *out) {
  static const char fn[] = "mrl_kl_adaptive";
  if (!e) return MRL_ERR_NULL;
  ADV_TRY(mrl__adv_need(e, fn, "out", out, 1));
  ADV_TRY(mrl__adv_range(e, fn, "value", value, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "current_kl", current_kl, -INFINITY, INFINITY));
  if (!(target > 0.0) || !(horizon > 0.0) || isinf(target) || isinf(horizon))
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "target (%g) and horizon (%g) must be positive and finite", target, horizon);
  if (n_steps < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "n_steps is %lld; it must be >= 0",
                     (long long)n_steps);
  double err = fmin(fmax(current_kl / target - 1.0, -0.2), 0.2);
  *out = value * (1.0 + err * (double)n_steps / horizon);
  return MRL_OK;
}

mrl_status mrl_turn_kl_loss(mrl_engine *e, mrl_kl_kind kind, const float *student,
                            const float *teacher, const float *mask, const int32_t *turn,
                            int64_t rows, int64_t cols, int64_t turns, const double *turn_weights,
                            double *loss, double *per_turn, float *dlogp) {
  static const char fn[] = "mrl_turn_kl_loss";
  ADV_TRY(check_masked(e, fn, kind, "student", student, "teacher", teacher, mask, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_sizes(e, fn, rows, turns));
  ADV_TRY(mrl__adv_need(e, fn, "turn", turn, n));
  ADV_TRY(mrl__adv_need(e, fn, "loss", loss, 1));
  for (int64_t i = 0; i < n; i++)
    if (turn[i] < -1)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "turn[%lld] is %d; turns are >= 0, or -1",
                       (long long)i, (int)turn[i]);
  if (turn_weights)
    for (int64_t i = 0; i < rows * turns; i++)
      if (!(turn_weights[i] >= 0.0) || isinf(turn_weights[i]))
        return mrl__fail(e, MRL_ERR_INVALID, fn,
                         "turn_weights[%lld] is %g; weights are finite and >= 0", (long long)i,
                         turn_weights[i]);
  mrl__scratch s = {.e = e, .fn = fn};
  double *sum = mrl__scratch_get(&s, rows * turns, sizeof *sum);
  double *count = mrl__scratch_get(&s, rows * turns, sizeof *count);
  double *row_w = mrl__scratch_get(&s, rows, sizeof *row_w); /* sum of the row's used weights */
  if (!sum || !count || !row_w) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t b = i / cols, k = turn[i];
    if (mask[i] == 0.0f || k < 0 || k >= turns) continue;
    double g;
    sum[b * turns + k] += kl_at(kind, (double)student[i] - teacher[i], &g);
    count[b * turns + k] += 1.0;
  }
  double total = 0.0;
  int64_t used_rows = 0;
  for (int64_t b = 0; b < rows; b++) {
    double num = 0.0;
    for (int64_t k = 0; k < turns; k++) {
      int64_t j = b * turns + k;
      double kl = count[j] > 0 ? sum[j] / count[j] : 0.0, wk = turn_weights ? turn_weights[j] : 1.0;
      if (per_turn) per_turn[j] = kl;
      if (count[j] > 0) {
        num += wk * kl;
        row_w[b] += wk;
      }
    }
    if (row_w[b] > 0) {
      total += num / row_w[b];
      used_rows++;
    }
  }
  *loss = used_rows ? total / (double)used_rows : 0.0;
  if (dlogp)
    for (int64_t i = 0; i < n; i++) {
      int64_t b = i / cols, k = turn[i];
      if (mask[i] == 0.0f || k < 0 || k >= turns || row_w[b] == 0.0) continue;
      double g, wk = turn_weights ? turn_weights[b * turns + k] : 1.0;
      kl_at(kind, (double)student[i] - teacher[i], &g);
      dlogp[i] += (float)(g * wk / (row_w[b] * count[b * turns + k] * (double)used_rows));
    }
  mrl__scratch_free(&s);
  return MRL_OK;
}

mrl_status mrl_ema_update(mrl_engine *e, float *teacher, const float *student, int64_t n,
                          double decay) {
  static const char fn[] = "mrl_ema_update";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "teacher", teacher, n));
  ADV_TRY(mrl__adv_need(e, fn, "student", student, n));
  ADV_TRY(mrl__adv_range(e, fn, "decay", decay, 0.0, 1.0));
  ADV_TRY(mrl__adv_finite(e, fn, "teacher", teacher, NULL, n));
  ADV_TRY(mrl__adv_finite(e, fn, "student", student, NULL, n));
  for (int64_t i = 0; i < n; i++)
    teacher[i] = (float)(decay * teacher[i] + (1.0 - decay) * student[i]);
  return MRL_OK;
}
