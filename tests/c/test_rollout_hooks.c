/* test_rollout_hooks.c - the hooks of mrl_rollout_run_hooks: forks made in a turn hook equal a
 * tree rollout's branches bit for bit, their outcomes reach the branches hook, dropped forks and
 * cut groups leave the batch, a gated run shares its first K turns with an ungated one, an
 * episode decodes the same alone as in a batch (batch_invariant), the selective gate against
 * hand-computed distances, resampling a turn before the environment sees it, failing hooks and
 * bad arguments, allocation failures. */
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the environment: "count" ----
 * The observation names the turn; the reward is the action's length modulo 2; done after
 * `turns` steps. It keeps the actions it was given (seen), so a test can tell what it saw.
 * fail_at >= 0 makes that step fail; clone_fails makes clone() fail. */
enum { SEEN = 8, SEEN_LEN = 128 };

typedef struct {
  int step, turns, fail_at;
  bool clone_fails;
  int seen;
  char seen_action[SEEN][SEEN_LEN];
  size_t seen_len[SEEN];
  char obs[32];
} count_env;

static mrl_status count_reset(void *self, const char **obs, size_t *len) {
  count_env *c = self;
  c->step = 0;
  c->seen = 0;
  snprintf(c->obs, sizeof c->obs, "turn 0");
  *obs = c->obs;
  *len = strlen(c->obs);
  return MRL_OK;
}

static mrl_status count_step(void *self, const char *action, size_t len, const char **obs,
                             size_t *obs_len, double *reward, int *done) {
  count_env *c = self;
  if (c->step == c->fail_at) return MRL_ERR_INVALID;
  if (c->seen < SEEN) {
    size_t n = len < SEEN_LEN - 1 ? len : SEEN_LEN - 1;
    memcpy(c->seen_action[c->seen], action, n);
    c->seen_len[c->seen] = n;
    c->seen_action[c->seen++][n] = '\0';
  }
  *reward = (double)(len % 2);
  c->step++;
  snprintf(c->obs, sizeof c->obs, "turn %d", c->step);
  *obs = c->obs;
  *obs_len = strlen(c->obs);
  *done = c->step >= c->turns;
  return MRL_OK;
}

static const char *count_error(void *self) {
  (void)self;
  return "the count environment broke on purpose";
}

static mrl_status count_clone(void *self, mrl_env **out);

static mrl_env count_vtable(count_env *c) {
  return (mrl_env){.self = c, .reset = count_reset, .step = count_step, .error = count_error,
                   .clone = count_clone};
}

typedef struct {
  mrl_env vt;
  count_env c;
} count_box;

static mrl_status count_clone(void *self, mrl_env **out) {
  count_env *c = self;
  if (c->clone_fails) return MRL_ERR_INVALID;
  count_box *b = malloc(sizeof *b);
  if (!b) return MRL_ERR_NOMEM;
  b->c = *c;
  b->vt = count_vtable(&b->c);
  *out = &b->vt;
  return MRL_OK;
}

/* ---- fixtures ---- */

enum { MAXE = 24, CAP = 160 };

typedef struct {
  mrl_engine *e;
  mrl_model *m;
  mrl_tokenizer *tok;
  mrl_rollout *r;
  count_env env[MAXE];
  mrl_env vt[MAXE], *pv[MAXE], *clones[MAXE];
  uint64_t seeds[MAXE];
} setup;

static void make_setup(setup *s, mrl_engine *e, int dim) {
  memset(s, 0, sizeof *s);
  s->e = e;
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.dim = dim;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn = 2 * dim;
  c.ctx = CAP;
  MUST(mrl_model_new(s->e, &c, 5, &s->m));
  MUST(mrl_tokenizer_bytes(s->e, &s->tok));
  MUST(mrl_rollout_new(s->m, MAXE, CAP, &s->r));
}

static void free_setup(setup *s) {
  free_clones(s->clones, MAXE);
  mrl_rollout_free(s->r);
  mrl_tokenizer_free(s->tok);
  mrl_model_free(s->m);
  CHECK(mrl_engine_memory_used(s->e) == 0);
  mrl_engine_free(s->e);
}

/* n fresh environments of `turns` steps, seeds base + i. */
static void fresh_envs(setup *s, int n, int turns, uint64_t base) {
  free_clones(s->clones, MAXE);
  for (int i = 0; i < n; i++) {
    s->env[i] = (count_env){.turns = turns, .fail_at = -1};
    s->vt[i] = count_vtable(&s->env[i]);
    s->pv[i] = &s->vt[i];
    s->seeds[i] = base + (uint64_t)i;
  }
}

static mrl_rollout_config config(int max_turns, int max_turn_tokens, float temperature) {
  mrl_rollout_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.sampling.temperature = temperature;
  cfg.max_turns = max_turns;
  cfg.max_turn_tokens = max_turn_tokens;
  cfg.chat = MRL_CHAT_AUTO;
  cfg.batch_invariant = 1;
  return cfg;
}

/* The record length at the end of turn `turns` (the first `turns` turns and their observations:
 * everything before turn index `turns`). */
static int prefix_length(const setup *s, int e, int turns) {
  int len = mrl_rollout_length(s->r, e);
  const int32_t *turn = mrl_rollout_turns(s->r, e);
  int n = 0;
  while (n < len && turn[n] < turns) n++;
  return n;
}

