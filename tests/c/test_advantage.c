/* test_advantage.c - unit tests of the advantage and loss API: values checked by hand, closed forms
 * against naive references (best-of-k weights by enumerating subsets, difflib ratios computed by
 * Python's difflib), every policy-loss, KL, entropy, value and turn-KL gradient against central
 * finite differences of the loss itself, and the error paths (NULL, sizes, masks, non-finite
 * values, unknown options, undefined statistics, memory limits). The spec's test vectors run
 * through the Lua binding in tests/lua/advantage_spec.lua. */
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static bool near(double got, double want, double tol) {
  return fabs(got - want) <= tol * (1.0 + fabs(want));
}

#define CHECK_NEAR(got, want, tol)                                                                 \
  CHECKF(near((got), (want), (tol)), "%s = %.12g, want %.12g", #got, (double)(got), (double)(want))

/* reproducible test data from a 64-bit LCG */
static uint64_t lcg = 7;
static double uniform(double lo, double hi) {
  lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * (double)(lcg >> 11) * 0x1.0p-53;
}

/* ---- outcome advantages by hand ---- */

static void test_grpo_by_hand(void) {
  mrl_engine *e = new_engine();
  /* rows 0 and 1 share group 5 (scores 1 and 3), row 2 is alone (score 2, one reward on a
   * mask-0 position, which still counts) */
  const float r[] = {0, 1, 0, 0, 3, 0, 0, 0, 2};
  const float m[] = {1, 1, 0, 1, 1, 1, 1, 1, 0};
  const int64_t g[] = {5, 5, -9};
  float adv[9];
  MUST(mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, r, m, g, 3, 3, adv));
  double a = 1.0 / (sqrt(2.0) + 1e-6);
  CHECK_NEAR(adv[0], -a, 1e-6);
  CHECK_NEAR(adv[1], -a, 1e-6);
  CHECK(adv[2] == 0.0f); /* masked */
  CHECK_NEAR(adv[3], a, 1e-6);
  CHECK_NEAR(adv[6], 2.0 / (1.0 + 1e-6), 1e-6); /* a group of one keeps its score */
  CHECK(adv[8] == 0.0f);
  mrl_outcome_opts o;
  mrl_outcome_defaults(&o);
  o.norm_by_std = 0; /* Dr. GRPO */
  MUST(mrl_outcome_advantage(e, MRL_ADV_GRPO, &o, r, m, g, 3, 3, adv));
  CHECK_NEAR(adv[0], -1.0, 1e-7);
  CHECK_NEAR(adv[4], 1.0, 1e-7);
  CHECK_NEAR(adv[7], 2.0, 1e-7);
  mrl_engine_free(e);
}

static void test_outcome_kinds_by_hand(void) {
  mrl_engine *e = new_engine();
  /* one group of three rows of 2 tokens, scores 1, 2 and 6; lengths 2, 1, 1 */
  const float r[] = {0, 1, 2, 0, 0, 6};
  const float m[] = {1, 1, 1, 0, 1, 0};
  const int64_t g[] = {1, 1, 1};
  float adv[6];
  MUST(mrl_outcome_advantage(e, MRL_ADV_RLOO, NULL, r, m, g, 3, 2, adv));
  CHECK_NEAR(adv[0], 1.0 - 4.0, 1e-7); /* score minus the mean of the others */
  CHECK_NEAR(adv[2], 2.0 - 3.5, 1e-7);
  CHECK_NEAR(adv[4], 6.0 - 1.5, 1e-7);
  MUST(mrl_outcome_advantage(e, MRL_ADV_OPO, NULL, r, m, g, 3, 2, adv));
  double base = (2 * 1.0 + 1 * 2.0 + 1 * 6.0) / 4.0; /* length-weighted mean */
  CHECK_NEAR(adv[0], 1.0 - base, 1e-7);
  CHECK_NEAR(adv[4], 6.0 - base, 1e-7);
  MUST(mrl_outcome_advantage(e, MRL_ADV_GPG, NULL, r, m, g, 3, 2, adv));
  CHECK_NEAR(adv[0], 1.0 * (1.0 - 3.0), 1e-7); /* alpha = 3 rows / 3 non-zero scores */
  MUST(mrl_outcome_advantage(e, MRL_ADV_GRPO_PASSK, NULL, r, m, g, 3, 2, adv));
  double sd = sqrt(((1 - 3.0) * (1 - 3.0) + (2 - 3.0) * (2 - 3.0) + (6 - 3.0) * (6 - 3.0)) / 2.0);
  CHECK(adv[0] == 0.0f && adv[2] == 0.0f);
  CHECK_NEAR(adv[4], (6.0 - 2.0) / (sd + 1e-6), 1e-6);
  mrl_engine_free(e);
}

static void test_returns_by_hand(void) {
  mrl_engine *e = new_engine();
  /* GAE, gamma = lambda = 1: an observation token (mask 0) with a huge value is transparent */
  const float r[] = {0, 0, 1, 0, 0, 2};
  const float v[] = {0.5f, 100, 0.25f, 0, 0, 0};
  const float m[] = {1, 0, 1, 1, 1, 1};
  float adv[6], ret[6];
  MUST(mrl_gae(e, r, v, m, 2, 3, 1.0, 1.0, adv, ret));
  CHECK_NEAR(ret[0], 1.0, 1e-6); /* 0 + V(2) - V(0) + (1 - V(2)), plus V(0) */
  CHECK_NEAR(ret[2], 1.0, 1e-6);
  CHECK_NEAR(ret[3], 2.0, 1e-6);
  /* REINFORCE++ (verl 1dda039): a mask-0 token gets 0 and passes the return on */
  MUST(mrl_reinforce_pp(e, r, m, 2, 3, 1.0, MRL_RETURN_CARRY, adv, ret));
  CHECK_NEAR(ret[2], 1.0, 1e-7);
  CHECK(ret[1] == 0.0f);
  CHECK_NEAR(ret[0], 1.0, 1e-7); /* the credit crosses the observation */
  CHECK(adv[1] == 0.0f);
  /* the rule before verl 8a1bf6d5b restarts the return at a mask-0 token */
  MUST(mrl_reinforce_pp(e, r, m, 2, 3, 1.0, MRL_RETURN_RESET, adv, ret));
  CHECK_NEAR(ret[2], 1.0, 1e-7);
  CHECK_NEAR(ret[1], 1.0, 1e-7);
  CHECK_NEAR(ret[0], 0.0, 1e-7); /* the credit does not cross the observation */
  /* ReMax: returns are the masked reverse cumulative sums */
  const double baseline[] = {0.5, 1.0};
  MUST(mrl_remax(e, r, m, baseline, 2, 3, adv, ret));
  CHECK_NEAR(ret[0], 1.0, 1e-7);
  CHECK_NEAR(adv[0], 0.5, 1e-7);
  CHECK_NEAR(adv[1], 1.0, 1e-7); /* not masked: the observation position keeps its return */
  CHECK_NEAR(ret[3], 2.0, 1e-7);
  /* discounted step returns, with Dr. MAS steps sharing an env_step */
  const double rewards[] = {1, 5, 0, 9, 2, 7};
  const int64_t traj[] = {3, 3, 3, 3, 3, 4}, env_step[] = {0, 0, 1, 1, 2, 0};
  double out[6];
  MUST(mrl_step_returns(e, rewards, traj, env_step, 6, 0.5, out));
  const double want[] = {1.5, 1.5, 1.0, 1.0, 2.0, 7.0};
  for (int i = 0; i < 6; i++) CHECK_NEAR(out[i], want[i], 1e-12);
  MUST(mrl_step_returns(e, rewards, NULL, NULL, 3, 0.5, out));
  CHECK_NEAR(out[0], 1.0 + 0.5 * 5.0, 1e-12);
  mrl_engine_free(e);
}

