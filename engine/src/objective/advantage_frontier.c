/* advantage_frontier.c - sample weighting beyond group baselines: PACEvolve++'s phase-adaptive
 * blend of group-relative and best-of-k frontier advantages (SLOO/PKPO weights in closed form, its
 * reward shaping), and freshness-aware prioritised replay (priorities, sampling probabilities,
 * importance weights, the beta schedule). Spec sections 6.10 and 6.11. */
#include "advantage.h"

#include <math.h>
#include <stdlib.h>

/* ---- best-of-k frontier weights ---- */

static int compare_desc(const void *x, const void *y) {
  double p = *(const double *)x, q = *(const double *)y;
  return p < q ? 1 : p > q ? -1 : 0;
}

/* log C(a, b), or -INFINITY when the subset count is 0 */
static double log_choose(int64_t a, int64_t b) {
  if (b < 0 || b > a) return -INFINITY;
  return lgamma((double)a + 1.0) - lgamma((double)b + 1.0) - lgamma((double)(a - b) + 1.0);
}

/* Instead of enumerating the C(n, k) subsets: sort descending; the (k-1)-subsets T of a sorted
 * list whose largest member is its j-th element (ties resolved by position) number
 * C(len - 1 - j, k - 2) (0-based j). SLOO: i earns r_i - max(T) only when every member of T is
 * strictly below r_i; PKPO: max(S) = max(r_i, max(T)) over T drawn from the others. */
static void frontier(const double *r, const double *sorted, int64_t n, int64_t k, bool pkpo,
                     double *out) {
  double log_total = log_choose(n, k);
  for (int64_t i = 0; i < n; i++) {
    double sum = 0.0;
    if (pkpo) {
      int64_t j = 0;
      bool skipped = false; /* leave one copy of r_i out of the others */
      for (int64_t p = 0; p < n; p++) {
        if (!skipped && sorted[p] == r[i]) {
          skipped = true;
          continue;
        }
        sum += exp(log_choose(n - 2 - j, k - 2) - log_total) * fmax(r[i], sorted[p]);
        j++;
      }
    } else {
      int64_t first = 0; /* the first sorted entry strictly below r_i */
      while (first < n && sorted[first] >= r[i]) first++;
      int64_t below = n - first;
      for (int64_t j = 0; j < below; j++)
        sum += exp(log_choose(below - 1 - j, k - 2) - log_total) * (r[i] - sorted[first + j]);
    }
    out[i] = sum;
  }
}

static mrl_status check_frontier(mrl_engine *e, const char *fn, const double *rewards, int64_t n,
                                 int64_t k) {
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, n));
  if (k < 2 || k > n)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "k is %lld; it must be in [2, n] with n = %lld",
                     (long long)k, (long long)n);
  return MRL_OK;
}

mrl_status mrl_frontier_weights(mrl_engine *e, const double *rewards, int64_t n, int64_t k,
                                int pkpo, double *out) {
  static const char fn[] = "mrl_frontier_weights";
  ADV_TRY(check_frontier(e, fn, rewards, n, k));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "rewards", rewards, n));
  mrl__scratch s = {.e = e, .fn = fn};
  double *sorted = mrl__scratch_get(&s, n, sizeof *sorted);
  if (!sorted) return MRL_ERR_NOMEM;
  for (int64_t i = 0; i < n; i++) sorted[i] = rewards[i];
  qsort(sorted, (size_t)n, sizeof *sorted, compare_desc);
  frontier(rewards, sorted, n, k, pkpo != 0, out);
  mrl__scratch_free(&s);
  return MRL_OK;
}

/* ---- PACEvolve++ ---- */

