/* test_rollout.c - multi-turn rollouts with an example C environment (the mrl_env vtable): the
 * loss mask covers exactly the sampled tokens, recorded log-probabilities equal a fresh forward
 * pass, the same seeds give the same episodes, observations follow the chat template, an
 * environment error ends only its episode, turn/turn-length/capacity limits, forks, errors. */
#include "lua_internal.h"
#include "model.h"
#include "support.h"

#include <lualib.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the example environment: "say a digit" for a few turns ----
 * Each turn the observation names a digit; an action that contains it earns 1. After `turns`
 * steps the episode is done. fail_at >= 0 makes step number fail_at return an error; nan_at
 * makes it return a NaN reward (inf_at: +infinity); clone_fails makes clone() fail. */
typedef struct {
  int digit, step, turns, fail_at, nan_at, inf_at;
  bool clone_fails;
  char obs[64];
} digit_env;

static mrl_status digit_reset(void *self, const char **obs, size_t *len) {
  digit_env *d = self;
  d->step = 0;
  snprintf(d->obs, sizeof d->obs, "say %d", d->digit);
  *obs = d->obs;
  *len = strlen(d->obs);
  return MRL_OK;
}

static mrl_status digit_step(void *self, const char *action, size_t len, const char **obs,
                             size_t *obs_len, double *reward, int *done) {
  digit_env *d = self;
  if (d->step == d->fail_at) return MRL_ERR_INVALID;
  char want = (char)('0' + d->digit);
  *reward = memchr(action, want, len) ? 1.0 : 0.0;
  if (d->step == d->nan_at) *reward = NAN;
  if (d->step == d->inf_at) *reward = INFINITY;
  d->step++;
  d->digit = (d->digit + 3) % 10;
  snprintf(d->obs, sizeof d->obs, "now %d", d->digit);
  *obs = d->obs;
  *obs_len = strlen(d->obs);
  *done = d->step >= d->turns;
  return MRL_OK;
}

static const char *digit_error(void *self) {
  (void)self;
  return "the digit environment broke on purpose";
}

static mrl_status digit_clone(void *self, mrl_env **out);

static mrl_env digit_vtable(digit_env *d) {
  return (mrl_env){.self = d, .reset = digit_reset, .step = digit_step, .error = digit_error,
                   .clone = digit_clone};
}

/* A clone: the vtable and the state in one malloc'd block (free_clone frees it). */
typedef struct {
  mrl_env vt;
  digit_env d;
} digit_clone_box;

static mrl_status digit_clone(void *self, mrl_env **out) {
  digit_env *d = self;
  if (d->clone_fails) return MRL_ERR_INVALID;
  digit_clone_box *b = malloc(sizeof *b);
  if (!b) return MRL_ERR_NOMEM;
  b->d = *d;
  b->vt = digit_vtable(&b->d);
  *out = &b->vt;
  return MRL_OK;
}

/* ---- fixtures ---- */

typedef struct {
  mrl_engine *e;
  mrl_model *m;
  mrl_tokenizer *tok;
  mrl_rollout *r;
} setup;

static setup make_setup(int episodes, int capacity) {
  setup s;
  s.e = new_engine();
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.dim = 32;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn = 64;
  c.ctx = 256;
  MUST(mrl_model_new(s.e, &c, 5, &s.m));
  MUST(mrl_tokenizer_bytes(s.e, &s.tok));
  MUST(mrl_rollout_new(s.m, episodes, capacity, &s.r));
  return s;
}

static void free_setup(setup *s) {
  mrl_rollout_free(s->r);
  mrl_tokenizer_free(s->tok);
  mrl_model_free(s->m);
  CHECK(mrl_engine_memory_used(s->e) == 0);
  mrl_engine_free(s->e);
}

static mrl_rollout_config config(int max_turns, int max_turn_tokens) {
  mrl_rollout_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.sampling.temperature = 1.0f;
  cfg.max_turns = max_turns;
  cfg.max_turn_tokens = max_turn_tokens;
  cfg.chat = MRL_CHAT_AUTO;
  return cfg;
}

enum { N = 4 };

static void run(setup *s, digit_env *envs, const uint64_t *seeds, const mrl_rollout_config *cfg) {
  mrl_env vt[N], *pv[N];
  for (int i = 0; i < N; i++) {
    vt[i] = digit_vtable(&envs[i]);
    pv[i] = &vt[i];
  }
  MUST(mrl_rollout_run(s->r, s->tok, N, pv, seeds, cfg));
}

static digit_env new_digit_env(int digit, int turns) {
  return (digit_env){.digit = digit, .turns = turns, .fail_at = -1, .nan_at = -1, .inf_at = -1};
}

static void default_envs(digit_env *envs) {
  for (int i = 0; i < N; i++) envs[i] = new_digit_env(i, 3);
}

/* Tokens of the byte tokenizer's text. */
static size_t encode(setup *s, const char *text, int32_t *ids, size_t cap) {
  size_t n;
  MUST(mrl_tokenizer_encode(s->tok, text, strlen(text), MRL_ENCODE_SPECIAL, ids, cap, &n));
  return n;
}

static void test_mask_and_template(void) {
  setup s = make_setup(N, 200);
  int cut_turns = 0;
  digit_env envs[N];
  default_envs(envs);
  uint64_t seeds[N] = {1, 2, 3, 4};
  mrl_rollout_config cfg = config(3, 12);
  run(&s, envs, seeds, &cfg);
  for (int e = 0; e < N; e++) {
    int len = mrl_rollout_length(s.r, e);
    const int32_t *t = mrl_rollout_tokens(s.r, e);
    const float *mask = mrl_rollout_mask(s.r, e);
    const int32_t *turn = mrl_rollout_turns(s.r, e);
    int end = mrl_rollout_end(s.r, e), turns = mrl_rollout_turn_count(s.r, e);
    CHECKF(end == MRL_END_DONE || end == MRL_END_MAX_TURNS, "episode %d ended %d", e, end);
    CHECK(turns == 3);
    /* the prompt: <|user|>say D<|end|><|assistant|> */
    char text[64];
    snprintf(text, sizeof text, "<|user|>say %d<|end|><|assistant|>", e);
    int32_t want[64];
    size_t np = encode(&s, text, want, 64);
    CHECK(len > (int)np && memcmp(t, want, np * sizeof(int32_t)) == 0);
    for (size_t i = 0; i < np; i++) CHECK(mask[i] == 0.0f && turn[i] == -1);
    /* then per turn: sampled tokens (mask 1) up to <|end|> or the limit, then, unless the
     * episode is over, the observation <|user|>now D<|end|><|assistant|> (mask 0) */
    int pos = (int)np, digit = e;
    for (int k = 0; k < turns; k++) {
      int start = pos;
      while (pos < len && mask[pos] == 1.0f) {
        CHECK(turn[pos] == k);
        pos++;
      }
      CHECKF(pos > start, "episode %d turn %d sampled nothing", e, k);
      CHECK(pos - start <= 12);
      bool cut = t[pos - 1] != MRL_TOKEN_END;
      CHECK(!cut || pos - start == 12);
      digit = (digit + 3) % 10;
      if (k + 1 == turns) break;
      if (cut) { /* a turn cut by the limit is closed by the template's end token, not sampled */
        CHECKF(t[pos] == MRL_TOKEN_END && mask[pos] == 0.0f && turn[pos] == k,
               "episode %d turn %d: a cut turn is not closed", e, k);
        cut_turns++;
        pos++;
      }
      snprintf(text, sizeof text, "<|user|>now %d<|end|><|assistant|>", digit);
      size_t no = encode(&s, text, want, 64);
      CHECKF(memcmp(t + pos, want, no * sizeof(int32_t)) == 0, "episode %d observation %d", e, k);
      for (size_t i = 0; i < no; i++) CHECK(mask[pos + (int)i] == 0.0f && turn[pos + (int)i] == k);
      pos += (int)no;
    }
    CHECKF(pos == len, "episode %d: %d tokens accounted for, %d recorded", e, pos, len);
  }
  check_note("%d of the turns were cut by the token limit", cut_turns);
  CHECK(cut_turns > 0); /* a random policy rarely says <|end|> within 12 tokens */
  free_setup(&s);
}