static void test_gigpo_by_hand(void) {
  mrl_engine *e = new_engine();
  /* one prompt, two trajectories: t0 (2 steps, score 1 each row), t1 (1 step, score 0); the
   * first steps of both saw anchor 7 */
  const float r[] = {1, 1, 0};
  const float m[] = {1, 1, 1};
  const double step_r[] = {0.9, 1.0, 0.0};
  const int64_t g[] = {0, 0, 0}, traj[] = {10, 10, 11}, anchor[] = {7, 8, 7};
  float adv[3], ep[3], sa[3];
  int64_t sg[3];
  mrl_gigpo_opts o;
  mrl_gigpo_defaults(&o);
  MUST(mrl_gigpo(e, &o, r, step_r, m, g, traj, anchor, 3, 1, adv, ep, sa, sg));
  CHECK_NEAR(ep[0], 1.0 - 2.0 / 3.0, 1e-6); /* every row counts */
  CHECK_NEAR(sa[0], 0.9 - 0.45, 1e-6);
  CHECK(sa[1] == 0.0f); /* a step group of one */
  CHECK_NEAR(adv[2], (0.0 - 2.0 / 3.0) + (0.0 - 0.45), 1e-6);
  CHECK(sg[0] == 0 && sg[1] == 1 && sg[2] == 0);
  o.dedup_traj = 1; /* one row per trajectory: mean (1 + 0) / 2 */
  MUST(mrl_gigpo(e, &o, r, step_r, m, g, traj, anchor, 3, 1, adv, ep, sa, sg));
  CHECK_NEAR(ep[0], 0.5, 1e-6);
  CHECK_NEAR(ep[2], -0.5, 1e-6);
  mrl_engine_free(e);
}

static void test_milestones_by_hand(void) {
  mrl_engine *e = new_engine();
  const int64_t match[] = {1, 4, -1};
  double rw[7];
  int64_t seg[7];
  MUST(mrl_milestone_segments(e, 7, match, 3, 0.5, rw, seg));
  const double want_r[] = {0.5, 1, 0.25, 0.5, 1, 0, 0};
  const int64_t want_s[] = {0, 0, 1, 1, 1, 2, 2};
  for (int i = 0; i < 7; i++) CHECK(rw[i] == want_r[i] && seg[i] == want_s[i]);
  const uint8_t flag[] = {0, 1, 0, 0, 1};
  const int64_t traj[] = {1, 1, 2, 1, 2};
  MUST(mrl_milestone_segments_dynamic(e, flag, traj, 5, 0.5, 10.0, rw, seg));
  CHECK(rw[0] == 5.0 && rw[1] == 10.0 && rw[3] == 0.0); /* after traj 1's last milestone: 0 */
  CHECK(rw[2] == 5.0 && rw[4] == 10.0);
  CHECK(seg[0] == 0 && seg[1] == 0 && seg[3] == 1 && seg[2] == 0 && seg[4] == 0);
  const char *actions[] = {"look", "take mug", "go sink", "clean mug"};
  const char *stones[] = {"take mug", "clean mug", "put mug"};
  int64_t found[3];
  MUST(mrl_match_milestones(e, actions, NULL, 4, stones, NULL, 3, 0.9, found));
  CHECK(found[0] == 1 && found[1] == 3 && found[2] == -1);
  mrl_engine_free(e);
}

/* difflib ratios computed with Python's difflib.SequenceMatcher(None, a, b).ratio() */
static void test_text_similarity_matches_difflib(void) {
  mrl_engine *e = new_engine();
  static const struct {
    const char *a, *b;
    double ratio;
  } cases[] = {{"abcd", "bcde", 0.75},
               {"go to desk 1", "go to desk 1.", 0.96},
               {"", "", 1.0},
               {"abc", "", 0.0},
               {"private Thread currentThread;", "private volatile Thread currentThread;",
                0.8656716417910447},
               {"h\xc3\xa9llo w\xc3\xb6rld", "hello world", 0.8181818181818182},
               {"take mug 1 from shelf 1", "take mug 2 from shelf 1", 0.9565217391304348}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double r;
    MUST(
        mrl_text_similarity(e, cases[i].a, strlen(cases[i].a), cases[i].b, strlen(cases[i].b), &r));
    CHECKF(fabs(r - cases[i].ratio) < 1e-12, "ratio(%s, %s) = %.17g, want %.17g", cases[i].a,
           cases[i].b, r, cases[i].ratio);
  }
  /* difflib's autojunk: in a b of 200+ symbols, one filling over 1% is left out of the index */
  char a[260], b[260];
  for (int i = 0; i < 250; i++) a[i] = i < 150 ? 'a' : 'b';
  for (int i = 0; i < 220; i++) b[i] = i % 2 ? 'b' : 'a';
  double r;
  MUST(mrl_text_similarity(e, a, 250, b, 220, &r));
  CHECK_NEAR(r, 0.00425531914893617, 1e-12);
  const char *texts[] = {"go to desk 1", "go to desk 1.", "open drawer 2", "go to desk 2", "x"};
  const int64_t g[] = {0, 0, 0, 0, 1};
  int64_t ids[5];
  MUST(mrl_similarity_groups(e, texts, NULL, g, 5, 0.9, ids));
  CHECK(ids[0] == 0 && ids[1] == 0 && ids[2] == 1 && ids[3] == 0 && ids[4] == 2);
  mrl_engine_free(e);
}

static void test_gate_and_edit_distance(void) {
  mrl_engine *e = new_engine();
  const int64_t a[] = {1, 2, 3, 4}, b[] = {1, 3, 4, 9};
  double d;
  MUST(mrl_edit_distance(e, a, 4, b, 4, &d));
  CHECK_NEAR(d, 0.5, 1e-12);
  /* three trajectories: {5}, {6}, {5, 7}; K = 3 */
  const int64_t actions[] = {5, 6, 5, 7}, offsets[] = {0, 1, 2, 4};
  mrl_selective_gate gate;
  MUST(mrl_selective_gate_eval(e, actions, offsets, 3, 3, 0.12, 0.6, &gate));
  CHECK_NEAR(gate.edit_distance, 4.0 / 9.0, 1e-12);
  CHECK_NEAR(gate.termination, 1.0, 1e-12);
  CHECK_NEAR(gate.unique_action, 1.0 / 3.0, 1e-12);
  CHECK_NEAR(gate.bigram_jaccard, 8.0 / 9.0, 1e-12);
  CHECK(gate.cut == 1);
  mrl_engine_free(e);
}

/* naive best-of-k weights: enumerate every size-k subset */
static void frontier_naive(const double *r, int n, int k, bool pkpo, double *out) {
  double subsets = 0.0;
  for (int i = 0; i < n; i++) out[i] = 0.0;
  for (unsigned s = 0; s < 1u << n; s++) {
    if (__builtin_popcount(s) != k) continue;
    subsets += 1.0;
    for (int i = 0; i < n; i++) {
      if (!(s & 1u << i)) continue;
      double best = -INFINITY, rest = -INFINITY;
      for (int j = 0; j < n; j++)
        if (s & 1u << j) {
          best = fmax(best, r[j]);
          if (j != i) rest = fmax(rest, r[j]);
        }
      out[i] += pkpo ? best : best - rest;
    }
  }
  for (int i = 0; i < n; i++) out[i] /= subsets;
}

