/* rollout_hooks.c - the hooks of a run (mrl_rollout_run_hooks): forks from inside a hook (record,
 * KV cache and stream copied, the environment cloned on demand) with their outcomes reported
 * when every branch has ended, groups held at a turn until a group hook keeps or cuts them, turns
 * sampled again before the environment sees them, and the selective gate as a ready group hook.
 * The episode loop itself is rollout_run.c's; it calls the mrl__hooked_* functions below. */
#include "rollout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int parent, turn, first, count, flags;
  bool reported;
} fork_record;

struct mrl_hooked {
  mrl_rollout *r;
  const mrl_rollout_hooks *h;
  const char *fn;
  int n, total;
  mrl_env **envs;        /* r->episodes: the environment each episode steps */
  mrl_env **clones;      /* the caller's (r->episodes entries) */
  fork_record *forks;    /* each fork adds an episode: at most r->episodes */
  int nforks;
  int *root_group;       /* n: the dense group of each given episode */
  int ngroups;
  int *group_id;         /* ngroups: the caller's id of each */
  bool *decided;         /* ngroups */
  int *members;          /* r->episodes: scratch for one group's members */
  float *turn_logits;    /* r->episodes x vocab, with a resample hook */
  size_t vocab;
  int depth;             /* > 0 while a hook runs: mrl_rollout_branch may be called */
};

/* ---- the run's state ---- */

typedef struct {
  int id, at;
} id_at;

static int by_id_then_at(const void *a, const void *b) {
  const id_at *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->at < y->at ? -1 : x->at > y->at;
}

void mrl__hooked_end(mrl_hooked *hk) {
  if (!hk) return;
  mrl_engine *e = hk->r->engine;
  size_t E = (size_t)hk->r->episodes, n = (size_t)hk->n;
  mrl__free(e, hk->envs, sizeof(mrl_env *) * E);
  mrl__free(e, hk->forks, sizeof(fork_record) * E);
  mrl__free(e, hk->root_group, sizeof(int) * n);
  mrl__free(e, hk->group_id, sizeof(int) * n);
  mrl__free(e, hk->decided, sizeof(bool) * n);
  mrl__free(e, hk->members, sizeof(int) * E);
  mrl__free(e, hk->turn_logits, sizeof(float) * E * hk->vocab);
  mrl__free(e, hk, sizeof *hk);
}

/* The dense group of each given episode, groups numbered in order of first appearance (the
 * order group hooks run in), in O(n log n) for any ids. */
static mrl_status dense_groups(mrl_hooked *hk) {
  mrl_engine *e = hk->r->engine;
  int n = hk->n;
  id_at *v = mrl__alloc(e, sizeof(id_at) * (size_t)n);
  if (!v) return MRL_ERR_NOMEM;
  for (int i = 0; i < n; i++) v[i] = (id_at){hk->h->groups[i], i};
  qsort(v, (size_t)n, sizeof *v, by_id_then_at);
  int *opener = hk->members; /* scratch: the first episode with each one's id */
  for (int i = 0; i < n; i++)
    opener[v[i].at] = i > 0 && v[i].id == v[i - 1].id ? opener[v[i - 1].at] : v[i].at;
  mrl__free(e, v, sizeof(id_at) * (size_t)n);
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (opener[i] == i) {
      hk->group_id[m] = hk->h->groups[i];
      hk->root_group[i] = m++;
    } else {
      hk->root_group[i] = hk->root_group[opener[i]];
    }
  }
  hk->ngroups = m;
  return MRL_OK;
}

mrl_status mrl__hooked_begin(mrl_rollout *r, const char *fn, int n, mrl_env *const *envs,
                             const mrl_rollout_hooks *h, mrl_env **clones, mrl_hooked **out) {
  mrl_engine *e = r->engine;
  if (h->max_resamples < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "hooks->max_resamples is %d, expected 0 or more",
                     h->max_resamples);
  if (h->group && !h->groups)
    return mrl__fail(e, MRL_ERR_NULL, fn, "hooks->groups is NULL: a group hook needs the groups");
  if (h->group && h->group_turn < 1)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "hooks->group_turn is %d, expected 1 or more",
                     h->group_turn);
  mrl_hooked *hk = mrl__alloc(e, sizeof *hk);
  if (!hk) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  memset(hk, 0, sizeof *hk);
  hk->r = r;
  hk->h = h;
  hk->fn = fn;
  hk->n = hk->total = n;
  hk->clones = clones;
  size_t E = (size_t)r->episodes;
  hk->envs = mrl__alloc(e, sizeof(mrl_env *) * E);
  hk->forks = mrl__alloc(e, sizeof(fork_record) * E);
  hk->root_group = mrl__alloc(e, sizeof(int) * (size_t)n);
  hk->group_id = mrl__alloc(e, sizeof(int) * (size_t)n);
  hk->decided = mrl__alloc(e, sizeof(bool) * (size_t)n);
  hk->members = mrl__alloc(e, sizeof(int) * E);
  bool ok = hk->envs && hk->forks && hk->root_group && hk->group_id && hk->decided && hk->members;
  if (ok && h->resample) {
    mrl_model_config mc;
    mrl_model_config_get(r->model, &mc);
    hk->vocab = (size_t)mc.vocab;
    ok = (hk->turn_logits = mrl__alloc(e, sizeof(float) * E * hk->vocab)) != NULL;
    if (!ok) hk->vocab = 0;
  }
  if (ok && h->group) ok = dense_groups(hk) == MRL_OK;
  if (!ok) {
    mrl__hooked_end(hk);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  }
  memcpy(hk->envs, envs, sizeof(mrl_env *) * (size_t)n);
  for (int g = 0; g < hk->ngroups; g++) hk->decided[g] = false;
  *out = hk;
  return MRL_OK;
}

