/* rollout_run.c - the episode driver: environments (mrl_env vtables) and the policy taking turns,
 * all episodes decoded together, observations rendered with the chat template, each episode
 * ending on its own (done, max turns, capacity, environment error, a reward that is not
 * finite). */
#include "rollout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  mrl_rollout *r;
  mrl_tokenizer *tok;
  const mrl_rollout_config *cfg;
  mrl_chat_template chat;
  int32_t stop;      /* end-of-turn token of the template */
  int32_t bos;       /* a leading token to drop from continuations (Llama 3's), or -1 */
  int32_t sep[4];    /* what the template puts after an end-of-turn token (ChatML's "\n") */
  int nsep;
  int32_t *ids;      /* render scratch */
  size_t ids_cap;
  char *text;        /* decode scratch */
  size_t text_cap;
} driver;

static mrl_engine *engine_of(driver *d) { return d->r->engine; }

static bool grow(driver *d, void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t n = *cap ? *cap : 256;
  while (n < need) n *= 2;
  void *q = mrl__alloc(engine_of(d), n * elem);
  if (!q) return false;
  if (*cap) memcpy(q, *p, *cap * elem); /* observations gathered so far stay */
  mrl__free(engine_of(d), *p, *cap * elem);
  *p = q;
  *cap = n;
  return true;
}

static int32_t token_id(const mrl_tokenizer *tok, const char *s) {
  return mrl_tokenizer_token_id(tok, s, strlen(s));
}

/* The template the tokenizer's MRL_CHAT_AUTO would pick, its end-of-turn token, and the leading
 * token a continuation must not repeat. */
static mrl_status resolve_template(driver *d, const char *fn) {
  const mrl_tokenizer *tok = d->tok;
  mrl_chat_template t = d->cfg->chat;
  bool bytes = mrl_tokenizer_vocab_size(tok) == MRL_BYTE_VOCAB &&
               token_id(tok, "<|end|>") == MRL_TOKEN_END;
  if (t == MRL_CHAT_AUTO)
    t = bytes ? MRL_CHAT_ROLES
        : token_id(tok, "<|im_start|>") >= 0       ? MRL_CHAT_CHATML
        : token_id(tok, "<|start_header_id|>") >= 0 ? MRL_CHAT_LLAMA3
                                                    : MRL_CHAT_AUTO;
  const char *end = t == MRL_CHAT_ROLES    ? "<|end|>"
                    : t == MRL_CHAT_CHATML ? "<|im_end|>"
                    : t == MRL_CHAT_LLAMA3 ? "<|eot_id|>"
                                           : NULL;
  d->stop = end ? token_id(tok, end) : -1;
  if (d->stop < 0)
    return mrl__fail(engine_of(d), MRL_ERR_UNSUPPORTED, fn,
                     "no chat template with an end-of-turn token fits this tokenizer");
  d->chat = t;
  d->bos = t == MRL_CHAT_LLAMA3 ? token_id(tok, "<|begin_of_text|>") : -1;
  d->nsep = 0;
  if (t == MRL_CHAT_CHATML) {
    size_t n = 0;
    mrl_status st = mrl_tokenizer_encode(d->tok, "\n", 1, 0, d->sep, 4, &n);
    if (st) return st;
    if (n > 4) return mrl__fail(engine_of(d), MRL_ERR_UNSUPPORTED, fn, "\"\\n\" is %zu tokens", n);
    d->nsep = (int)n;
  }
  return MRL_OK;
}

/* Renders messages with the generation prompt into d->ids; *count gets the length. */
static mrl_status render(driver *d, const char *fn, const mrl_chat_message *msgs, size_t n,
                         size_t *count) {
  mrl_status st = mrl_tokenizer_chat(d->tok, d->chat, msgs, n, 1, d->ids, d->ids_cap, count);
  if (st) return st;
  if (*count > d->ids_cap) {
    if (!grow(d, (void **)&d->ids, &d->ids_cap, *count, sizeof(int32_t)))
      return mrl__fail(engine_of(d), MRL_ERR_NOMEM, fn, "out of memory");
    return mrl_tokenizer_chat(d->tok, d->chat, msgs, n, 1, d->ids, d->ids_cap, count);
  }
  return MRL_OK;
}

/* Ends episode e with an environment error. */
static void env_failed(driver *d, mrl_env *env, int e, mrl_status st, const char *what) {
  mrl_episode *p = &d->r->ep[e];
  const char *msg = env->error ? env->error(env->self) : NULL;
  if (!msg || !*msg) msg = mrl_strerror(st);
  snprintf(p->error, sizeof p->error, "%s: %s", what, msg);
  p->end = MRL_END_ENV_ERROR;
  p->mid_turn = false;
}

