/* test_replay.c - unit tests of the replay buffer's arithmetic (mrl_replay_weights, _draw,
 * _ratios): values by hand, the age decay's half-life, draws against a naive reference of the
 * same rule (every draw renormalised over the entries left), draw frequencies against the
 * weights, staleness revisits, importance weights, and the error paths. */
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool near(double got, double want, double tol) {
  return fabs(got - want) <= tol * (1.0 + fabs(want));
}

#define CHECK_NEAR(got, want, tol)                                                                 \
  CHECKF(near((got), (want), (tol)), "%s = %.12g, want %.12g", #got, (double)(got), (double)(want))

static uint64_t lcg = 11;
static double uniform01(void) {
  lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(lcg >> 11) * 0x1.0p-53;
}

static void test_weights_by_hand(void) {
  mrl_engine *e = new_engine();
  const double p[] = {1.0, 4.0, 0.0, 2.0};
  const double age[] = {0.0, 10.0, 5.0, -3.0}; /* a negative age counts as 0 */
  double w[4];
  MUST(mrl_replay_weights(e, p, age, 4, 0.5, 10.0, 1e-6, w));
  CHECK_NEAR(w[0], 1.0, 1e-15);
  CHECK_NEAR(w[1], 2.0 * exp(-1.0), 1e-15);
  CHECK_NEAR(w[2], 1e-3 * exp(-0.5), 1e-12); /* the floor, then alpha */
  CHECK_NEAR(w[3], sqrt(2.0), 1e-15);
  MUST(mrl_replay_weights(e, p, age, 4, 0.5, INFINITY, 1e-6, w)); /* no decay */
  CHECK_NEAR(w[1], 2.0, 1e-15);
  mrl_engine_free(e);
}

/* With any alpha, the weight halves every decay * ln 2 steps. */
static void test_weights_half_life(void) {
  mrl_engine *e = new_engine();
  const double tau = 500.0, half = tau * log(2.0);
  const double p[] = {3.0, 3.0, 3.0};
  const double age[] = {0.0, half, 2.0 * half};
  for (double alpha = 0.0; alpha <= 1.0; alpha += 0.3) {
    double w[3];
    MUST(mrl_replay_weights(e, p, age, 3, alpha, tau, 1e-6, w));
    CHECK_NEAR(w[1] / w[0], 0.5, 1e-12);
    CHECK_NEAR(w[2] / w[0], 0.25, 1e-12);
  }
  mrl_engine_free(e);
}

/* The rule of mrl_replay_draw written the slow way: each draw over the entries left. */
static void naive_draw(const double *w, const int64_t *last, int64_t n, double staleness,
                       const double *u, int64_t k, int64_t *out) {
  bool taken[64] = {false};
  for (int64_t j = 0; j < k; j++) {
    double left = 0.0;
    for (int64_t i = 0; i < n; i++)
      if (!taken[i]) left += w[i];
    int64_t pick = -1;
    if (u[2 * j] < staleness || left <= 0.0) {
      for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (pick < 0 || last[i] < last[pick])) pick = i;
    } else {
      double acc = 0.0;
      for (int64_t i = 0; i < n; i++) {
        if (taken[i] || w[i] <= 0.0) continue;
        acc += w[i];
        if (acc > u[2 * j + 1] * left) {
          pick = i;
          break;
        }
      }
    }
    taken[pick] = true;
    out[j] = pick;
  }
}

static void test_draw_matches_naive(void) {
  mrl_engine *e = new_engine();
  enum { N = 40, K = 12 };
  double w[N], u[2 * K];
  int64_t last[N], got[K], want[K];
  for (int round = 0; round < 200; round++) {
    for (int i = 0; i < N; i++) {
      w[i] = uniform01() < 0.2 ? 0.0 : uniform01() * 3.0;
      last[i] = (int64_t)(uniform01() * 5.0);
    }
    for (int j = 0; j < 2 * K; j++) u[j] = uniform01();
    double staleness = round % 3 == 0 ? 0.0 : 0.3;
    naive_draw(w, last, N, staleness, u, K, want);
    uint8_t stale[K];
    MUST(mrl_replay_draw(e, w, last, N, staleness, 0.4, u, K, got, NULL, NULL, stale));
    bool same = true, distinct = true;
    for (int j = 0; j < K; j++) {
      same = same && got[j] == want[j];
      for (int i = 0; i < j; i++) distinct = distinct && got[i] != got[j];
    }
    CHECKF(same, "round %d: the draw differs from the naive reference", round);
    CHECK(distinct);
  }
  mrl_engine_free(e);
}