static void test_frontier_weights_against_enumeration(void) {
  mrl_engine *e = new_engine();
  const double r[] = {0.1, 0.5, 0.3, 0.9, 0.9, 0.2, 0.0, 0.4, 0.5};
  for (int k = 2; k <= 9; k++)
    for (int pkpo = 0; pkpo <= 1; pkpo++) {
      double got[9], want[9];
      MUST(mrl_frontier_weights(e, r, 9, k, pkpo, got));
      frontier_naive(r, 9, k, pkpo, want);
      for (int i = 0; i < 9; i++)
        CHECKF(fabs(got[i] - want[i]) < 1e-12, "k=%d pkpo=%d i=%d: %.15g vs %.15g", k, pkpo, i,
               got[i], want[i]);
    }
  mrl_engine_free(e);
}

static void test_kl_estimators_by_hand(void) {
  mrl_engine *e = new_engine();
  const float lp[] = {-0.1f, -1.0f, -30.0f}, ref[] = {-0.2f, -0.5f, -0.1f};
  float kl[3], g[3];
  MUST(mrl_kl(e, MRL_KL_K3, lp, ref, 3, kl, g));
  double d = (double)lp[0] - ref[0];
  CHECK_NEAR(kl[0], exp(-d) + d - 1.0, 1e-6);
  CHECK_NEAR(g[0], 1.0 - exp(-d), 1e-6);
  CHECK(kl[2] == 10.0f && g[2] == 0.0f); /* clamped: no gradient */
  MUST(mrl_kl(e, MRL_KL_K3_PLUS, lp, ref, 3, kl, g));
  CHECK_NEAR(g[1], (double)lp[1] - ref[1], 1e-6); /* k2's gradient */
  MUST(mrl_kl(e, MRL_KL_ABS, lp, ref, 3, kl, g));
  CHECK(g[1] == -1.0f && g[0] == 1.0f);
  MUST(mrl_kl(e, MRL_KL_ABS_PLUS, lp, ref, 3, kl, g)); /* |d| with k2's gradient d */
  CHECK_NEAR(kl[1], 0.5, 1e-6);
  CHECK_NEAR(g[1], -0.5, 1e-6);
  CHECK_NEAR(g[2], -29.9, 1e-5);
  double beta;
  MUST(mrl_kl_adaptive(e, 0.001, 0.25, 256, 0.1, 10000, &beta));
  CHECK_NEAR(beta, 0.001 * (1 + 0.2 * 256 / 10000.0), 1e-12);
  mrl_engine_free(e);
}

/* the aggregation modes that verl 1dda039 changed or added */
static void test_agg_by_hand(void) {
  mrl_engine *e = new_engine();
  const float ones[] = {1, 1, 1, 1}, full[] = {1, 1, 1, 1};
  double loss;
  /* seq-mean-token-sum-norm divides the row mean of the token sums by C (here L = 2) */
  MUST(mrl_agg_loss(e, MRL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, 0, ones, full, 2, 2, &loss));
  CHECK_NEAR(loss, 1.0, 1e-12);
  MUST(mrl_agg_loss(e, MRL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, 4, ones, full, 2, 2, &loss));
  CHECK_NEAR(loss, 0.5, 1e-12);
  /* an empty row is not counted: (3 + 1) / 2 rows / C = 2 */
  const float l3[] = {1, 2, 0, 0, 1, 0}, m3[] = {1, 1, 0, 0, 1, 0};
  MUST(mrl_agg_loss(e, MRL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, 0, l3, m3, 3, 2, &loss));
  CHECK_NEAR(loss, 1.0, 1e-12);
  MUST(mrl_agg_loss(e, MRL_AGG_TOKEN_SUM, 0, l3, m3, 3, 2, &loss));
  CHECK_NEAR(loss, 4.0, 1e-12);
  mrl_engine_free(e);
}

/* the losses verl 1dda039 has and the spec's source did not */
static void test_verl_losses_by_hand(void) {
  mrl_engine *e = new_engine();
  /* DPPO-TV on one row: p - q = 0.5 - 0.25 lies outside hi = 0.2 for A > 0 (no gradient), inside
   * for A < 0; the truncated ratio 2 multiplies -A logp */
  const float lp[] = {logf(0.5f), logf(0.5f)}, old[] = {logf(0.25f), logf(0.25f)};
  const float adv[] = {1.0f, -1.0f}, one[] = {1, 1};
  float tl[2], g[2] = {0};
  mrl_pg_stats st;
  MUST(mrl_policy_loss(e, MRL_PG_DPPO_TV, NULL, lp, old, adv, one, NULL, 1, 2, &st, tl, NULL, NULL,
                       g));
  CHECK(tl[0] == 0.0f && g[0] == 0.0f);
  CHECK_NEAR(tl[1], 2.0 * log(0.5), 1e-6);
  CHECK_NEAR(g[1], 2.0 / 2.0, 1e-6); /* -A * 2, token-mean over 2 tokens */
  CHECK_NEAR(st.clipfrac, 0.5, 1e-6);
  mrl_pg_opts o;
  mrl_pg_defaults(MRL_PG_DPPO_TV, &o);
  o.clip_c = 1.5; /* the ratio 2 is truncated at 1.5 */
  MUST(mrl_policy_loss(e, MRL_PG_DPPO_TV, &o, lp, old, adv, one, NULL, 1, 2, &st, tl, NULL, NULL,
                       NULL));
  CHECK_NEAR(tl[1], 1.5 * log(0.5), 1e-6);
  CHECK_NEAR(st.clipfrac_lower, 0.5, 1e-6);

  /* DRO: -A logp + beta / 2 (logp - old)^2 */
  mrl_pg_defaults(MRL_PG_DRO, &o);
  CHECK_FAILS(e, MRL_ERR_INVALID, "dro_beta is 0",
              mrl_policy_loss(e, MRL_PG_DRO, &o, lp, old, adv, one, NULL, 1, 2, NULL, NULL, NULL,
                              NULL, NULL));
  o.dro_beta = 0.5;
  MUST(mrl_policy_loss(e, MRL_PG_DRO, &o, lp, old, adv, one, NULL, 1, 2, &st, tl, NULL, NULL,
                       NULL));
  double x = log(2.0);
  CHECK_NEAR(tl[0], -log(0.5) + 0.25 * x * x, 1e-6);

  /* clip-cov: tokens chosen only among unclipped ones with covariance in the window, as many as
   * the ratio asks, the same ones for the same seed */
  enum { N = 40 };
  float l2[N], o2[N], a2[N], m2[N];
  for (int i = 0; i < N; i++) {
    a2[i] = (float)uniform(-2, 2);
    l2[i] = (float)uniform(-3, -0.1);
    o2[i] = l2[i] + (float)uniform(-0.05, 0.05);
    m2[i] = i % 7 == 6 ? 0.0f : 1.0f;
  }
  mrl_pg_defaults(MRL_PG_CLIP_COV, &o);
  o.cov_ratio = 0.25;
  o.cov_lb = -100;
  o.cov_ub = 100;
  float t1[N], t2[N], t3[N];
  mrl_pg_stats s1, s2;
  int same = 1, differs = 0;
  for (uint64_t seed = 1; seed < 6; seed++) {
    o.seed = seed;
    MUST(mrl_policy_loss(e, MRL_PG_CLIP_COV, &o, l2, o2, a2, m2, NULL, 1, N, &s1, t1, NULL, NULL,
                         NULL));
    MUST(mrl_policy_loss(e, MRL_PG_CLIP_COV, &o, l2, o2, a2, m2, NULL, 1, N, &s2, t2, NULL, NULL,
                         NULL));
    o.seed = seed + 100;
    MUST(mrl_policy_loss(e, MRL_PG_CLIP_COV, &o, l2, o2, a2, m2, NULL, 1, N, NULL, t3, NULL, NULL,
                         NULL));
    int chosen = 0, valid = 0;
    for (int i = 0; i < N; i++) {
      same &= t1[i] == t2[i];
      differs |= t1[i] != t3[i];
      valid += m2[i] != 0.0f;
      chosen += m2[i] != 0.0f && t1[i] == 0.0f;
    }
    CHECK(chosen == (int)(0.25 * valid));
    CHECK_NEAR(s1.clipfrac, (double)chosen / valid, 1e-6);
  }
  CHECK(same && differs);
  /* kl-cov: the share with the largest covariance gets kl_coef |log ratio| added */
  mrl_pg_defaults(MRL_PG_KL_COV, &o);
  o.cov_ratio = 0.1;
  o.kl_coef = 2.0;
  MUST(mrl_policy_loss(e, MRL_PG_KL_COV, &o, l2, o2, a2, m2, NULL, 1, N, &s1, t1, NULL, NULL,
                       NULL));
  double ma = 0, ml = 0, cnt = 0;
  for (int i = 0; i < N; i++)
    if (m2[i] != 0.0f) ma += a2[i], ml += l2[i], cnt += 1;
  ma /= cnt;
  ml /= cnt;
  int with_kl = 0;
  double smallest_chosen = INFINITY, largest_other = -INFINITY;
  for (int i = 0; i < N; i++) {
    if (m2[i] == 0.0f) continue;
    double xi = (double)l2[i] - o2[i], plain = -a2[i] * exp(xi);
    double cov = (a2[i] - ma) * (l2[i] - ml);
    bool kl = fabs(t1[i] - plain) > 1e-7;
    if (kl) {
      CHECK_NEAR(t1[i], plain + 2.0 * fabs(xi), 1e-5);
      smallest_chosen = fmin(smallest_chosen, cov);
    } else {
      largest_other = fmax(largest_other, cov);
    }
    with_kl += kl;
  }
  CHECK(with_kl == (int)(0.1 * cnt));
  CHECK(smallest_chosen > largest_other);
  mrl_engine_free(e);
}

