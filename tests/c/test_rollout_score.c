/* test_rollout_score.c - mrl_rollout_score, forced-continuation scoring: the scores equal the
 * model's full forward over the context and the forced tokens, an episode scored after its prompt
 * and after every turn (start and turn hooks) decodes exactly as the same episode unscored, the
 * scores of a batch equal those of each episode alone, information gain from the scores against
 * a hand computation from full forwards, bad arguments and allocation failures change nothing. */
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the environment: the observation names the turn; done after `turns` steps ---- */

typedef struct {
  int step, turns;
  char obs[32];
} count_env;

static mrl_status count_reset(void *self, const char **obs, size_t *len) {
  count_env *c = self;
  c->step = 0;
  snprintf(c->obs, sizeof c->obs, "turn 0");
  *obs = c->obs;
  *len = strlen(c->obs);
  return MRL_OK;
}

static mrl_status count_step(void *self, const char *action, size_t len, const char **obs,
                             size_t *obs_len, double *reward, int *done) {
  count_env *c = self;
  (void)action;
  *reward = (double)(len % 3);
  c->step++;
  snprintf(c->obs, sizeof c->obs, "turn %d", c->step);
  *obs = c->obs;
  *obs_len = strlen(c->obs);
  *done = c->step >= c->turns;
  return MRL_OK;
}

/* ---- fixtures ---- */

enum { MAXE = 6, CAP = 200, CTX = 256, FORCED_MAX = 16, MAXPT = 8 };

typedef struct {
  mrl_engine *e;
  mrl_model *m;
  mrl_tokenizer *tok;
  mrl_rollout *r;
  count_env env[MAXE];
  mrl_env vt[MAXE], *pv[MAXE], *clones[MAXE];
  uint64_t seeds[MAXE];
} setup;

static void make_setup(setup *s, mrl_engine *e) {
  memset(s, 0, sizeof *s);
  s->e = e;
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.dim = 16;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn = 32;
  c.ctx = CTX;
  MUST(mrl_model_new(s->e, &c, 11, &s->m));
  MUST(mrl_tokenizer_bytes(s->e, &s->tok));
  MUST(mrl_rollout_new(s->m, MAXE, CAP, &s->r));
}

static void free_setup(setup *s) {
  mrl_rollout_free(s->r);
  mrl_tokenizer_free(s->tok);
  mrl_model_free(s->m);
  CHECK(mrl_engine_memory_used(s->e) == 0);
  mrl_engine_free(s->e);
}

static void fresh_envs(setup *s, int n, int turns) {
  for (int i = 0; i < n; i++) {
    s->env[i] = (count_env){.turns = turns};
    s->vt[i] = (mrl_env){.self = &s->env[i], .reset = count_reset, .step = count_step};
    s->pv[i] = &s->vt[i];
    s->seeds[i] = 100 + (uint64_t)i;
  }
}

static mrl_rollout_config config(void) {
  mrl_rollout_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.sampling.temperature = 1.0f;
  cfg.max_turns = 4;
  cfg.max_turn_tokens = 12;
  cfg.chat = MRL_CHAT_AUTO;
  cfg.batch_invariant = 1;
  return cfg;
}

/* The forced continuation of episode e: "answer <e>" and the end-of-turn token. */
static int forced_tokens(int e, int32_t *out) {
  char text[16];
  int n = snprintf(text, sizeof text, "answer %d", e);
  for (int i = 0; i < n; i++) out[i] = (unsigned char)text[i];
  out[n] = MRL_TOKEN_END;
  return n + 1;
}

/* What the hooks saw: per episode and scoring point, the context and the scores. */
typedef struct {
  int points[MAXE];
  int ctx_len[MAXE][MAXPT];
  int32_t ctx[MAXE][MAXPT][CAP];
  int count[MAXE][MAXPT];
  float scores[MAXE][MAXPT][FORCED_MAX];
  bool on; /* score at all */
} scorer;

static mrl_status score_now(void *user, mrl_rollout *r, int e) {
  scorer *sc = user;
  if (!sc->on || mrl_rollout_end(r, e) != MRL_END_NONE) return MRL_OK;
  int k = sc->points[e];
  if (k >= MAXPT) return MRL_OK;
  int32_t f[FORCED_MAX];
  int n = forced_tokens(e, f);
  mrl_status st = mrl_rollout_score(r, 1, &e, f, &n, sc->scores[e][k]);
  if (st) return st;
  sc->ctx_len[e][k] = mrl_rollout_length(r, e);
  memcpy(sc->ctx[e][k], mrl_rollout_tokens(r, e), sizeof(int32_t) * (size_t)sc->ctx_len[e][k]);
  sc->count[e][k] = n;
  sc->points[e]++;
  return MRL_OK;
}