/* Single draws without staleness land on entries in proportion to their weights. */
static void test_draw_frequencies(void) {
  mrl_engine *e = new_engine();
  const double w[] = {1.0, 2.0, 3.0, 4.0, 0.0};
  const int64_t last[] = {0, 0, 0, 0, 0};
  long count[5] = {0};
  const long draws = 200000;
  for (long d = 0; d < draws; d++) {
    double u[2] = {uniform01(), uniform01()};
    int64_t pick;
    MUST(mrl_replay_draw(e, w, last, 5, 0.0, 0.0, u, 1, &pick, NULL, NULL, NULL));
    count[pick]++;
  }
  for (int i = 0; i < 5; i++) {
    double share = (double)count[i] / (double)draws;
    CHECKF(fabs(share - w[i] / 10.0) < 0.005, "entry %d: share %.4f, weight share %.4f", i, share,
           w[i] / 10.0);
  }
  CHECK(count[4] == 0);
  mrl_engine_free(e);
}

/* staleness 1 takes the least recently used entries, oldest first, ties by index; a zero total
 * weight falls back to it too. */
static void test_draw_staleness(void) {
  mrl_engine *e = new_engine();
  const double w[] = {5.0, 1.0, 1.0, 9.0};
  const int64_t last[] = {7, 3, 3, 1};
  const double u[8] = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
  int64_t out[4];
  uint8_t stale[4];
  double prob[4], isw[4];
  MUST(mrl_replay_draw(e, w, last, 4, 1.0, 0.0, u, 4, out, prob, isw, stale));
  CHECK(out[0] == 3 && out[1] == 1 && out[2] == 2 && out[3] == 0);
  CHECK(stale[0] && stale[1] && stale[2] && stale[3]);
  CHECK_NEAR(prob[0], 1.0, 1e-15); /* the least recently used entry */
  CHECK(prob[1] == 0.0);           /* a staleness-1 draw only ever takes it first */
  const double zero[] = {0.0, 0.0, 0.0, 0.0};
  MUST(mrl_replay_draw(e, zero, last, 4, 0.0, 0.5, u, 2, out, prob, isw, stale));
  CHECK(out[0] == 3 && out[1] == 1 && stale[0] && stale[1]);
  CHECK(isw[0] > 0.0 && isw[1] > 0.0 && isfinite(isw[0]) && isfinite(isw[1]));
  mrl_engine_free(e);
}

/* prob: (1 - s) w / W (+ s for the least recent entry); is_weight: (n P)^-beta / max. */
static void test_draw_importance_weights(void) {
  mrl_engine *e = new_engine();
  const double w[] = {1.0, 3.0};
  const int64_t last[] = {0, 5};
  const double u[4] = {0.9, 0.0, 0.9, 0.0}; /* two weighted draws: entry 0, then entry 1 */
  int64_t out[2];
  double prob[2], isw[2];
  MUST(mrl_replay_draw(e, w, last, 2, 0.2, 0.5, u, 2, out, prob, isw, NULL));
  CHECK(out[0] == 0 && out[1] == 1);
  CHECK_NEAR(prob[0], 0.8 * 0.25 + 0.2, 1e-15);
  CHECK_NEAR(prob[1], 0.8 * 0.75, 1e-15);
  double a = pow(2.0 * prob[0], -0.5), b = pow(2.0 * prob[1], -0.5);
  CHECK_NEAR(isw[0], a / fmax(a, b), 1e-15);
  CHECK_NEAR(isw[1], b / fmax(a, b), 1e-15);
  mrl_engine_free(e);
}

static void test_ratios_by_hand(void) {
  mrl_engine *e = new_engine();
  /* episode 0: tokens 0-2 (sampled 1, 2), episode 1: token 3 (a prompt only), episode 2: 4-5 */
  const float logp[] = {0.0f, -1.0f, -3.0f, 0.0f, -0.5f, -2.0f};
  const float beh[] = {0.0f, -2.0f, -2.0f, 0.0f, -2.5f, -2.0f};
  const float mask[] = {0, 1, 1, 0, 1, 1};
  const int64_t off[] = {0, 3, 4, 6};
  double r[3];
  float tw[6];
  MUST(mrl_replay_ratios(e, logp, beh, mask, off, 3, 4.0, r, tw));
  CHECK_NEAR(r[0], exp(0.0), 1e-12); /* (+1 - 1) / 2 */
  CHECK_NEAR(r[1], 1.0, 0.0);
  CHECK_NEAR(r[2], exp(1.0), 1e-12); /* (+2 + 0) / 2 */
  CHECK(tw[0] == 1.0f && tw[3] == 1.0f);
  CHECK_NEAR(tw[1], exp(1.0), 1e-6);
  CHECK_NEAR(tw[2], exp(-1.0), 1e-6);
  CHECK_NEAR(tw[4], 4.0, 0.0); /* exp(2) capped */
  MUST(mrl_replay_ratios(e, logp, beh, mask, off, 3, INFINITY, r, NULL));
  mrl_engine_free(e);
}

