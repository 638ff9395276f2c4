/* advantage_agentic.c - advantages over steps of multi-turn trajectories (spec section 6):
 * discounted step returns, GiGPO, Dr. MAS, StepPO's step-level GAE, BEACON's milestone segments,
 * A2TGPO's information-gain advantages, AEM's entropy modulation, and DAPO's group filter and
 * overlong shaping. */
#include "advantage.h"

#include <math.h>
#include <stdlib.h>

/* ---- discounted step returns ---- */

mrl_status mrl_step_returns(mrl_engine *e, const double *rewards, const int64_t *traj,
                            const int64_t *env_step, int64_t n, double gamma, double *returns) {
  static const char fn[] = "mrl_step_returns";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, n));
  ADV_TRY(mrl__adv_need(e, fn, "returns", returns, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "rewards", rewards, n));
  ADV_TRY(mrl__adv_range(e, fn, "gamma", gamma, 0.0, 1.0));
  mrl__scratch s = {.e = e, .fn = fn};
  int64_t *tj = mrl__scratch_get(&s, n, sizeof *tj);
  int64_t *start = mrl__scratch_get(&s, n, sizeof *start); /* first row of each row's step */
  int64_t trajs = n > 0 ? 1 : 0;
  if (!tj || !start || (traj && mrl__dense_ids(&s, traj, NULL, n, tj, &trajs))) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  int64_t *last = mrl__scratch_get(&s, trajs, sizeof *last); /* the trajectory's previous row */
  double *run = mrl__scratch_get(&s, trajs, sizeof *run);
  if (!last || !run) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  for (int64_t k = 0; k < trajs; k++) last[k] = -1;
  for (int64_t i = 0; i < n; i++) {
    int64_t k = tj[i], prev = last[k];
    bool same_step = env_step && prev >= 0 && env_step[prev] == env_step[i];
    start[i] = same_step ? start[prev] : i;
    last[k] = i;
  }
  /* backwards: a step's return is computed at its first row (met last), then copied forwards */
  for (int64_t i = n - 1; i >= 0; i--)
    if (start[i] == i) {
      run[tj[i]] = rewards[i] + gamma * run[tj[i]];
      returns[i] = run[tj[i]];
    }
  for (int64_t i = 0; i < n; i++) returns[i] = returns[start[i]];
  mrl__scratch_free(&s);
  return MRL_OK;
}

/* ---- GiGPO ---- */

void mrl_gigpo_defaults(mrl_gigpo_opts *opts) {
  if (!opts) return;
  *opts =
      (mrl_gigpo_opts){.epsilon = 1e-6, .step_weight = 1.0, .mode = MRL_NORM_MEAN, .dedup_traj = 0};
}

/* The episode term: row scores normalised within their group with statistics taken over the rows
 * where counted is set (stats_verl: a group of one counted row uses mean 0, std 1). */
static mrl_status episode_term(mrl__scratch *s, const double *score, const int64_t *g,
                               const bool *counted, int64_t rows, int64_t groups, bool by_std,
                               double eps, double *out) {
  double *x = mrl__scratch_get(s, rows, sizeof *x);
  int64_t *xg = mrl__scratch_get(s, rows, sizeof *xg);
  int64_t *size = mrl__scratch_get(s, groups, sizeof *size);
  double *mean = mrl__scratch_get(s, groups, sizeof *mean);
  double *std = mrl__scratch_get(s, groups, sizeof *std);
  if (!x || !xg || !size || !mean || !std) return MRL_ERR_NOMEM;
  int64_t m = 0;
  for (int64_t b = 0; b < rows; b++)
    if (counted[b]) {
      x[m] = score[b];
      xg[m++] = g[b];
    }
  mrl__group_moments(x, xg, m, groups, 1, size, mean, std);
  for (int64_t b = 0; b < rows; b++) {
    int64_t k = g[b];
    double mu = size[k] > 1 ? mean[k] : 0.0, sigma = size[k] > 1 ? std[k] : 1.0;
    out[b] = by_std ? (score[b] - mu) / (sigma + eps) : score[b] - mu;
  }
  return MRL_OK;
}

