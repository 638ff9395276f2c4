/* replay.c - the per-entry arithmetic of the replay buffer (rl.replay): sampling weights with
 * age decay, draws without replacement with staleness revisits and their importance weights, and
 * the importance ratios of stored episodes under the current policy. Plain arrays in and out. */
#include "advantage.h"

#include <math.h>

mrl_status mrl_replay_weights(mrl_engine *e, const double *priority, const double *age,
                              int64_t n, double alpha, double decay, double floor, double *w) {
  static const char fn[] = "mrl_replay_weights";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_need(e, fn, "priority", priority, n));
  ADV_TRY(mrl__adv_need(e, fn, "age", age, n));
  ADV_TRY(mrl__adv_need(e, fn, "w", w, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "priority", priority, n));
  ADV_TRY(mrl__adv_finite_d(e, fn, "age", age, n));
  ADV_TRY(mrl__adv_range(e, fn, "alpha", alpha, 0.0, INFINITY));
  if (!(decay > 0.0))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "decay is %g; it must be positive", decay);
  if (!(floor > 0.0) || isinf(floor))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "floor is %g; it must be positive and finite", floor);
  for (int64_t i = 0; i < n; i++)
    if (priority[i] < 0.0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "priority[%lld] is %g; priorities are >= 0",
                       (long long)i, priority[i]);
  for (int64_t i = 0; i < n; i++) {
    /* the decay multiplies the weight after alpha: its half-life is decay * ln 2 for any alpha */
    double fade = isinf(decay) ? 1.0 : exp(-fmax(age[i], 0.0) / decay);
    w[i] = pow(fmax(priority[i], floor), alpha) * fade;
  }
  return MRL_OK;
}

/* The least recently used entry not yet taken: smallest last, then smallest index. */
static int64_t least_recent(const int64_t *last, const uint8_t *taken, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; i++)
    if (!taken[i] && (best < 0 || last[i] < last[best])) best = i;
  return best;
}

mrl_status mrl_replay_draw(mrl_engine *e, const double *w, const int64_t *last, int64_t n,
                           double staleness, double beta, const double *u, int64_t k,
                           int64_t *out, double *prob, double *is_weight, uint8_t *stale) {
  static const char fn[] = "mrl_replay_draw";
  ADV_TRY(mrl__adv_sizes(e, fn, n, 1));
  ADV_TRY(mrl__adv_sizes(e, fn, k, 2));
  ADV_TRY(mrl__adv_need(e, fn, "w", w, n));
  ADV_TRY(mrl__adv_need(e, fn, "last", last, n));
  ADV_TRY(mrl__adv_need(e, fn, "u", u, 2 * k));
  ADV_TRY(mrl__adv_need(e, fn, "out", out, k));
  ADV_TRY(mrl__adv_finite_d(e, fn, "w", w, n));
  ADV_TRY(mrl__adv_range(e, fn, "staleness", staleness, 0.0, 1.0));
  ADV_TRY(mrl__adv_range(e, fn, "beta", beta, 0.0, INFINITY));
  if (k > n)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "k is %lld; at most n = %lld distinct entries",
                     (long long)k, (long long)n);
  for (int64_t i = 0; i < n; i++)
    if (w[i] < 0.0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "w[%lld] is %g; weights are >= 0", (long long)i,
                       w[i]);
  for (int64_t j = 0; j < 2 * k; j++)
    if (!(u[j] >= 0.0 && u[j] < 1.0))
      return mrl__fail(e, MRL_ERR_INVALID, fn, "u[%lld] is %g; uniforms are in [0, 1)",
                       (long long)j, u[j]);
  mrl__scratch s = {.e = e, .fn = fn};
  uint8_t *taken = mrl__scratch_get(&s, n, sizeof *taken);
  if (!taken) {
    mrl__scratch_free(&s);
    return MRL_ERR_NOMEM;
  }
  double total = 0.0; /* over every entry, in index order: the first-draw distribution */
  for (int64_t i = 0; i < n; i++) total += w[i];
  int64_t first_stale = least_recent(last, taken, n);
  for (int64_t j = 0; j < k; j++) {
    double left = 0.0; /* summed afresh each draw: no drift from subtracting */
    for (int64_t i = 0; i < n; i++)
      if (!taken[i]) left += w[i];
    int64_t pick = -1;
    bool by_age = u[2 * j] < staleness || !(left > 0.0);
    if (!by_age) {
      double target = u[2 * j + 1] * left, acc = 0.0;
      for (int64_t i = 0; i < n && pick < 0; i++) {
        if (taken[i] || !(w[i] > 0.0)) continue;
        acc += w[i];
        if (acc > target) pick = i;
      }
      if (pick < 0) /* rounding left the target at the very end: the last positive entry */
        for (int64_t i = n - 1; i >= 0 && pick < 0; i--)
          if (!taken[i] && w[i] > 0.0) pick = i;
    } else {
      pick = least_recent(last, taken, n);
    }
    taken[pick] = 1;
    out[j] = pick;
    if (stale) stale[j] = by_age;
    double p = total > 0.0 ? (1.0 - staleness) * w[pick] / total : 0.0;
    if (pick == first_stale) p += total > 0.0 ? staleness : 1.0;
    if (prob) prob[j] = p;
    if (is_weight) is_weight[j] = p;
  }
  if (is_weight) {
    /* (n P)^-beta over the drawn entries, divided by their largest; an entry drawn with
     * probability 0 (a weightless entry taken when every weight was 0) counts as P = 1 / n */
    double top = 0.0;
    for (int64_t j = 0; j < k; j++) {
      double np = is_weight[j] > 0.0 ? (double)n * is_weight[j] : 1.0;
      is_weight[j] = pow(np, -beta);
      top = fmax(top, is_weight[j]);
    }
    for (int64_t j = 0; j < k; j++) is_weight[j] = top > 0.0 ? is_weight[j] / top : 1.0;
  }
  mrl__scratch_free(&s);
  return MRL_OK;
}