static void test_errors(void) {
  mrl_engine *e = new_engine();
  const double p[] = {1.0, -1.0}, age[] = {0.0, NAN}, ok_age[] = {0.0, 0.0};
  double w[2];
  CHECK(mrl_replay_weights(NULL, p, ok_age, 2, 0.6, 1.0, 1e-6, w) == MRL_ERR_NULL);
  CHECK_FAILS(e, MRL_ERR_NULL, "priority is NULL", mrl_replay_weights(e, NULL, ok_age, 2, 0.6, 1.0, 1e-6, w));
  CHECK_FAILS(e, MRL_ERR_INVALID, "priority[1]", mrl_replay_weights(e, p, ok_age, 2, 0.6, 1.0, 1e-6, w));
  CHECK_FAILS(e, MRL_ERR_INVALID, "age[1]", mrl_replay_weights(e, p, age, 2, 0.6, 1.0, 1e-6, w));
  const double good[] = {1.0, 2.0};
  CHECK_FAILS(e, MRL_ERR_INVALID, "alpha", mrl_replay_weights(e, good, ok_age, 2, -1.0, 1.0, 1e-6, w));
  CHECK_FAILS(e, MRL_ERR_INVALID, "decay", mrl_replay_weights(e, good, ok_age, 2, 0.6, 0.0, 1e-6, w));
  CHECK_FAILS(e, MRL_ERR_INVALID, "floor", mrl_replay_weights(e, good, ok_age, 2, 0.6, 1.0, 0.0, w));
  CHECK_FAILS(e, MRL_ERR_INVALID, "sizes", mrl_replay_weights(e, good, ok_age, -1, 0.6, 1.0, 1e-6, w));
  const int64_t last[] = {0, 0};
  const double u[] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
  int64_t out[3];
  CHECK_FAILS(e, MRL_ERR_INVALID, "k is 3", mrl_replay_draw(e, good, last, 2, 0.1, 0.4, u, 3, out, NULL, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "w[1]", mrl_replay_draw(e, p, last, 2, 0.1, 0.4, u, 1, out, NULL, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "staleness", mrl_replay_draw(e, good, last, 2, 1.5, 0.4, u, 1, out, NULL, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "beta", mrl_replay_draw(e, good, last, 2, 0.1, -1.0, u, 1, out, NULL, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "last is NULL", mrl_replay_draw(e, good, NULL, 2, 0.1, 0.4, u, 1, out, NULL, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "out is NULL", mrl_replay_draw(e, good, last, 2, 0.1, 0.4, u, 1, NULL, NULL, NULL, NULL));
  const double bad_u[] = {0.1, 1.0};
  CHECK_FAILS(e, MRL_ERR_INVALID, "u[1]", mrl_replay_draw(e, good, last, 2, 0.1, 0.4, bad_u, 1, out, NULL, NULL, NULL));
  const float t[] = {0.0f, 0.0f}, m[] = {1.0f, 0.5f}, inf[] = {INFINITY, 0.0f}, m1[] = {1, 1};
  const int64_t off[] = {0, 2}, bad_off[] = {1, 2}, down[] = {0, 2, 1};
  double r[2];
  CHECK_FAILS(e, MRL_ERR_INVALID, "mask[1]", mrl_replay_ratios(e, t, t, m, off, 1, 1.0, r, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "logp[0]", mrl_replay_ratios(e, inf, t, m1, off, 1, 1.0, r, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "offsets[0]", mrl_replay_ratios(e, t, t, m1, bad_off, 1, 1.0, r, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "offsets[2]", mrl_replay_ratios(e, t, t, m1, down, 2, 1.0, r, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "cap", mrl_replay_ratios(e, t, t, m1, off, 1, 0.0, r, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "behaviour is NULL", mrl_replay_ratios(e, t, NULL, m1, off, 1, 1.0, r, NULL));
  mrl_engine_free(e);
}

/* The draw's one scratch block: its failure returns a status and keeps nothing. */
static void test_draw_alloc_failure(void) {
  counting_alloc c;
  mrl_engine *e = new_counting_engine(&c);
  const double w[] = {1.0, 2.0};
  const int64_t last[] = {0, 0};
  const double u[] = {0.5, 0.5};
  int64_t out[1] = {-7};
  long live = c.live;
  counting_alloc_arm(&c, 0);
  mrl_status st = mrl_replay_draw(e, w, last, 2, 0.0, 0.0, u, 1, out, NULL, NULL, NULL);
  counting_alloc_arm(&c, -1);
  CHECK(st == MRL_ERR_NOMEM);
  CHECK(out[0] == -7); /* an error never changes an output */
  CHECK(c.live == live && mrl_engine_memory_used(e) == 0);
  MUST(mrl_replay_draw(e, w, last, 2, 0.0, 0.0, u, 1, out, NULL, NULL, NULL));
  mrl_engine_free(e);
  CHECK(c.live == 0 && c.bad_frees == 0);
}

static const test_case tests[] = {
    {"replay weights by hand", test_weights_by_hand},
    {"replay weights halve every decay * ln 2 steps", test_weights_half_life},
    {"replay draws match the naive reference", test_draw_matches_naive},
    {"replay draw frequencies follow the weights", test_draw_frequencies},
    {"replay staleness revisits the least recently used", test_draw_staleness},
    {"replay draw probabilities and importance weights", test_draw_importance_weights},
    {"replay ratios by hand", test_ratios_by_hand},
    {"replay errors name the argument", test_errors},
    {"replay draw allocation failure", test_draw_alloc_failure},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