/* The behaviour log-probabilities recorded while sampling equal a fresh forward pass. */
static void test_logprobs_match_forward(void) {
  setup s = make_setup(N, 200);
  digit_env envs[N];
  default_envs(envs);
  uint64_t seeds[N] = {7, 8, 9, 10};
  mrl_rollout_config cfg = config(3, 10);
  run(&s, envs, seeds, &cfg);
  double worst = 0.0;
  int checked = 0;
  for (int e = 0; e < N; e++) {
    int len = mrl_rollout_length(s.r, e);
    const int32_t *t = mrl_rollout_tokens(s.r, e);
    const float *mask = mrl_rollout_mask(s.r, e), *lp = mrl_rollout_logprobs(s.r, e);
    int32_t *targets = malloc(sizeof(int32_t) * (size_t)len);
    float *fresh = malloc(sizeof(float) * (size_t)len);
    for (int i = 0; i < len; i++) targets[i] = i + 1 < len && mask[i + 1] == 1.0f ? t[i + 1] : -1;
    int32_t n = len;
    MUST(mrl_model_forward(s.m, t, &n, 1, len));
    MUST(mrl_model_score(s.m, targets, fresh, NULL));
    for (int i = 0; i + 1 < len; i++)
      if (targets[i] >= 0) {
        worst = fmax(worst, fabs(fresh[i] - lp[i + 1]));
        checked++;
      } else {
        CHECK(lp[i + 1] == 0.0f);
      }
    free(targets);
    free(fresh);
  }
  check_note("recorded vs fresh log-probabilities over %d tokens: max |difference| %.2e", checked,
             worst);
  CHECK(checked > 0 && worst < 1e-4);
  free_setup(&s);
}

static void copy_record(setup *s, int e, int32_t *buf, int *len) {
  *len = mrl_rollout_length(s->r, e);
  memcpy(buf, mrl_rollout_tokens(s->r, e), sizeof(int32_t) * (size_t)*len);
}

static void test_same_seed_same_episodes(void) {
  setup s = make_setup(N, 200);
  digit_env envs[N];
  uint64_t seeds[N] = {21, 22, 23, 24};
  mrl_rollout_config cfg = config(3, 10);
  int32_t first[N][200];
  int len1[N];
  default_envs(envs);
  run(&s, envs, seeds, &cfg);
  for (int e = 0; e < N; e++) copy_record(&s, e, first[e], &len1[e]);
  default_envs(envs);
  run(&s, envs, seeds, &cfg);
  for (int e = 0; e < N; e++) {
    int32_t again[200];
    int len2;
    copy_record(&s, e, again, &len2);
    CHECK(len1[e] == len2 && memcmp(first[e], again, sizeof(int32_t) * (size_t)len2) == 0);
  }
  /* another seed for episode 0 changes only episode 0 */
  seeds[0] = 99;
  default_envs(envs);
  run(&s, envs, seeds, &cfg);
  int32_t other[200];
  int len3;
  copy_record(&s, 0, other, &len3);
  CHECK(len3 != len1[0] || memcmp(first[0], other, sizeof(int32_t) * (size_t)len3) != 0);
  copy_record(&s, 1, other, &len3);
  CHECK(len3 == len1[1] && memcmp(first[1], other, sizeof(int32_t) * (size_t)len3) == 0);
  free_setup(&s);
}

static void test_env_error_ends_one_episode(void) {
  setup s = make_setup(N, 200);
  digit_env envs[N];
  default_envs(envs);
  envs[2].fail_at = 1;
  uint64_t seeds[N] = {1, 2, 3, 4};
  mrl_rollout_config cfg = config(3, 10);
  run(&s, envs, seeds, &cfg);
  for (int e = 0; e < N; e++) {
    if (e == 2) {
      CHECK(mrl_rollout_end(s.r, e) == MRL_END_ENV_ERROR);
      CHECK(mrl_rollout_turn_count(s.r, e) == 2);
      const char *msg = mrl_rollout_error(s.r, e);
      CHECKF(msg && strstr(msg, "step: the digit environment broke on purpose"), "%s", msg);
    } else {
      CHECK(mrl_rollout_end(s.r, e) == MRL_END_DONE);
      CHECK(mrl_rollout_turn_count(s.r, e) == 3);
      CHECK(mrl_rollout_error(s.r, e) == NULL);
    }
  }
  free_setup(&s);
}

/* Many episodes whose observations arrive in the same round (more tokens than the driver's first
 * buffer): each episode gets its own observation, intact. */
static void test_many_observations(void) {
  enum { M = 64 };
  setup s = make_setup(M, 128);
  digit_env envs[M];
  mrl_env vt[M], *pv[M];
  uint64_t seeds[M];
  for (int i = 0; i < M; i++) {
    envs[i] = new_digit_env(i % 10, 2);
    vt[i] = digit_vtable(&envs[i]);
    pv[i] = &vt[i];
    seeds[i] = (uint64_t)i + 1;
  }
  mrl_rollout_config cfg = config(2, 2);
  MUST(mrl_rollout_run(s.r, s.tok, M, pv, seeds, &cfg));
  char text[2048], want[32];
  for (int e = 0; e < M; e++) {
    size_t n;
    int len = mrl_rollout_length(s.r, e);
    MUST(mrl_tokenizer_decode(s.tok, mrl_rollout_tokens(s.r, e), (size_t)len, text, sizeof text, &n));
    if (n >= sizeof text) n = sizeof text - 1;
    snprintf(want, sizeof want, "now %d", (e % 10 + 3) % 10);
    size_t w = strlen(want);
    bool found = false; /* the sampled bytes may hold NULs: no strstr */
    for (size_t i = 0; i + w <= n && !found; i++) found = memcmp(text + i, want, w) == 0;
    CHECKF(found, "episode %d has no \"%s\"", e, want);
    CHECK(mrl_rollout_end(s.r, e) == MRL_END_DONE);
  }
  free_setup(&s);
}

static void test_limits(void) {
  setup s = make_setup(N, 60);
  digit_env envs[N];
  default_envs(envs);
  for (int i = 0; i < N; i++) envs[i].turns = 100; /* never done on its own */
  uint64_t seeds[N] = {5, 6, 7, 8};
  mrl_rollout_config cfg = config(2, 4); /* 2 turns of at most 4 tokens */
  run(&s, envs, seeds, &cfg);
  for (int e = 0; e < N; e++) {
    CHECK(mrl_rollout_end(s.r, e) == MRL_END_MAX_TURNS);
    CHECK(mrl_rollout_turn_count(s.r, e) == 2);
  }
  /* a capacity the second observation cannot fit in */
  cfg = config(50, 20);
  run(&s, envs, seeds, &cfg);
  for (int e = 0; e < N; e++) {
    CHECK(mrl_rollout_end(s.r, e) == MRL_END_BUDGET);
    CHECK(mrl_rollout_length(s.r, e) <= 60);
  }
  free_setup(&s);
}

/* A prompt or an observation that fills the capacity exactly leaves no room to sample: the
 * episode ends out of budget (it used to stay running, and the next decoding step failed the
 * whole run with "episode N is full"). */
static void test_exact_capacity(void) {
  digit_env envs[N];
  uint64_t seeds[N] = {5, 6, 7, 8};
  mrl_rollout_config cfg = config(2, 4);
  int prompt[N], first[N]; /* the prompt's length, and the record's after turn 1's observation */
  {
    setup s = make_setup(N, 200);
    default_envs(envs);
    run(&s, envs, seeds, &cfg);
    for (int e = 0; e < N; e++) {
      const int32_t *turn = mrl_rollout_turns(s.r, e);
      int len = mrl_rollout_length(s.r, e), n = 0;
      while (n < len && turn[n] < 0) n++;
      prompt[e] = n;
      while (n < len && turn[n] < 1) n++;
      first[e] = n;
      CHECK(mrl_rollout_turn_count(s.r, e) == 2);
    }
    free_setup(&s);
  }
  CHECKF(prompt[0] == prompt[1] && first[0] > prompt[0], "prompts %d %d, after turn 1: %d", prompt[0],
         prompt[1], first[0]);
  setup s = make_setup(N, prompt[0]);
  default_envs(envs);
  run(&s, envs, seeds, &cfg);
  for (int e = 0; e < N; e++) {
    CHECK(mrl_rollout_end(s.r, e) == MRL_END_BUDGET);
    CHECK(mrl_rollout_turn_count(s.r, e) == 0);
  }
  free_setup(&s);
  /* episode 0's first observation ends exactly at the capacity */
  s = make_setup(N, first[0]);
  default_envs(envs);
  run(&s, envs, seeds, &cfg);
  CHECKF(mrl_rollout_end(s.r, 0) == MRL_END_BUDGET && mrl_rollout_turn_count(s.r, 0) == 1,
         "episode 0: end %d after %d turns", mrl_rollout_end(s.r, 0), mrl_rollout_turn_count(s.r, 0));
  CHECK(mrl_rollout_length(s.r, 0) < first[0]); /* the observation that did not fit is not in */
  free_setup(&s);
}

