/* rl_loop.c - reinforcement learning from C alone: an environment written as an mrl_env vtable,
 * rollouts with mrl_rollout_run, GRPO advantages, the PPO loss, the model's backward and AdamW.
 * The task is one turn: the observation is "say a vowel" and the reward is 1 when the reply's
 * first byte is a vowel. A fresh byte-level policy says one a few percent of the time; after 30
 * steps of 8 prompts x 8 episodes it says one nearly always.
 *
 *   cc rl_loop.c $(pkg-config --cflags --libs moonrl) -o rl_loop && ./rl_loop
 *
 * It prints the success rate of each step and exits with 0 when the last five steps average
 * at least 0.8 (and 1 on any error).
 */
#include <moonrl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPTS = 8, GROUP = 8, EPISODES = PROMPTS * GROUP, STEPS = 30, CAPACITY = 32 };

/* ---- the environment ---- */
typedef struct {
  double reward;
} vowel_env;

static mrl_status vowel_reset(void *self, const char **obs, size_t *len) {
  ((vowel_env *)self)->reward = 0.0;
  *obs = "say a vowel";
  *len = strlen(*obs);
  return MRL_OK;
}

static mrl_status vowel_step(void *self, const char *action, size_t len, const char **obs,
                             size_t *obs_len, double *reward, int *done) {
  vowel_env *v = self;
  v->reward = len > 0 && strchr("aeiou", action[0]) && action[0] != '\0' ? 1.0 : 0.0;
  *reward = v->reward;
  *obs = NULL; /* the episode is over: no next observation */
  *obs_len = 0;
  *done = 1;
  return MRL_OK;
}

static int fail(mrl_engine *e, const char *what, mrl_status st) {
  fprintf(stderr, "%s failed: %s (%s)\n", what, mrl_strerror(st), mrl_engine_last_error(e));
  return 1;
}

#define TRY(call)                                 \
  do {                                            \
    if ((st = (call)) != MRL_OK) {                \
      rc = fail(e, #call, st);                    \
      goto done;                                  \
    }                                             \
  } while (0)

int main(void) {
  mrl_engine *e = NULL;
  mrl_model *m = NULL;
  mrl_tokenizer *tok = NULL;
  mrl_rollout *ro = NULL;
  mrl_status st;
  int rc = 1;
  if ((st = mrl_engine_new(&e))) {
    fprintf(stderr, "mrl_engine_new failed: %s\n", mrl_strerror(st));
    return 1;
  }

  mrl_model_config cfg;
  mrl_model_config_default(&cfg); /* byte vocabulary */
  cfg.dim = 32;
  cfg.layers = 1;
  cfg.heads = 2;
  cfg.kv_heads = 2;
  cfg.ffn = 64;
  cfg.ctx = CAPACITY;
  TRY(mrl_model_new(e, &cfg, 3, &m));
  TRY(mrl_tokenizer_bytes(e, &tok));
  TRY(mrl_rollout_new(m, EPISODES, CAPACITY, &ro));

  vowel_env envs[EPISODES];
  mrl_env vt[EPISODES], *pv[EPISODES];
  for (int i = 0; i < EPISODES; i++) {
    vt[i] = (mrl_env){.self = &envs[i], .reset = vowel_reset, .step = vowel_step};
    pv[i] = &vt[i];
  }
  mrl_rollout_config rcfg;
  memset(&rcfg, 0, sizeof rcfg);
  rcfg.sampling.temperature = 1.0f;
  rcfg.max_turns = 1;
  rcfg.max_turn_tokens = 1; /* one byte is the whole reply */
  rcfg.chat = MRL_CHAT_AUTO;

  /* the batch, right-padded to CAPACITY steps: tokens, lengths, and per cell (the position that
   * predicts the next token) its target, behaviour log-prob, mask, reward and the gradients */
  static int32_t tokens[EPISODES * CAPACITY], targets[EPISODES * CAPACITY];
  static int32_t lengths[EPISODES];
  static float old_lp[EPISODES * CAPACITY], lp[EPISODES * CAPACITY], mask[EPISODES * CAPACITY];
  static float rewards[EPISODES * CAPACITY], adv[EPISODES * CAPACITY], dlogp[EPISODES * CAPACITY];
  int64_t group[EPISODES];
  uint64_t seeds[EPISODES];
  mrl_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f};
  double last5 = 0.0;

  for (int step = 1; step <= STEPS; step++) {
    for (int i = 0; i < EPISODES; i++) {
      seeds[i] = (uint64_t)step * 1000003u + (uint64_t)i;
      group[i] = i / GROUP; /* the GROUP episodes of one prompt are compared with each other */
    }
    TRY(mrl_rollout_run(ro, tok, EPISODES, pv, seeds, &rcfg));
    memset(tokens, 0, sizeof tokens);
    memset(rewards, 0, sizeof rewards);
    double success = 0.0;
    for (int i = 0; i < EPISODES; i++) {
      int len = mrl_rollout_length(ro, i);
      const int32_t *t = mrl_rollout_tokens(ro, i);
      const float *mk = mrl_rollout_mask(ro, i), *blp = mrl_rollout_logprobs(ro, i);
      lengths[i] = len;
      for (int p = 0; p < CAPACITY; p++) {
        int c = i * CAPACITY + p;
        int sampled = p + 1 < len && mk[p + 1] != 0.0f; /* cell p predicts token p + 1 */
        tokens[c] = p < len ? t[p] : 0;
        targets[c] = sampled ? t[p + 1] : -1;
        mask[c] = sampled ? 1.0f : 0.0f;
        old_lp[c] = sampled ? blp[p + 1] : 0.0f;
      }
      rewards[i * CAPACITY] = (float)envs[i].reward; /* the row's score */
      success += envs[i].reward / EPISODES;
    }
    TRY(mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, rewards, mask, group, EPISODES, CAPACITY, adv));
    /* one PPO step on the whole batch: the current log-probs, the loss's gradient, backward */
    TRY(mrl_model_forward(m, tokens, lengths, EPISODES, CAPACITY));
    TRY(mrl_model_score(m, targets, lp, NULL));
    mrl_pg_stats stats;
    memset(dlogp, 0, sizeof dlogp);
    TRY(mrl_policy_loss(e, MRL_PG_PPO, NULL, lp, old_lp, adv, mask, NULL, EPISODES, CAPACITY,
                        &stats, NULL, NULL, NULL, dlogp));
    TRY(mrl_model_zero_grad(m));
    TRY(mrl_model_backward(m, targets, dlogp, NULL));
    TRY(mrl_model_clip_grad(m, 1.0, NULL));
    TRY(mrl_model_adamw_step(m, &opt));
    printf("step %2d  success %.3f  loss %+.4f\n", step, success, stats.loss);
    if (step > STEPS - 5) last5 += success / 5;
  }
  printf("success over the last 5 steps: %.3f\n", last5);
  rc = last5 >= 0.8 ? 0 : 1;

done:
  mrl_rollout_free(ro);
  mrl_tokenizer_free(tok);
  mrl_model_free(m);
  mrl_engine_free(e);
  return rc;
}