static void test_gdpo_otb_by_hand(void) {
  mrl_engine *e = new_engine();
  /* GDPO: two terms in one group of two rows of one token; term 1 (scores 0, 10) and term 2
   * (1, 0) normalise to (-a, a) and (a, -a) whatever their scales: with weights 1 and 1 (and no
   * epsilon) they cancel, where GRPO on the sums (1, 10) would not */
  const float m[] = {1, 1};
  const int64_t g[] = {4, 4};
  const double scores[] = {0, 10, 1, 0};
  float adv[2];
  CHECK_FAILS(e, MRL_ERR_INVALID, "whitening needs at least 2 valid tokens",
              mrl_gdpo(e, NULL, scores, NULL, 2, (const float[]){1, 0}, g, 2, 1, adv));
  mrl_outcome_opts no_eps;
  mrl_outcome_defaults(&no_eps);
  no_eps.epsilon = 0.0;
  MUST(mrl_gdpo(e, &no_eps, scores, NULL, 2, m, g, 2, 1, adv));
  CHECK(fabs(adv[0]) < 1e-6 && fabs(adv[1]) < 1e-6);
  const double w[] = {1, 0}; /* only term 1: GRPO then whitening: -1/sqrt(2), 1/sqrt(2) */
  MUST(mrl_gdpo(e, NULL, scores, w, 2, m, g, 2, 1, adv));
  CHECK_NEAR(adv[1], 1.0 / sqrt(2.0), 1e-5);
  CHECK_NEAR(adv[0], -1.0 / sqrt(2.0), 1e-5);

  /* the optimal token baseline: one group of two rows; w = 1 - 2 e^0 + 1.5 = 0.5 per token */
  const float r[] = {0, 1, 0, 0}, mk[] = {1, 1, 1, 0}, lp[] = {0, 0, 0, 0}, spq[] = {1.5f, 1.5f,
                                                                                     1.5f, 1.5f};
  float a[4], ret[4];
  mrl_otb_opts o;
  mrl_otb_defaults(&o);
  o.handle_zero_tail = 0;
  MUST(mrl_optimal_token_baseline(e, &o, r, mk, g, lp, spq, NULL, 2, 2, a, ret));
  /* step 0: G = (1, 0), W = (0.5, 0.5): B = 0.5; step 1: only row 0 (W 1): B = 1 */
  CHECK_NEAR(a[0], 0.5, 1e-6);
  CHECK_NEAR(a[2], -0.5, 1e-6);
  CHECK_NEAR(a[1], 0.0, 1e-6);
  CHECK(a[3] == 0.0f && ret[0] == 1.0f);
  o.handle_zero_tail = 1; /* row 0 alone past step 1: its baseline there is 0 */
  MUST(mrl_optimal_token_baseline(e, &o, r, mk, g, lp, spq, NULL, 2, 2, a, ret));
  CHECK_NEAR(a[1], 1.0, 1e-6);
  const int64_t alone[] = {1, 2}; /* groups of one: no baseline */
  MUST(mrl_optimal_token_baseline(e, &o, r, mk, alone, lp, spq, NULL, 2, 2, a, ret));
  CHECK_NEAR(a[0], 1.0, 1e-6);
  mrl_engine_free(e);
}

static void test_rollout_correction_by_hand(void) {
  mrl_engine *e = new_engine();
  /* log ratios ln 3, 0, -ln 4 on a row and 0.1 on a second */
  const float lp[] = {(float)log(3.0), 0, (float)-log(4.0), 0.1f};
  const float rp[] = {0, 0, 0, 0}, m[] = {1, 1, 1, 1};
  float w[4], mo[4];
  mrl_rollout_corr_opts o = {.is = MRL_ROLLOUT_IS_TOKEN, .is_upper = 2.0};
  mrl_rollout_corr_stats st;
  MUST(mrl_rollout_correction(e, &o, lp, rp, m, 2, 2, w, mo, &st));
  CHECK_NEAR(w[0], 2.0, 1e-6); /* truncated */
  CHECK_NEAR(w[2], 0.25, 1e-6);
  CHECK_NEAR(st.is_fraction_high, 0.25, 1e-6);
  CHECK_NEAR(st.is_fraction_low, 0.25, 1e-6);
  o.is_lower = 0.5; /* masked outside [0.5, 2] */
  MUST(mrl_rollout_correction(e, &o, lp, rp, m, 2, 2, w, mo, &st));
  CHECK(w[0] == 0.0f && w[2] == 0.0f && w[1] == 1.0f);
  o = (mrl_rollout_corr_opts){.is = MRL_ROLLOUT_IS_SEQUENCE, .is_upper = 10.0,
                              .is_batch_normalize = 1};
  MUST(mrl_rollout_correction(e, &o, lp, rp, m, 2, 2, w, mo, &st));
  /* row weights e^(ln 3 + 0) = 3 and e^(-ln 4 + 0.1), normalised by their mean */
  double w1 = exp(0.1) / 4.0, mean = (3.0 + w1) / 2.0;
  CHECK_NEAR(w[0], 3.0 / mean, 1e-5);
  CHECK_NEAR(w[1], 3.0 / mean, 1e-5);
  CHECK_NEAR(w[3], w1 / mean, 1e-5);
  CHECK_NEAR(st.is_norm_factor, mean, 1e-5);
  /* rejection: token_k1 within [ln 0.5, ln 2] drops the first and third tokens; seq_max_k2 <= 0.7
   * drops the second row (k2 of ln 3 is 0.60, of ln 4 0.96) */
  const mrl_rollout_rs rs[] = {{MRL_RS_TOKEN_K1, 2.0, 0.0}};
  o = (mrl_rollout_corr_opts){.rs = rs, .n_rs = 1};
  MUST(mrl_rollout_correction(e, &o, lp, rp, m, 2, 2, NULL, mo, &st));
  CHECK(mo[0] == 0.0f && mo[1] == 1.0f && mo[2] == 0.0f && mo[3] == 1.0f);
  CHECK_NEAR(st.rs_masked_fraction, 0.5, 1e-6);
  const mrl_rollout_rs seq[] = {{MRL_RS_SEQ_MAX_K2, 0.7, 0.0}};
  o.rs = seq;
  float inplace[] = {1, 1, 1, 1};
  MUST(mrl_rollout_correction(e, &o, lp, rp, inplace, 2, 2, NULL, inplace, &st));
  CHECK(inplace[0] == 1.0f && inplace[1] == 1.0f && inplace[2] == 0.0f && inplace[3] == 0.0f);
  CHECK_NEAR(st.rs_seq_masked_fraction, 0.5, 1e-6);
  CHECK_FAILS(e, MRL_ERR_INVALID, "at least one valid token",
              mrl_rollout_correction(e, &o, lp, rp, (const float[]){0, 0, 0, 0}, 2, 2, NULL, mo,
                                     NULL));
  o = (mrl_rollout_corr_opts){.is = MRL_ROLLOUT_IS_TOKEN, .is_upper = 2.0, .is_lower = 3.0};
  CHECK_FAILS(e, MRL_ERR_INVALID, "is_lower is 3",
              mrl_rollout_correction(e, &o, lp, rp, m, 2, 2, w, mo, NULL));
  const mrl_rollout_rs bad[] = {{(mrl_rollout_rs_kind)12, 1.0, 0.0}};
  o = (mrl_rollout_corr_opts){.rs = bad, .n_rs = 1};
  CHECK_FAILS(e, MRL_ERR_INVALID, "unknown criterion 12",
              mrl_rollout_correction(e, &o, lp, rp, m, 2, 2, NULL, mo, NULL));
  mrl_engine_free(e);
}