/* ---- forks ---- */

typedef struct {
  int fork_turn, k, flags;
  int first[MAXE];            /* per parent: its first branch, or -1 */
  int reports, report_parent[MAXE], report_turn[MAXE], report_first[MAXE], report_count[MAXE];
  bool all_ended_when_reported;
  mrl_status branch_status;   /* the last mrl_rollout_branch's */
} fork_hooks;

static mrl_status fork_at_turn(void *user, mrl_rollout *r, int e) {
  fork_hooks *f = user;
  int parent;
  mrl_rollout_origin(r, e, &parent, NULL, NULL);
  if (parent >= 0 || mrl_rollout_turn_count(r, e) != f->fork_turn) return MRL_OK;
  f->branch_status = mrl_rollout_branch(r, e, f->k, f->flags, &f->first[e]);
  return f->branch_status;
}

static mrl_status note_branches(void *user, mrl_rollout *r, int parent, int turn, int first,
                                int count) {
  fork_hooks *f = user;
  int i = f->reports++;
  f->report_parent[i] = parent;
  f->report_turn[i] = turn;
  f->report_first[i] = first;
  f->report_count[i] = count;
  bool ended = mrl_rollout_end(r, parent) != MRL_END_NONE;
  for (int b = first; b < first + count; b++) ended = ended && mrl_rollout_end(r, b) != MRL_END_NONE;
  f->all_ended_when_reported = f->all_ended_when_reported && ended;
  return MRL_OK;
}

static fork_hooks new_fork_hooks(int fork_turn, int k, int flags) {
  fork_hooks f;
  memset(&f, 0, sizeof f);
  f.fork_turn = fork_turn;
  f.k = k;
  f.flags = flags;
  f.all_ended_when_reported = true;
  for (int i = 0; i < MAXE; i++) f.first[i] = -1;
  return f;
}

/* Forking every root after turn t into k in a turn hook gives the branches of a tree rollout
 * with tree = {turn = t, k}: the same tokens, log-probabilities, rewards and ends, bit for bit. */