static mrl_status run_scored(setup *s, int n, scorer *sc) {
  fresh_envs(s, n, 3);
  mrl_rollout_config cfg = config();
  mrl_rollout_hooks h;
  memset(&h, 0, sizeof h);
  h.user = sc;
  h.start = score_now;
  h.turn = score_now;
  int total = 0;
  return mrl_rollout_run_hooks(s->r, s->tok, n, s->pv, s->seeds, &cfg, &h, s->clones, &total);
}

/* log p(forced[j] | ctx, forced[0..j)) for every j by one full forward over the concatenation:
 * the reference, computed without the KV cache. */
static void full_forward(mrl_model *m, const int32_t *ctx, int len, const int32_t *forced, int n,
                         float *out) {
  int T = len + n;
  int32_t *seq = malloc(sizeof(int32_t) * (size_t)T), *targets = malloc(sizeof(int32_t) * (size_t)T);
  float *lp = malloc(sizeof(float) * (size_t)T);
  if (!seq || !targets || !lp) abort();
  memcpy(seq, ctx, sizeof(int32_t) * (size_t)len);
  memcpy(seq + len, forced, sizeof(int32_t) * (size_t)n);
  for (int i = 0; i < T; i++) targets[i] = i >= len - 1 && i + 1 < T ? seq[i + 1] : -1;
  int32_t lengths[1] = {T};
  MUST(mrl_model_forward(m, seq, lengths, 1, T));
  MUST(mrl_model_score(m, targets, lp, NULL));
  for (int j = 0; j < n; j++) out[j] = lp[len - 1 + j];
  free(seq);
  free(targets);
  free(lp);
}

/* ---- tests ---- */

static void test_scores_equal_full_forward(void) {
  setup s;
  make_setup(&s, new_engine());
  scorer *sc = calloc(1, sizeof *sc);
  sc->on = true;
  MUST(run_scored(&s, 4, sc));
  double worst = 0.0;
  int points = 0;
  for (int e = 0; e < 4; e++) {
    CHECKF(sc->points[e] == 1 + mrl_rollout_turn_count(s.r, e) - 1,
           "episode %d: scored %d times, took %d turns", e, sc->points[e],
           mrl_rollout_turn_count(s.r, e));
    CHECK(sc->ctx_len[e][0] < sc->ctx_len[e][1]); /* the prompt alone, then after a turn */
    for (int k = 0; k < sc->points[e]; k++) {
      int32_t f[FORCED_MAX];
      int n = forced_tokens(e, f);
      float want[FORCED_MAX];
      full_forward(s.m, sc->ctx[e][k], sc->ctx_len[e][k], f, n, want);
      for (int j = 0; j < n; j++) {
        double d = fabs((double)want[j] - (double)sc->scores[e][k][j]);
        if (d > worst) worst = d;
        CHECK(sc->scores[e][k][j] < 0.0f);
      }
      points++;
    }
  }
  check_note("%d scoring points against full forwards: max |difference| %.3g", points, worst);
  CHECK(points >= 12);
  CHECK(worst < 1e-4);
  free(sc);
  free_setup(&s);
}

static void test_scoring_leaves_episodes_as_they_were(void) {
  setup s;
  make_setup(&s, new_engine());
  scorer *sc = calloc(1, sizeof *sc);
  episode *want = malloc(sizeof(episode) * MAXE), got;
  sc->on = false;
  MUST(run_scored(&s, 5, sc));
  for (int e = 0; e < 5; e++) copy_episode(s.r, e, &want[e]);
  sc->on = true;
  MUST(run_scored(&s, 5, sc));
  for (int e = 0; e < 5; e++) {
    copy_episode(s.r, e, &got);
    CHECKF(memcmp(&got, &want[e], sizeof got) == 0,
           "episode %d scored at every turn differs from it unscored", e);
    CHECK(sc->points[e] >= 3);
  }
  /* after the run: scoring twice gives the same floats, and the record stays */
  int eps[2] = {1, 3}, counts[2];
  int32_t f[2 * FORCED_MAX];
  counts[0] = forced_tokens(1, f);
  counts[1] = forced_tokens(3, f + counts[0]);
  float a[2 * FORCED_MAX], b[2 * FORCED_MAX];
  MUST(mrl_rollout_score(s.r, 2, eps, f, counts, a));
  MUST(mrl_rollout_score(s.r, 2, eps, f, counts, b));
  CHECK(memcmp(a, b, sizeof(float) * (size_t)(counts[0] + counts[1])) == 0);
  copy_episode(s.r, 3, &got);
  CHECK(memcmp(&got, &want[3], sizeof got) == 0);
  /* a batch scores each episode as it scores alone (to rounding: outside a batch-invariant run
   * the rows share one matrix product) */
  float alone[FORCED_MAX];
  MUST(mrl_rollout_score(s.r, 1, &eps[1], f + counts[0], &counts[1], alone));
  double worst = 0.0;
  for (int j = 0; j < counts[1]; j++) worst = fmax(worst, fabs(alone[j] - a[counts[0] + j]));
  CHECKF(worst < 1e-5, "episode 3 alone vs in a batch: %g", worst);
  /* the scores are those of the full forward after the episode's end too */
  float ref[FORCED_MAX];
  full_forward(s.m, mrl_rollout_tokens(s.r, 3), mrl_rollout_length(s.r, 3), f + counts[0],
               counts[1], ref);
  worst = 0.0;
  for (int j = 0; j < counts[1]; j++) worst = fmax(worst, fabs(ref[j] - alone[j]));
  CHECKF(worst < 1e-4, "after the run: %g from the full forward", worst);
  free(want);
  free(sc);
  free_setup(&s);
}