mrl_status mrl_gigpo(mrl_engine *e, const mrl_gigpo_opts *opts, const float *rewards,
                     const double *step_rewards, const float *mask, const int64_t *group,
                     const int64_t *traj, const int64_t *anchor, int64_t rows, int64_t cols,
                     float *adv, float *episode_adv, float *step_adv, int64_t *step_group) {
  static const char fn[] = "mrl_gigpo";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  mrl_gigpo_opts o;
  mrl_gigpo_defaults(&o);
  if (opts) o = *opts;
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, n));
  ADV_TRY(mrl__adv_need(e, fn, "step_rewards", step_rewards, rows));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "group", group, rows));
  ADV_TRY(mrl__adv_need(e, fn, "anchor", anchor, rows));
  if (o.dedup_traj) ADV_TRY(mrl__adv_need(e, fn, "traj", traj, rows));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "rewards", rewards, NULL, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "step_rewards", step_rewards, rows));
  ADV_TRY(mrl__adv_range(e, fn, "epsilon", o.epsilon, 0.0, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "step_weight", o.step_weight, -INFINITY, INFINITY));
  if (o.mode != MRL_NORM_MEAN && o.mode != MRL_NORM_MEAN_STD)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "unknown normalisation mode %d", (int)o.mode);
  bool by_std = o.mode == MRL_NORM_MEAN_STD;

  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = MRL_ERR_NOMEM;
  double *score = mrl__scratch_get(&s, rows, sizeof *score);
  double *ep = mrl__scratch_get(&s, rows, sizeof *ep);
  double *sa = mrl__scratch_get(&s, rows, sizeof *sa);
  int64_t *g = mrl__scratch_get(&s, rows, sizeof *g);
  int64_t *sg = mrl__scratch_get(&s, rows, sizeof *sg);
  bool *counted = mrl__scratch_get(&s, rows, sizeof *counted);
  int64_t groups = 0, step_groups = 0;
  if (!score || !ep || !sa || !g || !sg || !counted ||
      mrl__dense_ids(&s, group, NULL, rows, g, &groups) ||
      mrl__dense_ids(&s, group, anchor, rows, sg, &step_groups))
    goto done;
  if (o.dedup_traj) {
    /* statistics over one row per (group, traj) pair: its first */
    int64_t *tp = mrl__scratch_get(&s, rows, sizeof *tp), pairs = 0;
    bool *seen = tp ? mrl__scratch_get(&s, rows, sizeof *seen) : NULL;
    if (!seen || mrl__dense_ids(&s, group, traj, rows, tp, &pairs)) goto done;
    for (int64_t b = 0; b < rows; b++) {
      counted[b] = !seen[tp[b]];
      seen[tp[b]] = true;
    }
  } else {
    for (int64_t b = 0; b < rows; b++) counted[b] = true;
  }
  mrl__row_sums(rewards, NULL, rows, cols, score);
  if ((st = episode_term(&s, score, g, counted, rows, groups, by_std, o.epsilon, ep)) ||
      (st = mrl__group_norm(&s, step_rewards, sg, rows, step_groups, true, by_std, o.epsilon, sa)))
    goto done;
  for (int64_t b = 0; b < rows; b++)
    for (int64_t t = 0; t < cols; t++) {
      int64_t i = b * cols + t;
      adv[i] = (float)((ep[b] + o.step_weight * sa[b]) * mask[i]);
      if (episode_adv) episode_adv[i] = (float)(ep[b] * mask[i]);
      if (step_adv) step_adv[i] = (float)(sa[b] * mask[i]);
    }
  if (step_group)
    for (int64_t b = 0; b < rows; b++) step_group[b] = sg[b];
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}

/* ---- Dr. MAS ---- */

