/* rollout_run.c - the episode driver: environments (mrl_env vtables) and the policy taking turns,
 * all episodes decoded together, observations rendered with the chat template, each episode
 * ending on its own (done, max turns, capacity, environment error, a reward that is not
 * finite), and the points where a hooked run calls its hooks (rollout_hooks.c). */
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
      mrl__rollout_blank(d->r, e, seeds[e]);
      env_failed(d, envs[e], e, st ? st : MRL_ERR_NULL, "reset");
      continue;
    }
    mrl_chat_message msgs[2];
    size_t k = 0;
    if (d->cfg->system) msgs[k++] = (mrl_chat_message){"system", d->cfg->system, strlen(d->cfg->system)};
    msgs[k++] = (mrl_chat_message){"user", obs, len};
    size_t count;
    if ((st = render(d, fn, msgs, k, &count))) return st;
    if ((int64_t)count >= d->r->capacity) { /* no room left for a single sampled token */
      mrl__rollout_blank(d->r, e, seeds[e]);
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

/* The arguments mrl_rollout_run and mrl_rollout_run_hooks share. */
static mrl_status check_run(mrl_rollout *r, const char *fn, mrl_tokenizer *tok, int n,
                            mrl_env *const *envs, const uint64_t *seeds,
                            const mrl_rollout_config *cfg) {
  mrl_engine *eng = r->engine;
  if (!tok || !envs || !seeds || !cfg)
    return mrl__fail(eng, MRL_ERR_NULL, fn, "%s is NULL",
                     !tok ? "tok" : !envs ? "envs" : !seeds ? "seeds" : "cfg");
  if (r->hooked)
    return mrl__fail(eng, MRL_ERR_INVALID, fn, "the rollout is running (a hook cannot run it)");
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
  return MRL_OK;
}

/* Steps episode e's environment with the action in d->text: its reward and end, or its next
 * observation gathered into the round's batch (obs_*). */
typedef struct {
  int32_t *ids;
  size_t cap, total;
  int *eps;
  size_t eps_cap;
  int n;
} observations;

static mrl_status take_turn(driver *d, const char *fn, mrl_env *env, int e, int reason,
                            size_t alen, observations *o, int *counts) {
  mrl_rollout *r = d->r;
  const mrl_rollout_config *cfg = d->cfg;
  mrl_episode *p = &r->ep[e];
  const char *obs = NULL;
  size_t olen = 0;
  double reward = 0.0;
  int is_done = 0;
  mrl_status es = env->step(env->self, d->text, alen, &obs, &olen, &reward, &is_done);
  p->rewards[p->turns - 1] = 0.0; /* a failed turn earns nothing */
  if (es) {
    env_failed(d, env, e, es, "step");
    return MRL_OK;
  }
  if (!isfinite(reward)) {
    snprintf(p->error, sizeof p->error, "step: the reward is %g, not a finite number", reward);
    p->end = MRL_END_ENV_ERROR;
    return MRL_OK;
  }
  p->rewards[p->turns - 1] = reward;
  if (is_done) {
    p->end = MRL_END_DONE;
  } else if (p->turns >= cfg->max_turns) {
    p->end = MRL_END_MAX_TURNS;
  } else if (reason == MRL_TURN_FULL || !obs) {
    p->end = obs ? MRL_END_BUDGET : MRL_END_ENV_ERROR;
    if (!obs) snprintf(p->error, sizeof p->error, "step: no observation for a continuing episode");
  } else {
    const char *role = cfg->observation_role ? cfg->observation_role : "user";
    mrl_chat_message msg = {role, obs, olen};
    size_t count;
    mrl_status st = render(d, fn, &msg, 1, &count);
    if (st) return st;
    const int32_t *ids = d->ids;
    if (d->bos >= 0 && count > 0 && ids[0] == d->bos) {
      ids++;
      count--;
    }
    /* the template between the action and the next message: a turn cut by the token limit
     * is closed with the end-of-turn token, then what follows one (ChatML's "\n") */
    int32_t pre[5];
    size_t npre = 0;
    if (reason != MRL_TURN_STOP) pre[npre++] = d->stop;
    for (int k = 0; k < d->nsep; k++) pre[npre++] = d->sep[k];
    /* (an observation that would leave no room for a sampled token does not go in either) */
    if ((int64_t)p->length + (int64_t)(npre + count) >= r->capacity) {
      p->end = MRL_END_BUDGET;
      return MRL_OK;
    }
    if (!grow(d, (void **)&o->ids, &o->cap, o->total + npre + count, sizeof(int32_t)) ||
        !grow(d, (void **)&o->eps, &o->eps_cap, (size_t)o->n + 1, sizeof(int)))
      return mrl__fail(r->engine, MRL_ERR_NOMEM, fn, "out of memory");
    memcpy(o->ids + o->total, pre, sizeof(int32_t) * npre);
    memcpy(o->ids + o->total + npre, ids, sizeof(int32_t) * count);
    o->total += npre + count;
    counts[o->n] = (int)(npre + count);
    o->eps[o->n++] = e;
  }
  return MRL_OK;
}

/* The episodes of a run to the end, or to cfg->pause_turn: the loop of mrl_rollout_run (hk
 * NULL) and mrl_rollout_run_hooks. */
static mrl_status run_loop(mrl_rollout *r, const char *fn, mrl_tokenizer *tok, int n,
                           mrl_env *const *envs, const uint64_t *seeds,
                           const mrl_rollout_config *cfg, mrl_hooked *hk) {
  mrl_engine *eng = r->engine;
  driver d = {.r = r, .tok = tok, .cfg = cfg};
  mrl_status st = resolve_template(&d, fn);
  if (st) return st;
  /* room for every episode the rollout holds: hooks add branches */
  int cap = r->episodes;
  int *live = mrl__alloc(eng, sizeof(int) * (size_t)cap * 5);
  if (!live) return mrl__fail(eng, MRL_ERR_NOMEM, fn, "out of memory");
  int *ended = live + cap, *reasons = live + 2 * cap, *counts = live + 3 * cap;
  int *stepped = live + 4 * cap;
  observations o = {0};
  mrl_kv_cache_set_batch_invariant(r->cache, cfg->batch_invariant);
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
  if (hk) {
    /* the start hooks, then the groups that ended at reset */
    if ((st = mrl__hooked_start(hk)) || (st = mrl__hooked_settle(hk))) goto done;
  }
  int nlive = 0;
  for (int e = 0; e < n; e++)
    if (r->ep[e].end == MRL_END_NONE && !(hk && mrl__hooked_held(hk, e))) live[nlive++] = e;
  while (nlive > 0) {
    int n_ended, n_stepped = 0;
    st = mrl__rollout_generate(r, nlive, live, &cfg->sampling, &d.stop, 1, cfg->max_turn_tokens,
                               ended, reasons, &n_ended, hk ? mrl__hooked_turn_logits(hk) : NULL);
    if (st) goto done;
    /* environments answer the episodes whose turns ended; their observations go in together */
    o.total = 0;
    o.n = 0;
    for (int i = 0; i < n_ended; i++) {
      int e = ended[i];
      size_t alen;
      if ((st = action_text(&d, fn, e, reasons[i], &alen))) goto done;
      bool again = false;
      if (hk && (st = mrl__hooked_resample(hk, e, d.text, alen, &again))) goto done;
      if (again) continue;
      stepped[n_stepped++] = e;
      mrl_env *env = hk ? mrl__hooked_env(hk, e) : envs[e];
      if ((st = take_turn(&d, fn, env, e, reasons[i], alen, &o, counts))) goto done;
    }
    if (o.n > 0 && (st = mrl_rollout_observe(r, o.n, o.eps, o.ids, counts))) goto done;
    if (cfg->pause_turn > 0)
      for (int i = 0; i < o.n; i++)
        if (r->ep[o.eps[i]].turns == cfg->pause_turn) r->ep[o.eps[i]].end = MRL_END_PAUSED;
    if (hk && ((st = mrl__hooked_turns(hk, stepped, n_stepped)) || (st = mrl__hooked_settle(hk))))
      goto done;
    int total = hk ? mrl__hooked_total(hk) : n;
    nlive = 0;
    for (int e = 0; e < total; e++)
      if (r->ep[e].started && r->ep[e].end == MRL_END_NONE && !(hk && mrl__hooked_held(hk, e)))
        live[nlive++] = e;
  }
done:
  mrl_kv_cache_set_batch_invariant(r->cache, 0);
  mrl__free(eng, live, sizeof(int) * (size_t)cap * 5);
  mrl__free(eng, o.ids, o.cap * sizeof(int32_t));
  mrl__free(eng, o.eps, o.eps_cap * sizeof(int));
  mrl__free(eng, d.ids, d.ids_cap * sizeof(int32_t));
  mrl__free(eng, d.text, d.text_cap);
  return st;
}

mrl_status mrl_rollout_run(mrl_rollout *r, mrl_tokenizer *tok, int n, mrl_env *const *envs,
                           const uint64_t *seeds, const mrl_rollout_config *cfg) {
  const char *fn = "mrl_rollout_run";
  if (!r) return MRL_ERR_NULL;
  mrl_status st = check_run(r, fn, tok, n, envs, seeds, cfg);
  if (st) return st;
  return run_loop(r, fn, tok, n, envs, seeds, cfg, NULL);
}

mrl_status mrl_rollout_run_hooks(mrl_rollout *r, mrl_tokenizer *tok, int n, mrl_env *const *envs,
                                 const uint64_t *seeds, const mrl_rollout_config *cfg,
                                 const mrl_rollout_hooks *hooks, mrl_env **clones, int *total) {
  const char *fn = "mrl_rollout_run_hooks";
  if (!r) return MRL_ERR_NULL;
  if (!hooks || !clones || !total)
    return mrl__fail(r->engine, MRL_ERR_NULL, fn, "%s is NULL",
                     !hooks ? "hooks" : !clones ? "clones" : "total");
  for (int e = 0; e < r->episodes; e++) clones[e] = NULL;
  mrl_status st = check_run(r, fn, tok, n, envs, seeds, cfg);
  if (st) return st;
  if (cfg->pause_turn || cfg->resume)
    return mrl__fail(r->engine, MRL_ERR_INVALID, fn,
                     "cfg->pause_turn and cfg->resume must be 0 in a run with hooks");
  mrl_hooked *hk = NULL;
  if ((st = mrl__hooked_begin(r, fn, n, envs, hooks, clones, &hk))) return st;
  r->hooked = hk;
  st = run_loop(r, fn, tok, n, envs, seeds, cfg, hk);
  if (!st) *total = mrl__hooked_total(hk);
  r->hooked = NULL;
  mrl__hooked_end(hk);
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