/* A fork continues from the same state: same prefix, own stream. */
static void test_fork(void) {
  setup s = make_setup(3, 100);
  int32_t prompt[5] = {MRL_TOKEN_USER, 'h', 'i', MRL_TOKEN_END, MRL_TOKEN_ASSISTANT};
  MUST(mrl_rollout_start(s.r, 0, prompt, 5, 1));
  mrl_sampling sampling = {.temperature = 1.0f};
  int32_t stop = MRL_TOKEN_END;
  int ended[3], reasons[3], n_ended, ep0 = 0;
  MUST(mrl_rollout_generate(s.r, 1, &ep0, &sampling, &stop, 1, 6, ended, reasons, &n_ended));
  int base = mrl_rollout_length(s.r, 0);
  MUST(mrl_rollout_fork(s.r, 0, 1, 11));
  MUST(mrl_rollout_fork(s.r, 0, 2, 11));
  CHECK(mrl_rollout_length(s.r, 1) == base);
  CHECK(memcmp(mrl_rollout_tokens(s.r, 1), mrl_rollout_tokens(s.r, 0), sizeof(int32_t) * (size_t)base) == 0);
  int both[2] = {1, 2};
  int32_t obs[3] = {MRL_TOKEN_USER, 'x', MRL_TOKEN_END};
  int counts[2] = {3, 3};
  int32_t obs2[6];
  memcpy(obs2, obs, sizeof obs);
  memcpy(obs2 + 3, obs, sizeof obs);
  MUST(mrl_rollout_observe(s.r, 2, both, obs2, counts));
  /* same seed, same state: the two forks continue identically, so they end their turns together */
  MUST(mrl_rollout_generate(s.r, 2, both, &sampling, &stop, 1, 6, ended, reasons, &n_ended));
  CHECK(n_ended == 2);
  int l1 = mrl_rollout_length(s.r, 1), l2 = mrl_rollout_length(s.r, 2);
  CHECK(l1 == l2 && memcmp(mrl_rollout_tokens(s.r, 1), mrl_rollout_tokens(s.r, 2), sizeof(int32_t) * (size_t)l1) == 0);
  free_setup(&s);
}

/* A tree: two roots run one turn and pause with their observation in; each is forked into a
 * second episode (environment copied); all four resume. Branches share their root's first turn
 * and observation token for token, then go their own ways; pausing and resuming misuse fails. */
static void test_tree(void) {
  setup s = make_setup(N, 200);
  digit_env envs[N];
  default_envs(envs);
  for (int i = 0; i < N; i++) envs[i].turns = 3;
  mrl_env vt[N], *pv[N];
  for (int i = 0; i < N; i++) {
    vt[i] = digit_vtable(&envs[i]);
    pv[i] = &vt[i];
  }
  uint64_t seeds[N] = {31, 32, 0, 0};
  mrl_rollout_config cfg = config(3, 10);
  cfg.pause_turn = 1;
  MUST(mrl_rollout_run(s.r, s.tok, 2, pv, seeds, &cfg));
  int trunk[2];
  for (int e = 0; e < 2; e++) {
    CHECK(mrl_rollout_end(s.r, e) == MRL_END_PAUSED);
    CHECK(mrl_rollout_turn_count(s.r, e) == 1);
    trunk[e] = mrl_rollout_length(s.r, e);
    /* the trunk ends with the observation and the assistant tag */
    CHECK(mrl_rollout_tokens(s.r, e)[trunk[e] - 1] == MRL_TOKEN_ASSISTANT);
  }
  /* misuse: resuming an episode that never ran */
  cfg.pause_turn = 0;
  cfg.resume = 1;
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "episode 2 was never started",
              mrl_rollout_run(s.r, s.tok, 3, pv, seeds, &cfg));
  for (int e = 0; e < 2; e++) {
    MUST(mrl_rollout_fork(s.r, e, e + 2, 100 + (uint64_t)e));
    envs[e + 2] = envs[e]; /* the environment's clone */
  }
  MUST(mrl_rollout_run(s.r, s.tok, N, pv, seeds, &cfg));
  for (int e = 0; e < N; e++) {
    CHECKF(mrl_rollout_end(s.r, e) == MRL_END_DONE, "episode %d ended %d", e, mrl_rollout_end(s.r, e));
    CHECK(mrl_rollout_turn_count(s.r, e) == 3);
  }
  for (int e = 0; e < 2; e++) {
    const int32_t *a = mrl_rollout_tokens(s.r, e), *b = mrl_rollout_tokens(s.r, e + 2);
    int la = mrl_rollout_length(s.r, e), lb = mrl_rollout_length(s.r, e + 2);
    CHECK(la > trunk[e] && lb > trunk[e]);
    CHECK(memcmp(a, b, sizeof(int32_t) * (size_t)trunk[e]) == 0);
    CHECK(mrl_rollout_rewards(s.r, e)[0] == mrl_rollout_rewards(s.r, e + 2)[0]);
    /* the continuations differ (own streams): 20+ sampled bytes each */
    CHECKF(la != lb || memcmp(a, b, sizeof(int32_t) * (size_t)la) != 0, "branch %d copies its root", e);
    /* every episode saw the same observations: the environment went on from the copy */
    char text[512];
    size_t n;
    MUST(mrl_tokenizer_decode(s.tok, b, (size_t)lb, text, sizeof text, &n));
    char want[16];
    snprintf(want, sizeof want, "now %d", (e + 6) % 10);
    bool found = false;
    for (size_t i = 0; i + strlen(want) <= n && i + strlen(want) <= sizeof text && !found; i++)
      found = memcmp(text + i, want, strlen(want)) == 0;
    CHECKF(found, "branch %d lacks its second observation \"%s\"", e, want);
  }
  /* the logged-probabilities of a branch equal a fresh forward pass as well */
  int len = mrl_rollout_length(s.r, 3);
  const int32_t *t = mrl_rollout_tokens(s.r, 3);
  const float *mask = mrl_rollout_mask(s.r, 3), *lp = mrl_rollout_logprobs(s.r, 3);
  int32_t targets[200];
  float fresh[200];
  for (int i = 0; i < len; i++) targets[i] = i + 1 < len && mask[i + 1] == 1.0f ? t[i + 1] : -1;
  int32_t nn = len;
  MUST(mrl_model_forward(s.m, t, &nn, 1, len));
  MUST(mrl_model_score(s.m, targets, fresh, NULL));
  double worst = 0.0;
  for (int i = 0; i + 1 < len; i++)
    if (targets[i] >= 0) worst = fmax(worst, fabs(fresh[i] - lp[i + 1]));
  CHECKF(worst < 1e-4, "branch log-probabilities off by %.2e", worst);
  cfg.pause_turn = -1;
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "pause_turn is -1", mrl_rollout_run(s.r, s.tok, 2, pv, seeds, &cfg));
  free_setup(&s);
}

static void test_errors(void) {
  setup s = make_setup(2, 50);
  mrl_engine *e = s.e;
  mrl_rollout *r = NULL;
  CHECK_FAILS(e, MRL_ERR_INVALID, "capacity <= ctx", mrl_rollout_new(s.m, 2, 1000, &r));
  int32_t p[2] = {1, 2};
  CHECK_FAILS(e, MRL_ERR_RANGE, "episode 2 is outside 0..1", mrl_rollout_start(s.r, 2, p, 2, 0));
  CHECK_FAILS(e, MRL_ERR_INVALID, "at least one token", mrl_rollout_start(s.r, 0, p, 0, 0));
  mrl_sampling sampling = {.temperature = 1.0f};
  int ended[2], reasons[2], n_ended, ep = 1;
  CHECK_FAILS(e, MRL_ERR_INVALID, "episode 1 was not started",
              mrl_rollout_generate(s.r, 1, &ep, &sampling, NULL, 0, 4, ended, reasons, &n_ended));
  digit_env d = new_digit_env(1, 1);
  mrl_env vt = digit_vtable(&d), *pv = &vt;
  uint64_t seed = 1;
  mrl_rollout_config cfg = config(0, 4);
  CHECK_FAILS(e, MRL_ERR_INVALID, "max_turns", mrl_rollout_run(s.r, s.tok, 1, &pv, &seed, &cfg));
  cfg = config(2, 4);
  CHECK_FAILS(e, MRL_ERR_INVALID, "n is 3", mrl_rollout_run(s.r, s.tok, 3, &pv, &seed, &cfg));
  mrl_env broken = {.self = &d, .step = digit_step}, *pb = &broken;
  CHECK_FAILS(e, MRL_ERR_NULL, "envs[0] lacks reset", mrl_rollout_run(s.r, s.tok, 1, &pb, &seed, &cfg));
  CHECK(mrl_rollout_length(s.r, 1) == -1 && mrl_rollout_tokens(s.r, 7) == NULL);
  free_setup(&s);
}