/* IG_t = f(c_t) - f(c_{t-1}), f the mean log-probability of the answer's tokens (and exp of it
 * for the probability kind), by hand from full forwards, against mrl_information_gain on the
 * scores. */
static void test_information_gain_by_hand(void) {
  setup s;
  make_setup(&s, new_engine());
  scorer *sc = calloc(1, sizeof *sc);
  sc->on = true;
  MUST(run_scored(&s, 2, sc));
  for (int e = 0; e < 2; e++) {
    int K = sc->points[e];
    double f[MAXPT], ig_lp[MAXPT], ig_p[MAXPT];
    for (int k = 0; k < K; k++) {
      double sum = 0.0;
      for (int j = 0; j < sc->count[e][k]; j++) sum += sc->scores[e][k][j];
      f[k] = sum / sc->count[e][k];
    }
    MUST(mrl_information_gain(s.e, f, K, ig_lp, ig_p));
    for (int t = 1; t < K; t++) {
      int32_t forced[FORCED_MAX];
      int n = forced_tokens(e, forced);
      float before[FORCED_MAX], after[FORCED_MAX];
      full_forward(s.m, sc->ctx[e][t - 1], sc->ctx_len[e][t - 1], forced, n, before);
      full_forward(s.m, sc->ctx[e][t], sc->ctx_len[e][t], forced, n, after);
      double mb = 0.0, ma = 0.0;
      for (int j = 0; j < n; j++) {
        mb += before[j] / (double)n;
        ma += after[j] / (double)n;
      }
      CHECKF(fabs(ig_lp[t - 1] - (ma - mb)) < 1e-4, "episode %d turn %d: log-prob IG %g vs %g",
             e, t, ig_lp[t - 1], ma - mb);
      CHECKF(fabs(ig_p[t - 1] - (exp(ma) - exp(mb))) < 1e-5, "episode %d turn %d: prob IG", e,
             t);
    }
  }
  free(sc);
  free_setup(&s);
}

static mrl_status failing_start(void *user, mrl_rollout *r, int e) {
  (void)user;
  int32_t t = 300; /* outside the byte vocabulary */
  int one = 1;
  float lp;
  return e == 1 ? mrl_rollout_score(r, 1, &e, &t, &one, &lp) : MRL_OK;
}