/* Starts every episode from its environment's first observation. */
static mrl_status start_all(driver *d, const char *fn, int n, mrl_env *const *envs,
                            const uint64_t *seeds) {
  for (int e = 0; e < n; e++) {
    const char *obs = NULL;
    size_t len = 0;
    mrl_status st = envs[e]->reset(envs[e]->self, &obs, &len);
    mrl_episode *p = &d->r->ep[e];
    if (st || !obs) {
      /* a record with nothing in it: the episode exists, with its error */
      p->started = true;
      p->length = p->turns = 0;
      env_failed(d, envs[e], e, st ? st : MRL_ERR_NULL, "reset");
      continue;
    }
    mrl_chat_message msgs[2];
    size_t k = 0;
    if (d->cfg->system) msgs[k++] = (mrl_chat_message){"system", d->cfg->system, strlen(d->cfg->system)};
    msgs[k++] = (mrl_chat_message){"user", obs, len};
    size_t count;
    if ((st = render(d, fn, msgs, k, &count))) return st;
    if ((int64_t)count > d->r->capacity) {
      p->started = true;
      p->length = p->turns = 0;
      p->end = MRL_END_BUDGET;
      continue;
    }
    if ((st = mrl_rollout_start(d->r, e, d->ids, (int)count, seeds[e]))) return st;
  }
  return MRL_OK;
}

/* The text of episode e's last turn (without its end-of-turn token) into d->text. */
static mrl_status action_text(driver *d, const char *fn, int e, int reason, size_t *len) {
  const mrl_episode *p = &d->r->ep[e];
  int n = p->turn_tokens - (reason == MRL_TURN_STOP ? 1 : 0);
  const int32_t *ids = p->tokens + p->length - p->turn_tokens;
  mrl_status st = mrl_tokenizer_decode(d->tok, ids, (size_t)n, d->text, d->text_cap, len);
  if (st) return st;
  if (*len + 1 > d->text_cap) {
    if (!grow(d, (void **)&d->text, &d->text_cap, *len + 1, 1))
      return mrl__fail(engine_of(d), MRL_ERR_NOMEM, fn, "out of memory");
    return mrl_tokenizer_decode(d->tok, ids, (size_t)n, d->text, d->text_cap, len);
  }
  return MRL_OK;
}