mrl_status mrl_pace_shape(mrl_engine *e, const double *y, int64_t n, double y_init, double y_target,
                          int lower_is_better, double alpha_r, double scale, double *out) {
  static const char fn[] = "mrl_pace_shape";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "y", y, n));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, n));
  ADV_TRY(mrl__adv_range(e, fn, "y_init", y_init, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "y_target", y_target, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "scale", scale, -INFINITY, INFINITY));
  if (!(alpha_r > 0.0) || isinf(alpha_r))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "alpha_r is %g; it must be positive and finite",
                     alpha_r);
  if (lower_is_better ? !(y_target < y_init) : !(y_target > y_init))
    return mrl__fail(
        e, MRL_ERR_INVALID, fn, "y_target (%g) must be %s y_init (%g) when %s is better", y_target,
        lower_is_better ? "below" : "above", y_init, lower_is_better ? "lower" : "higher");
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(y[i])) { /* a failed evaluation */
      out[i] = -1.0;
      continue;
    }
    double progress = fmin(fmax((y[i] - y_init) / (y_target - y_init), 0.0), 1.0);
    out[i] = scale * pow(progress, alpha_r);
  }
  return MRL_OK;
}

double mrl_pace_phase(int64_t step, int64_t total) {
  if (total <= 1) return 0.0;
  return fmin(fmax((double)step / (double)(total - 1), 0.0), 1.0);
}

/* mean and population std of x */
static void moments(const double *x, int64_t n, double *mean, double *std) {
  double m = 0.0, v = 0.0;
  for (int64_t i = 0; i < n; i++) m += x[i];
  m /= (double)n;
  for (int64_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
  *mean = m;
  *std = sqrt(v / (double)n);
}

mrl_status mrl_pace_advantage(mrl_engine *e, const double *rewards, int64_t n, int64_t k,
                              double alpha, double *adv, double *a_group, double *a_topk,
                              int *skip) {
  static const char fn[] = "mrl_pace_advantage";
  ADV_TRY(check_frontier(e, fn, rewards, n, k));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(mrl__adv_need(e, fn, "skip", skip, 1));
  ADV_TRY(mrl__adv_range(e, fn, "alpha", alpha, 0.0, 1.0));
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(rewards[i])) {
      *skip = MRL_PACE_NONFINITE;
      return MRL_OK;
    }
  mrl__scratch s = {.e = e, .fn = fn};
  double *group = mrl__scratch_get(&s, n, sizeof *group);
  double *topk = mrl__scratch_get(&s, n, sizeof *topk);
  double *sorted = mrl__scratch_get(&s, n, sizeof *sorted);
  if (!group || !topk || !sorted) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  double mean, std;
  moments(rewards, n, &mean, &std);
  for (int64_t i = 0; i < n; i++) {
    group[i] = rewards[i] - mean;
    sorted[i] = rewards[i];
  }
  qsort(sorted, (size_t)n, sizeof *sorted, compare_desc);
  frontier(rewards, sorted, n, k, false, topk);
  double gmean, gstd, tmean, tstd;
  moments(group, n, &gmean, &gstd);
  moments(topk, n, &tmean, &tstd);
  int reasons = 0;
  if (alpha < 1.0 && gstd < 1e-6) reasons |= MRL_PACE_COLLAPSED_GROUP;
  if (alpha > 0.0 && tstd < 1e-6) reasons |= MRL_PACE_COLLAPSED_TOPK;
  for (int64_t i = 0; i < n; i++) {
    if (a_group) a_group[i] = group[i];
    if (a_topk) a_topk[i] = topk[i];
    if (!reasons) {
      double zg = gstd > 0.0 ? (group[i] - gmean) / (gstd + 1e-8) : 0.0;
      double zt = tstd > 0.0 ? (topk[i] - tmean) / (tstd + 1e-8) : 0.0;
      adv[i] = (1.0 - alpha) * zg + alpha * zt;
    }
  }
  *skip = reasons;
  mrl__scratch_free(&s);
  return MRL_OK;
}

/* ---- freshness-aware prioritised replay ---- */

static mrl_status check_ages(mrl_engine *e, const char *fn, const double *age, int64_t n,
                             double decay) {
  ADV_TRY(mrl__adv_need(e, fn, "age", age, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "age", age, n));
  if (!(decay > 0.0) || isinf(decay))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "decay is %g; it must be positive and finite", decay);
  return MRL_OK;
}

