/* advantage.c - outcome and critic advantage estimators (spec sections 1 and 6.8): GRPO and
 * Dr. GRPO, pass@k, RLOO, OPO, GPG, REINFORCE++(-baseline), GDPO, ReMax, GAE, and the fatal-step
 * mask and clamp of fatal-aware GRPO. */
#include "advantage.h"

#include <math.h>

void mrl_outcome_defaults(mrl_outcome_opts *opts) {
  if (!opts) return;
  *opts = (mrl_outcome_opts){.epsilon = 1e-6, .norm_by_std = 1, .singleton_zero = 0, .f_norm = 1.0};
}

/* The checks every (rows, cols) estimator shares: sizes, the mask, finite rewards (a reward on a
 * mask-0 position still counts in the score, so it must be finite everywhere). */
static mrl_status check_token_batch(mrl_engine *e, const char *fn, const float *rewards,
                                    const float *mask, int64_t rows, int64_t cols) {
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  return mrl__adv_finite(e, fn, "rewards", rewards, NULL, n);
}

/* pass@k: the best member of each group gets max - second max, the others 0. */
static void passk_values(const double *score, const int64_t *g, int64_t rows, int64_t groups,
                         const double *std, const mrl_outcome_opts *o, int64_t *best,
                         double *second, double *a) {
  for (int64_t k = 0; k < groups; k++) {
    best[k] = -1;
    second[k] = -INFINITY;
  }
  for (int64_t b = 0; b < rows; b++) {
    int64_t k = g[b];
    if (best[k] < 0 || score[b] > score[best[k]]) {
      if (best[k] >= 0) second[k] = score[best[k]];
      best[k] = b;
    } else if (score[b] > second[k]) {
      second[k] = score[b];
    }
    a[b] = 0.0;
  }
  for (int64_t k = 0; k < groups; k++) {
    double gap = score[best[k]] - second[k]; /* 0 for a tie at the top */
    a[best[k]] = o->norm_by_std ? gap / (std[k] + o->epsilon) : gap;
  }
}