mrl_status mrl_drmas(mrl_engine *e, const float *rewards, const float *mask, const int64_t *group,
                     const int64_t *traj, const int64_t *agent, int64_t rows, int64_t cols,
                     int agent_wise, int norm_by_std, double epsilon, float *adv) {
  static const char fn[] = "mrl_drmas";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "group", group, rows));
  ADV_TRY(mrl__adv_need(e, fn, agent_wise ? "agent" : "traj", agent_wise ? agent : traj, rows));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "rewards", rewards, NULL, n));
  ADV_TRY(mrl__adv_range(e, fn, "epsilon", epsilon, 0.0, INFINITY));
  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = MRL_ERR_NOMEM;
  double *score = mrl__scratch_get(&s, rows, sizeof *score);
  double *a = mrl__scratch_get(&s, rows, sizeof *a);
  int64_t *key = mrl__scratch_get(&s, rows, sizeof *key);
  int64_t keys = 0;
  if (!score || !a || !key ||
      mrl__dense_ids(&s, group, agent_wise ? agent : traj, rows, key, &keys))
    goto done;
  mrl__row_sums(rewards, NULL, rows, cols, score);
  if (agent_wise) {
    if ((st = mrl__group_norm(&s, score, key, rows, keys, false, norm_by_std, epsilon, a)))
      goto done;
  } else {
    /* one value per (group, traj) trajectory: its rows' mean score, normalised among the
     * trajectories of its prompt group */
    double *tscore = mrl__scratch_get(&s, keys, sizeof *tscore);
    double *tnorm = mrl__scratch_get(&s, keys, sizeof *tnorm);
    int64_t *tcount = mrl__scratch_get(&s, keys, sizeof *tcount);
    int64_t *tgroup_id = mrl__scratch_get(&s, keys, sizeof *tgroup_id);
    int64_t *tg = mrl__scratch_get(&s, keys, sizeof *tg), tgroups = 0;
    if (!tscore || !tnorm || !tcount || !tgroup_id || !tg) goto done;
    for (int64_t b = 0; b < rows; b++) {
      tscore[key[b]] += score[b];
      tcount[key[b]]++;
      tgroup_id[key[b]] = group[b];
    }
    for (int64_t k = 0; k < keys; k++) tscore[k] /= (double)tcount[k];
    if (mrl__dense_ids(&s, tgroup_id, NULL, keys, tg, &tgroups) ||
        (st = mrl__group_norm(&s, tscore, tg, keys, tgroups, false, norm_by_std, epsilon, tnorm)))
      goto done;
    for (int64_t b = 0; b < rows; b++) a[b] = tnorm[key[b]];
  }
  mrl__broadcast_rows(a, mask, rows, cols, adv);
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}

/* ---- StepPO ---- */

typedef struct {
  int64_t traj, step, row;
} step_row;

static int compare_step_rows(const void *x, const void *y) {
  const step_row *p = x, *q = y;
  if (p->traj != q->traj) return p->traj < q->traj ? -1 : 1;
  return p->step < q->step ? -1 : p->step > q->step;
}