static mrl_status hook_failed(mrl_hooked *hk, mrl_status st, const char *hook, const char *what,
                              int which);

mrl_status mrl__hooked_start(mrl_hooked *hk) {
  for (int e = 0; e < hk->n; e++) hk->r->ep[e].group = hk->ngroups ? hk->root_group[e] : -1;
  const mrl_rollout_hooks *h = hk->h;
  if (!h->start) return MRL_OK;
  for (int e = 0; e < hk->n; e++) {
    if (hk->r->ep[e].end != MRL_END_NONE) continue; /* its prompt never went in */
    mrl_engine_clear_error(hk->r->engine);
    mrl_status st = h->start(h->user, hk->r, e); /* depth stays 0: no forks before a turn */
    if (st) return hook_failed(hk, st, "start", "episode", e);
  }
  return MRL_OK;
}

int mrl__hooked_total(const mrl_hooked *hk) { return hk->total; }
mrl_env *mrl__hooked_env(const mrl_hooked *hk, int e) { return hk->envs[e]; }
float *mrl__hooked_turn_logits(const mrl_hooked *hk) { return hk->turn_logits; }

bool mrl__hooked_held(const mrl_hooked *hk, int e) {
  const mrl_episode *p = &hk->r->ep[e];
  return p->group >= 0 && !hk->decided[p->group] && p->turns >= hk->h->group_turn &&
         !p->mid_turn;
}

/* A hook's failure as the run's: its status, and a message naming the hook and the episode that
 * keeps the hook's own (when a failing call made in it left one). */
static mrl_status hook_failed(mrl_hooked *hk, mrl_status st, const char *hook, const char *what,
                              int which) {
  mrl_engine *e = hk->r->engine;
  char own[512];
  snprintf(own, sizeof own, "%s", mrl_engine_last_error(e));
  if (*own)
    return mrl__fail(e, st, hk->fn, "the %s hook (%s %d) failed: %s", hook, what, which, own);
  return mrl__fail(e, st, hk->fn, "the %s hook (%s %d) returned %s", hook, what, which,
                   mrl_strerror(st));
}

/* ---- resampling ---- */

mrl_status mrl__hooked_resample(mrl_hooked *hk, int e, const char *action, size_t len,
                                bool *again) {
  *again = false;
  const mrl_rollout_hooks *h = hk->h;
  mrl_episode *p = &hk->r->ep[e];
  int max = h->max_resamples > 0 ? h->max_resamples : 1;
  if (!h->resample || p->resamples >= max) return MRL_OK;
  int yes = 0;
  mrl_engine_clear_error(hk->r->engine);
  hk->depth++;
  mrl_status st = h->resample(h->user, hk->r, e, p->resamples, action, len, &yes);
  hk->depth--;
  if (st) return hook_failed(hk, st, "resample", "episode", e);
  if (!yes) return MRL_OK;
  int start = p->length - p->turn_tokens;
  st = mrl_kv_cache_truncate(hk->r->cache, e, start, hk->turn_logits + (size_t)e * hk->vocab);
  if (st) return st;
  p->length = start;
  p->turn_tokens = 0;
  p->mid_turn = true;
  p->resamples++;
  *again = true;
  return MRL_OK;
}

/* ---- forks ---- */

