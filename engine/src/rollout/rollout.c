/* rollout.c - multi-turn episodes decoded together over one model: batched decode steps over all
 * episodes mid-turn, turns ending independently (continuous batching), observations appended in
 * batched passes, forks for tree rollouts, and the per-token record (tokens, behaviour
 * log-probabilities, loss mask, turn). */
#include "rollout.h"

#include <string.h>

static void free_episodes(mrl_rollout *r) {
  mrl_engine *e = r->engine;
  for (int i = 0; r->ep && i < r->episodes; i++) {
    mrl_episode *p = &r->ep[i];
    mrl__free(e, p->tokens, sizeof(int32_t) * (size_t)r->capacity);
    mrl__free(e, p->turn, sizeof(int32_t) * (size_t)r->capacity);
    mrl__free(e, p->logprobs, sizeof(float) * (size_t)r->capacity);
    mrl__free(e, p->mask, sizeof(float) * (size_t)r->capacity);
    mrl__free(e, p->rewards, sizeof(double) * (size_t)r->capacity);
  }
  mrl__free(e, r->ep, sizeof(mrl_episode) * (size_t)r->episodes);
}

void mrl_rollout_free(mrl_rollout *r) {
  if (!r) return;
  mrl_engine *e = r->engine;
  free_episodes(r);
  mrl__free(e, r->slots, sizeof(int) * (size_t)r->episodes);
  mrl__free(e, r->ones, sizeof(int) * (size_t)r->episodes);
  mrl__free(e, r->sampled, sizeof(int32_t) * (size_t)r->episodes);
  mrl__free(e, r->sampled_lp, sizeof(float) * (size_t)r->episodes);
  mrl_kv_cache_free(r->cache);
  mrl__free(e, r, sizeof *r);
}

mrl_status mrl_rollout_new(mrl_model *m, int episodes, int capacity, mrl_rollout **out) {
  const char *fn = "mrl_rollout_new";
  if (!m) return MRL_ERR_NULL;
  mrl_engine *e = mrl_model_engine(m);
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  mrl_model_config cfg;
  mrl_model_config_get(m, &cfg);
  if (episodes <= 0 || capacity <= 0 || capacity > cfg.ctx)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "need episodes > 0 and 0 < capacity <= ctx (%d), got %d and %d", cfg.ctx,
                     episodes, capacity);
  mrl_rollout *r = mrl__alloc(e, sizeof *r);
  if (!r) return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a rollout");
  memset(r, 0, sizeof *r);
  r->model = m;
  r->engine = e;
  r->episodes = episodes;
  r->capacity = capacity;
  mrl_status st = mrl_kv_cache_new(m, episodes, capacity, &r->cache);
  if (st) {
    mrl__free(e, r, sizeof *r);
    return st;
  }
  r->ep = mrl__alloc(e, sizeof(mrl_episode) * (size_t)episodes);
  r->slots = mrl__alloc(e, sizeof(int) * (size_t)episodes);
  r->ones = mrl__alloc(e, sizeof(int) * (size_t)episodes);
  r->sampled = mrl__alloc(e, sizeof(int32_t) * (size_t)episodes);
  r->sampled_lp = mrl__alloc(e, sizeof(float) * (size_t)episodes);
  bool ok = r->ep && r->slots && r->ones && r->sampled && r->sampled_lp;
  if (r->ep) memset(r->ep, 0, sizeof(mrl_episode) * (size_t)episodes);
  for (int i = 0; ok && i < episodes; i++) {
    mrl_episode *p = &r->ep[i];
    ok = (p->tokens = mrl__alloc(e, sizeof(int32_t) * (size_t)capacity)) &&
         (p->turn = mrl__alloc(e, sizeof(int32_t) * (size_t)capacity)) &&
         (p->logprobs = mrl__alloc(e, sizeof(float) * (size_t)capacity)) &&
         (p->mask = mrl__alloc(e, sizeof(float) * (size_t)capacity)) &&
         (p->rewards = mrl__alloc(e, sizeof(double) * (size_t)capacity));
    r->ones[i] = 1;
  }
  if (!ok) {
    mrl_rollout_free(r);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate %d episodes of %d tokens", episodes,
                     capacity);
  }
  *out = r;
  return MRL_OK;
}

static mrl_status check_episode(const mrl_rollout *r, const char *fn, int e, bool started) {
  if (e < 0 || e >= r->episodes)
    return mrl__fail(r->engine, MRL_ERR_RANGE, fn, "episode %d is outside 0..%d", e,
                     r->episodes - 1);
  if (started && !r->ep[e].started)
    return mrl__fail(r->engine, MRL_ERR_INVALID, fn, "episode %d was not started", e);
  return MRL_OK;
}

/* Appends tokens to an episode's record (the cache is appended separately, batched). */
static void record(mrl_episode *p, const int32_t *tokens, int n, float mask, const float *logprobs,
                   int turn) {
  for (int i = 0; i < n; i++) {
    p->tokens[p->length] = tokens[i];
    p->mask[p->length] = mask;
    p->logprobs[p->length] = logprobs ? logprobs[i] : 0.0f;
    p->turn[p->length] = turn;
    p->length++;
  }
}