mrl_status mrl_steppo_gae(mrl_engine *e, const float *rewards, const float *values,
                          const float *mask, const int64_t *traj, const int64_t *step, int64_t rows,
                          int64_t cols, double gamma, double lambda, float *adv, float *returns) {
  static const char fn[] = "mrl_steppo_gae";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, n));
  ADV_TRY(mrl__adv_need(e, fn, "values", values, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "traj", traj, rows));
  ADV_TRY(mrl__adv_need(e, fn, "step", step, rows));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "rewards", rewards, NULL, n));
  ADV_TRY(mrl__adv_finite(e, fn, "values", values, NULL, n));
  ADV_TRY(mrl__adv_range(e, fn, "gamma", gamma, 0.0, 1.0));
  ADV_TRY(mrl__adv_range(e, fn, "lambda", lambda, 0.0, 1.0));
  if (rows < 2)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "whitening over rows needs at least 2 rows (the batch has %lld)",
                     (long long)rows);
  if (cols < 1) return mrl__fail(e, MRL_ERR_INVALID, fn, "cols is 0: a row has no value[b, 0]");
  for (int64_t b = 0; b < rows; b++)
    if (step[b] < 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "step[%lld] is %lld; steps are >= 0", (long long)b,
                       (long long)step[b]);
  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = MRL_ERR_NOMEM;
  step_row *order = mrl__scratch_get(&s, rows, sizeof *order);
  int64_t *tj = mrl__scratch_get(&s, rows, sizeof *tj), trajs = 0;
  double *a = mrl__scratch_get(&s, rows, sizeof *a);
  double *rho = mrl__scratch_get(&s, rows, sizeof *rho);
  if (!order || !tj || !a || !rho || mrl__dense_ids(&s, traj, NULL, rows, tj, &trajs)) goto done;
  mrl__row_sums(rewards, mask, rows, cols, rho);
  for (int64_t b = 0; b < rows; b++) order[b] = (step_row){tj[b], step[b], b};
  qsort(order, (size_t)rows, sizeof *order, compare_step_rows);
  for (int64_t i = 1; i < rows; i++)
    if (order[i].traj == order[i - 1].traj && order[i].step == order[i - 1].step) {
      st =
          mrl__fail(e, MRL_ERR_INVALID, fn,
                    "rows %lld and %lld are both step %lld of one "
                    "trajectory",
                    (long long)order[i - 1].row, (long long)order[i].row, (long long)order[i].step);
      goto done;
    }
  /* GAE backwards along each trajectory's steps. A gap of m missing steps before the next
   * present step (value v, advantage A) is m zero-reward, zero-value steps: the one just before
   * it has advantage gamma v + gamma lambda A, each earlier one gamma lambda times the next. */
  double gl = gamma * lambda;
  for (int64_t i = rows - 1; i >= 0; i--) {
    int64_t b = order[i].row;
    double v = values[b * cols], next_v = 0.0, next_a = 0.0;
    if (i + 1 < rows && order[i + 1].traj == order[i].traj) {
      int64_t nb = order[i + 1].row, gap = order[i + 1].step - order[i].step - 1;
      double nv = values[nb * cols];
      if (gap == 0) {
        next_v = nv;
        next_a = a[nb];
      } else {
        next_a = pow(gl, (double)(gap - 1)) * (gamma * nv + gl * a[nb]);
      }
    }
    a[b] = rho[b] + gamma * next_v - v + gl * next_a;
  }
  double mean = 0.0, var = 0.0;
  for (int64_t b = 0; b < rows; b++) mean += a[b];
  mean /= (double)rows;
  for (int64_t b = 0; b < rows; b++) var += (a[b] - mean) * (a[b] - mean);
  double scale = 1.0 / (sqrt(var / (double)(rows - 1)) + 1e-8);
  for (int64_t b = 0; b < rows; b++) {
    double ret = a[b] + values[b * cols], white = (a[b] - mean) * scale;
    for (int64_t t = 0; t < cols; t++) {
      int64_t i = b * cols + t;
      adv[i] = (float)(white * mask[i]);
      if (returns) returns[i] = (float)(ret * mask[i]);
    }
  }
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}

/* ---- BEACON milestone segments ---- */