mrl_status mrl_rollout_branch(mrl_rollout *r, int e, int k, int flags, int *first) {
  const char *fn = "mrl_rollout_branch";
  if (!r) return MRL_ERR_NULL;
  mrl_engine *eng = r->engine;
  mrl_hooked *hk = r->hooked;
  if (!hk || hk->depth == 0)
    return mrl__fail(eng, MRL_ERR_INVALID, fn,
                     "only a hook of mrl_rollout_run_hooks can fork an episode");
  if (e < 0 || e >= hk->total)
    return mrl__fail(eng, MRL_ERR_RANGE, fn, "episode %d is outside the run's 0..%d", e,
                     hk->total - 1);
  if (k < 2)
    return mrl__fail(eng, MRL_ERR_INVALID, fn,
                     "k is %d; a fork makes k >= 2 episodes (the episode and k - 1 branches)", k);
  if (flags & ~MRL_BRANCH_DROP)
    return mrl__fail(eng, MRL_ERR_INVALID, fn, "unknown flags 0x%x", (unsigned)flags);
  mrl_episode *p = &r->ep[e];
  if (!p->started || p->mid_turn)
    return mrl__fail(eng, MRL_ERR_INVALID, fn, "episode %d is %s", e,
                     p->started ? "in the middle of a turn (forks happen between turns)"
                                : "not started");
  if (k - 1 > r->episodes - hk->total)
    return mrl__fail(eng, MRL_ERR_RANGE, fn,
                     "no room for %d branches: the rollout holds %d episodes and %d are in use",
                     k - 1, r->episodes, hk->total);
  bool running = p->end == MRL_END_NONE;
  mrl_env *env = hk->envs[e];
  if (running && !env->clone)
    return mrl__fail(eng, MRL_ERR_UNSUPPORTED, fn,
                     "the episode's environment has no clone(): a fork needs it");
  int first_branch = hk->total;
  for (int j = 1; j < k; j++) {
    int dst = first_branch + j - 1;
    mrl_status st = mrl_rollout_fork(r, e, dst, mrl_rollout_branch_seed(p->seed, p->forks + j));
    if (st) return st; /* cannot happen: e and dst were checked; nothing is counted yet */
    mrl_episode *b = &r->ep[dst];
    b->parent = e;
    b->index = j + 1;
    b->fork_turn = p->turns;
    hk->envs[dst] = env; /* an ended episode's branches are never stepped */
    if (!running) continue;
    mrl_env *copy = NULL;
    mrl_status cs = env->clone(env->self, &copy);
    if (!cs) hk->clones[dst] = copy; /* the caller's, whatever its shape */
    if (cs || !copy || !copy->reset || !copy->step)
      mrl__rollout_clone_failed(r, dst, env, cs, copy != NULL);
    else
      hk->envs[dst] = copy;
  }
  p->forks += k - 1;
  hk->total += k - 1;
  hk->forks[hk->nforks++] =
      (fork_record){.parent = e, .turn = p->turns, .first = first_branch, .count = k - 1,
                    .flags = flags};
  if (first) *first = first_branch;
  return MRL_OK;
}

mrl_status mrl__hooked_turns(mrl_hooked *hk, const int *eps, int n) {
  const mrl_rollout_hooks *h = hk->h;
  if (!h->turn) return MRL_OK;
  for (int i = 0; i < n; i++) {
    mrl_engine_clear_error(hk->r->engine);
    hk->depth++;
    mrl_status st = h->turn(h->user, hk->r, eps[i]);
    hk->depth--;
    if (st) return hook_failed(hk, st, "turn", "episode", eps[i]);
  }
  return MRL_OK;
}

static bool over(const mrl_episode *p) { return p->end != MRL_END_NONE; }

/* The outcome hook of every fork whose episodes have all ended; *changed when one ran. */
static mrl_status report_forks(mrl_hooked *hk, bool *changed) {
  const mrl_rollout_hooks *h = hk->h;
  mrl_rollout *r = hk->r;
  for (int i = 0; i < hk->nforks; i++) { /* a hook's forks join the list as it grows */
    fork_record *f = &hk->forks[i];
    if (f->reported || !over(&r->ep[f->parent])) continue;
    bool done = true;
    for (int b = f->first; b < f->first + f->count && done; b++) done = over(&r->ep[b]);
    if (!done) continue;
    f->reported = true;
    *changed = true;
    if (h->branches) {
      fork_record copy = *f;
      mrl_engine_clear_error(r->engine);
      hk->depth++;
      mrl_status st = h->branches(h->user, r, copy.parent, copy.turn, copy.first, copy.count);
      hk->depth--;
      if (st) return hook_failed(hk, st, "branches", "episode", copy.parent);
    }
    if (hk->forks[i].flags & MRL_BRANCH_DROP)
      for (int b = hk->forks[i].first; b < hk->forks[i].first + hk->forks[i].count; b++)
        r->ep[b].dropped = true;
  }
  return MRL_OK;
}

/* The group hook of every undecided group whose members have all taken group_turn turns or
 * ended; *changed when one ran. */