mrl_status mrl_replay_ratios(mrl_engine *e, const float *logp, const float *behaviour,
                             const float *mask, const int64_t *offsets, int64_t episodes,
                             double cap, double *ratio, float *token_weight) {
  static const char fn[] = "mrl_replay_ratios";
  ADV_TRY(mrl__adv_sizes(e, fn, episodes, 1));
  ADV_TRY(mrl__adv_need(e, fn, "offsets", offsets, episodes + 1));
  ADV_TRY(mrl__adv_need(e, fn, "ratio", ratio, episodes));
  if (!(cap > 0.0))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "cap is %g; it must be positive", cap);
  if (offsets[0] != 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "offsets[0] is %lld; it must be 0",
                     (long long)offsets[0]);
  for (int64_t i = 0; i < episodes; i++)
    if (offsets[i + 1] < offsets[i])
      return mrl__fail(e, MRL_ERR_INVALID, fn, "offsets[%lld] is %lld, below offsets[%lld]",
                       (long long)i + 1, (long long)offsets[i + 1], (long long)i);
  int64_t total = offsets[episodes];
  ADV_TRY(mrl__adv_need(e, fn, "logp", logp, total));
  ADV_TRY(mrl__adv_need(e, fn, "behaviour", behaviour, total));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, total));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, total));
  ADV_TRY(mrl__adv_finite(e, fn, "logp", logp, mask, total));
  ADV_TRY(mrl__adv_finite(e, fn, "behaviour", behaviour, mask, total));
  for (int64_t i = 0; i < episodes; i++) {
    double sum = 0.0;
    int64_t count = 0;
    for (int64_t p = offsets[i]; p < offsets[i + 1]; p++) {
      if (mask[p] == 0.0f) {
        if (token_weight) token_weight[p] = 1.0f;
        continue;
      }
      double d = (double)logp[p] - (double)behaviour[p];
      sum += d;
      count++;
      if (token_weight) token_weight[p] = (float)fmin(exp(d), cap);
    }
    ratio[i] = count > 0 ? exp(sum / (double)count) : 1.0;
  }
  return MRL_OK;
}