mrl_status mrl_milestone_segments(mrl_engine *e, int64_t steps, const int64_t *match,
                                  int64_t n_milestones, double gamma, double *rewards,
                                  int64_t *segment) {
  static const char fn[] = "mrl_milestone_segments";
  ADV_TRY(mrl__adv_sizes(e, fn, steps, 1));
  ADV_TRY(mrl__adv_sizes(e, fn, n_milestones, 1));
  ADV_TRY(mrl__adv_need(e, fn, "match", match, n_milestones));
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, steps));
  ADV_TRY(mrl__adv_need(e, fn, "segment", segment, steps));
  ADV_TRY(mrl__adv_range(e, fn, "gamma", gamma, 0.0, 1.0));
  int64_t prev = -1;
  bool unmatched = false;
  for (int64_t k = 0; k < n_milestones; k++) {
    if (match[k] == -1) {
      unmatched = true;
      continue;
    }
    if (unmatched || match[k] <= prev || match[k] >= steps)
      return mrl__fail(e, MRL_ERR_INVALID, fn,
                       "match[%lld] is %lld; matches increase within [0, %lld) and, after the "
                       "first -1, are all -1",
                       (long long)k, (long long)match[k], (long long)steps);
    prev = match[k];
  }
  for (int64_t t = 0; t < steps; t++) {
    rewards[t] = 0.0;
    segment[t] = -1;
  }
  prev = -1;
  for (int64_t k = 0; k < n_milestones; k++) {
    if (match[k] == -1) { /* the rest of the trajectory failed to reach milestone k */
      for (int64_t t = prev + 1; t < steps; t++) segment[t] = k;
      break;
    }
    for (int64_t t = prev + 1; t <= match[k]; t++) {
      segment[t] = k;
      rewards[t] = pow(gamma, (double)(match[k] - t));
    }
    prev = match[k];
  }
  return MRL_OK;
}

mrl_status mrl_milestone_segments_dynamic(mrl_engine *e, const uint8_t *is_milestone,
                                          const int64_t *traj, int64_t n, double gamma,
                                          double scale, double *rewards, int64_t *segment) {
  static const char fn[] = "mrl_milestone_segments_dynamic";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "is_milestone", is_milestone, n));
  ADV_TRY(mrl__adv_need(e, fn, "traj", traj, n));
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, n));
  ADV_TRY(mrl__adv_need(e, fn, "segment", segment, n));
  ADV_TRY(mrl__adv_range(e, fn, "gamma", gamma, 0.0, 1.0));
  ADV_TRY(mrl__adv_range(e, fn, "scale", scale, -INFINITY, INFINITY));
  mrl__scratch s = {.e = e, .fn = fn};
  int64_t *tj = mrl__scratch_get(&s, n, sizeof *tj), trajs = 0;
  int64_t *local = mrl__scratch_get(&s, n, sizeof *local); /* position within the trajectory */
  if (!tj || !local || mrl__dense_ids(&s, traj, NULL, n, tj, &trajs)) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  int64_t *count = mrl__scratch_get(&s, trajs, sizeof *count);
  int64_t *next = mrl__scratch_get(&s, trajs, sizeof *next);
  if (!count || !next) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  for (int64_t i = 0; i < n; i++) local[i] = count[tj[i]]++;
  for (int64_t k = 0; k < trajs; k++) {
    count[k] = 0; /* from here: milestones seen so far */
    next[k] = -1; /* the position of the trajectory's next milestone, scanning backwards */
  }
  for (int64_t i = 0; i < n; i++) {
    segment[i] = count[tj[i]];
    if (is_milestone[i]) count[tj[i]]++;
  }
  for (int64_t i = n - 1; i >= 0; i--) {
    if (is_milestone[i]) next[tj[i]] = local[i];
    rewards[i] = next[tj[i]] >= 0 ? scale * pow(gamma, (double)(next[tj[i]] - local[i])) : 0.0;
  }
  mrl__scratch_free(&s);
  return MRL_OK;
}

/* ---- A2TGPO ---- */

void mrl_a2tgpo_defaults(mrl_a2tgpo_opts *opts) {
  if (!opts) return;
  *opts = (mrl_a2tgpo_opts){
      .epsilon = 1e-6, .gamma = 1.0, .alpha = 0.3, .clip_beta = 0.3, .ig_ddof = 0};
}

static void accumulate(const double *g, int64_t n, double gamma, double *out) {
  double run = 0.0;
  for (int64_t t = n - 1; t >= 0; t--) {
    run = g[t] + gamma * run;
    out[t] = run / sqrt((double)(n - t));
  }
}

