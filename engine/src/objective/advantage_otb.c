/* advantage_otb.c - verl's optimal token baseline ("optimal_token_baseline" and, with its tokens
 * packed per row, "tir_optimal_token_baseline"): a baseline per step of the response, the
 * returns of a prompt group's rows weighted by their accumulated score-function variance. */
#include "advantage.h"

#include <math.h>

void mrl_otb_defaults(mrl_otb_opts *opts) {
  if (!opts) return;
  *opts = (mrl_otb_opts){.epsilon = 1e-8, .handle_zero_tail = 1, .multi_turn = 0};
}

mrl_status mrl_optimal_token_baseline(mrl_engine *e, const mrl_otb_opts *opts,
                                      const float *rewards, const float *mask,
                                      const int64_t *group, const float *old_logp,
                                      const float *sum_pi_sq, const float *is_weights,
                                      int64_t rows, int64_t cols, float *adv, float *returns) {
  static const char fn[] = "mrl_optimal_token_baseline";
  ADV_TRY(mrl__adv_sizes(e, fn, rows, cols));
  int64_t n = rows * cols;
  ADV_TRY(mrl__adv_need(e, fn, "rewards", rewards, n));
  ADV_TRY(mrl__adv_need(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_need(e, fn, "group", group, rows));
  ADV_TRY(mrl__adv_need(e, fn, "old_logp", old_logp, n));
  ADV_TRY(mrl__adv_need(e, fn, "sum_pi_sq", sum_pi_sq, n));
  ADV_TRY(mrl__adv_need(e, fn, "adv", adv, n));
  ADV_TRY(mrl__adv_mask(e, fn, "mask", mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "rewards", rewards, mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "old_logp", old_logp, mask, n));
  ADV_TRY(mrl__adv_finite(e, fn, "sum_pi_sq", sum_pi_sq, mask, n));
  if (is_weights) ADV_TRY(mrl__adv_finite(e, fn, "is_weights", is_weights, mask, n));
  mrl_otb_opts o;
  mrl_otb_defaults(&o);
  if (opts) o = *opts;
  ADV_TRY(mrl__adv_range(e, fn, "epsilon", o.epsilon, 0.0, INFINITY));

  mrl__scratch s = {.e = e, .fn = fn};
  mrl_status st = MRL_ERR_NOMEM;
  double *G = mrl__scratch_get(&s, n, sizeof *G);    /* reward-to-go, (rows, cols) */
  double *W = mrl__scratch_get(&s, n, sizeof *W);    /* accumulated variance, per step */
  double *R = mrl__scratch_get(&s, n, sizeof *R);    /* returns per step */
  double *B = mrl__scratch_get(&s, n, sizeof *B);    /* baseline per step */
  int64_t *pos = mrl__scratch_get(&s, n, sizeof *pos); /* flat position of each step, or -1 */
  int64_t *len = mrl__scratch_get(&s, rows, sizeof *len);
  int64_t *g = mrl__scratch_get(&s, rows, sizeof *g), groups = 0;
  if (!G || !W || !R || !B || !pos || !len || !g) goto done;
  for (int64_t b = 0; b < rows; b++) {
    double run = 0.0, acc = 0.0;
    for (int64_t t = cols - 1; t >= 0; t--) {
      int64_t i = b * cols + t;
      if (mask[i] != 0.0f) run += rewards[i];
      G[i] = run;
    }
    /* steps: the columns, or with multi_turn the row's mask-1 tokens packed to the left */
    int64_t j = 0;
    for (int64_t t = 0; t < cols; t++) {
      int64_t i = b * cols + t;
      if (mask[i] != 0.0f) {
        double w = 1.0 - 2.0 * exp((double)old_logp[i]) + sum_pi_sq[i];
        if (is_weights) w *= (double)is_weights[i] * is_weights[i];
        acc += w;
        len[b]++;
      }
      if (o.multi_turn && mask[i] == 0.0f) continue;
      int64_t k = b * cols + (o.multi_turn ? j++ : t);
      pos[k] = i;
      W[k] = acc;
      R[k] = G[i];
    }
    for (; j < cols && o.multi_turn; j++) pos[b * cols + j] = -1;
  }
  if (mrl__dense_ids(&s, group, NULL, rows, g, &groups)) goto done;
  int64_t *size = mrl__scratch_get(&s, groups, sizeof *size);
  int64_t *longest = mrl__scratch_get(&s, groups, sizeof *longest); /* its length */
  int64_t *n_longest = mrl__scratch_get(&s, groups, sizeof *n_longest);
  int64_t *who = mrl__scratch_get(&s, groups, sizeof *who);         /* a row that long */
  int64_t *second = mrl__scratch_get(&s, groups, sizeof *second);   /* the others' longest */
  double *num = mrl__scratch_get(&s, groups * cols, sizeof *num);
  double *den = mrl__scratch_get(&s, groups * cols, sizeof *den);
  if (!size || !longest || !n_longest || !who || !second || !num || !den) goto done;
  /* verl's tir variant leaves rows without tokens out of their groups (they get 0 anyway) */
  for (int64_t b = 0; b < rows; b++) {
    if (o.multi_turn && len[b] == 0) continue;
    int64_t k = g[b];
    if (size[k]++ == 0 || len[b] > longest[k]) {
      longest[k] = len[b];
      n_longest[k] = 1;
      who[k] = b;
    } else if (len[b] == longest[k]) {
      n_longest[k]++;
    }
    for (int64_t t = 0; t < cols; t++) {
      int64_t i = b * cols + t;
      /* the columns variant counts a step where the row has a token; packed steps past a row's
       * length hold nothing */
      if (o.multi_turn ? pos[i] < 0 : mask[i] == 0.0f) continue;
      num[k * cols + t] += R[i] * W[i];
      den[k * cols + t] += W[i];
    }
  }
  for (int64_t k = 0; k < groups; k++) second[k] = -1;
  for (int64_t b = 0; b < rows; b++)
    if (!(o.multi_turn && len[b] == 0) && b != who[g[b]] && len[b] > second[g[b]])
      second[g[b]] = len[b];
  for (int64_t b = 0; b < rows; b++) {
    int64_t k = g[b];
    /* the only row of its group that long: nothing to compare its tail with */
    bool tail = o.handle_zero_tail && size[k] > 1 && n_longest[k] == 1 && who[k] == b;
    for (int64_t t = 0; t < cols; t++) {
      int64_t i = b * cols + t;
      B[i] = size[k] > 1 ? num[k * cols + t] / (den[k * cols + t] + o.epsilon) : 0.0;
      if (tail && t >= second[k]) B[i] = 0.0;
    }
  }
  for (int64_t i = 0; i < n; i++) adv[i] = 0.0f;
  for (int64_t i = 0; i < n; i++)
    if (pos[i] >= 0 && mask[pos[i]] != 0.0f) adv[pos[i]] = (float)(R[i] - B[i]);
  if (returns)
    for (int64_t i = 0; i < n; i++) returns[i] = (float)G[i];
  st = MRL_OK;
done:
  mrl__scratch_free(&s);
  return st;
}