/* ---- rewards that are not finite ---- */

/* A NaN or infinite reward is an environment error of its episode only, naming the reward; the
 * turn earns 0. */
static void test_nonfinite_reward_ends_one_episode(void) {
  setup s = make_setup(N, 200);
  digit_env envs[N];
  default_envs(envs);
  envs[1].nan_at = 1;
  envs[3].inf_at = 0;
  uint64_t seeds[N] = {1, 2, 3, 4};
  mrl_rollout_config cfg = config(3, 10);
  run(&s, envs, seeds, &cfg);
  for (int e = 0; e < N; e++) {
    int end = mrl_rollout_end(s.r, e), turns = mrl_rollout_turn_count(s.r, e);
    if (e == 1 || e == 3) {
      CHECKF(end == MRL_END_ENV_ERROR, "episode %d ended %d", e, end);
      CHECK(turns == (e == 1 ? 2 : 1));
      const char *msg = mrl_rollout_error(s.r, e);
      CHECKF(msg && strstr(msg, "reward") && strstr(msg, e == 1 ? "nan" : "inf"), "%s", msg);
      CHECK(mrl_rollout_rewards(s.r, e)[turns - 1] == 0.0);
    } else {
      CHECK(end == MRL_END_DONE && turns == 3);
    }
  }
  free_setup(&s);
}

/* ---- tree rollouts in C (mrl_rollout_run_tree) ---- */

enum { ROOTS = 2, K = 3, BRANCHES = ROOTS * (K - 1), TREE = ROOTS * K };

static void tree_envs(digit_env *envs, mrl_env *vt, mrl_env **pv) {
  for (int i = 0; i < ROOTS; i++) {
    envs[i] = new_digit_env(i + 4, 3);
    vt[i] = digit_vtable(&envs[i]);
    pv[i] = &vt[i];
  }
}

typedef struct {
  int len[TREE], end[TREE], turns[TREE];
  int32_t tokens[TREE][200];
  float logprobs[TREE][200];
} tree_record;

static void take_tree(setup *s, tree_record *t) {
  memset(t, 0, sizeof *t);
  for (int e = 0; e < TREE; e++) {
    t->len[e] = mrl_rollout_length(s->r, e);
    t->end[e] = mrl_rollout_end(s->r, e);
    t->turns[e] = mrl_rollout_turn_count(s->r, e);
    if (t->len[e] > 0) {
      memcpy(t->tokens[e], mrl_rollout_tokens(s->r, e), sizeof(int32_t) * (size_t)t->len[e]);
      memcpy(t->logprobs[e], mrl_rollout_logprobs(s->r, e), sizeof(float) * (size_t)t->len[e]);
    }
  }
}

static bool same_tree(const tree_record *a, const tree_record *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

/* The layout is the documented one: the tree equals the same run done by hand with pause_turn,
 * mrl_rollout_fork into episode n + i * (k - 1) + j - 1 seeded mrl_rollout_branch_seed(seed, j)
 * and resume, episode for episode and token for token; every branch has its clone. */
static void test_tree_layout(void) {
  setup s = make_setup(TREE, 200);
  digit_env envs[ROOTS];
  mrl_env vt[ROOTS], *pv[ROOTS], *clones[BRANCHES];
  tree_envs(envs, vt, pv);
  uint64_t seeds[ROOTS] = {51, 52};
  mrl_rollout_config cfg = config(3, 10);
  MUST(mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 1, K, clones));
  tree_record tree;
  take_tree(&s, &tree);
  for (int b = 0; b < BRANCHES; b++) CHECKF(clones[b] != NULL, "branch %d has no clone", b);
  for (int e = 0; e < TREE; e++)
    CHECKF(tree.end[e] == MRL_END_DONE && tree.turns[e] == 3, "episode %d: end %d, %d turns", e,
           tree.end[e], tree.turns[e]);
  free_clones(clones, BRANCHES);

  /* by hand */
  digit_env copies[TREE];
  mrl_env hv[TREE], *hp[TREE];
  tree_envs(copies, hv, hp);
  cfg.pause_turn = 1;
  MUST(mrl_rollout_run(s.r, s.tok, ROOTS, hp, seeds, &cfg));
  for (int i = 0; i < ROOTS; i++)
    for (int j = 1; j < K; j++) {
      int dst = ROOTS + i * (K - 1) + (j - 1);
      MUST(mrl_rollout_fork(s.r, i, dst, mrl_rollout_branch_seed(seeds[i], j)));
      copies[dst] = copies[i];
      hv[dst] = digit_vtable(&copies[dst]);
      hp[dst] = &hv[dst];
    }
  cfg.pause_turn = 0;
  cfg.resume = 1;
  MUST(mrl_rollout_run(s.r, s.tok, TREE, hp, seeds, &cfg));
  tree_record hand;
  take_tree(&s, &hand);
  CHECK(same_tree(&tree, &hand));
  /* branches share their root's trunk and then differ from it */
  int differ = 0;
  for (int i = 0; i < ROOTS; i++)
    for (int j = 1; j < K; j++) {
      int dst = ROOTS + i * (K - 1) + (j - 1);
      CHECK(memcmp(tree.tokens[dst], tree.tokens[i], 20 * sizeof(int32_t)) == 0);
      differ += tree.len[dst] != tree.len[i] ||
                memcmp(tree.tokens[dst], tree.tokens[i], sizeof(int32_t) * (size_t)tree.len[i]);
    }
  CHECK(differ == BRANCHES);
  /* the documented seed formula (splitmix64 of seed + (j + 1) * golden gamma) */
  uint64_t z = 51 + 0x9E3779B97F4A7C15ull * 2;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  CHECK(mrl_rollout_branch_seed(51, 1) == (z ^ (z >> 31)));
  free_setup(&s);
}

/* The same seeds give the same tree; another seed for root 0 changes root 0's episodes only. */
static void test_tree_deterministic(void) {
  setup s = make_setup(TREE, 200);
  digit_env envs[ROOTS];
  mrl_env vt[ROOTS], *pv[ROOTS], *clones[BRANCHES];
  uint64_t seeds[ROOTS] = {61, 62};
  mrl_rollout_config cfg = config(3, 10);
  tree_record a, b;
  tree_envs(envs, vt, pv);
  MUST(mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 2, K, clones));
  free_clones(clones, BRANCHES);
  take_tree(&s, &a);
  tree_envs(envs, vt, pv);
  MUST(mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 2, K, clones));
  free_clones(clones, BRANCHES);
  take_tree(&s, &b);
  CHECK(same_tree(&a, &b));
  seeds[0] = 600;
  tree_envs(envs, vt, pv);
  MUST(mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 2, K, clones));
  free_clones(clones, BRANCHES);
  take_tree(&s, &b);
  int root0[] = {0, 2, 3}, root1[] = {1, 4, 5};
  for (int i = 0; i < 3; i++) {
    int e = root0[i], f = root1[i];
    CHECKF(a.len[e] != b.len[e] || memcmp(a.tokens[e], b.tokens[e], sizeof a.tokens[e]) != 0,
           "episode %d did not change with its root's seed", e);
    CHECKF(a.len[f] == b.len[f] && memcmp(a.tokens[f], b.tokens[f], sizeof a.tokens[f]) == 0,
           "episode %d changed with another root's seed", f);
  }
  free_setup(&s);
}

/* A clone that fails ends only its branch, with the environment's message; a root that ended
 * before the branch turn is copied as it ended and cloned for no branch. */