mrl_status mrl_a2tgpo_accumulate(mrl_engine *e, const double *g, int64_t n, double gamma,
                                 double *out) {
  static const char fn[] = "mrl_a2tgpo_accumulate";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "g", g, n));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "g", g, n));
  ADV_TRY(mrl__adv_range(e, fn, "gamma", gamma, 0.0, 1.0));
  accumulate(g, n, gamma, out);
  return MRL_OK;
}

mrl_status mrl_a2tgpo_advantages(mrl_engine *e, const mrl_a2tgpo_opts *opts, const double *ig,
                                 const int64_t *offsets, const int64_t *group,
                                 const double *outcome, int64_t trajs, double *normed,
                                 double *accumulated, double *turn_adv, double *clip_scale,
                                 double *outcome_adv) {
  static const char fn[] = "mrl_a2tgpo_advantages";
  ADV_TRY(mrl__adv_sizes(e, fn, trajs, 1));
  ADV_TRY(mrl__adv_need(e, fn, "offsets", offsets, 1));
  ADV_TRY(mrl__adv_need(e, fn, "group", group, trajs));
  ADV_TRY(mrl__adv_need(e, fn, "outcome", outcome, trajs));
  mrl_a2tgpo_opts o;
  mrl_a2tgpo_defaults(&o);
  if (opts) o = *opts;
  if (offsets[0] != 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "offsets[0] is %lld; it must be 0",
                     (long long)offsets[0]);
  for (int64_t i = 0; i < trajs; i++)
    if (offsets[i + 1] < offsets[i])
      return mrl__fail(e, MRL_ERR_INVALID, fn, "offsets decrease at %lld", (long long)i + 1);
  int64_t turns = offsets[trajs];
  ADV_TRY(mrl__adv_sizes(e, fn, turns, 1));
  ADV_TRY(mrl__adv_need(e, fn, "ig", ig, turns));
  ADV_TRY(mrl__adv_finite_d(e, fn, "ig", ig, turns));
  ADV_TRY(mrl__adv_finite_d(e, fn, "outcome", outcome, trajs));
  ADV_TRY(mrl__adv_range(e, fn, "epsilon", o.epsilon, 0.0, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "gamma", o.gamma, 0.0, 1.0));
  ADV_TRY(mrl__adv_range(e, fn, "alpha", o.alpha, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "clip_beta", o.clip_beta, 0.0, 1.0));
  if (o.ig_ddof != 0 && o.ig_ddof != 1)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "ig_ddof is %d; it must be 0 or 1", o.ig_ddof);

  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = MRL_ERR_NOMEM;
  int64_t *tgroup = mrl__scratch_get(&s, turns, sizeof *tgroup); /* the traj's group per turn */
  int64_t *tindex = mrl__scratch_get(&s, turns, sizeof *tindex); /* the turn's index */
  int64_t *key = mrl__scratch_get(&s, turns, sizeof *key), keys = 0;
  int64_t *og = mrl__scratch_get(&s, trajs, sizeof *og), ogroups = 0;
  double *g = mrl__scratch_get(&s, turns, sizeof *g);
  double *d = mrl__scratch_get(&s, turns, sizeof *d);
  double *ao = mrl__scratch_get(&s, trajs, sizeof *ao);
  if (!tgroup || !tindex || !key || !og || !g || !d || !ao) goto done;
  for (int64_t i = 0; i < trajs; i++)
    for (int64_t j = offsets[i]; j < offsets[i + 1]; j++) {
      tgroup[j] = group[i];
      tindex[j] = j - offsets[i];
    }
  if (mrl__dense_ids(&s, tgroup, tindex, turns, key, &keys) ||
      mrl__dense_ids(&s, group, NULL, trajs, og, &ogroups))
    goto done;
  int64_t *size = mrl__scratch_get(&s, keys, sizeof *size);
  double *mean = mrl__scratch_get(&s, keys, sizeof *mean);
  double *std = mrl__scratch_get(&s, keys, sizeof *std);
  if (!size || !mean || !std) goto done;
  mrl__group_moments(ig, key, turns, keys, o.ig_ddof, size, mean, std);
  for (int64_t j = 0; j < turns; j++)
    g[j] = size[key[j]] > 1 ? (ig[j] - mean[key[j]]) / (std[key[j]] + o.epsilon) : 0.0;
  for (int64_t i = 0; i < trajs; i++)
    accumulate(g + offsets[i], offsets[i + 1] - offsets[i], o.gamma, d + offsets[i]);
  if ((st = mrl__group_norm(&s, outcome, og, trajs, ogroups, false, true, o.epsilon, ao)))
    goto done;
  for (int64_t i = 0; i < trajs; i++) {
    if (outcome_adv) outcome_adv[i] = ao[i];
    for (int64_t j = offsets[i]; j < offsets[i + 1]; j++) {
      if (normed) normed[j] = g[j];
      if (accumulated) accumulated[j] = d[j];
      if (turn_adv) turn_adv[j] = o.alpha * d[j] + ao[i];
      if (clip_scale) clip_scale[j] = 1.0 + o.clip_beta * (2.0 / (1.0 + exp(-g[j])) - 1.0);
    }
  }
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}