static mrl_status decide_groups(mrl_hooked *hk, bool *changed) {
  const mrl_rollout_hooks *h = hk->h;
  mrl_rollout *r = hk->r;
  int K = h->group_turn;
  for (int g = 0; g < hk->ngroups; g++) {
    if (hk->decided[g]) continue;
    int count = 0;
    bool ready = true;
    for (int e = 0; e < hk->total && ready; e++) {
      const mrl_episode *p = &r->ep[e];
      if (p->group != g) continue;
      ready = over(p) || (p->turns >= K && !p->mid_turn);
      hk->members[count++] = e;
    }
    if (!ready) continue;
    int cut = 0;
    mrl_engine_clear_error(r->engine);
    hk->depth++;
    mrl_status st = h->group(h->user, r, hk->group_id[g], K, hk->members, count, &cut);
    hk->depth--;
    if (st) return hook_failed(hk, st, "group", "group", hk->group_id[g]);
    hk->decided[g] = true;
    *changed = true;
    if (!cut) continue;
    /* the members again: a fork made by the hook joined the group */
    for (int e = 0; e < hk->total; e++) {
      mrl_episode *p = &r->ep[e];
      if (p->group != g) continue;
      p->dropped = true;
      if (!over(p) && !h->finish_cut) p->end = MRL_END_CUT;
    }
  }
  return MRL_OK;
}

mrl_status mrl__hooked_settle(mrl_hooked *hk) {
  bool changed = true;
  while (changed) { /* a hook's forks and cuts may complete other groups and forks */
    changed = false;
    mrl_status st;
    if (hk->h->group && (st = decide_groups(hk, &changed))) return st;
    if ((st = report_forks(hk, &changed))) return st;
  }
  return MRL_OK;
}

/* ---- the selective gate ---- */

mrl_status mrl_rollout_gate_group(void *gate, mrl_rollout *r, int group, int turn,
                                  const int *members, int count, int *cut) {
  const char *fn = "mrl_rollout_gate_group";
  (void)group;
  if (!r) return MRL_ERR_NULL;
  mrl_engine *e = r->engine;
  mrl_rollout_gate *g = gate;
  if (!g || !members || !cut)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", !g ? "gate" : !members ? "members" : "cut");
  if (turn < 1 || count < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "need turn >= 1 and count >= 0, got %d and %d",
                     turn, count);
  for (int i = 0; i < count; i++)
    if (mrl_rollout_length(r, members[i]) < 0)
      return mrl__fail(e, MRL_ERR_RANGE, fn, "members[%d] = %d is not a started episode", i,
                       members[i]);
  *cut = 0;
  g->groups++;
  g->distance = 0.0;
  g->termination = 0.0;
  if (count < 2) return MRL_OK;
  /* each action a symbol: the index of the first action with the same tokens */
  size_t slots = (size_t)count * (size_t)turn;
  int64_t *actions = mrl__alloc(e, sizeof(int64_t) * slots);
  int64_t *offsets = mrl__alloc(e, sizeof(int64_t) * ((size_t)count + 1));
  const int32_t **seen = mrl__alloc(e, sizeof(int32_t *) * slots);
  int *seen_len = mrl__alloc(e, sizeof(int) * slots);
  mrl_status st = MRL_OK;
  if (!actions || !offsets || !seen || !seen_len) {
    st = mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
    goto done;
  }
  int distinct = 0;
  offsets[0] = 0;
  for (int i = 0; i < count; i++) {
    int taken = mrl_rollout_turn_count(r, members[i]);
    int T = taken < turn ? taken : turn;
    int64_t at = offsets[i];
    for (int t = 0; t < T; t++) {
      const int32_t *tok = NULL;
      int len = mrl_rollout_action(r, members[i], t, &tok);
      int id = 0;
      while (id < distinct && !(seen_len[id] == len &&
                                memcmp(seen[id], tok, sizeof(int32_t) * (size_t)len) == 0))
        id++;
      if (id == distinct) {
        seen[distinct] = tok;
        seen_len[distinct++] = len;
      }
      actions[at++] = id;
    }
    offsets[i + 1] = at;
  }
  mrl_selective_gate out;
  if ((st = mrl_selective_gate_eval(e, actions, offsets, count, turn, g->d_low, g->t_high, &out)))
    goto done;
  g->distance = out.edit_distance;
  g->termination = out.termination;
  g->cut += out.cut != 0;
  *cut = out.cut != 0;
done:
  mrl__free(e, actions, sizeof(int64_t) * slots);
  mrl__free(e, offsets, sizeof(int64_t) * ((size_t)count + 1));
  mrl__free(e, seen, sizeof(int32_t *) * slots);
  mrl__free(e, seen_len, sizeof(int) * slots);
  return st;
}