static void test_tree_clone_fails_ends_one_branch(void) {
  setup s = make_setup(TREE, 200);
  digit_env envs[ROOTS];
  mrl_env vt[ROOTS], *pv[ROOTS], *clones[BRANCHES];
  tree_envs(envs, vt, pv);
  envs[0].clone_fails = true;
  uint64_t seeds[ROOTS] = {71, 72};
  mrl_rollout_config cfg = config(3, 10);
  MUST(mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 1, K, clones));
  CHECK(mrl_rollout_end(s.r, 0) == MRL_END_DONE && mrl_rollout_turn_count(s.r, 0) == 3);
  for (int j = 1; j < K; j++) {
    int e = ROOTS + (j - 1);
    CHECK(clones[j - 1] == NULL);
    CHECK(mrl_rollout_end(s.r, e) == MRL_END_ENV_ERROR);
    CHECK(mrl_rollout_turn_count(s.r, e) == 1);
    const char *msg = mrl_rollout_error(s.r, e);
    CHECKF(msg && strcmp(msg, "clone: the digit environment broke on purpose") == 0, "%s", msg);
  }
  for (int e = 1; e < TREE; e++)
    if (e != 2 && e != 3) CHECK(mrl_rollout_end(s.r, e) == MRL_END_DONE);
  free_clones(clones, BRANCHES);

  /* root 1 is done after one turn, before the branch turn 2 */
  tree_envs(envs, vt, pv);
  envs[1].turns = 1;
  envs[1].clone_fails = true; /* never asked */
  MUST(mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 2, K, clones));
  int root_len = mrl_rollout_length(s.r, 1);
  for (int j = 1; j < K; j++) {
    int e = ROOTS + (K - 1) + (j - 1);
    CHECK(clones[(K - 1) + (j - 1)] == NULL && clones[j - 1] != NULL);
    CHECK(mrl_rollout_end(s.r, e) == MRL_END_DONE && mrl_rollout_turn_count(s.r, e) == 1);
    CHECK(mrl_rollout_length(s.r, e) == root_len);
    CHECK(memcmp(mrl_rollout_tokens(s.r, e), mrl_rollout_tokens(s.r, 1),
                 sizeof(int32_t) * (size_t)root_len) == 0);
  }
  free_clones(clones, BRANCHES);
  free_setup(&s);
}

/* Misuse is refused before anything runs, with a message and no memory kept. */
static void test_tree_errors(void) {
  setup s = make_setup(TREE, 200);
  mrl_engine *e = s.e;
  digit_env envs[ROOTS];
  mrl_env vt[ROOTS], *pv[ROOTS], *clones[BRANCHES];
  tree_envs(envs, vt, pv);
  vt[1].clone = NULL;
  uint64_t seeds[ROOTS] = {1, 2};
  mrl_rollout_config cfg = config(3, 10);
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "envs[1] has no clone()",
              mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 1, K, clones));
  CHECK(mrl_rollout_length(s.r, 0) == -1); /* nothing ran */
  vt[1].clone = digit_clone;
  CHECK_FAILS(e, MRL_ERR_INVALID, "2 roots x 4 need 8 episodes, the rollout has 6",
              mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 1, 4, clones));
  CHECK_FAILS(e, MRL_ERR_INVALID, "k >= 2",
              mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 1, 1, clones));
  CHECK_FAILS(e, MRL_ERR_INVALID, "tree_turn >= 1",
              mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 0, K, clones));
  CHECK_FAILS(e, MRL_ERR_NULL, "clones is NULL",
              mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 1, K, NULL));
  cfg.pause_turn = 2;
  CHECK_FAILS(e, MRL_ERR_INVALID, "pause_turn",
              mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 1, K, clones));
  cfg = config(0, 10);
  CHECK_FAILS(e, MRL_ERR_INVALID, "max_turns",
              mrl_rollout_run_tree(s.r, s.tok, ROOTS, pv, seeds, &cfg, 1, K, clones));
  CHECK(mrl_rollout_run_tree(NULL, s.tok, ROOTS, pv, seeds, &cfg, 1, K, clones) == MRL_ERR_NULL);
  CHECK(mrl_rollout_length(s.r, 0) == -1);
  free_setup(&s);
}

/* ---- generation with stop ids and stop strings (mrl_model_generate) ---- */

enum { GEN_MAX = 12 };

typedef struct {
  int32_t tokens[3 * GEN_MAX];
  float logprobs[3 * GEN_MAX];
  int lengths[3], reasons[3];
} gen_out;

static const int32_t gen_prompts[] = {MRL_TOKEN_USER, 'h', 'i', MRL_TOKEN_END, MRL_TOKEN_ASSISTANT,
                                      MRL_TOKEN_USER, 'y', MRL_TOKEN_END, MRL_TOKEN_ASSISTANT,
                                      'a', 'b', 'c'};
static const int gen_lengths[] = {5, 4, 3};

static mrl_generate_options gen_options(float temperature, int max_new, uint64_t seed) {
  mrl_generate_options o;
  memset(&o, 0, sizeof o);
  o.sampling.temperature = temperature;
  o.max_new_tokens = max_new;
  o.seed = seed;
  return o;
}

static void generate(setup *s, int batch, const int32_t *prompts, const int *lengths,
                     const mrl_generate_options *o, gen_out *g) {
  memset(g, 0, sizeof *g);
  MUST(mrl_model_generate(s->m, batch, prompts, lengths, o, g->tokens, g->logprobs, g->lengths,
                          g->reasons));
}

/* Each sequence samples with seed + b: a sequence's tokens are the same alone or in a batch, also
 * where seed + b wraps around 2^64. */
static void test_generate_seeds_per_sequence(void) {
  setup s = make_setup(1, 16);
  gen_out all, alone, again;
  mrl_generate_options o = gen_options(1.0f, GEN_MAX, 500);
  generate(&s, 3, gen_prompts, gen_lengths, &o, &all);
  generate(&s, 3, gen_prompts, gen_lengths, &o, &again);
  CHECK(memcmp(&all, &again, sizeof all) == 0);
  o.seed = 501;
  generate(&s, 1, gen_prompts + 5, gen_lengths + 1, &o, &alone);
  CHECK(alone.lengths[0] == all.lengths[1] && alone.reasons[0] == all.reasons[1]);
  CHECK(memcmp(alone.tokens, all.tokens + GEN_MAX, sizeof(int32_t) * (size_t)alone.lengths[0]) == 0);
  CHECK(memcmp(alone.logprobs, all.logprobs + GEN_MAX, sizeof(float) * (size_t)alone.lengths[0]) == 0);
  o.seed = UINT64_MAX; /* sequence 1 samples with 0 */
  generate(&s, 3, gen_prompts, gen_lengths, &o, &all);
  o.seed = 0;
  generate(&s, 1, gen_prompts + 5, gen_lengths + 1, &o, &alone);
  CHECK(memcmp(alone.tokens, all.tokens + GEN_MAX, sizeof(int32_t) * (size_t)alone.lengths[0]) == 0);
  /* a cache of one's own gives the same */
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(s.m, 4, 64, &c));
  o = gen_options(1.0f, GEN_MAX, 500);
  generate(&s, 3, gen_prompts, gen_lengths, &o, &all);
  o.cache = c;
  generate(&s, 3, gen_prompts, gen_lengths, &o, &again);
  CHECK(memcmp(&all, &again, sizeof all) == 0);
  mrl_kv_cache_free(c);
  free_setup(&s);
}

/* Greedy decoding: the free continuation, then the same cut by a stop id, by a stop string
 * spanning two tokens, by max_new_tokens, and by the end of the context. */