mrl_status mrl_information_gain(mrl_engine *e, const double *answer_logp, int64_t n,
                                double *ig_logprob, double *ig_prob) {
  static const char fn[] = "mrl_information_gain";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  if (n < 1)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "answer_logp needs the value before the first turn (n is 0)");
  ADV_TRY(mrl__adv_need(e, fn, "answer_logp", answer_logp, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "answer_logp", answer_logp, n));
  for (int64_t t = 0; t + 1 < n; t++) {
    if (ig_logprob) ig_logprob[t] = answer_logp[t + 1] - answer_logp[t];
    if (ig_prob) ig_prob[t] = exp(answer_logp[t + 1]) - exp(answer_logp[t]);
  }
  return MRL_OK;
}

/* ---- AEM ---- */

mrl_status mrl_aem(mrl_engine *e, const double *base_adv, const double *mean_entropy,
                   const int64_t *group, int64_t n, double lambda, double min_range, double *adv,
                   double *alpha) {
  static const char fn[] = "mrl_aem";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "base_adv", base_adv, n));
  ADV_TRY(mrl__adv_need(e, fn, "mean_entropy", mean_entropy, n));
  ADV_TRY(mrl__adv_need(e, fn, "group", group, n));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "base_adv", base_adv, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "mean_entropy", mean_entropy, n));
  ADV_TRY(mrl__adv_range(e, fn, "lambda", lambda, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "min_range", min_range, 0.0, INFINITY));
  mrl__scratch s = {.e = e, .fn = fn};
  int64_t *g = mrl__scratch_get(&s, n, sizeof *g), groups = 0;
  double *w = mrl__scratch_get(&s, n, sizeof *w);
  if (!g || !w || mrl__dense_ids(&s, group, NULL, n, g, &groups)) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  double *lo = mrl__scratch_get(&s, groups, sizeof *lo);
  double *hi = mrl__scratch_get(&s, groups, sizeof *hi);
  double *wsum = mrl__scratch_get(&s, groups, sizeof *wsum);
  int64_t *size = mrl__scratch_get(&s, groups, sizeof *size);
  if (!lo || !hi || !wsum || !size) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  for (int64_t k = 0; k < groups; k++) {
    lo[k] = INFINITY;
    hi[k] = -INFINITY;
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t k = g[i];
    if (mean_entropy[i] < lo[k]) lo[k] = mean_entropy[i];
    if (mean_entropy[i] > hi[k]) hi[k] = mean_entropy[i];
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t k = g[i];
    double range = hi[k] - lo[k];
    w[i] =
        range < min_range || range == 0.0 ? 1.0 : exp(-lambda * (mean_entropy[i] - lo[k]) / range);
    wsum[k] += w[i];
    size[k]++;
  }
  for (int64_t i = 0; i < n; i++) {
    double a = w[i] / (wsum[g[i]] / (double)size[g[i]]); /* weights with group mean 1 */
    adv[i] = a * base_adv[i];
    if (alpha) alpha[i] = a;
  }
  mrl__scratch_free(&s);
  return MRL_OK;
}

