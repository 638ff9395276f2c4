/* rollout_tree.c - tree rollouts: roots run a few turns and pause, each is forked into branches
 * (record and KV cache copied, environment cloned, own random stream), and every episode then
 * runs to the end. The layout of episodes is the one moonrl.h documents. */
#include "rollout.h"

#include <stdio.h>
#include <string.h>

uint64_t mrl_rollout_branch_seed(uint64_t seed, int j) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * ((uint64_t)j + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void mrl__rollout_clone_failed(mrl_rollout *r, int e, const mrl_env *src, mrl_status st,
                               bool made) {
  mrl_episode *p = &r->ep[e];
  const char *msg = !st && made ? "it made an environment without reset or step"
                    : !st       ? "it made no environment"
                    : src->error ? src->error(src->self)
                                 : NULL;
  if (!msg || !*msg) msg = mrl_strerror(st);
  snprintf(p->error, sizeof p->error, "clone: %s", msg);
  p->end = MRL_END_ENV_ERROR;
  p->mid_turn = false;
}

mrl_status mrl_rollout_run_tree(mrl_rollout *r, mrl_tokenizer *tok, int n, mrl_env *const *envs,
                                const uint64_t *seeds, const mrl_rollout_config *cfg,
                                int tree_turn, int k, mrl_env **clones) {
  const char *fn = "mrl_rollout_run_tree";
  if (!r) return MRL_ERR_NULL;
  mrl_engine *eng = r->engine;
  if (!envs || !seeds || !cfg || !clones)
    return mrl__fail(eng, MRL_ERR_NULL, fn, "%s is NULL",
                     !envs ? "envs" : !seeds ? "seeds" : !cfg ? "cfg" : "clones");
  if (n <= 0 || tree_turn < 1 || k < 2)
    return mrl__fail(eng, MRL_ERR_INVALID, fn,
                     "need n >= 1, tree_turn >= 1 and k >= 2, got %d, %d and %d", n, tree_turn, k);
  if ((int64_t)n * k > r->episodes)
    return mrl__fail(eng, MRL_ERR_INVALID, fn, "%d roots x %d need %lld episodes, the rollout has %d",
                     n, k, (long long)n * k, r->episodes);
  if (cfg->pause_turn || cfg->resume)
    return mrl__fail(eng, MRL_ERR_INVALID, fn,
                     "cfg->pause_turn and cfg->resume must be 0 (the tree sets them)");
  int branches = k - 1, total = n * k;
  for (int i = 0; i < n * branches; i++) clones[i] = NULL;
  for (int e = 0; e < n; e++) {
    if (!envs[e]) return mrl__fail(eng, MRL_ERR_NULL, fn, "envs[%d] is NULL", e);
    if (!envs[e]->clone)
      return mrl__fail(eng, MRL_ERR_UNSUPPORTED, fn,
                       "envs[%d] has no clone(): a tree needs it to fork its episodes", e);
  }
  mrl_env **all = mrl__alloc(eng, sizeof(mrl_env *) * (size_t)total);
  if (!all) return mrl__fail(eng, MRL_ERR_NOMEM, fn, "out of memory");
  memcpy(all, envs, sizeof(mrl_env *) * (size_t)n);
  mrl_rollout_config c = *cfg;
  c.pause_turn = tree_turn;
  mrl_status st = mrl_rollout_run(r, tok, n, envs, seeds, &c);
  for (int i = 0; !st && i < n; i++) {
    bool paused = r->ep[i].end == MRL_END_PAUSED;
    for (int j = 1; !st && j < k; j++) {
      int dst = n + i * branches + (j - 1);
      all[dst] = envs[i]; /* an ended root's branches are never stepped */
      if ((st = mrl_rollout_fork(r, i, dst, mrl_rollout_branch_seed(seeds[i], j)))) break;
      if (!paused) continue;
      mrl_env *copy = NULL;
      mrl_status cs = envs[i]->clone(envs[i]->self, &copy);
      if (!cs) clones[i * branches + (j - 1)] = copy; /* the caller's, whatever its shape */
      if (cs || !copy || !copy->reset || !copy->step)
        mrl__rollout_clone_failed(r, dst, envs[i], cs, copy != NULL);
      else
        all[dst] = copy;
    }
  }
  if (!st) {
    c.pause_turn = 0;
    c.resume = 1;
    st = mrl_rollout_run(r, tok, total, all, seeds, &c);
  }
  mrl__free(eng, all, sizeof(mrl_env *) * (size_t)total);
  return st;
}