static void test_generate_stops(void) {
  setup s = make_setup(1, 16);
  gen_out free_run, g;
  mrl_generate_options o = gen_options(0.0f, GEN_MAX, 1);
  generate(&s, 1, gen_prompts + 9, gen_lengths + 2, &o, &free_run);
  CHECK(free_run.lengths[0] == GEN_MAX && free_run.reasons[0] == MRL_TURN_LENGTH);
  /* the logprobs are the behaviour log-probabilities a forward pass gives */
  int32_t seq[3 + GEN_MAX], targets[3 + GEN_MAX];
  float fresh[3 + GEN_MAX];
  memcpy(seq, gen_prompts + 9, 3 * sizeof(int32_t));
  memcpy(seq + 3, free_run.tokens, GEN_MAX * sizeof(int32_t));
  for (int i = 0; i < 3 + GEN_MAX; i++) targets[i] = i >= 2 && i + 1 < 3 + GEN_MAX ? seq[i + 1] : -1;
  int32_t len = 3 + GEN_MAX;
  MUST(mrl_model_forward(s.m, seq, &len, 1, len));
  MUST(mrl_model_score(s.m, targets, fresh, NULL));
  for (int i = 0; i + 1 < GEN_MAX; i++)
    CHECKF(fabs(fresh[2 + i] - free_run.logprobs[i]) < 1e-4, "token %d: %g vs %g", i,
           fresh[2 + i], free_run.logprobs[i]);

  /* stop ids: the first occurrence of token 4's id ends the sequence there */
  int32_t stop_id = free_run.tokens[4];
  int first = 0;
  while (free_run.tokens[first] != stop_id) first++;
  o.stop = &stop_id;
  o.n_stop = 1;
  generate(&s, 1, gen_prompts + 9, gen_lengths + 2, &o, &g);
  CHECK(g.lengths[0] == first + 1 && g.reasons[0] == MRL_TURN_STOP);
  CHECK(memcmp(g.tokens, free_run.tokens, sizeof(int32_t) * (size_t)(first + 1)) == 0);
  o.stop = NULL;
  o.n_stop = 0;

  /* a stop string made of the last byte of token 5 and the first of token 6 */
  char text[GEN_MAX][32];
  size_t tlen[GEN_MAX];
  for (int i = 0; i < GEN_MAX; i++)
    MUST(mrl_tokenizer_decode(s.tok, &free_run.tokens[i], 1, text[i], sizeof text[i], &tlen[i]));
  char stop[2] = {text[5][tlen[5] - 1], text[6][0]};
  const char *stops[2] = {"never-seen", stop};
  size_t stop_lens[2] = {10, 2};
  /* where the text first contains it: token 6 at the latest */
  char acc[GEN_MAX * 32];
  size_t used = 0;
  int want = -1;
  for (int i = 0; i < GEN_MAX && want < 0; i++) {
    memcpy(acc + used, text[i], tlen[i]);
    used += tlen[i];
    for (size_t at = 0; at + 2 <= used && want < 0; at++)
      if (memcmp(acc + at, stop, 2) == 0) want = i;
  }
  CHECK(want >= 0 && want <= 6);
  o.stop_strings = stops;
  o.stop_lengths = stop_lens;
  o.n_stop_strings = 2;
  o.tokenizer = s.tok;
  generate(&s, 1, gen_prompts + 9, gen_lengths + 2, &o, &g);
  CHECKF(g.lengths[0] == want + 1 && g.reasons[0] == MRL_TURN_STOP, "stopped after %d tokens, want %d",
         g.lengths[0], want + 1);
  o.n_stop_strings = 0;

  /* max_new_tokens */
  o.max_new_tokens = 3;
  generate(&s, 1, gen_prompts + 9, gen_lengths + 2, &o, &g);
  CHECK(g.lengths[0] == 3 && g.reasons[0] == MRL_TURN_LENGTH);
  CHECK(memcmp(g.tokens, free_run.tokens, 3 * sizeof(int32_t)) == 0);

  /* the context (256): a prompt of 253 tokens gets 4 (the last one is not appended) */
  static int32_t longp[253];
  for (int i = 0; i < 253; i++) longp[i] = 'a' + i % 26;
  int longn = 253;
  o.max_new_tokens = GEN_MAX;
  generate(&s, 1, longp, &longn, &o, &g);
  CHECKF(g.lengths[0] == 4 && g.reasons[0] == MRL_TURN_FULL, "%d tokens, reason %d", g.lengths[0],
         g.reasons[0]);
  free_setup(&s);
}

/* Bad arguments fail with a status and a message, keep no memory and write no output. */
static void test_generate_errors(void) {
  setup s = make_setup(1, 16);
  mrl_engine *e = s.e;
  gen_out g;
  memset(&g, 0x55, sizeof g);
  gen_out before = g;
  mrl_generate_options o = gen_options(1.0f, 4, 1);
  /* a first call grows the model's own scratch, which it keeps */
  MUST(mrl_model_generate(s.m, 3, gen_prompts, gen_lengths, &o, g.tokens, g.logprobs, g.lengths,
                          g.reasons));
  memset(&g, 0x55, sizeof g);
#define GEN(batch_, prompts_, lengths_) \
  mrl_model_generate(s.m, batch_, prompts_, lengths_, &o, g.tokens, g.logprobs, g.lengths, g.reasons)
  CHECK_FAILS(e, MRL_ERR_INVALID, "batch is 0", GEN(0, gen_prompts, gen_lengths));
  CHECK_FAILS(e, MRL_ERR_NULL, "prompts is NULL", GEN(1, NULL, gen_lengths));
  CHECK_FAILS(e, MRL_ERR_NULL, "reasons is NULL",
              mrl_model_generate(s.m, 1, gen_prompts, gen_lengths, &o, g.tokens, NULL, g.lengths, NULL));
  int zero = 0, huge = 300;
  CHECK_FAILS(e, MRL_ERR_RANGE, "prompt 0 has 0 tokens", GEN(1, gen_prompts, &zero));
  CHECK_FAILS(e, MRL_ERR_RANGE, "prompt 0 has 300 tokens", GEN(1, gen_prompts, &huge));
  int32_t bad_ids[2] = {1, 9999};
  int two = 2;
  CHECK_FAILS(e, MRL_ERR_RANGE, "9999", GEN(1, bad_ids, &two));
  o.max_new_tokens = 0;
  CHECK_FAILS(e, MRL_ERR_INVALID, "max_new_tokens is 0", GEN(1, gen_prompts, gen_lengths));
  o = gen_options(-1.0f, 4, 1);
  CHECK_FAILS(e, MRL_ERR_INVALID, "temperature", GEN(1, gen_prompts, gen_lengths));
  o = gen_options(1.0f, 4, 1);
  int32_t stop = 264;
  o.stop = &stop;
  o.n_stop = 1;
  CHECK_FAILS(e, MRL_ERR_RANGE, "stop[0] is 264", GEN(1, gen_prompts, gen_lengths));
  o.stop = NULL;
  CHECK_FAILS(e, MRL_ERR_NULL, "stop NULL", GEN(1, gen_prompts, gen_lengths));
  o.n_stop = 0;
  const char *strs[1] = {"x"};
  size_t lens[1] = {1};
  o.stop_strings = strs;
  o.stop_lengths = lens;
  o.n_stop_strings = 1;
  CHECK_FAILS(e, MRL_ERR_NULL, "the tokenizer", GEN(1, gen_prompts, gen_lengths));
  o.tokenizer = s.tok;
  lens[0] = 0;
  CHECK_FAILS(e, MRL_ERR_INVALID, "stop_strings[0] is empty", GEN(1, gen_prompts, gen_lengths));
  /* a cache of another shape: too few slots */
  lens[0] = 1;
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(s.m, 1, 64, &c));
  o.cache = c;
  CHECK_FAILS(e, MRL_ERR_RANGE, NULL, GEN(3, gen_prompts, gen_lengths));
  mrl_kv_cache_free(c);
#undef GEN
  CHECK(mrl_model_generate(NULL, 1, gen_prompts, gen_lengths, &o, g.tokens, g.logprobs, g.lengths,
                           g.reasons) == MRL_ERR_NULL);
  CHECK(memcmp(&g, &before, sizeof g) == 0);
  free_setup(&s);
}

/* ---- allocation failures ---- */

typedef struct {
  mrl_engine *e;
  counting_alloc c;
  mrl_model *m;
  mrl_tokenizer *tok;
} counted;

static void make_counted(counted *k) {
  k->e = new_counting_engine(&k->c);
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.dim = 16;
  c.layers = 1;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn = 32;
  c.ctx = 128;
  MUST(mrl_model_new(k->e, &c, 9, &k->m));
  MUST(mrl_tokenizer_bytes(k->e, &k->tok));
}

static void free_counted(counted *k) {
  mrl_tokenizer_free(k->tok);
  mrl_model_free(k->m);
  CHECK(mrl_engine_memory_used(k->e) == 0);
  mrl_engine_free(k->e);
  CHECK(k->c.live == 0 && k->c.bad_frees == 0);
}

/* Checks one failed call of a sweep: a status with a message, and memory back where it was. */
static void check_swept(counted *k, mrl_status st, long fail_at, size_t used, long live,
                        const char *what) {
  CHECKF(st != MRL_OK, "%s: request %ld failed but the call succeeded", what, fail_at);
  CHECKF(*mrl_engine_last_error(k->e) != '\0', "%s: request %ld: no message", what, fail_at);
  CHECKF(mrl_engine_memory_used(k->e) == used && k->c.live == live,
         "%s: request %ld: memory %zu -> %zu, blocks %ld -> %ld", what, fail_at, used,
         mrl_engine_memory_used(k->e), live, k->c.live);
}

/* mrl_rollout_new: every allocation failure returns a status and keeps nothing. */
static void test_rollout_new_alloc_failures(void) {
  counted k;
  make_counted(&k);
  size_t used = mrl_engine_memory_used(k.e);
  long live = k.c.live, fails = 0;
  for (long at = 0;; at++) {
    mrl_rollout *r = NULL;
    mrl_engine_clear_error(k.e);
    counting_alloc_arm(&k.c, at);
    mrl_status st = mrl_rollout_new(k.m, 3, 64, &r);
    counting_alloc_arm(&k.c, -1);
    if (st == MRL_OK && k.c.requests <= at) {
      mrl_rollout_free(r);
      break;
    }
    if (st == MRL_OK) mrl_rollout_free(r);
    check_swept(&k, st, at, used, live, "mrl_rollout_new");
    CHECK(r == NULL);
    fails++;
  }
  check_note("mrl_rollout_new: %ld allocations, each failure handled", fails);
  CHECK(fails > 5);
  free_counted(&k);
}

