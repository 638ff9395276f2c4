/* rollout_score.c - forced-continuation scoring: the teacher-forced log-probability of given
 * tokens after each listed episode's current context, batched over episodes, with every
 * episode's KV cache put back as it was (extended, then truncated with its saved logits) and its
 * record and random stream untouched. */
#include "rollout.h"

#include <math.h>
#include <string.h>

/* log softmax(logits)[token] at temperature 1, in double. */
static double token_logprob(const float *logits, int64_t vocab, int32_t token) {
  double top = logits[0];
  for (int64_t v = 1; v < vocab; v++)
    if (logits[v] > top) top = logits[v];
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; v++) sum += exp((double)logits[v] - top);
  return (double)logits[token] - top - log(sum);
}

mrl_status mrl_rollout_score(mrl_rollout *r, int n, const int *eps, const int32_t *tokens,
                             const int *counts, float *logprobs) {
  const char *fn = "mrl_rollout_score";
  if (!r) return MRL_ERR_NULL;
  mrl_engine *e = r->engine;
  if (n < 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "n is negative");
  if (n == 0) return MRL_OK;
  if (!eps || !tokens || !counts || !logprobs)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL",
                     !eps ? "eps" : !tokens ? "tokens" : !counts ? "counts" : "logprobs");
  mrl_model_config mc;
  mrl_model_config_get(r->model, &mc);
  int64_t V = mc.vocab, total = 0;
  int steps = 0;
  for (int i = 0; i < n; i++) {
    int x = eps[i];
    if (x < 0 || x >= r->episodes)
      return mrl__fail(e, MRL_ERR_RANGE, fn, "episode %d is outside 0..%d", x, r->episodes - 1);
    const mrl_episode *p = &r->ep[x];
    if (!p->started || p->length < 1)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "episode %d has no context (%s)", x,
                       p->started ? "its prompt never went in" : "it was not started");
    if (p->mid_turn)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "episode %d is in the middle of a turn", x);
    for (int j = 0; j < i; j++)
      if (eps[j] == x) return mrl__fail(e, MRL_ERR_INVALID, fn, "episode %d is listed twice", x);
    if (counts[i] < 1)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "counts[%d] = %d (episode %d): 1 or more expected",
                       i, counts[i], x);
    /* the last token is scored from the logits before it and never appended */
    if ((int64_t)p->length + counts[i] - 1 > r->capacity)
      return mrl__fail(e, MRL_ERR_RANGE, fn,
                       "episode %d has no room: %d tokens + %d scored exceed the capacity of %d",
                       x, p->length, counts[i], r->capacity);
    for (int k = 0; k < counts[i]; k++)
      if (tokens[total + k] < 0 || tokens[total + k] >= V)
        return mrl__fail(e, MRL_ERR_RANGE, fn, "token %d (episode %d) is outside 0..%lld",
                         tokens[total + k], x, (long long)(V - 1));
    total += counts[i];
    if (counts[i] > steps) steps = counts[i];
  }
  /* saved: each episode's logits (to put back), the token offsets, the step's slots */
  size_t saved_size = sizeof(float) * (size_t)n * (size_t)V;
  float *saved = mrl__alloc(e, saved_size);
  int64_t *off = mrl__alloc(e, sizeof(int64_t) * (size_t)n);
  int *slots = mrl__alloc(e, sizeof(int) * (size_t)n);
  int32_t *step_tokens = mrl__alloc(e, sizeof(int32_t) * (size_t)n);
  float *out = mrl__alloc(e, sizeof(float) * (size_t)total);
  mrl_status st = MRL_OK;
  if (!saved || !off || !slots || !step_tokens || !out) {
    st = mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
    goto done;
  }
  for (int i = 0; i < n; i++) {
    off[i] = i == 0 ? 0 : off[i - 1] + counts[i - 1];
    memcpy(saved + (size_t)i * (size_t)V, mrl_kv_cache_logits(r->cache, eps[i]),
           sizeof(float) * (size_t)V);
  }
  /* step j scores token j of every episode that has one, then appends it when a later token
   * needs the logits after it */
  for (int j = 0; j < steps && !st; j++) {
    int live = 0;
    for (int i = 0; i < n; i++) {
      if (j >= counts[i]) continue;
      const float *logits = mrl_kv_cache_logits(r->cache, eps[i]);
      int32_t t = tokens[off[i] + j];
      double lp = token_logprob(logits, V, t);
      if (!isfinite(lp)) {
        st = mrl__fail(e, MRL_ERR_INVALID, fn,
                       "episode %d: the log-probability of token %d is not finite", eps[i], j);
        break;
      }
      out[off[i] + j] = (float)lp;
      if (j + 1 < counts[i]) {
        slots[live] = eps[i];
        step_tokens[live++] = t;
      }
    }
    if (!st && live > 0) st = mrl_kv_cache_append(r->cache, live, slots, step_tokens, r->ones);
  }
  /* every episode back to its length and logits, whatever happened above */
  for (int i = 0; i < n; i++) {
    mrl_status back = mrl_kv_cache_truncate(r->cache, eps[i], r->ep[eps[i]].length,
                                            saved + (size_t)i * (size_t)V);
    if (back && !st) st = back;
  }
  if (!st) memcpy(logprobs, out, sizeof(float) * (size_t)total);
done:
  mrl__free(e, saved, saved_size);
  mrl__free(e, off, sizeof(int64_t) * (size_t)n);
  mrl__free(e, slots, sizeof(int) * (size_t)n);
  mrl__free(e, step_tokens, sizeof(int32_t) * (size_t)n);
  mrl__free(e, out, sizeof(float) * (size_t)total);
  return st;
}