/* ---- gradients by central finite differences ---- */

enum { FD_ROWS = 5, FD_COLS = 7, FD_N = FD_ROWS * FD_COLS };

typedef struct {
  float logp[FD_N], old[FD_N], adv[FD_N], mask[FD_N], w[FD_N], scale[FD_N];
  int32_t turn[FD_N];
} fd_batch;

/* log ratios away from the kinks of every clip used below (ratio bounds 0.8, 1.2, 1.28, 0.7,
 * log bounds +-0.4, the value clip +-0.5, the dual clip at ratio 3), so the loss is smooth
 * within the step */
static bool near_kink(double x) {
  static const double kinks[] = {-0.2231436, 0.1823216, 0.2468601, -0.3566749, 0.4,
                                 -0.4,       0.5,       -0.5,      1.0986123,  0.0};
  for (size_t i = 0; i < sizeof kinks / sizeof kinks[0]; i++)
    if (fabs(x - kinks[i]) < 0.02) return true;
  return false;
}

static void fd_fill(fd_batch *b) {
  lcg = 11; /* every test gets the same batch */
  for (int i = 0; i < FD_N; i++) {
    double x;
    do x = uniform(-1.6, 1.6);
    while (near_kink(x));
    b->old[i] = (float)uniform(-3.0, -0.2);
    b->logp[i] = (float)(b->old[i] + x);
    b->adv[i] = (float)((uniform(0, 1) < 0.5 ? -1 : 1) * uniform(0.2, 2.0));
    b->mask[i] = (i % FD_COLS) < FD_COLS - (i / FD_COLS) % 3 ? 1.0f : 0.0f; /* ragged rows */
    b->w[i] = (float)uniform(0.5, 1.5);
    b->scale[i] = (float)uniform(0.8, 1.2);
    b->turn[i] = b->mask[i] != 0.0f ? (i % FD_COLS) / 3 : -1;
  }
  for (int t = 0; t < FD_COLS; t++) b->mask[3 * FD_COLS + t] = 0.0f; /* a row without tokens */
}

/* what a gradient check differentiates: the loss at logp */
typedef double (*loss_fn)(const void *ctx, const float *logp);

/* Checks grad (from the API) against central differences of f at x, perturbing each entry by
 * about h (the float steps actually taken are used). */
static void check_gradient(const char *what, loss_fn f, const void *ctx, const float *x,
                           const float *grad, int n) {
  float probe[FD_N];
  double worst = 0.0;
  int bad = -1;
  for (int i = 0; i < n; i++) {
    memcpy(probe, x, (size_t)n * sizeof *probe);
    float up = x[i] + 1e-3f, down = x[i] - 1e-3f;
    probe[i] = up;
    double lu = f(ctx, probe);
    probe[i] = down;
    double ld = f(ctx, probe);
    double fd = (lu - ld) / ((double)up - (double)down);
    double err = fabs(fd - grad[i]) / (1e-4 + fabs(fd));
    if (err > worst) {
      worst = err;
      bad = i;
    }
  }
  CHECKF(worst < 2e-3, "%s: gradient[%d] = %g, finite difference differs (relative %g)", what, bad,
         bad >= 0 ? grad[bad] : 0.0, worst);
}

typedef struct {
  mrl_engine *e;
  mrl_pg_kind kind;
  mrl_pg_opts opts;
  const fd_batch *b;
  bool weights;
} pg_ctx;

static double pg_loss(const void *p, const float *logp) {
  const pg_ctx *c = p;
  mrl_pg_stats st;
  MUST(mrl_policy_loss(c->e, c->kind, &c->opts, logp, c->b->old, c->b->adv, c->b->mask,
                       c->weights ? c->b->w : NULL, FD_ROWS, FD_COLS, &st, NULL, NULL, NULL, NULL));
  return st.loss;
}

static void test_policy_loss_gradients(void) {
  mrl_engine *e = new_engine();
  fd_batch b;
  fd_fill(&b);
  static const struct {
    mrl_pg_kind kind;
    const char *name;
  } kinds[] = {{MRL_PG_PPO, "ppo"},          {MRL_PG_SAPO, "sapo"},
               {MRL_PG_GPG, "gpg"},          {MRL_PG_GMPO, "gmpo"},
               {MRL_PG_CLIP_COV, "clip_cov"}, {MRL_PG_KL_COV, "kl_cov"},
               {MRL_PG_DRO, "dro"},          {MRL_PG_REINFORCE, "reinforce"}};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (int mode = MRL_AGG_TOKEN_MEAN; mode <= MRL_AGG_TOKEN_SUM; mode++) {
      pg_ctx c = {e, kinds[k].kind, {0}, &b, mode == 1 || mode == MRL_AGG_TOKEN_SUM};
      mrl_pg_defaults(c.kind, &c.opts);
      c.opts.agg = (mrl_loss_agg)mode;
      if (c.kind == MRL_PG_PPO) c.opts.clip_high = 0.28; /* asymmetric, DAPO's clip-higher */
      c.opts.dro_beta = 0.7;
      c.opts.cov_ratio = 0.2;  /* several tokens chosen */
      c.opts.cov_lb = -1.0;    /* a window the data's covariances straddle */
      c.opts.cov_ub = 0.5;
      c.opts.seed = 11;
      float grad[FD_N] = {0};
      mrl_pg_stats st;
      MUST(mrl_policy_loss(e, c.kind, &c.opts, b.logp, b.old, b.adv, b.mask, c.weights ? b.w : NULL,
                           FD_ROWS, FD_COLS, &st, NULL, NULL, NULL, grad));
      char what[64];
      snprintf(what, sizeof what, "%s, aggregation %d", kinds[k].name, mode);
      check_gradient(what, pg_loss, &c, b.logp, grad, FD_N);
      if (c.kind == MRL_PG_PPO && mode == 0) /* the data reaches every branch */
        CHECKF(st.clipfrac > 0.1 && st.clipfrac_lower > 0.02, "clipfrac %g, lower %g", st.clipfrac,
               st.clipfrac_lower);
    }
  mrl_engine_free(e);
}