mrl_status mrl_row_mean(mrl_engine *e, const float *x, const float *mask, int64_t rows,
                        int64_t cols, double *out) {
  static const char fn[] = "mrl_row_mean";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  ADV_TRY(mrl__adv_need(e, fn, "x", x, rows * cols));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, rows * cols));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, rows));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, rows * cols));
  ADV_TRY(mrl__adv_finite(e, fn, "x", x, mask, rows * cols));
  mrl__row_sums(x, mask, rows, cols, out);
  for (int64_t b = 0; b < rows; b++) {
    int64_t c = mrl__mask_count(mask + b * cols, cols);
    out[b] = c ? out[b] / (double)c : 0.0;
  }
  return MRL_OK;
}

/* ---- DAPO ---- */

mrl_status mrl_dapo_filter(mrl_engine *e, const double *metric, const int64_t *group, int64_t n,
                           uint8_t *keep, int64_t *kept_groups) {
  static const char fn[] = "mrl_dapo_filter";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "metric", metric, n));
  ADV_TRY(mrl__adv_need(e, fn, "group", group, n));
  ADV_TRY(mrl__adv_need(e, fn, "keep", keep, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "metric", metric, n));
  mrl__scratch s = {.e = e, .fn = fn};
  int64_t *g = mrl__scratch_get(&s, n, sizeof *g), groups = 0;
  if (!g || mrl__dense_ids(&s, group, NULL, n, g, &groups)) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  int64_t *size = mrl__scratch_get(&s, groups, sizeof *size);
  double *mean = mrl__scratch_get(&s, groups, sizeof *mean);
  double *std = mrl__scratch_get(&s, groups, sizeof *std);
  if (!size || !mean || !std) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  mrl__group_moments(metric, g, n, groups, 0, size, mean, std); /* population std, as DAPO */
  int64_t kept = 0;
  for (int64_t k = 0; k < groups; k++) kept += size[k] == 1 || std[k] > 0.0;
  for (int64_t i = 0; i < n; i++) keep[i] = size[g[i]] == 1 || std[g[i]] > 0.0;
  if (kept_groups) *kept_groups = kept;
  mrl__scratch_free(&s);
  return MRL_OK;
}

mrl_status mrl_overlong_penalty(mrl_engine *e, const int64_t *lengths, int64_t n, int64_t max_len,
                                int64_t buffer, double factor, int paper_floor, double *penalty) {
  static const char fn[] = "mrl_overlong_penalty";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "lengths", lengths, n));
  ADV_TRY(mrl__adv_need(e, fn, "penalty", penalty, n));
  if (buffer < 1 || max_len < buffer)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "buffer is %lld and max_len %lld; expected 1 <= buffer <= max_len",
                     (long long)buffer, (long long)max_len);
  ADV_TRY(mrl__adv_range(e, fn, "factor", factor, 0.0, INFINITY));
  for (int64_t i = 0; i < n; i++)
    if (lengths[i] < 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "lengths[%lld] is %lld; lengths are >= 0",
                       (long long)i, (long long)lengths[i]);
  double expected = (double)(max_len - buffer);
  for (int64_t i = 0; i < n; i++) {
    double p = fmin(-((double)lengths[i] - expected) / (double)buffer * factor, 0.0);
    penalty[i] = paper_floor ? fmax(p, -factor) : p;
  }
  return MRL_OK;
}