mrl_status mrl_rollout_start(mrl_rollout *r, int e, const int32_t *prompt, int count,
                             uint64_t seed) {
  const char *fn = "mrl_rollout_start";
  if (!r) return MRL_ERR_NULL;
  mrl_status st = check_episode(r, fn, e, false);
  if (st) return st;
  if (!prompt || count <= 0)
    return mrl__fail(r->engine, MRL_ERR_INVALID, fn, "a prompt of at least one token is needed");
  if (count > r->capacity)
    return mrl__fail(r->engine, MRL_ERR_RANGE, fn,
                     "prompt of %d tokens exceeds the capacity of %d", count, r->capacity);
  if ((st = mrl_kv_cache_reset(r->cache, e, seed))) return st;
  if ((st = mrl_kv_cache_append(r->cache, 1, &e, prompt, &count))) return st;
  mrl__rollout_blank(r, e, seed);
  record(&r->ep[e], prompt, count, 0.0f, NULL, -1);
  return MRL_OK;
}

void mrl__rollout_blank(mrl_rollout *r, int e, uint64_t seed) {
  mrl_episode *p = &r->ep[e];
  p->length = 0;
  p->turns = 0;
  p->turn_tokens = 0;
  p->mid_turn = false;
  p->started = true;
  p->end = MRL_END_NONE;
  p->error[0] = '\0';
  p->seed = seed;
  p->parent = -1;
  p->index = 1;
  p->fork_turn = p->forks = p->resamples = 0;
  p->group = -1;
  p->dropped = false;
}

mrl_status mrl_rollout_observe(mrl_rollout *r, int n, const int *eps, const int32_t *tokens,
                               const int *counts) {
  const char *fn = "mrl_rollout_observe";
  if (!r) return MRL_ERR_NULL;
  mrl_engine *e = r->engine;
  if (n < 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "n is negative");
  if (n == 0) return MRL_OK;
  if (!eps || !tokens || !counts)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", !eps ? "eps" : !tokens ? "tokens" : "counts");
  for (int i = 0; i < n; i++) {
    mrl_status st = check_episode(r, fn, eps[i], true);
    if (st) return st;
    if (r->ep[eps[i]].mid_turn)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "episode %d is in the middle of a turn", eps[i]);
  }
  /* the cache checks slots, counts, capacity and token ids before changing anything */
  mrl_status st = mrl_kv_cache_append(r->cache, n, eps, tokens, counts);
  if (st) return st;
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    mrl_episode *p = &r->ep[eps[i]];
    record(p, tokens + off, counts[i], 0.0f, NULL, p->turns - 1);
    off += counts[i];
  }
  return MRL_OK;
}

mrl_status mrl_rollout_generate(mrl_rollout *r, int n, const int *eps,
                                const mrl_sampling *sampling, const int32_t *stop, int n_stop,
                                int max_tokens, int *ended, int *reasons, int *n_ended) {
  return mrl__rollout_generate(r, n, eps, sampling, stop, n_stop, max_tokens, ended, reasons,
                               n_ended, NULL);
}

mrl_status mrl__rollout_generate(mrl_rollout *r, int n, const int *eps,
                                 const mrl_sampling *sampling, const int32_t *stop, int n_stop,
                                 int max_tokens, int *ended, int *reasons, int *n_ended,
                                 float *turn_logits) {
  const char *fn = "mrl_rollout_generate";
  if (!r) return MRL_ERR_NULL;
  mrl_engine *e = r->engine;
  if (n <= 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "no episodes to generate for");
  if (!eps || !sampling || !ended || !reasons || !n_ended || (n_stop > 0 && !stop))
    return mrl__fail(e, MRL_ERR_NULL, fn, "an array argument is NULL");
  if (n_stop < 0 || max_tokens <= 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "need n_stop >= 0 and max_tokens > 0");
  for (int i = 0; i < n; i++) {
    mrl_status st = check_episode(r, fn, eps[i], true);
    if (st) return st;
    for (int j = 0; j < i; j++)
      if (eps[j] == eps[i])
        return mrl__fail(e, MRL_ERR_INVALID, fn, "episode %d is listed twice", eps[i]);
    if (r->ep[eps[i]].length >= r->capacity)
      return mrl__fail(e, MRL_ERR_RANGE, fn, "episode %d is full (%d tokens)", eps[i],
                       r->capacity);
  }
  size_t vocab = 0;
  if (turn_logits) {
    mrl_model_config mc;
    mrl_model_config_get(r->model, &mc);
    vocab = (size_t)mc.vocab;
  }
  for (int i = 0; i < n; i++) {
    mrl_episode *p = &r->ep[eps[i]];
    if (!p->mid_turn) {
      p->mid_turn = true;
      p->turn_tokens = 0;
      p->resamples = 0;
      p->turns++;
      const float *now = turn_logits ? mrl_kv_cache_logits(r->cache, eps[i]) : NULL;
      if (now) memcpy(turn_logits + (size_t)eps[i] * vocab, now, sizeof(float) * vocab);
    }
  }
  int live = n;
  memcpy(r->slots, eps, sizeof(int) * (size_t)n);
  *n_ended = 0;
  while (*n_ended == 0) {
    mrl_status st = mrl_kv_cache_sample(r->cache, live, r->slots, sampling, r->sampled,
                                        r->sampled_lp);
    if (st) return st;
    if ((st = mrl_kv_cache_append(r->cache, live, r->slots, r->sampled, r->ones))) return st;
    for (int i = 0; i < live; i++) {
      mrl_episode *p = &r->ep[r->slots[i]];
      record(p, &r->sampled[i], 1, 1.0f, &r->sampled_lp[i], p->turns - 1);
      p->turn_tokens++;
      int reason = 0;
      for (int k = 0; k < n_stop && !reason; k++)
        if (r->sampled[i] == stop[k]) reason = MRL_TURN_STOP;
      if (!reason && p->length >= r->capacity) reason = MRL_TURN_FULL;
      if (!reason && p->turn_tokens >= max_tokens) reason = MRL_TURN_LENGTH;
      if (reason) {
        p->mid_turn = false;
        ended[*n_ended] = r->slots[i];
        reasons[*n_ended] = reason;
        (*n_ended)++;
      }
    }
  }
  return MRL_OK;
}