/* CISPO's weight is a stop-gradient: moving logp and old_logp together keeps the ratio, so the
 * loss then changes by exactly the gradient the API reports. */
typedef struct {
  mrl_engine *e;
  const fd_batch *b;
  const float *base;
  mrl_pg_kind kind; /* CISPO, or DPPO (whose truncated ratio is a stop-gradient too) */
} cispo_ctx;

static double cispo_shifted(const void *p, const float *logp) {
  const cispo_ctx *c = p;
  float old[FD_N];
  for (int i = 0; i < FD_N; i++) old[i] = c->b->old[i] + (logp[i] - c->base[i]);
  mrl_pg_stats st;
  MUST(mrl_policy_loss(c->e, c->kind, NULL, logp, old, c->b->adv, c->b->mask, c->b->w, FD_ROWS,
                       FD_COLS, &st, NULL, NULL, NULL, NULL));
  return st.loss;
}

/* GSPO gives each token its sequence ratio times its own log-probability's gradient; with one
 * token per row that is the full derivative. */
typedef struct {
  mrl_engine *e;
  const fd_batch *b;
  const float *mask;
} gspo_ctx;

static double gspo_loss(const void *p, const float *logp) {
  const gspo_ctx *c = p;
  mrl_pg_opts o;
  mrl_pg_defaults(MRL_PG_GSPO, &o);
  o.clip_low = 0.2;
  o.clip_high = 0.28;
  mrl_pg_stats st;
  MUST(mrl_policy_loss(c->e, MRL_PG_GSPO, &o, logp, c->b->old, c->b->adv, c->mask, NULL, FD_ROWS,
                       FD_COLS, &st, NULL, NULL, NULL, NULL));
  return st.loss;
}

static void test_cispo_and_gspo_gradients(void) {
  mrl_engine *e = new_engine();
  fd_batch b;
  fd_fill(&b);
  float grad[FD_N] = {0};
  static const mrl_pg_kind stopped[] = {MRL_PG_CISPO, MRL_PG_DPPO_TV, MRL_PG_DPPO_KL};
  for (int k = 0; k < 3; k++) {
    memset(grad, 0, sizeof grad);
    mrl_pg_stats st;
    MUST(mrl_policy_loss(e, stopped[k], NULL, b.logp, b.old, b.adv, b.mask, b.w, FD_ROWS, FD_COLS,
                         &st, NULL, NULL, NULL, grad));
    cispo_ctx cc = {e, &b, b.logp, stopped[k]};
    char what[32];
    snprintf(what, sizeof what, "stop-gradient kind %d", (int)stopped[k]);
    check_gradient(what, cispo_shifted, &cc, b.logp, grad, FD_N);
    if (k > 0) /* the data has tokens on both sides of the trust region */
      CHECKF(st.clipfrac > 0.05 && st.clipfrac < 0.95, "DPPO %d: clipfrac %g", k, st.clipfrac);
  }

  float one[FD_N] = {0}; /* the first token of each row */
  for (int r = 0; r < FD_ROWS; r++) one[r * FD_COLS] = 1.0f;
  gspo_ctx gc = {e, &b, one};
  mrl_pg_opts o;
  mrl_pg_defaults(MRL_PG_GSPO, &o);
  o.clip_low = 0.2;
  o.clip_high = 0.28;
  memset(grad, 0, sizeof grad);
  double ratio[FD_ROWS];
  MUST(mrl_policy_loss(e, MRL_PG_GSPO, &o, b.logp, b.old, b.adv, one, NULL, FD_ROWS, FD_COLS, NULL,
                       NULL, ratio, NULL, grad));
  check_gradient("gspo, one token per row", gspo_loss, &gc, b.logp, grad, FD_N);
  /* with longer rows every unclipped token gets -A s / (tokens x rows), s the row's ratio */
  memset(grad, 0, sizeof grad);
  MUST(mrl_policy_loss(e, MRL_PG_GSPO, &o, b.logp, b.old, b.adv, b.mask, NULL, FD_ROWS, FD_COLS,
                       NULL, NULL, ratio, NULL, grad));
  double s = ratio[0];
  int tokens = 0;
  for (int t = 0; t < FD_COLS; t++) tokens += b.mask[t] != 0.0f;
  for (int t = 0; t < FD_COLS; t++) {
    double a = b.adv[t];
    bool clipped = -a * fmin(fmax(s, 0.8), 1.28) > -a * s;
    double want = clipped ? 0.0 : -a * s / (tokens * 4.0); /* 4 rows have tokens */
    CHECK_NEAR(grad[t], want, 1e-5);
  }
  mrl_engine_free(e);
}

typedef struct {
  mrl_engine *e;
  const fd_batch *b;
  int turn_level;
} a2_ctx;

static double a2_loss(const void *p, const float *logp) {
  const a2_ctx *c = p;
  mrl_pg_stats st;
  MUST(mrl_a2tgpo_loss(c->e, NULL, c->turn_level, logp, c->b->old, c->b->adv, c->b->mask,
                       c->b->turn, c->b->scale, FD_ROWS, FD_COLS, &st, NULL, NULL, NULL));
  return st.loss;
}

static void test_a2tgpo_gradients(void) {
  mrl_engine *e = new_engine();
  fd_batch b;
  fd_fill(&b);
  for (int i = 0; i < FD_N; i++) b.logp[i] = b.old[i] + (float)uniform(-0.3, 0.3);
  for (int turn_level = 0; turn_level <= 1; turn_level++) {
    float grad[FD_N] = {0}, ratio[FD_N];
    MUST(mrl_a2tgpo_loss(e, NULL, turn_level, b.logp, b.old, b.adv, b.mask, b.turn, b.scale,
                         FD_ROWS, FD_COLS, NULL, NULL, ratio, grad));
    a2_ctx c = {e, &b, turn_level};
    check_gradient(turn_level ? "a2tgpo, turn ratios" : "a2tgpo, token ratios", a2_loss, &c, b.logp,
                   grad, FD_N);
    if (turn_level) CHECK(ratio[0] == ratio[1] && ratio[0] != ratio[3]); /* turns 0 and 1 */
  }
  mrl_engine_free(e);
}

typedef struct {
  mrl_engine *e;
  const fd_batch *b;
  mrl_kl_kind kind;
  int which; /* 0: KL loss, 1: entropy bonus, 2: turn KL, 3: value loss */
} aux_ctx;

static double aux_loss(const void *p, const float *x) {
  const aux_ctx *c = p;
  double loss;
  const double tw[FD_ROWS * 3] = {1, 2, 3, 1, 1, 1, 0.5, 0, 1, 1, 1, 1, 2, 2, 1};
  switch (c->which) {
  case 0:
    MUST(mrl_kl_loss(c->e, c->kind, MRL_AGG_SEQ_MEAN_TOKEN_MEAN, 0, 0.1, x, c->b->old, c->b->mask,
                     FD_ROWS, FD_COLS, &loss, NULL));
    break;
  case 1:
    MUST(mrl_entropy_bonus(c->e, MRL_AGG_TOKEN_MEAN, 0, 0.01, x, c->b->mask, FD_ROWS, FD_COLS,
                           &loss, NULL));
    break;
  case 2:
    MUST(mrl_turn_kl_loss(c->e, c->kind, x, c->b->old, c->b->mask, c->b->turn, FD_ROWS, FD_COLS, 3,
                          tw, &loss, NULL, NULL));
    break;
  default:
    MUST(mrl_value_loss(c->e, MRL_AGG_TOKEN_MEAN, 0, 0.5, x, c->b->old, c->b->adv, c->b->mask,
                        FD_ROWS, FD_COLS, &loss, NULL, NULL));
    break;
  }
  return loss;
}