enum { SWEEP_N = 3 };

typedef struct {
  int len[SWEEP_N * 2], end[SWEEP_N * 2];
  int32_t tokens[SWEEP_N * 2][64];
} sweep_record;

static void take_sweep(mrl_rollout *r, int n, sweep_record *t) {
  memset(t, 0, sizeof *t);
  for (int e = 0; e < n; e++) {
    t->len[e] = mrl_rollout_length(r, e);
    t->end[e] = mrl_rollout_end(r, e);
    if (t->len[e] > 0)
      memcpy(t->tokens[e], mrl_rollout_tokens(r, e), sizeof(int32_t) * (size_t)t->len[e]);
  }
}

/* One run of the sweeps: a plain run of SWEEP_N episodes, or a tree of SWEEP_N roots x 2. */
static mrl_status sweep_run(counted *k, mrl_rollout *r, bool tree) {
  digit_env envs[SWEEP_N];
  mrl_env vt[SWEEP_N], *pv[SWEEP_N], *clones[SWEEP_N];
  uint64_t seeds[SWEEP_N] = {3, 4, 5};
  for (int i = 0; i < SWEEP_N; i++) {
    envs[i] = new_digit_env(i, 3);
    vt[i] = digit_vtable(&envs[i]);
    pv[i] = &vt[i];
  }
  mrl_rollout_config cfg = config(3, 4);
  if (!tree) return mrl_rollout_run(r, k->tok, SWEEP_N, pv, seeds, &cfg);
  mrl_status st = mrl_rollout_run_tree(r, k->tok, SWEEP_N, pv, seeds, &cfg, 1, 2, clones);
  free_clones(clones, SWEEP_N);
  return st;
}

/* mrl_rollout_run and mrl_rollout_run_tree: every allocation failure returns a status with a
 * message and keeps no memory, and the next run gives what a run that never failed gives. */
static void sweep_runs(bool tree) {
  const char *what = tree ? "mrl_rollout_run_tree" : "mrl_rollout_run";
  counted k;
  make_counted(&k);
  mrl_rollout *r = NULL;
  MUST(mrl_rollout_new(k.m, SWEEP_N * 2, 64, &r));
  int n = tree ? SWEEP_N * 2 : SWEEP_N;
  sweep_record want, got;
  MUST(sweep_run(&k, r, tree)); /* warms what is made once (the tokenizer's caches) */
  MUST(sweep_run(&k, r, tree));
  take_sweep(r, n, &want);
  size_t used = mrl_engine_memory_used(k.e);
  long live = k.c.live, fails = 0;
  for (long at = 0;; at++) {
    mrl_engine_clear_error(k.e);
    counting_alloc_arm(&k.c, at);
    mrl_status st = sweep_run(&k, r, tree);
    counting_alloc_arm(&k.c, -1);
    if (st == MRL_OK && k.c.requests <= at) break;
    if (st == MRL_OK) continue; /* a failure the callee absorbed (none is expected) */
    check_swept(&k, st, at, used, live, what);
    MUST(sweep_run(&k, r, tree));
    take_sweep(r, n, &got);
    CHECKF(memcmp(&want, &got, sizeof want) == 0, "%s: the run after request %ld failed differs",
           what, at);
    fails++;
  }
  check_note("%s: %ld allocations, each failure handled", what, fails);
  CHECK(fails > 0);
  mrl_rollout_free(r);
  free_counted(&k);
}

/* The same from cold: a new engine, model and tokenizer for every request that fails, so the
 * allocations made once (the model's scratch, the tokenizer's caches) fail as well. What the
 * objects keep after such a failure is theirs; nothing may be left once they are freed. */
static void sweep_runs_cold(bool tree) {
  const char *what = tree ? "mrl_rollout_run_tree (cold)" : "mrl_rollout_run (cold)";
  int n = tree ? SWEEP_N * 2 : SWEEP_N;
  sweep_record want, got;
  long fails = 0;
  for (long at = -1;; at++) {
    counted k;
    make_counted(&k);
    mrl_rollout *r = NULL;
    MUST(mrl_rollout_new(k.m, SWEEP_N * 2, 64, &r));
    mrl_engine_clear_error(k.e);
    counting_alloc_arm(&k.c, at);
    mrl_status st = sweep_run(&k, r, tree);
    counting_alloc_arm(&k.c, -1);
    bool last = st == MRL_OK && k.c.requests <= at;
    if (at < 0) {
      MUST(st);
      take_sweep(r, n, &want);
    } else if (st != MRL_OK) {
      CHECKF(*mrl_engine_last_error(k.e) != '\0', "%s: request %ld: no message", what, at);
      MUST(sweep_run(&k, r, tree));
      take_sweep(r, n, &got);
      CHECKF(memcmp(&want, &got, sizeof want) == 0, "%s: the run after request %ld failed differs",
             what, at);
      fails++;
    }
    mrl_rollout_free(r);
    free_counted(&k);
    if (last) break;
  }
  check_note("%s: %ld allocations, each failure handled", what, fails);
  CHECK(fails > 0);
}

static void test_rollout_run_alloc_failures(void) {
  sweep_runs(false);
  sweep_runs_cold(false);
}
static void test_rollout_tree_alloc_failures(void) {
  sweep_runs(true);
  sweep_runs_cold(true);
}

/* mrl_model_generate: the same, with stop strings (their scratch) and a cache of its own. */
static void test_generate_alloc_failures(void) {
  counted k;
  make_counted(&k);
  mrl_generate_options o = gen_options(1.0f, GEN_MAX, 8);
  const char *strs[1] = {"zq"};
  size_t lens[1] = {2};
  o.stop_strings = strs;
  o.stop_lengths = lens;
  o.n_stop_strings = 1;
  o.tokenizer = k.tok;
  gen_out want, got;
  memset(&want, 0, sizeof want);
  MUST(mrl_model_generate(k.m, 3, gen_prompts, gen_lengths, &o, want.tokens, want.logprobs,
                          want.lengths, want.reasons));
  size_t used = mrl_engine_memory_used(k.e);
  long live = k.c.live, fails = 0;
  for (long at = 0;; at++) {
    memset(&got, 0, sizeof got);
    mrl_engine_clear_error(k.e);
    counting_alloc_arm(&k.c, at);
    mrl_status st = mrl_model_generate(k.m, 3, gen_prompts, gen_lengths, &o, got.tokens,
                                       got.logprobs, got.lengths, got.reasons);
    counting_alloc_arm(&k.c, -1);
    if (st == MRL_OK && k.c.requests <= at) {
      CHECK(memcmp(&want, &got, sizeof want) == 0);
      break;
    }
    if (st == MRL_OK) continue;
    check_swept(&k, st, at, used, live, "mrl_model_generate");
    gen_out zero;
    memset(&zero, 0, sizeof zero);
    CHECK(memcmp(&got, &zero, sizeof got) == 0); /* nothing written */
    fails++;
  }
  check_note("mrl_model_generate: %ld allocations, each failure handled", fails);
  CHECK(fails > 5);
  free_counted(&k);
}

/* ---- Lua environments under memory errors (the binding's callbacks run under lua_pcall) ----
 * A Lua state whose allocator can be told to fail: the requests to grow a block numbered
 * fail_at and fail_at + 1 after arming fail (two, because Lua retries a failed allocation once
 * after an emergency collection). */
typedef struct {
  long requests, fail_at;
} lua_mem;

static void *lua_mem_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  lua_mem *m = ud;
  if (nsize == 0) {
    free(ptr);
    return NULL;
  }
  if (nsize > (ptr ? osize : 0)) {
    long r = m->requests++;
    if (m->fail_at >= 0 && (r == m->fail_at || r == m->fail_at + 1)) return NULL;
  }
  return realloc(ptr, nsize);
}

/* fail_soon(): from Lua, makes the state's next growing allocation fail. */
static int l_fail_soon(lua_State *L) {
  lua_mem *m = lua_touserdata(L, lua_upvalueindex(1));
  m->requests = 0;
  m->fail_at = 0;
  return 0;
}

/* An environment whose step (for a task with hungry = true) runs out of memory, and a function
 * running a rollout of two episodes (mode "tree": a tree; "hooks": a fork made by on_turn, a
 * gate function and on_action) and returning a digest of the results. */