mrl_status mrl_rollout_fork(mrl_rollout *r, int src, int dst, uint64_t seed) {
  const char *fn = "mrl_rollout_fork";
  if (!r) return MRL_ERR_NULL;
  mrl_status st = check_episode(r, fn, src, true);
  if (st || (st = check_episode(r, fn, dst, false))) return st;
  if (src == dst) return mrl__fail(r->engine, MRL_ERR_INVALID, fn, "src and dst are the same");
  if ((st = mrl_kv_cache_copy(r->cache, src, dst, seed))) return st;
  mrl_episode *a = &r->ep[src], *b = &r->ep[dst];
  int n = a->length;
  memcpy(b->tokens, a->tokens, sizeof(int32_t) * (size_t)n);
  memcpy(b->turn, a->turn, sizeof(int32_t) * (size_t)n);
  memcpy(b->logprobs, a->logprobs, sizeof(float) * (size_t)n);
  memcpy(b->mask, a->mask, sizeof(float) * (size_t)n);
  b->length = n;
  b->turns = a->turns;
  b->turn_tokens = a->turn_tokens;
  b->mid_turn = a->mid_turn;
  b->started = true;
  b->end = a->end;
  memcpy(b->rewards, a->rewards, sizeof(double) * (size_t)a->turns);
  memcpy(b->error, a->error, sizeof b->error);
  b->seed = seed;
  b->parent = -1;
  b->index = 1;
  b->fork_turn = b->forks = 0;
  b->resamples = a->resamples;
  b->group = a->group;
  b->dropped = a->dropped;
  return MRL_OK;
}

static const mrl_episode *episode_of(const mrl_rollout *r, int e) {
  return r && e >= 0 && e < r->episodes && r->ep[e].started ? &r->ep[e] : NULL;
}

int mrl_rollout_length(const mrl_rollout *r, int e) {
  const mrl_episode *p = episode_of(r, e);
  return p ? p->length : -1;
}
const int32_t *mrl_rollout_tokens(const mrl_rollout *r, int e) {
  const mrl_episode *p = episode_of(r, e);
  return p ? p->tokens : NULL;
}
const float *mrl_rollout_logprobs(const mrl_rollout *r, int e) {
  const mrl_episode *p = episode_of(r, e);
  return p ? p->logprobs : NULL;
}
const float *mrl_rollout_mask(const mrl_rollout *r, int e) {
  const mrl_episode *p = episode_of(r, e);
  return p ? p->mask : NULL;
}
const int32_t *mrl_rollout_turns(const mrl_rollout *r, int e) {
  const mrl_episode *p = episode_of(r, e);
  return p ? p->turn : NULL;
}

int mrl_rollout_action(const mrl_rollout *r, int e, int turn, const int32_t **tokens) {
  const mrl_episode *p = episode_of(r, e);
  if (!p || !tokens || turn < 0 || turn >= p->turns) return -1;
  /* a turn's sampled tokens are contiguous: its closing template tokens and observation follow */
  int at = 0;
  while (at < p->length && !(p->mask[at] == 1.0f && p->turn[at] == turn)) at++;
  int end = at;
  while (end < p->length && p->mask[end] == 1.0f && p->turn[end] == turn) end++;
  *tokens = p->tokens + at;
  return end - at;
}

int mrl_rollout_origin(const mrl_rollout *r, int e, int *parent, int *index, int *turn) {
  const mrl_episode *p = episode_of(r, e);
  if (!p) return -1;
  if (parent) *parent = p->parent;
  if (index) *index = p->index;
  if (turn) *turn = p->fork_turn;
  return 0;
}

uint64_t mrl_rollout_seed(const mrl_rollout *r, int e) {
  const mrl_episode *p = episode_of(r, e);
  return p ? p->seed : 0;
}

int mrl_rollout_dropped(const mrl_rollout *r, int e) {
  const mrl_episode *p = episode_of(r, e);
  return p ? p->dropped : -1;
}
