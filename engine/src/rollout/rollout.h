/* rollout.h - the rollout's internals shared by rollout.c (decoding), rollout_run.c (the episode
 * driver), rollout_tree.c (trees) and rollout_hooks.c (the hooks of a run). Not installed. */
#ifndef MRL_ROLLOUT_H
#define MRL_ROLLOUT_H

#include "internal.h"

typedef struct {
  int32_t *tokens, *turn; /* capacity entries each */
  float *logprobs, *mask;
  double *rewards;        /* reward of each turn (at most one turn per token) */
  int length;
  int turns;       /* turns started so far; the current (or last) one is turns - 1 */
  int turn_tokens; /* tokens sampled in the current turn */
  bool mid_turn;   /* a turn is under way (started and not ended) */
  bool started;
  int end;         /* MRL_END_* */
  char error[512]; /* the environment's message when end is MRL_END_ENV_ERROR */
  uint64_t seed;   /* its stream's seed, from which its branches' derive */
  int parent;      /* the episode a hook forked it from, or -1 */
  int index;       /* its place in that fork: 2..k (1 when it was not forked by a hook) */
  int fork_turn;   /* the turns it shares with its parent (0 when it has none) */
  int forks;       /* branches made from it so far: the next one's seed index */
  int group;       /* its group in a hooked run (a dense index), or -1 */
  int resamples;   /* times its current turn was sampled again (the resample hook) */
  bool dropped;    /* cut with its group, or a dropped branch: not part of the batch */
} mrl_episode;

typedef struct mrl_hooked mrl_hooked; /* a hooked run in progress (rollout_hooks.c) */

struct mrl_rollout {
  mrl_model *model; /* reached only through the public model API */
  mrl_engine *engine;
  mrl_kv_cache *cache;
  int episodes, capacity;
  mrl_episode *ep;
  /* per-call scratch, one entry per episode */
  int *slots, *ones;
  int32_t *sampled;
  float *sampled_lp;
  mrl_hooked *hooked; /* the hooked run in progress (mrl_rollout_branch reaches it), or NULL */
};

/* rollout.c: makes episode e an empty record of a started episode, running, with its stream's
 * seed, not forked, in no group (what mrl_rollout_start does besides the prompt and cache). */
void mrl__rollout_blank(mrl_rollout *r, int e, uint64_t seed);
/* rollout.c: mrl_rollout_generate, saving each listed episode's logits when a turn starts into
 * turn_logits (episodes x vocab floats) when it is not NULL. */
mrl_status mrl__rollout_generate(mrl_rollout *r, int n, const int *eps,
                                 const mrl_sampling *sampling, const int32_t *stop, int n_stop,
                                 int max_tokens, int *ended, int *reasons, int *n_ended,
                                 float *turn_logits);

/* rollout_tree.c: ends branch episode e because src's clone failed (st) or made no usable
 * environment (made: it made one without reset or step). */
void mrl__rollout_clone_failed(mrl_rollout *r, int e, const mrl_env *src, mrl_status st,
                               bool made);

/* rollout_hooks.c: the hooks' side of a run, which rollout_run.c's loop calls at each stage. */
mrl_status mrl__hooked_begin(mrl_rollout *r, const char *fn, int n, mrl_env *const *envs,
                             const mrl_rollout_hooks *hooks, mrl_env **clones, mrl_hooked **out);
void mrl__hooked_end(mrl_hooked *hk);
int mrl__hooked_total(const mrl_hooked *hk);          /* the episodes in use: n + branches */
mrl_env *mrl__hooked_env(const mrl_hooked *hk, int e); /* the environment episode e steps */
float *mrl__hooked_turn_logits(const mrl_hooked *hk); /* for mrl__rollout_generate, or NULL */
/* Puts the n given episodes, just started, into their groups, and calls the start hook of each
 * whose prompt went in. */
mrl_status mrl__hooked_start(mrl_hooked *hk);
/* Whether episode e waits at its group's turn for the group hook's decision. */
bool mrl__hooked_held(const mrl_hooked *hk, int e);
/* The resample hook on episode e's action (the text decoded); *again: the turn was taken back
 * (record and cache shortened to its start) to be sampled anew. */
mrl_status mrl__hooked_resample(mrl_hooked *hk, int e, const char *action, size_t len,
                                bool *again);
/* The turn hook of each of the n episodes whose turns were taken (stepped) in this round. */
mrl_status mrl__hooked_turns(mrl_hooked *hk, const int *eps, int n);
/* Group hooks of the groups now complete, and the outcome hooks of forks now over. */
mrl_status mrl__hooked_settle(mrl_hooked *hk);

#endif /* MRL_ROLLOUT_H */