static const char *const lua_rollout_chunk =
    "local fail_soon = ...\n"
    "local rl = require 'moonrl'\n"
    "local tok = rl.tokenizer.bytes()\n"
    "local m = rl.model.new { vocab = 264, dim = 16, layers = 1, heads = 2, ffn = 32, ctx = 96, seed = 2 }\n"
    "local ro = rl.rollout.new { model = m, episodes = 4, capacity = 96 }\n"
    "local env = { name = 'hungry', tasks = function() return {} end,\n"
    "  new = function() return {\n"
    "    reset = function(self, task) self.task = task return 'go' end,\n"
    "    step = function(self, action)\n"
    "      if self.task.hungry then fail_soon() local t = {} for i = 1, 100 do t[i] = { i } end end\n"
    "      return 'again ' .. #action, 1, false end,\n"
    "    clone = function(self) return { task = self.task, reset = self.reset, step = self.step } end } end }\n"
    "return function(hungry, mode)\n"
    "  local hooks = mode == 'hooks'\n"
    "  local res = ro:run { tokenizer = tok, env = env, tasks = { { hungry = hungry }, {} }, seeds = { 1, 2 },\n"
    "    max_turns = 2, max_turn_tokens = 4, branch = mode == 'tree' and { turn = 1, k = 2 } or nil,\n"
    "    groups = hooks and { 1, 1 } or nil,\n"
    "    on_turn = hooks and function(ep) if ep.turns == 1 and not ep.branch then return 2 end end or nil,\n"
    "    on_action = hooks and function(ep, a, attempt) return attempt == 0 and ep.turns == 2 end or nil,\n"
    "    gate = hooks and { turn = 1, fn = function(g) return #g.episodes > 9 end } or nil }\n"
    "  local out = {}\n"
    "  for i, r in ipairs(res) do\n"
    "    local acts = {}\n"
    "    for k, rec in ipairs(r.record) do acts[k] = rec.action end\n"
    "    out[i] = table.concat({ r['end'], r.turns, r.length, r.return_, tostring(r.error), table.concat(acts, '|') }, ' ')\n"
    "  end\n"
    "  return table.concat(out, '\\n')\n"
    "end\n";

typedef struct {
  mrl_engine *e;
  counting_alloc c;
  lua_mem mem;
  lua_State *L;
} lua_setup;

static void open_lua(lua_setup *s) {
  s->e = new_counting_engine(&s->c);
  s->mem = (lua_mem){0, -1};
  s->L = lua_newstate(lua_mem_alloc, &s->mem);
  if (!s->L) MUST(MRL_ERR_NOMEM);
  luaL_openlibs(s->L);
  mrl__lua_set_engine(s->L, s->e);
  luaL_requiref(s->L, "moonrl.core", mrl__lua_open_core, 0);
  lua_pop(s->L, 1);
  mrl__lua_preload_embedded(s->L);
  if (luaL_loadstring(s->L, lua_rollout_chunk) != LUA_OK) MUST(MRL_ERR_LUA);
  lua_pushlightuserdata(s->L, &s->mem);
  lua_pushcclosure(s->L, l_fail_soon, 1);
  if (lua_pcall(s->L, 1, 1, 0) != LUA_OK) {
    printf("Bail out! %s\n", lua_tostring(s->L, -1));
    exit(1);
  }
}

/* Calls the chunk's function (at the top of the stack) under lua_pcall; returns whether it
 * succeeded, with its digest or message copied to out. */
static bool call_lua_run(lua_setup *s, bool hungry, const char *mode, char *out, size_t cap) {
  lua_pushvalue(s->L, -1);
  lua_pushboolean(s->L, hungry);
  lua_pushstring(s->L, mode);
  bool ok = lua_pcall(s->L, 2, 1, 0) == LUA_OK;
  snprintf(out, cap, "%s", lua_type(s->L, -1) == LUA_TSTRING ? lua_tostring(s->L, -1) : "?");
  lua_pop(s->L, 1);
  return ok;
}

static void close_lua(lua_setup *s) {
  lua_close(s->L);
  CHECK(mrl_engine_memory_used(s->e) == 0);
  mrl_engine_free(s->e);
  CHECK(s->c.live == 0 && s->c.bad_frees == 0);
}

/* A step that runs out of memory ends only its episode ("not enough memory"); the rollout stays
 * usable and gives what it gave before. */
static void test_lua_step_out_of_memory(void) {
  lua_setup s;
  open_lua(&s);
  char before[4096], hungry[4096], after[4096];
  CHECK(call_lua_run(&s, false, "plain", before, sizeof before));
  CHECK(call_lua_run(&s, true, "plain", hungry, sizeof hungry));
  check_note("%.*s", (int)strcspn(hungry, "\n"), hungry);
  CHECKF(strncmp(hungry, "env_error 1 ", 12) == 0 && strstr(hungry, "step: not enough memory"),
         "%s", hungry);
  const char *second = strchr(hungry, '\n'), *want = strchr(before, '\n');
  CHECK(second && want && strcmp(second, want) == 0); /* the other episode, untouched */
  CHECK(call_lua_run(&s, false, "plain", after, sizeof after));
  CHECK(strcmp(before, after) == 0);
  close_lua(&s);
}

/* Out of memory at every allocation of a Lua rollout (plain, tree, with hooks) in turn: ro:run
 * either raises in Lua or ends episodes with errors, never unwinds through the engine (whose
 * memory stays as it was), and the next run gives what a run that never failed gives. */
static void test_lua_rollout_memory_sweep(void) {
  static const char *const modes[] = {"plain", "tree", "hooks"};
  for (int mi = 0; mi < 3; mi++) {
    const char *mode = modes[mi];
    lua_setup s;
    open_lua(&s);
    char want[4096], got[4096];
    CHECK(call_lua_run(&s, false, mode, want, sizeof want));
    lua_gc(s.L, LUA_GCCOLLECT);
    size_t used = mrl_engine_memory_used(s.e);
    long raised = 0, ended = 0, at;
    for (at = 0;; at++) {
      s.mem.requests = 0;
      s.mem.fail_at = at;
      bool ok = call_lua_run(&s, false, mode, got, sizeof got);
      s.mem.fail_at = -1;
      if (ok && s.mem.requests <= at) break;
      if (!ok) raised++;
      else if (strcmp(got, want) != 0) ended++;
      lua_gc(s.L, LUA_GCCOLLECT);
      CHECKF(mrl_engine_memory_used(s.e) == used, "request %ld: engine memory %zu -> %zu", at,
             used, mrl_engine_memory_used(s.e));
      CHECKF(call_lua_run(&s, false, mode, got, sizeof got) && strcmp(got, want) == 0,
             "request %ld: the next run gave %s", at, got);
    }
    check_note("%s: %ld allocations failed in turn: %ld raised from ro:run, %ld ended episodes",
               mode, at, raised, ended);
    CHECK(raised > 0 && ended > 0);
    close_lua(&s);
  }
}

static const test_case tests[] = {{"mask_and_template", test_mask_and_template},
                                   {"many_observations", test_many_observations},
                                  {"logprobs_match_forward", test_logprobs_match_forward},
                                  {"same_seed_same_episodes", test_same_seed_same_episodes},
                                  {"env_error_ends_one_episode", test_env_error_ends_one_episode},
                                  {"limits", test_limits},
                                  {"exact_capacity", test_exact_capacity},
                                  {"fork", test_fork},
                                  {"tree", test_tree},
                                  {"errors", test_errors},
                                  {"nonfinite_reward_ends_one_episode", test_nonfinite_reward_ends_one_episode},
                                  {"tree_layout", test_tree_layout},
                                  {"tree_deterministic", test_tree_deterministic},
                                  {"tree_clone_fails_ends_one_branch", test_tree_clone_fails_ends_one_branch},
                                  {"tree_errors", test_tree_errors},
                                  {"generate_seeds_per_sequence", test_generate_seeds_per_sequence},
                                  {"generate_stops", test_generate_stops},
                                  {"generate_errors", test_generate_errors},
                                  {"rollout_new_alloc_failures", test_rollout_new_alloc_failures},
                                  {"rollout_run_alloc_failures", test_rollout_run_alloc_failures},
                                  {"rollout_tree_alloc_failures", test_rollout_tree_alloc_failures},
                                  {"generate_alloc_failures", test_generate_alloc_failures},
                                  {"lua_step_out_of_memory", test_lua_step_out_of_memory},
                                  {"lua_rollout_memory_sweep", test_lua_rollout_memory_sweep},
                                  {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