mrl_status mrl_per_reward_priority(mrl_engine *e, const double *reward, const double *age,
                                   int64_t n, double eps, double decay, double *out) {
  static const char fn[] = "mrl_per_reward_priority";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "reward", reward, n));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "reward", reward, n));
  ADV_TRY(check_ages(e, fn, age, n, decay));
  ADV_TRY(mrl__adv_range(e, fn, "eps", eps, 0.0, INFINITY));
  for (int64_t i = 0; i < n; i++)
    out[i] = (fabs(reward[i]) + eps) * exp(-fmax(age[i], 0.0) / decay);
  return MRL_OK;
}

mrl_status mrl_per_priority(mrl_engine *e, const double *base, const double *age, int64_t n,
                            double decay, double floor, double *out) {
  static const char fn[] = "mrl_per_priority";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "base", base, n));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "base", base, n));
  ADV_TRY(check_ages(e, fn, age, n, decay));
  ADV_TRY(mrl__adv_range(e, fn, "floor", floor, 0.0, INFINITY));
  for (int64_t i = 0; i < n; i++)
    if (base[i] < 0.0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "base[%lld] is %g; priorities are >= 0",
                       (long long)i, base[i]);
  for (int64_t i = 0; i < n; i++) out[i] = fmax(base[i] * exp(-fmax(age[i], 0.0) / decay), floor);
  return MRL_OK;
}

mrl_status mrl_per_sampling(mrl_engine *e, const double *priority, int64_t n, double alpha,
                            double beta, const int64_t *sampled, int64_t n_sampled, double *probs,
                            double *weights) {
  static const char fn[] = "mrl_per_sampling";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_sizes(e, fn, n_sampled, 1));
  ADV_TRY(mrl__adv_need(e, fn, "priority", priority, n));
  ADV_TRY(mrl__adv_need(e, fn, "sampled", sampled, weights ? n_sampled : 0));
  ADV_TRY(mrl__adv_range(e, fn, "alpha", alpha, 0.0, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "beta", beta, 0.0, INFINITY));
  for (int64_t i = 0; i < n; i++)
    if (!(priority[i] > 0.0) || isinf(priority[i]))
      return mrl__fail(e, MRL_ERR_INVALID, fn,
                       "priority[%lld] is %g; priorities must be positive and finite", (long long)i,
                       priority[i]);
  if (weights)
    for (int64_t j = 0; j < n_sampled; j++)
      if (sampled[j] < 0 || sampled[j] >= n)
        return mrl__fail(e, MRL_ERR_RANGE, fn, "sampled[%lld] is %lld; entries are 0..%lld",
                         (long long)j, (long long)sampled[j], (long long)n - 1);
  double total = 0.0, lowest = INFINITY;
  for (int64_t i = 0; i < n; i++) {
    double p = pow(priority[i], alpha);
    total += p;
    lowest = fmin(lowest, p);
  }
  if (probs)
    for (int64_t i = 0; i < n; i++) probs[i] = pow(priority[i], alpha) / total;
  if (weights) {
    /* with beta >= 0 the largest weight belongs to the least likely entry */
    double top = pow((double)n * lowest / total, -beta);
    for (int64_t j = 0; j < n_sampled; j++)
      weights[j] = pow((double)n * pow(priority[sampled[j]], alpha) / total, -beta) / top;
  }
  return MRL_OK;
}

mrl_status mrl_per_beta(mrl_engine *e, int64_t step, int64_t total, double start, double end,
                        double *out) {
  static const char fn[] = "mrl_per_beta";
  if (!e) return MRL_ERR_NULL;
  ADV_TRY(mrl__adv_need(e, fn, "out", out, 1));
  if (total < 1)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "total is %lld; it must be >= 1", (long long)total);
  ADV_TRY(mrl__adv_range(e, fn, "start", start, -INFINITY, INFINITY));
  ADV_TRY(mrl__adv_range(e, fn, "end", end, -INFINITY, INFINITY));
  double frac = total > 1 ? fmin(fmax((double)step / (double)(total - 1), 0.0), 1.0) : 1.0;
  *out = start + (end - start) * frac;
  return MRL_OK;
}