static void test_kl_entropy_value_gradients(void) {
  mrl_engine *e = new_engine();
  fd_batch b;
  fd_fill(&b);
  const double tw[FD_ROWS * 3] = {1, 2, 3, 1, 1, 1, 0.5, 0, 1, 1, 1, 1, 2, 2, 1};
  static const mrl_kl_kind kinds[] = {MRL_KL_K1, MRL_KL_K2, MRL_KL_K3, MRL_KL_ABS};
  for (int which = 0; which < 4; which++)
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
      if ((which == 1 || which == 3) && k > 0) continue;
      float grad[FD_N] = {0};
      double loss, clipfrac = 0;
      if (which == 0)
        MUST(mrl_kl_loss(e, kinds[k], MRL_AGG_SEQ_MEAN_TOKEN_MEAN, 0, 0.1, b.logp, b.old, b.mask,
                         FD_ROWS, FD_COLS, &loss, grad));
      else if (which == 1)
        MUST(mrl_entropy_bonus(e, MRL_AGG_TOKEN_MEAN, 0, 0.01, b.logp, b.mask, FD_ROWS, FD_COLS,
                               &loss, grad));
      else if (which == 2)
        MUST(mrl_turn_kl_loss(e, kinds[k], b.logp, b.old, b.mask, b.turn, FD_ROWS, FD_COLS, 3, tw,
                              &loss, NULL, grad));
      else
        MUST(mrl_value_loss(e, MRL_AGG_TOKEN_MEAN, 0, 0.5, b.logp, b.old, b.adv, b.mask, FD_ROWS,
                            FD_COLS, &loss, &clipfrac, grad));
      aux_ctx c = {e, &b, kinds[k], which};
      char what[64];
      snprintf(what, sizeof what, "auxiliary loss %d, KL kind %d", which, (int)kinds[k]);
      check_gradient(what, aux_loss, &c, b.logp, grad, FD_N);
      if (which == 3)
        CHECKF(clipfrac > 0.1, "value clipfrac %g: the clip is never reached", clipfrac);
    }
  mrl_engine_free(e);
}

static void test_gradients_accumulate(void) {
  mrl_engine *e = new_engine();
  fd_batch b;
  fd_fill(&b);
  float once[FD_N] = {0}, twice[FD_N] = {0};
  MUST(mrl_policy_loss(e, MRL_PG_PPO, NULL, b.logp, b.old, b.adv, b.mask, NULL, FD_ROWS, FD_COLS,
                       NULL, NULL, NULL, NULL, once));
  for (int k = 0; k < 2; k++)
    MUST(mrl_policy_loss(e, MRL_PG_PPO, NULL, b.logp, b.old, b.adv, b.mask, NULL, FD_ROWS, FD_COLS,
                         NULL, NULL, NULL, NULL, twice));
  int nonzero = 0;
  for (int i = 0; i < FD_N; i++) {
    CHECK(twice[i] == 2.0f * once[i]);
    CHECK(b.mask[i] != 0.0f || once[i] == 0.0f); /* nothing reaches masked tokens */
    nonzero += once[i] != 0.0f;
  }
  CHECK(nonzero > 0);
  mrl_engine_free(e);
}

/* ---- error paths ---- */