static void test_bad_arguments(void) {
  setup s;
  make_setup(&s, new_engine());
  int32_t prompt[CAP];
  for (int i = 0; i < CAP; i++) prompt[i] = 'a' + i % 26;
  MUST(mrl_rollout_start(s.r, 0, prompt, 10, 1));
  MUST(mrl_rollout_start(s.r, 1, prompt, CAP - 1, 2));
  int32_t f[FORCED_MAX];
  int n = forced_tokens(0, f);
  float ref[FORCED_MAX], lp[FORCED_MAX];
  int e0 = 0, e1 = 1, e5 = 5, em = -1, dup[2] = {0, 0}, twice[2] = {n, n}, zero = 0, two = 2;
  MUST(mrl_rollout_score(s.r, 1, &e0, f, &n, ref));
  float sentinel[FORCED_MAX];
  for (int j = 0; j < FORCED_MAX; j++) lp[j] = sentinel[j] = -123.0f;
  CHECK_FAILS(s.e, MRL_ERR_RANGE, "episode -1", mrl_rollout_score(s.r, 1, &em, f, &n, lp));
  CHECK_FAILS(s.e, MRL_ERR_RANGE, "episode 6", mrl_rollout_score(s.r, 1, (int[]){6}, f, &n, lp));
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "episode 5", mrl_rollout_score(s.r, 1, &e5, f, &n, lp));
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "listed twice", mrl_rollout_score(s.r, 2, dup, f, twice, lp));
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "counts[0]", mrl_rollout_score(s.r, 1, &e0, f, &zero, lp));
  CHECK_FAILS(s.e, MRL_ERR_RANGE, "episode 0",
              mrl_rollout_score(s.r, 1, &e0, (int32_t[]){'a', 999}, &two, lp));
  CHECK_FAILS(s.e, MRL_ERR_RANGE, "episode 1 has no room", mrl_rollout_score(s.r, 1, &e1, f, &n, lp));
  CHECK_FAILS(s.e, MRL_ERR_NULL, "logprobs", mrl_rollout_score(s.r, 1, &e0, f, &n, NULL));
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "negative", mrl_rollout_score(s.r, -1, &e0, f, &n, lp));
  CHECK(memcmp(lp, sentinel, sizeof lp) == 0); /* nothing written on failure */
  /* two tokens fit in the last free place: only the first is appended */
  MUST(mrl_rollout_score(s.r, 1, &e1, f, &two, lp));
  /* a turn under way: episode 1 fills up after one token, episode 0 is mid-turn */
  int both[2] = {0, 1}, ended[2], reasons[2], n_ended;
  mrl_sampling greedy = {0};
  MUST(mrl_rollout_generate(s.r, 2, both, &greedy, NULL, 0, 8, ended, reasons, &n_ended));
  CHECK(n_ended == 1 && ended[0] == 1 && reasons[0] == MRL_TURN_FULL);
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "episode 0 is in the middle of a turn",
              mrl_rollout_score(s.r, 1, &e0, f, &n, lp));
  CHECK_FAILS(s.e, MRL_ERR_RANGE, "episode 1 has no room", mrl_rollout_score(s.r, 1, &e1, f, &n, lp));
  /* a failure from inside a start hook fails the run, naming the hook and the episode */
  fresh_envs(&s, 2, 2);
  mrl_rollout_config cfg = config();
  mrl_rollout_hooks h;
  memset(&h, 0, sizeof h);
  int total;
  MUST(mrl_rollout_run_hooks(s.r, s.tok, 2, s.pv, s.seeds, &cfg, &h, s.clones, &total)); /* warm */
  fresh_envs(&s, 2, 2);
  h.start = failing_start;
  CHECK_FAILS(s.e, MRL_ERR_RANGE, "start hook (episode 1) failed: mrl_rollout_score: token 300",
              mrl_rollout_run_hooks(s.r, s.tok, 2, s.pv, s.seeds, &cfg, &h, s.clones, &total));
  free_setup(&s);
}

static void test_score_alloc_failures(void) {
  counting_alloc c;
  setup s;
  make_setup(&s, new_counting_engine(&c));
  int32_t prompt[24];
  for (int i = 0; i < 24; i++) prompt[i] = 'a' + i;
  MUST(mrl_rollout_start(s.r, 0, prompt, 24, 1));
  MUST(mrl_rollout_start(s.r, 1, prompt, 12, 2));
  int eps[2] = {0, 1}, counts[2];
  int32_t f[2 * FORCED_MAX];
  counts[0] = forced_tokens(0, f);
  counts[1] = forced_tokens(17, f + counts[0]);
  float want[2 * FORCED_MAX], got[2 * FORCED_MAX];
  MUST(mrl_rollout_score(s.r, 2, eps, f, counts, want));
  MUST(mrl_rollout_score(s.r, 2, eps, f, counts, want));
  size_t used = mrl_engine_memory_used(s.e);
  long fails = 0;
  for (long at = 0;; at++) {
    mrl_engine_clear_error(s.e);
    counting_alloc_arm(&c, at);
    mrl_status st = mrl_rollout_score(s.r, 2, eps, f, counts, got);
    counting_alloc_arm(&c, -1);
    if (st == MRL_OK && c.requests <= at) break;
    if (st == MRL_OK) continue;
    CHECKF(*mrl_engine_last_error(s.e) != '\0', "request %ld: no message", at);
    CHECKF(mrl_engine_memory_used(s.e) == used, "request %ld: memory kept", at);
    MUST(mrl_rollout_score(s.r, 2, eps, f, counts, got));
    CHECKF(memcmp(got, want, sizeof(float) * (size_t)(counts[0] + counts[1])) == 0,
           "the scores after request %ld failed differ", at);
    fails++;
  }
  check_note("mrl_rollout_score: %ld allocations, each failure handled", fails);
  CHECK(fails >= 5);
  free_setup(&s);
  CHECK(c.live == 0 && c.bad_frees == 0);
}

static const test_case tests[] = {
    {"scores_equal_full_forward", test_scores_equal_full_forward},
    {"scoring_leaves_episodes_as_they_were", test_scoring_leaves_episodes_as_they_were},
    {"information_gain_by_hand", test_information_gain_by_hand},
    {"bad_arguments", test_bad_arguments},
    {"score_alloc_failures", test_score_alloc_failures},
    {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