mrl_status mrl_outcome_advantage(mrl_engine *e, mrl_outcome_kind kind, const mrl_outcome_opts *opts,
                                 const float *rewards, const float *mask, const int64_t *group,
                                 int64_t rows, int64_t cols, float *adv) {
  static const char fn[] = "mrl_outcome_advantage";
  ADV_TRY(check_token_batch(e, fn, rewards, mask, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_need(e, fn, "group", group, rows));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  if ((int)kind < MRL_ADV_GRPO || (int)kind > MRL_ADV_REINFORCE_PP_BASELINE)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "unknown outcome estimator %d", (int)kind);
  mrl_outcome_opts o;
  mrl_outcome_defaults(&o);
  if (opts) o = *opts;
  ADV_TRY(mrl__adv_range(e, fn, "epsilon", o.epsilon, 0.0, INFINITY));
  if (kind == MRL_ADV_GPG && (!isfinite(o.f_norm) || o.f_norm == 0.0))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "f_norm is %g; it must be finite and non-zero",
                     o.f_norm);
  if (kind == MRL_ADV_REINFORCE_PP_BASELINE) ADV_TRY(mrl__whiten_count(e, fn, mask, n));

  mrl__scratch s = {.e = e, .fn = fn};
  double *score = mrl__scratch_get(&s, rows, sizeof *score);
  double *a = mrl__scratch_get(&s, rows, sizeof *a);
  int64_t *g = mrl__scratch_get(&s, rows, sizeof *g);
  int64_t groups = 0;
  mrl_status st = MRL_ERR_NOMEM;
  if (!score || !a || !g || mrl__dense_ids(&s, group, NULL, rows, g, &groups)) goto done;
  int64_t *size = mrl__scratch_get(&s, groups, sizeof *size);
  double *mean = mrl__scratch_get(&s, groups, sizeof *mean);
  double *std = mrl__scratch_get(&s, groups, sizeof *std);
  double *acc = mrl__scratch_get(&s, groups, sizeof *acc);        /* pass@k, OPO */
  int64_t *best = mrl__scratch_get(&s, groups, sizeof *best);     /* pass@k */
  int64_t *length = mrl__scratch_get(&s, groups, sizeof *length); /* OPO */
  if (!size || !mean || !std || !acc || !best || !length) goto done;
  mrl__row_sums(rewards, NULL, rows, cols, score);
  mrl__group_moments(score, g, rows, groups, 1, size, mean, std);

  switch (kind) {
  case MRL_ADV_GRPO:
    if ((st = mrl__group_norm(&s, score, g, rows, groups, false, o.norm_by_std, o.epsilon, a)))
      goto done;
    break;
  case MRL_ADV_GRPO_PASSK:
    for (int64_t b = 0; b < rows; b++)
      if (size[g[b]] < 2) {
        st = mrl__fail(e, MRL_ERR_INVALID, fn,
                       "group: pass@k needs groups of 2 or more; row %lld is alone in its group",
                       (long long)b);
        goto done;
      }
    passk_values(score, g, rows, groups, std, &o, best, acc, a);
    break;
  case MRL_ADV_RLOO:
    for (int64_t b = 0; b < rows; b++) {
      double m = (double)size[g[b]];
      a[b] = m > 1 ? m / (m - 1.0) * (score[b] - mean[g[b]]) : o.singleton_zero ? 0.0 : score[b];
    }
    break;
  case MRL_ADV_OPO: {
    /* baseline = sum(len S) / sum(len) over the group */
    for (int64_t b = 0; b < rows; b++) {
      int64_t len = mrl__mask_count(mask + b * cols, cols);
      length[g[b]] += len;
      acc[g[b]] += (double)len * score[b];
    }
    for (int64_t b = 0; b < rows; b++)
      if (size[g[b]] > 1 && length[g[b]] == 0) {
        st = mrl__fail(e, MRL_ERR_INVALID, fn,
                       "mask: OPO's length-weighted baseline is 0/0: every row of the group of "
                       "row %lld has an empty mask",
                       (long long)b);
        goto done;
      }
    for (int64_t b = 0; b < rows; b++)
      a[b] = score[b] - (size[g[b]] > 1 ? acc[g[b]] / (double)length[g[b]] : 0.0);
    break;
  }
  case MRL_ADV_GPG: {
    int64_t nonzero = 0;
    for (int64_t b = 0; b < rows; b++) nonzero += score[b] != 0.0;
    double alpha = (double)rows / (double)(nonzero > 0 ? nonzero : 1);
    for (int64_t b = 0; b < rows; b++)
      a[b] = alpha * (score[b] - (size[g[b]] > 1 ? mean[g[b]] : 0.0)) / o.f_norm;
    break;
  }
  case MRL_ADV_REINFORCE_PP_BASELINE: {
    double *tok = mrl__scratch_get(&s, n, sizeof *tok);
    if (!tok) goto done;
    for (int64_t b = 0; b < rows; b++) {
      double centred = score[b] - (size[g[b]] > 1 ? mean[g[b]] : 0.0);
      for (int64_t t = 0; t < cols; t++) tok[b * cols + t] = centred * mask[b * cols + t];
    }
    mrl__masked_whiten(tok, mask, n, tok);
    for (int64_t i = 0; i < n; i++) adv[i] = (float)(tok[i] * mask[i]);
    st = MRL_OK;
    goto done;
  }
  }
  mrl__broadcast_rows(a, mask, rows, cols, adv);
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}

/* ---- GDPO: each reward term normalised on its own, then summed and whitened ---- */