static void test_fork_in_hook_equals_tree(void) {
  enum { ROOTS = 3, K = 3, T = 2 };
  setup s;
  make_setup(&s, new_engine(), 32);
  mrl_rollout_config cfg = config(4, 6, 1.0f);
  fresh_envs(&s, ROOTS, 4, 80);
  MUST(mrl_rollout_run_tree(s.r, s.tok, ROOTS, s.pv, s.seeds, &cfg, T, K, s.clones));
  episode tree[ROOTS * K];
  for (int e = 0; e < ROOTS * K; e++) copy_episode(s.r, e, &tree[e]);

  fresh_envs(&s, ROOTS, 4, 80);
  fork_hooks f = new_fork_hooks(T, K, 0);
  mrl_rollout_hooks hooks = {.user = &f, .turn = fork_at_turn, .branches = note_branches};
  int total = 0;
  MUST(mrl_rollout_run_hooks(s.r, s.tok, ROOTS, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  CHECK(total == ROOTS * K);
  int differ = 0;
  for (int i = 0; i < ROOTS; i++) {
    episode got;
    copy_episode(s.r, i, &got);
    CHECKF(same_episode(&got, &tree[i]), "root %d differs from the tree's", i);
    CHECKF(f.first[i] >= ROOTS, "root %d was not forked", i);
    for (int j = 1; j < K; j++) {
      int b = f.first[i] + j - 1, parent, index, turn;
      copy_episode(s.r, b, &got);
      CHECKF(same_episode(&got, &tree[ROOTS + i * (K - 1) + j - 1]),
             "branch %d of root %d differs from the tree's", j, i);
      CHECK(mrl_rollout_origin(s.r, b, &parent, &index, &turn) == 0);
      CHECK(parent == i && index == j + 1 && turn == T);
      CHECK(s.clones[b] != NULL && mrl_rollout_dropped(s.r, b) == 0);
      differ += got.len != tree[i].len || memcmp(got.tokens, tree[i].tokens, sizeof got.tokens);
    }
  }
  CHECK(differ == ROOTS * (K - 1)); /* the branches went their own ways */
  /* every fork reported once, when all of its episodes had ended */
  CHECK(f.reports == ROOTS && f.all_ended_when_reported);
  for (int i = 0; i < f.reports; i++)
    CHECK(f.report_turn[i] == T && f.report_count[i] == K - 1 &&
          f.report_first[i] == f.first[f.report_parent[i]]);
  free_setup(&s);
}

/* A turn hook that forks episode 0 at turn 1 with the drop flag, then the first branch at turn
 * 2, and every episode at its last turn (a copy of an ended episode); asks for more room than
 * the rollout has; records what mrl_rollout_branch says. */
typedef struct {
  fork_hooks f;
  int first_drop, first_nested, first_ended;
  mrl_status too_many;
} mixed_forks;

static mrl_status mixed_turn(void *user, mrl_rollout *r, int e) {
  mixed_forks *m = user;
  int turns = mrl_rollout_turn_count(r, e);
  if (e == 0 && turns == 1) {
    m->too_many = mrl_rollout_branch(r, 0, MAXE, 0, NULL);
    return mrl_rollout_branch(r, 0, 3, MRL_BRANCH_DROP, &m->first_drop);
  }
  if (m->first_drop > 0 && e == m->first_drop && turns == 2)
    return mrl_rollout_branch(r, e, 2, 0, &m->first_nested);
  if (e == 1 && mrl_rollout_end(r, e) != MRL_END_NONE)
    return mrl_rollout_branch(r, e, 2, 0, &m->first_ended);
  return MRL_OK;
}

static void test_fork_outcomes_and_drops(void) {
  setup s;
  make_setup(&s, new_engine(), 32);
  mrl_rollout_config cfg = config(3, 5, 1.0f);
  fresh_envs(&s, 2, 3, 7);
  mixed_forks m;
  memset(&m, 0, sizeof m);
  m.f = new_fork_hooks(0, 0, 0);
  mrl_rollout_hooks hooks = {.user = &m, .turn = mixed_turn, .branches = note_branches};
  int total = 0;
  MUST(mrl_rollout_run_hooks(s.r, s.tok, 2, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  CHECK(m.too_many == MRL_ERR_RANGE); /* refused, changing nothing: the next fork got 2.. */
  /* the nested fork and the ended one came in either order */
  int nested = m.first_nested, copy = m.first_ended;
  CHECK(m.first_drop == 2 && nested + copy == 9 && (nested == 4 || nested == 5) && total == 6);
  /* the dropped fork's branches are out of the batch, its parent and the nested fork are not */
  CHECK(mrl_rollout_dropped(s.r, 0) == 0);
  CHECK(mrl_rollout_dropped(s.r, 2) == 1 && mrl_rollout_dropped(s.r, 3) == 1);
  CHECK(mrl_rollout_dropped(s.r, 4) == 0 && mrl_rollout_dropped(s.r, 5) == 0);
  int parent, index, turn;
  mrl_rollout_origin(s.r, nested, &parent, &index, &turn);
  CHECK(parent == 2 && index == 2 && turn == 2);
  /* a fork of an ended episode is a copy of it, never stepped, with no clone */
  episode a, b;
  copy_episode(s.r, 1, &a);
  copy_episode(s.r, copy, &b);
  CHECK(same_episode(&a, &b) && a.end == MRL_END_DONE && s.clones[copy] == NULL);
  CHECK(s.clones[2] && s.clones[3] && s.clones[nested]);
  /* three forks, each reported once when over: the ended copy at once, the nested one before
   * (or with) the fork it grew from, whose parent ran on */
  CHECK(m.f.reports == 3 && m.f.all_ended_when_reported);
  for (int i = 0; i < m.f.reports; i++) {
    int p = m.f.report_parent[i];
    CHECK((p == 0 && m.f.report_first[i] == 2 && m.f.report_count[i] == 2 && m.f.report_turn[i] == 1) ||
          (p == 2 && m.f.report_first[i] == nested && m.f.report_count[i] == 1 && m.f.report_turn[i] == 2) ||
          (p == 1 && m.f.report_first[i] == copy && m.f.report_count[i] == 1 && m.f.report_turn[i] == 3));
  }
  /* the branches' environments went on from copies: each saw the parent's first action */
  count_env *b2 = &((count_box *)s.clones[2])->c;
  CHECK(b2->seen == 3 && b2->seen_len[0] == s.env[0].seen_len[0] &&
        memcmp(b2->seen_action[0], s.env[0].seen_action[0], b2->seen_len[0]) == 0);
  /* outside a hook */
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "only a hook", mrl_rollout_branch(s.r, 0, 2, 0, NULL));
  free_setup(&s);
}

/* A clone that fails ends only its branch; an environment without clone() makes the fork fail,
 * and a hook that passes the failure on stops the run with both messages. */
static void test_fork_clone_failures(void) {
  setup s;
  make_setup(&s, new_engine(), 32);
  mrl_rollout_config cfg = config(3, 5, 1.0f);
  fresh_envs(&s, 2, 3, 9);
  s.env[0].clone_fails = true;
  fork_hooks f = new_fork_hooks(1, 2, 0);
  mrl_rollout_hooks hooks = {.user = &f, .turn = fork_at_turn, .branches = note_branches};
  int total = 0;
  MUST(mrl_rollout_run_hooks(s.r, s.tok, 2, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  int b0 = f.first[0], b1 = f.first[1];
  CHECK(mrl_rollout_end(s.r, b0) == MRL_END_ENV_ERROR && s.clones[b0] == NULL);
  const char *msg = mrl_rollout_error(s.r, b0);
  CHECKF(msg && strcmp(msg, "clone: the count environment broke on purpose") == 0, "%s", msg);
  CHECK(mrl_rollout_end(s.r, b1) == MRL_END_DONE && mrl_rollout_end(s.r, 0) == MRL_END_DONE);
  CHECK(f.reports == 2);

  fresh_envs(&s, 2, 3, 9);
  s.vt[1].clone = NULL;
  f = new_fork_hooks(1, 2, 0);
  CHECK_FAILS(s.e, MRL_ERR_UNSUPPORTED,
              "the turn hook (episode 1) failed: mrl_rollout_branch: the episode's environment "
              "has no clone()",
              mrl_rollout_run_hooks(s.r, s.tok, 2, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  free_clones(s.clones, MAXE);
  /* the rollout runs as before */
  fresh_envs(&s, 2, 3, 9);
  f = new_fork_hooks(1, 2, 0);
  MUST(mrl_rollout_run_hooks(s.r, s.tok, 2, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  CHECK(total == 4);
  free_setup(&s);
}

/* ---- groups ---- */

enum { GROUPS = 4, G = 3, GN = GROUPS * G };

typedef struct {
  int cut_ids[GROUPS], ncut;
  int calls, bad_members;
  int seen_turn;
  mrl_rollout_gate gate; /* for the gate tests */
  bool use_gate;
  int max_turns_seen; /* the most turns a member had when its group was decided */
} group_hooks;

static mrl_status cut_by_id(void *user, mrl_rollout *r, int group, int turn, const int *members,
                            int count, int *cut) {
  group_hooks *g = user;
  g->calls++;
  g->seen_turn = turn;
  if (count != G) g->bad_members++;
  for (int i = 0; i < count; i++) {
    if (i > 0 && members[i] <= members[i - 1]) g->bad_members++;
    int t = mrl_rollout_turn_count(r, members[i]);
    if (t > g->max_turns_seen) g->max_turns_seen = t;
  }
  for (int i = 0; i < g->ncut; i++)
    if (g->cut_ids[i] == group) *cut = 1;
  return MRL_OK;
}

static void group_ids(int *groups) {
  for (int e = 0; e < GN; e++) groups[e] = 10 + e / G; /* ids 10..13 */
}

/* A cut group leaves no trace: its members are dropped and stopped at K turns (they waited
 * there); the other groups decode exactly as without a gate, and so do the cut ones' first K
 * turns; with finish_cut the cut groups run to the end as they would have, dropped. An episode
 * run alone decodes the same as in the batch. */
static void test_group_cut_and_shared_prefix(void) {
  enum { KT = 2 };
  setup s;
  make_setup(&s, new_engine(), 32);
  mrl_rollout_config cfg = config(4, 5, 1.0f);
  fresh_envs(&s, GN, 4, 300);
  MUST(mrl_rollout_run(s.r, s.tok, GN, s.pv, s.seeds, &cfg));
  episode plain[GN];
  for (int e = 0; e < GN; e++) copy_episode(s.r, e, &plain[e]);

  int groups[GN];
  group_ids(groups);
  for (int finish = 0; finish <= 1; finish++) {
    fresh_envs(&s, GN, 4, 300);
    group_hooks g = {.cut_ids = {11, 13}, .ncut = 2};
    mrl_rollout_hooks hooks = {.user = &g, .group = cut_by_id, .groups = groups,
                               .group_turn = KT, .finish_cut = finish};
    int total = 0;
    MUST(mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
    CHECK(total == GN && g.calls == GROUPS && g.bad_members == 0 && g.seen_turn == KT);
    CHECK(g.max_turns_seen == KT); /* nobody went past K before its group was decided */
    for (int e = 0; e < GN; e++) {
      bool cut = groups[e] == 11 || groups[e] == 13;
      episode got;
      copy_episode(s.r, e, &got);
      CHECK(mrl_rollout_dropped(s.r, e) == (cut ? 1 : 0));
      if (!cut || finish) {
        CHECKF(same_episode(&got, &plain[e]), "episode %d (finish %d) differs from the ungated run's",
               e, finish);
        continue;
      }
      CHECKF(got.end == MRL_END_CUT && got.turns == KT, "episode %d: end %d, %d turns", e, got.end,
             got.turns);
      /* the first K turns (and their observations) token for token, log-prob for log-prob */
      int n = prefix_length(&s, e, KT);
      CHECK(n == got.len && n < plain[e].len);
      CHECK(memcmp(got.tokens, plain[e].tokens, sizeof(int32_t) * (size_t)n) == 0);
      CHECK(memcmp(got.logprobs, plain[e].logprobs, sizeof(float) * (size_t)n) == 0);
      CHECK(memcmp(got.rewards, plain[e].rewards, sizeof(double) * KT) == 0);
    }
  }
  /* alone, episode 7 decodes as it did among twelve */
  fresh_envs(&s, 1, 4, 307);
  MUST(mrl_rollout_run(s.r, s.tok, 1, s.pv, s.seeds, &cfg));
  episode alone;
  copy_episode(s.r, 0, &alone);
  CHECK(same_episode(&alone, &plain[7]));
  free_setup(&s);
}

/* ---- the selective gate ---- */

/* Levenshtein distance of two symbol sequences, the textbook table. */
static int levenshtein(const int *a, int na, const int *b, int nb) {
  int d[16][16];
  for (int i = 0; i <= na; i++) d[i][0] = i;
  for (int j = 0; j <= nb; j++) d[0][j] = j;
  for (int i = 1; i <= na; i++)
    for (int j = 1; j <= nb; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      d[i][j] = best;
    }
  return d[na][nb];
}

static void test_edit_distance_hand_cases(void) {
  mrl_engine *e = new_engine();
  double d;
  /* kitten -> sitting: k->s, e->i, +g: 3 edits over 7 symbols */
  const int64_t kitten[] = {'k', 'i', 't', 't', 'e', 'n'}, sitting[] = {'s', 'i', 't', 't', 'i', 'n', 'g'};
  MUST(mrl_edit_distance(e, kitten, 6, sitting, 7, &d));
  CHECK(d == 3.0 / 7.0);
  const int64_t abc[] = {1, 2, 3}, cba[] = {3, 2, 1}, ab[] = {1, 2};
  MUST(mrl_edit_distance(e, abc, 3, abc, 3, &d));
  CHECK(d == 0.0);
  MUST(mrl_edit_distance(e, abc, 3, cba, 3, &d)); /* two substitutions */
  CHECK(d == 2.0 / 3.0);
  MUST(mrl_edit_distance(e, abc, 0, ab, 2, &d)); /* empty against two: 2 insertions / 2 */
  CHECK(d == 1.0);
  MUST(mrl_edit_distance(e, abc, 3, ab, 2, &d)); /* one deletion / 3 */
  CHECK(d == 1.0 / 3.0);
  MUST(mrl_edit_distance(e, abc, 0, ab, 0, &d));
  CHECK(d == 0.0);
  /* the gate over {a b}, {a c}, {a} at K = 2: prefixes ab, ac, a<END>; every pair differs in one
   * of two places: mean 1/2; one of three ended before K */
  const int64_t actions[] = {1, 2, 1, 3, 1}, offsets[] = {0, 2, 4, 5};
  mrl_selective_gate g;
  MUST(mrl_selective_gate_eval(e, actions, offsets, 3, 2, 0.6, 2.0, &g));
  CHECK(g.edit_distance == 0.5 && fabs(g.termination - 1.0 / 3.0) < 1e-15 && g.cut == 1);
  MUST(mrl_selective_gate_eval(e, actions, offsets, 3, 2, 0.5, 2.0, &g));
  CHECK(g.cut == 0); /* below d_low, strictly */
  MUST(mrl_selective_gate_eval(e, actions, offsets, 3, 2, 0.1, 0.3, &g));
  CHECK(g.cut == 1); /* the OR-rule: a third ended before K >= t_high */
  /* {x y z} and {z y x} at K = 3 and {x} padded: (xyz, zyx) 2/3, (xyz, x<E><E>) 2/3,
   * (zyx, x<E><E>) 3/3: mean 7/9 */
  const int64_t more[] = {7, 8, 9, 9, 8, 7, 7}, moff[] = {0, 3, 6, 7};
  MUST(mrl_selective_gate_eval(e, more, moff, 3, 3, 0.12, 2.0, &g));
  CHECK(fabs(g.edit_distance - 7.0 / 9.0) < 1e-15 && g.cut == 0);
  mrl_engine_free(e);
}

/* The group hook the gate tests run: mrl_rollout_gate_group, then the same distance computed
 * here from the members' actions (each action a symbol: equal tokens, equal symbol). */
typedef struct {
  mrl_rollout_gate gate;
  int calls, cuts, between; /* between: groups whose distance is neither 0 nor 1 */
  double worst;             /* the largest |gate - reference| */
} checked_gate;

static mrl_status gate_and_check(void *user, mrl_rollout *r, int group, int turn,
                                 const int *members, int count, int *cut) {
  checked_gate *c = user;
  mrl_status st = mrl_rollout_gate_group(&c->gate, r, group, turn, members, count, cut);
  if (st) return st;
  c->calls++;
  c->cuts += *cut;
  int sym[G][8], len[G];
  const int32_t *act[G * 8];
  int act_len[G * 8], distinct = 0;
  for (int i = 0; i < count; i++) {
    int taken = mrl_rollout_turn_count(r, members[i]);
    len[i] = taken < turn ? taken : turn;
    for (int t = 0; t < len[i]; t++) {
      const int32_t *tok;
      int n = mrl_rollout_action(r, members[i], t, &tok);
      int id = 0;
      while (id < distinct && !(act_len[id] == n && memcmp(act[id], tok, sizeof *tok * (size_t)n) == 0))
        id++;
      if (id == distinct) {
        act[distinct] = tok;
        act_len[distinct++] = n;
      }
      sym[i][t] = id;
    }
    for (int t = len[i]; t < turn; t++) sym[i][t] = -1; /* <END> */
  }
  double sum = 0.0;
  int pairs = 0;
  for (int i = 0; i < count; i++)
    for (int j = i + 1; j < count; j++, pairs++)
      sum += (double)levenshtein(sym[i], turn, sym[j], turn) / turn;
  double want = pairs ? sum / pairs : 0.0;
  if (fabs(want - c->gate.distance) > c->worst) c->worst = fabs(want - c->gate.distance);
  c->between += want > 0.0 && want < 1.0;
  return MRL_OK;
}

/* Single-token actions sampled from the two likeliest tokens repeat now and then, so the groups'
 * distances lie between 0 and 1: the gate's equal the reference's. Greedy groups act alike (distance 0): all
 * cut; long random actions never repeat (distance 1): none cut. */
static void test_selective_gate_in_a_run(void) {
  enum { KT = 3 };
  setup s;
  make_setup(&s, new_engine(), 16);
  int groups[GN];
  group_ids(groups);
  checked_gate c = {.gate = {.d_low = 0.5, .t_high = 2.0}};
  mrl_rollout_hooks hooks = {.user = &c, .group = gate_and_check, .groups = groups,
                             .group_turn = KT};
  int total;
  mrl_rollout_config cfg = config(4, 1, 1.0f);
  cfg.sampling.top_k = 2;
  fresh_envs(&s, GN, 4, 40);
  MUST(mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  check_note("gate on single-token actions: %d of %d groups cut, %d strictly between 0 and 1; "
             "|gate - reference| <= %.1e", c.cuts, c.calls, c.between, c.worst);
  CHECK(c.calls == GROUPS && c.gate.groups == GROUPS && c.gate.cut == c.cuts && c.worst < 1e-12);
  CHECK(c.between > 0);

  c = (checked_gate){.gate = {.d_low = 0.12, .t_high = 2.0}};
  cfg = config(4, 6, 0.0f);
  fresh_envs(&s, GN, 4, 40);
  MUST(mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  CHECK(c.cuts == GROUPS && c.gate.distance == 0.0);
  for (int e = 0; e < GN; e++)
    CHECK(mrl_rollout_dropped(s.r, e) == 1 && mrl_rollout_end(s.r, e) == MRL_END_CUT);

  c = (checked_gate){.gate = {.d_low = 0.12, .t_high = 2.0}};
  cfg = config(4, 8, 1.0f);
  fresh_envs(&s, GN, 4, 40);
  MUST(mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  CHECK(c.cuts == 0 && c.gate.distance == 1.0 && c.worst < 1e-12);
  for (int e = 0; e < GN; e++) CHECK(mrl_rollout_dropped(s.r, e) == 0);
  /* a group of one is kept */
  int one = 0, cut = 1;
  MUST(mrl_rollout_gate_group(&c.gate, s.r, 0, KT, &one, 1, &cut));
  CHECK(cut == 0);
  CHECK_FAILS(s.e, MRL_ERR_NULL, "cut is NULL", mrl_rollout_gate_group(&c.gate, s.r, 0, KT, &one, 1, NULL));
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "turn >= 1", mrl_rollout_gate_group(&c.gate, s.r, 0, 0, &one, 1, &cut));
  int bad = MAXE;
  CHECK_FAILS(s.e, MRL_ERR_RANGE, "members[0]", mrl_rollout_gate_group(&c.gate, s.r, 0, KT, &bad, 1, &cut));
  free_setup(&s);
}

/* ---- resampling ---- */

typedef struct {
  int on_turn;          /* resample this turn (1-based) */
  int calls, attempts[8];
  char first[SEEN_LEN]; /* the action taken back */
  size_t first_len;
} resample_hooks;

static mrl_status resample_turn(void *user, mrl_rollout *r, int e, int attempt, const char *action,
                                size_t len, int *again) {
  resample_hooks *h = user;
  if (e != 0 || mrl_rollout_turn_count(r, e) != h->on_turn) return MRL_OK;
  if (h->calls < 8) h->attempts[h->calls] = attempt;
  h->calls++;
  if (attempt == 0) {
    size_t n = len < SEEN_LEN - 1 ? len : SEEN_LEN - 1;
    memcpy(h->first, action, n);
    h->first_len = n;
  }
  *again = 1;
  return MRL_OK;
}

/* A resampled turn never reaches the environment: it sees one action per turn, the one
 * recorded; the new sample comes from the same logits with the stream gone on, so its
 * log-probabilities are a fresh forward pass's; the hook is called max_resamples times. */
static void test_resample_turn(void) {
  setup s;
  make_setup(&s, new_engine(), 32);
  mrl_rollout_config cfg = config(3, 8, 1.0f);
  for (int max = 1; max <= 2; max++) {
    fresh_envs(&s, 2, 3, 90);
    resample_hooks h = {.on_turn = 2};
    mrl_rollout_hooks hooks = {.user = &h, .resample = resample_turn, .max_resamples = max};
    int total;
    MUST(mrl_rollout_run_hooks(s.r, s.tok, 2, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
    CHECK(h.calls == max && h.attempts[0] == 0 && (max == 1 || h.attempts[1] == 1));
    CHECK(s.env[0].seen == 3 && mrl_rollout_turn_count(s.r, 0) == 3);
    const int32_t *tok;
    int n = mrl_rollout_action(s.r, 0, 1, &tok);
    char text[SEEN_LEN];
    size_t tl;
    int drop_end = n > 0 && tok[n - 1] == MRL_TOKEN_END;
    MUST(mrl_tokenizer_decode(s.tok, tok, (size_t)(n - drop_end), text, sizeof text, &tl));
    CHECK(tl == s.env[0].seen_len[1] && memcmp(text, s.env[0].seen_action[1], tl) == 0);
    CHECK(h.first_len != tl || memcmp(h.first, text, tl) != 0); /* a new sample */
    /* the recorded log-probabilities are those of a fresh forward pass */
    int len = mrl_rollout_length(s.r, 0);
    const int32_t *t = mrl_rollout_tokens(s.r, 0);
    const float *mask = mrl_rollout_mask(s.r, 0), *lp = mrl_rollout_logprobs(s.r, 0);
    int32_t targets[CAP];
    float fresh[CAP];
    for (int i = 0; i < len; i++) targets[i] = i + 1 < len && mask[i + 1] == 1.0f ? t[i + 1] : -1;
    int32_t nn = len;
    MUST(mrl_model_forward(s.m, t, &nn, 1, len));
    MUST(mrl_model_score(s.m, targets, fresh, NULL));
    double worst = 0.0;
    for (int i = 0; i + 1 < len; i++)
      if (targets[i] >= 0) worst = fmax(worst, fabs(fresh[i] - lp[i + 1]));
    CHECKF(worst < 1e-4, "resampled log-probabilities off by %.2e", worst);
    /* episode 1 was never resampled: as in a run without hooks */
    episode hooked, plain;
    copy_episode(s.r, 1, &hooked);
    fresh_envs(&s, 2, 3, 90);
    MUST(mrl_rollout_run(s.r, s.tok, 2, s.pv, s.seeds, &cfg));
    copy_episode(s.r, 1, &plain);
    CHECK(same_episode(&hooked, &plain));
  }
  free_setup(&s);
}

/* ---- failing hooks and bad arguments ---- */

typedef struct {
  int fail_in; /* 0 turn, 1 branches, 2 group, 3 resample, 4 the turn hook runs the rollout; 5:
                * none, forking as 1 does */
  setup *s;
} failing;

static mrl_status fail_turn(void *user, mrl_rollout *r, int e) {
  failing *f = user;
  if (e != 0) return MRL_OK;
  if (f->fail_in == 4) {
    setup *s = f->s;
    return mrl_rollout_run(r, s->tok, 1, s->pv, s->seeds, &(mrl_rollout_config){.max_turns = 1,
                           .max_turn_tokens = 1});
  }
  if (f->fail_in == 0 && mrl_rollout_turn_count(r, e) == 2) return MRL_ERR_INVALID;
  if ((f->fail_in == 1 || f->fail_in == 5) && mrl_rollout_turn_count(r, e) == 1)
    return mrl_rollout_branch(r, e, 2, 0, NULL);
  return MRL_OK;
}
static mrl_status fail_branches(void *user, mrl_rollout *r, int parent, int turn, int first,
                                int count) {
  (void)r, (void)parent, (void)turn, (void)first, (void)count;
  return ((failing *)user)->fail_in == 1 ? MRL_ERR_IO : MRL_OK;
}
static mrl_status fail_group(void *user, mrl_rollout *r, int group, int turn, const int *members,
                             int count, int *cut) {
  (void)r, (void)turn, (void)members, (void)count, (void)cut;
  return ((failing *)user)->fail_in == 2 && group == 11 ? MRL_ERR_RANGE : MRL_OK;
}
static mrl_status fail_resample(void *user, mrl_rollout *r, int e, int attempt, const char *action,
                                size_t len, int *again) {
  (void)r, (void)attempt, (void)action, (void)len, (void)again;
  return ((failing *)user)->fail_in == 3 && e == 0 ? MRL_ERR_NOMEM : MRL_OK;
}

/* A hook that fails stops the run with its status and a message naming it, keeps no memory
 * (the clones made so far are the caller's), and the rollout runs normally afterwards. */
static void test_hook_errors(void) {
  setup s;
  make_setup(&s, new_engine(), 16);
  mrl_rollout_config cfg = config(3, 4, 1.0f);
  int groups[GN], total;
  group_ids(groups);
  failing f = {.s = &s};
  mrl_rollout_hooks hooks = {.user = &f, .turn = fail_turn, .branches = fail_branches,
                             .group = fail_group, .groups = groups, .group_turn = 1,
                             .resample = fail_resample};
  f.fail_in = 5; /* a first run grows what grows once (the cache's rows, the model's scratch) */
  fresh_envs(&s, GN, 3, 5);
  MUST(mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  free_clones(s.clones, MAXE);
  static const struct {
    mrl_status st;
    const char *msg;
  } want[] = {{MRL_ERR_INVALID, "the turn hook (episode 0) returned invalid argument"},
              {MRL_ERR_IO, "the branches hook (episode 0) returned"},
              {MRL_ERR_RANGE, "the group hook (group 11) returned"},
              {MRL_ERR_NOMEM, "the resample hook (episode 0) returned"},
              {MRL_ERR_INVALID, "the turn hook (episode 0) failed: mrl_rollout_run: the rollout "
                                "is running"}};
  for (int i = 0; i < 5; i++) {
    f.fail_in = i;
    fresh_envs(&s, GN, 3, 5);
    CHECK_FAILS(s.e, want[i].st, want[i].msg,
                mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
    free_clones(s.clones, MAXE);
  }
  /* bad arguments, refused before anything runs */
  mrl_rollout_hooks bad = hooks;
  f.fail_in = -1;
  bad.groups = NULL;
  CHECK_FAILS(s.e, MRL_ERR_NULL, "hooks->groups is NULL",
              mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &bad, s.clones, &total));
  bad = hooks;
  bad.group_turn = 0;
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "hooks->group_turn is 0",
              mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &bad, s.clones, &total));
  bad = hooks;
  bad.max_resamples = -1;
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "max_resamples is -1",
              mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &bad, s.clones, &total));
  CHECK_FAILS(s.e, MRL_ERR_NULL, "hooks is NULL",
              mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, NULL, s.clones, &total));
  CHECK_FAILS(s.e, MRL_ERR_NULL, "clones is NULL",
              mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &hooks, NULL, &total));
  mrl_rollout_config paused = cfg;
  paused.pause_turn = 1;
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "pause_turn",
              mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &paused, &hooks, s.clones, &total));
  CHECK_FAILS(s.e, MRL_ERR_INVALID, "n is 25",
              mrl_rollout_run_hooks(s.r, s.tok, MAXE + 1, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  CHECK(mrl_rollout_run_hooks(NULL, s.tok, GN, s.pv, s.seeds, &cfg, &hooks, s.clones, &total) ==
        MRL_ERR_NULL);
  /* and the rollout is as good as before */
  fresh_envs(&s, GN, 3, 5);
  MUST(mrl_rollout_run_hooks(s.r, s.tok, GN, s.pv, s.seeds, &cfg, &hooks, s.clones, &total));
  CHECK(total == GN);
  free_setup(&s);
}

/* ---- allocation failures ---- */

typedef struct {
  fork_hooks f;
  checked_gate gate;
  resample_hooks resample;
} all_hooks;

static mrl_status all_turn(void *user, mrl_rollout *r, int e) {
  return fork_at_turn(&((all_hooks *)user)->f, r, e);
}
static mrl_status all_branches(void *user, mrl_rollout *r, int parent, int turn, int first,
                               int count) {
  return note_branches(&((all_hooks *)user)->f, r, parent, turn, first, count);
}
static mrl_status all_group(void *user, mrl_rollout *r, int group, int turn, const int *members,
                            int count, int *cut) {
  return mrl_rollout_gate_group(&((all_hooks *)user)->gate.gate, r, group, turn, members, count, cut);
}
static mrl_status all_resample(void *user, mrl_rollout *r, int e, int attempt, const char *action,
                               size_t len, int *again) {
  return resample_turn(&((all_hooks *)user)->resample, r, e, attempt, action, len, again);
}

static mrl_status sweep_run(setup *s, int *total) {
  enum { N = 6 };
  int groups[N] = {1, 1, 1, 2, 2, 2};
  static all_hooks a;
  memset(&a, 0, sizeof a);
  a.f = new_fork_hooks(1, 2, MRL_BRANCH_DROP);
  a.gate.gate = (mrl_rollout_gate){.d_low = 0.12, .t_high = 2.0};
  a.resample.on_turn = 1;
  mrl_rollout_hooks hooks = {.user = &a, .turn = all_turn, .branches = all_branches,
                             .group = all_group, .groups = groups, .group_turn = 2,
                             .resample = all_resample};
  mrl_rollout_config cfg = config(3, 4, 1.0f);
  fresh_envs(s, N, 3, 3);
  return mrl_rollout_run_hooks(s->r, s->tok, N, s->pv, s->seeds, &cfg, &hooks, s->clones, total);
}

/* Every allocation of a hooked run (forks, groups, the gate, resampling) failing in turn: a
 * status with a message, no memory kept, and the next run gives what a run that never failed
 * gives. */
static void test_hooks_alloc_failures(void) {
  counting_alloc c;
  setup s;
  make_setup(&s, new_counting_engine(&c), 16);
  int total = 0;
  episode want[MAXE], got;
  MUST(sweep_run(&s, &total)); /* warms what is made once */
  MUST(sweep_run(&s, &total));
  int want_total = total;
  for (int e = 0; e < total; e++) copy_episode(s.r, e, &want[e]);
  free_clones(s.clones, MAXE);
  size_t used = mrl_engine_memory_used(s.e);
  long live = c.live, fails = 0;
  for (long at = 0;; at++) {
    mrl_engine_clear_error(s.e);
    counting_alloc_arm(&c, at);
    mrl_status st = sweep_run(&s, &total);
    counting_alloc_arm(&c, -1);
    free_clones(s.clones, MAXE);
    if (st == MRL_OK && c.requests <= at) break;
    if (st == MRL_OK) continue;
    CHECKF(*mrl_engine_last_error(s.e) != '\0', "request %ld: no message", at);
    CHECKF(mrl_engine_memory_used(s.e) == used && c.live == live,
           "request %ld: memory %zu -> %zu, blocks %ld -> %ld", at, used,
           mrl_engine_memory_used(s.e), live, c.live);
    MUST(sweep_run(&s, &total));
    bool same = total == want_total;
    for (int e = 0; e < total && same; e++) {
      copy_episode(s.r, e, &got);
      same = same_episode(&got, &want[e]);
    }
    CHECKF(same, "the run after request %ld failed differs", at);
    free_clones(s.clones, MAXE);
    fails++;
  }
  check_note("mrl_rollout_run_hooks: %ld allocations, each failure handled", fails);
  CHECK(fails > 5);
  free_setup(&s);
  CHECK(c.live == 0 && c.bad_frees == 0);
}

static const test_case tests[] = {
    {"fork_in_hook_equals_tree", test_fork_in_hook_equals_tree},
    {"fork_outcomes_and_drops", test_fork_outcomes_and_drops},
    {"fork_clone_failures", test_fork_clone_failures},
    {"group_cut_and_shared_prefix", test_group_cut_and_shared_prefix},
    {"edit_distance_hand_cases", test_edit_distance_hand_cases},
    {"selective_gate_in_a_run", test_selective_gate_in_a_run},
    {"resample_turn", test_resample_turn},
    {"hook_errors", test_hook_errors},
    {"hooks_alloc_failures", test_hooks_alloc_failures},
    {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