mrl_status mrl_rollout_run(mrl_rollout *r, mrl_tokenizer *tok, int n, mrl_env *const *envs,
                           const uint64_t *seeds, const mrl_rollout_config *cfg) {
  const char *fn = "mrl_rollout_run";
  if (!r) return MRL_ERR_NULL;
  mrl_engine *eng = r->engine;
  if (!tok || !envs || !seeds || !cfg)
    return mrl__fail(eng, MRL_ERR_NULL, fn, "%s is NULL",
                     !tok ? "tok" : !envs ? "envs" : !seeds ? "seeds" : "cfg");
  if (n <= 0 || n > r->episodes)
    return mrl__fail(eng, MRL_ERR_INVALID, fn, "n is %d, the rollout holds 1..%d episodes", n,
                     r->episodes);
  if (cfg->max_turns <= 0 || cfg->max_turn_tokens <= 0)
    return mrl__fail(eng, MRL_ERR_INVALID, fn, "max_turns and max_turn_tokens must be positive");
  if (cfg->pause_turn < 0)
    return mrl__fail(eng, MRL_ERR_INVALID, fn, "pause_turn is %d, expected 0 or more",
                     cfg->pause_turn);
  for (int e = 0; e < n; e++)
    if (!envs[e] || !envs[e]->reset || !envs[e]->step)
      return mrl__fail(eng, MRL_ERR_NULL, fn, "envs[%d] lacks reset or step", e);
  driver d = {.r = r, .tok = tok, .cfg = cfg};
  mrl_status st = resolve_template(&d, fn);
  if (st) return st;
  int *live = mrl__alloc(eng, sizeof(int) * (size_t)n * 4);
  if (!live) return mrl__fail(eng, MRL_ERR_NOMEM, fn, "out of memory");
  int *ended = live + n, *reasons = live + 2 * n, *counts = live + 3 * n;
  int32_t *obs_ids = NULL;
  size_t obs_cap = 0;
  int *obs_eps = NULL;
  size_t obs_eps_cap = 0;
  if (cfg->resume) {
    for (int e = 0; e < n; e++) {
      mrl_episode *p = &r->ep[e];
      if (!p->started || (p->end == MRL_END_NONE && p->mid_turn)) {
        st = mrl__fail(eng, MRL_ERR_INVALID, fn, "resume: episode %d %s", e,
                       p->started ? "is in the middle of a turn" : "was never started");
        goto done;
      }
    }
    for (int e = 0; e < n; e++)
      if (r->ep[e].end == MRL_END_PAUSED) r->ep[e].end = MRL_END_NONE;
  } else if ((st = start_all(&d, fn, n, envs, seeds))) {
    goto done;
  }
  int nlive = 0;
  for (int e = 0; e < n; e++)
    if (r->ep[e].end == MRL_END_NONE) live[nlive++] = e;
  const char *role = cfg->observation_role ? cfg->observation_role : "user";
  while (nlive > 0) {
    int n_ended;
    st = mrl_rollout_generate(r, nlive, live, &cfg->sampling, &d.stop, 1, cfg->max_turn_tokens,
                              ended, reasons, &n_ended);
    if (st) goto done;
    /* environments answer the episodes whose turns ended; their observations go in together */
    size_t obs_total = 0;
    int n_obs = 0;
    for (int i = 0; i < n_ended; i++) {
      int e = ended[i];
      mrl_episode *p = &r->ep[e];
      size_t alen;
      if ((st = action_text(&d, fn, e, reasons[i], &alen))) goto done;
      const char *obs = NULL;
      size_t olen = 0;
      double reward = 0.0;
      int is_done = 0;
      mrl_status es = envs[e]->step(envs[e]->self, d.text, alen, &obs, &olen, &reward, &is_done);
      p->rewards[p->turns - 1] = 0.0; /* a failed turn earns nothing */
      if (es) {
        env_failed(&d, envs[e], e, es, "step");
        continue;
      }
      if (!isfinite(reward)) {
        snprintf(p->error, sizeof p->error, "step: the reward is %g, not a finite number", reward);
        p->end = MRL_END_ENV_ERROR;
        continue;
      }
      p->rewards[p->turns - 1] = reward;
      if (is_done) {
        p->end = MRL_END_DONE;
      } else if (p->turns >= cfg->max_turns) {
        p->end = MRL_END_MAX_TURNS;
      } else if (reasons[i] == MRL_TURN_FULL || !obs) {
        p->end = obs ? MRL_END_BUDGET : MRL_END_ENV_ERROR;
        if (!obs) snprintf(p->error, sizeof p->error, "step: no observation for a continuing episode");
      } else {
        mrl_chat_message msg = {role, obs, olen};
        size_t count;
        if ((st = render(&d, fn, &msg, 1, &count))) goto done;
        const int32_t *ids = d.ids;
        if (d.bos >= 0 && count > 0 && ids[0] == d.bos) {
          ids++;
          count--;
        }
        /* the template between the action and the next message: a turn cut by the token limit
         * is closed with the end-of-turn token, then what follows one (ChatML's "\n") */
        int32_t pre[5];
        size_t npre = 0;
        if (reasons[i] != MRL_TURN_STOP) pre[npre++] = d.stop;
        for (int k = 0; k < d.nsep; k++) pre[npre++] = d.sep[k];
        if ((int64_t)p->length + (int64_t)(npre + count) > r->capacity) {
          p->end = MRL_END_BUDGET;
          continue;
        }
        if (!grow(&d, (void **)&obs_ids, &obs_cap, obs_total + npre + count, sizeof(int32_t)) ||
            !grow(&d, (void **)&obs_eps, &obs_eps_cap, (size_t)n_obs + 1, sizeof(int))) {
          st = mrl__fail(eng, MRL_ERR_NOMEM, fn, "out of memory");
          goto done;
        }
        memcpy(obs_ids + obs_total, pre, sizeof(int32_t) * npre);
        memcpy(obs_ids + obs_total + npre, ids, sizeof(int32_t) * count);
        obs_total += npre + count;
        counts[n_obs] = (int)(npre + count);
        obs_eps[n_obs++] = e;
      }
    }
    if (n_obs > 0 && (st = mrl_rollout_observe(r, n_obs, obs_eps, obs_ids, counts))) goto done;
    if (cfg->pause_turn > 0)
      for (int i = 0; i < n_obs; i++)
        if (r->ep[obs_eps[i]].turns == cfg->pause_turn) r->ep[obs_eps[i]].end = MRL_END_PAUSED;
    nlive = 0;
    for (int e = 0; e < n; e++)
      if (r->ep[e].started && r->ep[e].end == MRL_END_NONE) live[nlive++] = e;
  }
done:
  mrl__free(eng, live, sizeof(int) * (size_t)n * 4);
  mrl__free(eng, obs_ids, obs_cap * sizeof(int32_t));
  mrl__free(eng, obs_eps, obs_eps_cap * sizeof(int));
  mrl__free(eng, d.ids, d.ids_cap * sizeof(int32_t));
  mrl__free(eng, d.text, d.text_cap);
  return st;
}

static const mrl_episode *finished(const mrl_rollout *r, int e) {
  return r && e >= 0 && e < r->episodes && r->ep[e].started ? &r->ep[e] : NULL;
}

int mrl_rollout_end(const mrl_rollout *r, int e) {
  const mrl_episode *p = finished(r, e);
  return p ? p->end : -1;
}

int mrl_rollout_turn_count(const mrl_rollout *r, int e) {
  const mrl_episode *p = finished(r, e);
  return p ? p->turns : -1;
}

const double *mrl_rollout_rewards(const mrl_rollout *r, int e) {
  const mrl_episode *p = finished(r, e);
  return p ? p->rewards : NULL;
}

const char *mrl_rollout_error(const mrl_rollout *r, int e) {
  const mrl_episode *p = finished(r, e);
  return p && p->end == MRL_END_ENV_ERROR ? p->error : NULL;
}