mrl_status mrl_gdpo(mrl_engine *e, const mrl_outcome_opts *opts, const double *scores,
                    const double *weights, int64_t terms, const float *mask, const int64_t *group,
                    int64_t rows, int64_t cols, float *adv) {
  static const char fn[] = "mrl_gdpo";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  ADV_TRY(mrl__adv_sizes(e, fn, terms, rows));
  if (terms < 1)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "terms is %lld; GDPO needs at least one reward term",
                     (long long)terms);
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_need(e, fn, "scores", scores, terms * rows));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "group", group, rows));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "scores", scores, terms * rows));
  if (weights) ADV_TRY(mrl__adv_finite_d(e, fn, "weights", weights, terms));
  mrl_outcome_opts o;
  mrl_outcome_defaults(&o);
  if (opts) o = *opts;
  ADV_TRY(mrl__adv_range(e, fn, "epsilon", o.epsilon, 0.0, INFINITY));
  ADV_TRY(mrl__whiten_count(e, fn, mask, n));
  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = MRL_ERR_NOMEM;
  double *sum = mrl__scratch_get(&s, rows, sizeof *sum);
  double *tok = mrl__scratch_get(&s, n, sizeof *tok);
  int64_t *g = mrl__scratch_get(&s, rows, sizeof *g), groups = 0;
  if (!sum || !tok || !g || mrl__dense_ids(&s, group, NULL, rows, g, &groups)) goto done;
  int64_t *size = mrl__scratch_get(&s, groups, sizeof *size);
  double *mean = mrl__scratch_get(&s, groups, sizeof *mean);
  double *std = mrl__scratch_get(&s, groups, sizeof *std);
  if (!size || !mean || !std) goto done;
  for (int64_t k = 0; k < terms; k++) {
    /* GRPO of term k: a group of one keeps its score (mean 0, std 1) */
    const double *x = scores + k * rows;
    mrl__group_moments(x, g, rows, groups, 1, size, mean, std);
    for (int64_t b = 0; b < rows; b++) {
      double mu = size[g[b]] > 1 ? mean[g[b]] : 0.0, sigma = size[g[b]] > 1 ? std[g[b]] : 1.0;
      double a = o.norm_by_std ? (x[b] - mu) / (sigma + o.epsilon) : x[b] - mu;
      sum[b] += (weights ? weights[k] : 1.0) * a;
    }
  }
  for (int64_t i = 0; i < n; i++) tok[i] = sum[i / cols] * mask[i];
  mrl__masked_whiten(tok, mask, n, tok);
  for (int64_t i = 0; i < n; i++) adv[i] = (float)(tok[i] * mask[i]);
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}

/* ---- token-level returns ---- */

static mrl_status check_discount(mrl_engine *e, const char *fn, const char *name, double v) {
  return mrl__adv_range(e, fn, name, v, 0.0, 1.0);
}

mrl_status mrl_gae(mrl_engine *e, const float *rewards, const float *values, const float *mask,
                   int64_t rows, int64_t cols, double gamma, double lambda, float *adv,
                   float *returns) {
  static const char fn[] = "mrl_gae";
  ADV_TRY(check_token_batch(e, fn, rewards, mask, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_need(e, fn, "values", values, n));
  ADV_TRY(mrl__adv_finite(e, fn, "values", values, NULL, n));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(check_discount(e, fn, "gamma", gamma));
  ADV_TRY(check_discount(e, fn, "lambda", lambda));
  ADV_TRY(mrl__whiten_count(e, fn, mask, n));
  mrl__scratch s = {.e = e, .fn = fn};
  double *g = mrl__scratch_get(&s, n, sizeof *g);
  if (!g) return MRL_ERR_NOMEM;
  for (int64_t b = 0; b < rows; b++) {
    double next_value = 0.0, acc = 0.0;
    for (int64_t t = cols - 1; t >= 0; t--) {
      int64_t i = b * cols + t;
      if (mask[i] != 0.0f) { /* a mask-0 token neither bootstraps nor advances the recursion */
        double delta = rewards[i] + gamma * next_value - values[i];
        acc = delta + gamma * lambda * acc;
        next_value = values[i];
      }
      g[i] = acc;
    }
  }
  if (returns)
    for (int64_t i = 0; i < n; i++) returns[i] = (float)(g[i] + values[i]);
  mrl__masked_whiten(g, mask, n, g);
  for (int64_t i = 0; i < n; i++) adv[i] = (float)g[i];
  mrl__scratch_free(&s);
  return MRL_OK;
}

mrl_status mrl_reinforce_pp(mrl_engine *e, const float *rewards, const float *mask, int64_t rows,
                            int64_t cols, double gamma, mrl_return_rule rule, float *adv,
                            float *returns) {
  static const char fn[] = "mrl_reinforce_pp";
  ADV_TRY(check_token_batch(e, fn, rewards, mask, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(check_discount(e, fn, "gamma", gamma));
  if (rule != MRL_RETURN_CARRY && rule != MRL_RETURN_RESET)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "unknown return rule %d", (int)rule);
  ADV_TRY(mrl__whiten_count(e, fn, mask, n));
  mrl__scratch s = {.e = e, .fn = fn};
  double *ret = mrl__scratch_get(&s, n, sizeof *ret);
  if (!ret) return MRL_ERR_NOMEM;
  for (int64_t b = 0; b < rows; b++) {
    double run = 0.0;
    for (int64_t t = cols - 1; t >= 0; t--) {
      int64_t i = b * cols + t;
      double next = rewards[i] + gamma * run;
      if (mask[i] != 0.0f) {
        ret[i] = run = next;
      } else if (rule == MRL_RETURN_CARRY) {
        ret[i] = 0.0; /* an observation token: the return passes it unchanged */
      } else {
        ret[i] = next; /* the rule before verl 8a1bf6d5b: no credit across an observation */
        run = 0.0;
      }
    }
  }
  if (returns)
    for (int64_t i = 0; i < n; i++) returns[i] = (float)ret[i];
  mrl__masked_whiten(ret, mask, n, ret);
  for (int64_t i = 0; i < n; i++) adv[i] = (float)(ret[i] * mask[i]);
  mrl__scratch_free(&s);
  return MRL_OK;
}

mrl_status mrl_remax(mrl_engine *e, const float *rewards, const float *mask, const double *baseline,
                     int64_t rows, int64_t cols, float *adv, float *returns) {
  static const char fn[] = "mrl_remax";
  ADV_TRY(check_token_batch(e, fn, rewards, mask, rows, cols));
  ADV_TRY(mrl__adv_need(e, fn, "baseline", baseline, rows));
  ADV_TRY(mrl__adv_finite_d(e, fn, "baseline", baseline, rows));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, rows * cols));
  for (int64_t b = 0; b < rows; b++) {
    double run = 0.0;
    for (int64_t t = cols - 1; t >= 0; t--) {
      int64_t i = b * cols + t;
      run += (double)rewards[i] * mask[i];
      adv[i] = (float)(run - baseline[b] * mask[i]);
      if (returns) returns[i] = (float)run;
    }
  }
  return MRL_OK;
}

