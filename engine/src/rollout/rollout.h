/* rollout.h - the rollout's internals shared by rollout.c (decoding) and rollout_run.c (the
 * episode driver). Not installed. */
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
} mrl_episode;

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
};

#endif /* MRL_ROLLOUT_H */