static void test_errors(void) {
  mrl_engine *e = new_engine();
  const float r[] = {0, 1, 1, 0}, m[] = {1, 1, 1, 1}, half[] = {1, 0.5f, 1, 1};
  const float nan_r[] = {0, NAN, 1, 0};
  const int64_t g[] = {0, 0};
  float adv[4] = {7, 7, 7, 7};
  CHECK(mrl_outcome_advantage(NULL, MRL_ADV_GRPO, NULL, r, m, g, 2, 2, adv) == MRL_ERR_NULL);
  CHECK_FAILS(e, MRL_ERR_NULL, "rewards is NULL",
              mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, NULL, m, g, 2, 2, adv));
  CHECK_FAILS(e, MRL_ERR_NULL, "group is NULL",
              mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, r, m, NULL, 2, 2, adv));
  CHECK_FAILS(e, MRL_ERR_INVALID, "sizes must be >= 0",
              mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, r, m, g, -1, 2, adv));
  CHECK_FAILS(e, MRL_ERR_OVERFLOW, "too many",
              mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, r, m, g, INT64_MAX / 2, 4, adv));
  CHECK_FAILS(e, MRL_ERR_INVALID, "mask[1] is 0.5",
              mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, r, half, g, 2, 2, adv));
  CHECK_FAILS(e, MRL_ERR_INVALID, "rewards[1] is nan",
              mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, nan_r, m, g, 2, 2, adv));
  CHECK_FAILS(e, MRL_ERR_INVALID, "unknown outcome estimator 42",
              mrl_outcome_advantage(e, (mrl_outcome_kind)42, NULL, r, m, g, 2, 2, adv));
  const int64_t alone[] = {0, 1};
  CHECK_FAILS(e, MRL_ERR_INVALID, "pass@k needs groups of 2",
              mrl_outcome_advantage(e, MRL_ADV_GRPO_PASSK, NULL, r, m, alone, 2, 2, adv));
  const float empty_mask[] = {0, 0, 0, 0};
  CHECK_FAILS(e, MRL_ERR_INVALID, "0/0",
              mrl_outcome_advantage(e, MRL_ADV_OPO, NULL, r, empty_mask, g, 2, 2, adv));
  for (int i = 0; i < 4; i++) CHECK(adv[i] == 7.0f); /* no failure wrote an output */

  const float one_token[] = {1, 0, 0, 0};
  CHECK_FAILS(e, MRL_ERR_INVALID, "at least 2 valid tokens",
              mrl_gae(e, r, r, one_token, 2, 2, 1.0, 1.0, adv, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "at least 2 valid tokens",
              mrl_reinforce_pp(e, r, empty_mask, 2, 2, 1.0, MRL_RETURN_CARRY, adv, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "unknown return rule 2",
              mrl_reinforce_pp(e, r, m, 2, 2, 1.0, (mrl_return_rule)2, adv, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "gamma is 1.5", mrl_gae(e, r, r, m, 2, 2, 1.5, 1.0, adv, NULL));

  double loss;
  CHECK_FAILS(e, MRL_ERR_INVALID, "unknown aggregation mode 9",
              mrl_agg_loss(e, (mrl_loss_agg)9, 0, r, m, 2, 2, &loss));
  CHECK_FAILS(e, MRL_ERR_INVALID, "loss[1] is nan", mrl_agg_loss(e, 0, 0, nan_r, m, 2, 2, &loss));
  MUST(mrl_agg_loss(e, MRL_AGG_TOKEN_MEAN, 0, nan_r, one_token, 2, 2, &loss)); /* NaN masked out */
  CHECK(loss == 0.0);
  MUST(mrl_agg_loss(e, MRL_AGG_TOKEN_MEAN, 0, r, empty_mask, 2, 2, &loss)); /* no token: 0 */
  CHECK(loss == 0.0);

  mrl_pg_opts o;
  mrl_pg_defaults(MRL_PG_PPO, &o);
  o.clip_c = 1.0;
  float tl[4];
  CHECK_FAILS(
      e, MRL_ERR_INVALID, "dual clip",
      mrl_policy_loss(e, MRL_PG_PPO, &o, r, r, r, m, NULL, 2, 2, NULL, NULL, NULL, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "old_logp is NULL",
              mrl_policy_loss(e, MRL_PG_PPO, NULL, r, NULL, r, m, NULL, 2, 2, NULL, NULL, NULL,
                              NULL, NULL));
  CHECK_FAILS(
      e, MRL_ERR_UNSUPPORTED, "GMPO has no per-token loss",
      mrl_policy_loss(e, MRL_PG_GMPO, NULL, r, r, r, m, NULL, 2, 2, NULL, tl, NULL, NULL, NULL));
  const float negative[] = {1, -0.5f, 1, 1};
  CHECK_FAILS(
      e, MRL_ERR_INVALID, "is_weights[1] is -0.5",
      mrl_policy_loss(e, MRL_PG_GMPO, NULL, r, r, r, m, negative, 2, 2, NULL, NULL, NULL, NULL,
                      NULL));
  mrl_pg_defaults(MRL_PG_DPPO_KL, &o);
  o.clip_c = 0.0;
  CHECK_FAILS(e, MRL_ERR_INVALID, "DPPO truncates",
              mrl_policy_loss(e, MRL_PG_DPPO_KL, &o, r, r, r, m, NULL, 2, 2, NULL, NULL, NULL,
                              NULL, NULL));
  mrl_pg_defaults(MRL_PG_KL_COV, &o);
  o.cov_ratio = 0.0;
  CHECK_FAILS(e, MRL_ERR_INVALID, "cov_ratio is 0",
              mrl_policy_loss(e, MRL_PG_KL_COV, &o, r, r, r, m, NULL, 2, 2, NULL, NULL, NULL,
                              NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "old_logp is NULL",
              mrl_policy_loss(e, MRL_PG_DPPO_TV, NULL, r, NULL, r, m, NULL, 2, 2, NULL, NULL, NULL,
                              NULL, NULL));
  MUST(mrl_policy_loss(e, MRL_PG_REINFORCE, NULL, r, NULL, r, m, NULL, 2, 2, NULL, NULL, NULL,
                       NULL, NULL)); /* the rollout's log-probs are only for its KL metric */
  CHECK_FAILS(e, MRL_ERR_INVALID, "terms is 0",
              mrl_gdpo(e, NULL, (const double[]){1, 2}, NULL, 0, m, g, 2, 2, adv));
  const double inf_score[] = {1, INFINITY};
  CHECK_FAILS(e, MRL_ERR_INVALID, "scores[1] is inf",
              mrl_gdpo(e, NULL, inf_score, NULL, 1, m, g, 2, 2, adv));
  CHECK_FAILS(e, MRL_ERR_INVALID, "old_logp[1] is nan",
              mrl_optimal_token_baseline(e, NULL, r, m, g, nan_r, r, NULL, 2, 2, adv, NULL));
  double ratio[2];
  CHECK_FAILS(
      e, MRL_ERR_INVALID, "only GSPO and GMPO",
      mrl_policy_loss(e, MRL_PG_PPO, NULL, r, r, r, m, NULL, 2, 2, NULL, NULL, ratio, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "unknown policy loss 17",
              mrl_policy_loss(e, (mrl_pg_kind)17, NULL, r, r, r, m, NULL, 2, 2, NULL, NULL, NULL,
                              NULL, NULL));
  float kl[4];
  CHECK_FAILS(e, MRL_ERR_INVALID, "unknown KL estimator 7", mrl_kl(e, 7, r, r, 4, kl, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "target", mrl_kl_adaptive(e, 0.1, 0.2, 10, 0.0, 100.0, &loss));

  const double scores[] = {1, 2, 3};
  double w[3];
  CHECK_FAILS(e, MRL_ERR_INVALID, "k is 4", mrl_frontier_weights(e, scores, 3, 4, 0, w));
  CHECK_FAILS(
      e, MRL_ERR_INVALID, "threshold is 1",
      mrl_similarity_groups(e, (const char *const[]){"a"}, NULL, g, 1, 1.0, (int64_t[1]){0}));
  const int64_t bad_match[] = {3, 1};
  double seg_r[5];
  int64_t seg[5];
  CHECK_FAILS(e, MRL_ERR_INVALID, "match[1] is 1",
              mrl_milestone_segments(e, 5, bad_match, 2, 0.9, seg_r, seg));
  const int64_t traj[] = {1, 1}, steps[] = {2, 2};
  CHECK_FAILS(e, MRL_ERR_INVALID, "both step 2",
              mrl_steppo_gae(e, r, r, m, traj, steps, 2, 2, 0.9, 1.0, adv, NULL));
  const int64_t offsets[] = {0, 1};
  mrl_selective_gate gate;
  CHECK_FAILS(e, MRL_ERR_INVALID, "2 or more trajectories",
              mrl_selective_gate_eval(e, g, offsets, 1, 3, 0.1, 0.9, &gate));
  CHECK_FAILS(
      e, MRL_ERR_INVALID, "threshold is 0",
      mrl_fatal_step(e, (const uint8_t[]){1}, 1, 0, 0, (int64_t[1]){0}, &(mrl_fatal_reason){0}));
  int skip;
  CHECK_FAILS(e, MRL_ERR_INVALID, "alpha is 2",
              mrl_pace_advantage(e, scores, 3, 2, 2.0, w, NULL, NULL, &skip));
  mrl_engine_free(e);
}

static void test_memory_limit(void) {
  mrl_engine *e = new_engine();
  enum { N = 4096 };
  float *r = calloc(N, sizeof *r), *m = calloc(N, sizeof *m), *adv = calloc(N, sizeof *adv);
  int64_t *g = calloc(N / 8, sizeof *g);
  for (int i = 0; i < N; i++) m[i] = 1.0f;
  MUST(mrl_engine_set_memory_limit(e, 1024));
  CHECK_FAILS(e, MRL_ERR_NOMEM, "scratch memory",
              mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, r, m, g, N / 8, 8, adv));
  CHECK_FAILS(e, MRL_ERR_NOMEM, "scratch memory",
              mrl_policy_loss(e, MRL_PG_PPO, NULL, r, r, r, m, NULL, N / 8, 8, NULL, NULL, NULL,
                              NULL, NULL));
  MUST(mrl_engine_set_memory_limit(e, 0));
  MUST(mrl_outcome_advantage(e, MRL_ADV_GRPO, NULL, r, m, g, N / 8, 8, adv));
  CHECK(mrl_engine_memory_used(e) == 0); /* scratch is given back */
  free(r);
  free(m);
  free(adv);
  free(g);
  mrl_engine_free(e);
}

static const test_case tests[] = {
    {"grpo_by_hand", test_grpo_by_hand},
    {"outcome_kinds_by_hand", test_outcome_kinds_by_hand},
    {"returns_by_hand", test_returns_by_hand},
    {"gigpo_by_hand", test_gigpo_by_hand},
    {"milestones_by_hand", test_milestones_by_hand},
    {"text_similarity_matches_difflib", test_text_similarity_matches_difflib},
    {"gate_and_edit_distance", test_gate_and_edit_distance},
    {"frontier_weights_against_enumeration", test_frontier_weights_against_enumeration},
    {"kl_estimators_by_hand", test_kl_estimators_by_hand},
    {"agg_by_hand", test_agg_by_hand},
    {"verl_losses_by_hand", test_verl_losses_by_hand},
    {"gdpo_otb_by_hand", test_gdpo_otb_by_hand},
    {"rollout_correction_by_hand", test_rollout_correction_by_hand},
    {"policy_loss_gradients", test_policy_loss_gradients},
    {"cispo_and_gspo_gradients", test_cispo_and_gspo_gradients},
    {"a2tgpo_gradients", test_a2tgpo_gradients},
    {"kl_entropy_value_gradients", test_kl_entropy_value_gradients},
    {"gradients_accumulate", test_gradients_accumulate},
    {"errors", test_errors},
    {"memory_limit", test_memory_limit},
    {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