/* ---- fatal-aware training ---- */

mrl_status mrl_fatal_step(mrl_engine *e, const uint8_t *step_is_error, int64_t steps, int answered,
                          int threshold, int64_t *index, mrl_fatal_reason *reason) {
  static const char fn[] = "mrl_fatal_step";
  if (!e) return MRL_ERR_NULL;
  if (steps < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "steps is %lld; it must be >= 0", (long long)steps);
  ADV_TRY(mrl__adv_need(e, fn, "step_is_error", step_is_error, steps));
  ADV_TRY(mrl__adv_need(e, fn, "index", index, 1));
  ADV_TRY(mrl__adv_need(e, fn, "reason", reason, 1));
  if (threshold < 1)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "threshold is %d; it must be >= 1", threshold);
  if (steps == 0) {
    *index = 0;
    *reason = MRL_FATAL_NO_STEPS;
    return MRL_OK;
  }
  int64_t run = 0;
  for (int64_t i = 0; i < steps; i++) {
    run = step_is_error[i] ? run + 1 : 0;
    if (run == threshold) {
      *index = i - threshold + 1;
      *reason = MRL_FATAL_CONSECUTIVE_ERRORS;
      return MRL_OK;
    }
  }
  *index = answered ? -1 : steps;
  *reason = answered ? MRL_FATAL_NONE : MRL_FATAL_NO_FINAL_ANSWER;
  return MRL_OK;
}

mrl_status mrl_fatal_mask(mrl_engine *e, const int64_t *fatal_index, int64_t rows, int64_t cols,
                          float *mask) {
  static const char fn[] = "mrl_fatal_mask";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  ADV_TRY(mrl__adv_need(e, fn, "fatal_index", fatal_index, rows));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, rows * cols));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, rows * cols));
  for (int64_t b = 0; b < rows; b++) {
    if (fatal_index[b] < 0) continue;
    float *row = mask + b * cols;
    int64_t block = -1, t = 0;
    for (; t < cols; t++) {
      if (row[t] != 0.0f && (t == 0 || row[t - 1] == 0.0f)) block++;
      if (block == fatal_index[b]) break;
    }
    for (; t < cols; t++) row[t] = 0.0f;
  }
  return MRL_OK;
}

mrl_status mrl_fatal_clamp(mrl_engine *e, const uint8_t *is_fatal, int64_t rows, int64_t cols,
                           float *adv) {
  static const char fn[] = "mrl_fatal_clamp";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  ADV_TRY(mrl__adv_need(e, fn, "is_fatal", is_fatal, rows));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, rows * cols));
  for (int64_t b = 0; b < rows; b++)
    if (is_fatal[b])
      for (int64_t t = 0; t < cols; t++)
        if (adv[b * cols + t] < 0.0f) adv[b * cols + t] = 0.0f;
  return MRL_OK;
}
