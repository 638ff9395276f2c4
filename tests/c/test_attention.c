/* test_attention.c - the attention kernels (attention.c) against their reference (the same maths
 * as OpenBLAS products) and against a direct double-precision evaluation written here, over head
 * sizes and row counts that cover every partial tile; and the model run on the kernels against
 * the model run on the reference (logits, gradients, KV-cache logits). */
#include "model.h"
#include "support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void fill(float *x, int64_t n, struct mrl_rng *r, double scale) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * mrl__rng_normal(r));
}

static double max_diff(const float *a, const float *b, int64_t n) {
  double w = 0.0;
  for (int64_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
  return w;
}

/* The keys of rows k (stride ld) transposed as the forward kernel takes them; caller frees. */
static float *transposed(const float *k, int64_t ld, int keys, int hd, int64_t *ldkt) {
  *ldkt = mrl__attn_key_columns(keys);
  float *kt = malloc(sizeof(float) * (size_t)(*ldkt * hd));
  mrl__attn_transpose_keys(kt, *ldkt, k, ld, keys, hd);
  return kt;
}

/* One head's shapes; the rows sit inside wider rows (strides bigger than hd) as in the model. */
typedef struct {
  int hd, rows, pos;
} shape;

static const shape shapes[] = {{2, 1, 0},  {6, 5, 0},  {8, 4, 3},   {16, 17, 1}, {32, 33, 0},
                               {32, 1, 40}, {40, 9, 7}, {64, 70, 0}, {4, 130, 0}, {24, 3, 61}};

/* softmax(q k^T / sqrt(hd)) v for row t in double precision: the test's own reference. */
static void direct_row(double *out, double *p, const float *q, const float *k, const float *v,
                       int64_t ld, int hd, int last) {
  double mx = -INFINITY, sum = 0.0;
  for (int s = 0; s <= last; s++) {
    double dot = 0.0;
    for (int d = 0; d < hd; d++) dot += (double)q[d] * k[(int64_t)s * ld + d];
    p[s] = dot / sqrt((double)hd);
    mx = fmax(mx, p[s]);
  }
  for (int s = 0; s <= last; s++) sum += p[s] = exp(p[s] - mx);
  for (int d = 0; d < hd; d++) out[d] = 0.0;
  for (int s = 0; s <= last; s++) {
    p[s] /= sum;
    for (int d = 0; d < hd; d++) out[d] += p[s] * v[(int64_t)s * ld + d];
  }
}

static void test_forward_matches_reference(void) {
  struct mrl_rng r;
  mrl__rng_seed(&r, 11);
  double worst_ref = 0.0, worst_direct = 0.0, worst_probs = 0.0;
  bool zero_past_range = true;
  for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
    int hd = shapes[c].hd, rows = shapes[c].rows, pos = shapes[c].pos, keys = pos + rows;
    int64_t ld = 3 * hd + 5, width = keys + 3; /* strides wider than the head */
    float *q = malloc(sizeof(float) * (size_t)(rows * ld));
    float *k = malloc(sizeof(float) * (size_t)(keys * ld));
    float *v = malloc(sizeof(float) * (size_t)(keys * ld));
    float *out = malloc(sizeof(float) * (size_t)(rows * ld));
    float *ref = malloc(sizeof(float) * (size_t)(rows * ld));
    float *probs = malloc(sizeof(float) * (size_t)(rows * width));
    float *probs_ref = malloc(sizeof(float) * (size_t)(rows * width));
    float *work = malloc(sizeof(float) * (size_t)(mrl__attn_forward_work(hd, keys) +
                                                  mrl__attn_forward_ref_work(rows, keys)));
    fill(q, rows * ld, &r, 1.5);
    fill(k, keys * ld, &r, 1.5);
    fill(v, keys * ld, &r, 1.0);
    for (int64_t i = 0; i < rows * width; i++) probs[i] = probs_ref[i] = 7.0f; /* overwritten */
    int64_t ldkt;
    float *kt = transposed(k, ld, keys, hd, &ldkt);
    mrl__attn_forward(out, ld, probs, width, (int)width, q, ld, kt, ldkt, MRL_ATTN_COLS, v, ld,
                      rows, pos, hd, work);
    mrl__attn_forward_ref(ref, ld, probs_ref, width, (int)width, q, ld, kt, ldkt, v, ld, rows, pos,
                          hd, work);
    double *direct = malloc(sizeof(double) * (size_t)hd);
    double *p = malloc(sizeof(double) * (size_t)keys);
    for (int t = 0; t < rows; t++) {
      worst_ref = fmax(worst_ref, max_diff(out + t * ld, ref + t * ld, hd));
      worst_probs = fmax(worst_probs, max_diff(probs + t * width, probs_ref + t * width, width));
      direct_row(direct, p, q + t * ld, k, v, ld, hd, pos + t);
      for (int d = 0; d < hd; d++)
        worst_direct = fmax(worst_direct, fabs(out[t * ld + d] - direct[d]));
      for (int s = 0; s <= pos + t; s++)
        worst_probs = fmax(worst_probs, fabs(probs[t * width + s] - p[s]));
      for (int s = pos + t + 1; s < width; s++) zero_past_range &= probs[t * width + s] == 0.0f;
    }
    /* without kept probabilities (decoding) the output is the same */
    float *again = malloc(sizeof(float) * (size_t)(rows * ld));
    mrl__attn_forward(again, ld, NULL, 0, 0, q, ld, kt, ldkt, MRL_ATTN_COLS, v, ld, rows, pos, hd,
                      work);
    bool same = true;
    for (int t = 0; t < rows; t++)
      same &= memcmp(again + t * ld, out + t * ld, sizeof(float) * (size_t)hd) == 0;
    CHECKF(same, "hd %d rows %d pos %d: output differs without kept probabilities", hd, rows, pos);
    free(again);
    free(kt);
    free(direct);
    free(p);
    free(q);
    free(k);
    free(v);
    free(out);
    free(ref);
    free(probs);
    free(probs_ref);
    free(work);
  }
  check_note("forward: kernel vs reference %.2e, vs double precision %.2e, probabilities %.2e",
             worst_ref, worst_direct, worst_probs);
  CHECK(worst_ref < 2e-6 && worst_direct < 2e-6 && worst_probs < 2e-6);
  CHECK(zero_past_range);
}

/* Each row alone (as decoding appends it) gives the same bits as the rows together; the second
 * shape reaches the one-row kernels' four-tiles-at-once paths. */
static void test_rows_alone_equal_rows_together(void) {
  struct mrl_rng r;
  mrl__rng_seed(&r, 5);
  const int sizes[2][2] = {{24, 11}, {64, 80}};
  for (int c = 0; c < 2; c++) {
    int hd = sizes[c][0], rows = sizes[c][1], ld = 2 * hd;
    size_t bytes = sizeof(float) * (size_t)(rows * ld);
    float *q = malloc(bytes), *k = malloc(bytes), *v = malloc(bytes), *together = malloc(bytes);
    float *alone = malloc(sizeof(float) * (size_t)ld);
    float *work = malloc(sizeof(float) * (size_t)mrl__attn_forward_work(hd, rows));
    fill(q, rows * ld, &r, 2.0);
    fill(k, rows * ld, &r, 2.0);
    fill(v, rows * ld, &r, 1.0);
    int64_t ldkt;
    float *kt = transposed(k, ld, rows, hd, &ldkt);
    mrl__attn_forward(together, ld, NULL, 0, 0, q, ld, kt, ldkt, MRL_ATTN_COLS, v, ld, rows, 0, hd,
                      work);
    bool same = true;
    for (int t = 0; t < rows; t++) {
      mrl__attn_forward(alone, ld, NULL, 0, 0, q + t * ld, ld, kt, ldkt, MRL_ATTN_COLS, v, ld, 1, t,
                        hd, work);
      same &= memcmp(alone, together + t * ld, sizeof(float) * (size_t)hd) == 0;
    }
    CHECKF(same, "head size %d, %d rows: a row alone differs", hd, rows);
    free(kt);
    free(q);
    free(k);
    free(v);
    free(together);
    free(alone);
    free(work);
  }
}

static void test_backward_matches_reference(void) {
  struct mrl_rng r;
  mrl__rng_seed(&r, 12);
  double worst = 0.0, scale = 0.0;
  for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
    int hd = shapes[c].hd, rows = shapes[c].rows + shapes[c].pos; /* pos 0: training */
    int64_t ld = 3 * hd + 1, width = rows + 2;
    int64_t n = rows * ld;
    float *q = malloc(sizeof(float) * (size_t)n), *k = malloc(sizeof(float) * (size_t)n);
    float *v = malloc(sizeof(float) * (size_t)n), *dout = malloc(sizeof(float) * (size_t)n);
    float *out = malloc(sizeof(float) * (size_t)n);
    float *probs = malloc(sizeof(float) * (size_t)(rows * width));
    float *grads[2][3];
    for (int w = 0; w < 2; w++)
      for (int g = 0; g < 3; g++) grads[w][g] = malloc(sizeof(float) * (size_t)n);
    float *work = malloc(sizeof(float) * (size_t)(mrl__attn_backward_work(hd, rows) +
                                                  mrl__attn_backward_ref_work(rows) +
                                                  mrl__attn_forward_work(hd, rows)));
    fill(q, n, &r, 1.5);
    fill(k, n, &r, 1.5);
    fill(v, n, &r, 1.0);
    fill(dout, n, &r, 1.0);
    int64_t ldkt;
    float *kt = transposed(k, ld, rows, hd, &ldkt);
    mrl__attn_forward(out, ld, probs, width, (int)width, q, ld, kt, ldkt, MRL_ATTN_COLS, v, ld,
                      rows, 0, hd, work);
    free(kt);
    for (int w = 0; w < 2; w++) {
      /* dq is written, dk and dv added to: start them from the same non-zero values */
      for (int64_t i = 0; i < n; i++) {
        grads[w][0][i] = 9.0f;
        grads[w][1][i] = grads[w][2][i] = (float)(i % 7) * 0.25f;
      }
      (w ? mrl__attn_backward_ref : mrl__attn_backward)(grads[w][0], ld, grads[w][1],
                                                         grads[w][2], ld, dout, ld, probs, width,
                                                         q, ld, k, v, ld, rows, hd, work);
    }
    for (int g = 0; g < 3; g++)
      for (int t = 0; t < rows; t++) {
        worst = fmax(worst, max_diff(grads[0][g] + t * ld, grads[1][g] + t * ld, hd));
        for (int d = 0; d < hd; d++) scale = fmax(scale, fabs(grads[1][g][t * ld + d]));
      }
    /* columns past hd are not touched */
    bool untouched = true;
    for (int t = 0; t < rows; t++)
      for (int64_t d = hd; d < ld; d++) untouched &= grads[0][0][t * ld + d] == 9.0f;
    CHECKF(untouched, "hd %d rows %d: dq written past the head", hd, rows);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(probs);
    for (int w = 0; w < 2; w++)
      for (int g = 0; g < 3; g++) free(grads[w][g]);
    free(work);
  }
  check_note("backward: kernel vs reference max |difference| %.2e (largest gradient %.2e)", worst,
             scale);
  CHECK(worst < 1e-5 * fmax(1.0, scale));
}

/* ---- the model on the kernels vs the model on the reference ---- */

static mrl_model *model_for(mrl_engine *e, bool reference) {
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.vocab = 29;
  c.dim = 48;
  c.layers = 2;
  c.heads = 6;
  c.kv_heads = 2;
  c.head_dim = 10;
  c.ffn = 40;
  c.ctx = 80;
  c.qk_norm = 1;
  c.tie_embeddings = 0;
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, &c, 3, &m));
  struct mrl_rng r;
  mrl__rng_seed(&r, 4);
  for (int64_t i = 0; i < m->numel; i++) m->weights[i] += (float)(0.1 * mrl__rng_normal(&r));
  m->reference_attention = reference;
  return m;
}

static void test_model_kernels_vs_reference(void) {
  mrl_engine *e = new_engine();
  MUST(mrl_engine_set_threads(e, 3));
  e->pool_min_work = 0;
  enum { B = 3, T = 70 };
  int32_t tokens[B * T], lengths[B] = {70, 33, 1}, targets[B * T];
  float dlogp[B * T];
  struct mrl_rng r;
  mrl__rng_seed(&r, 8);
  for (int i = 0; i < B * T; i++) {
    tokens[i] = (int32_t)(mrl__rng_u64(&r) % 29);
    dlogp[i] = (float)mrl__rng_normal(&r);
  }
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      targets[b * T + t] = t + 1 < lengths[b] ? tokens[b * T + t + 1] : -1;
  float *logits[2], *grads[2], cache[2][2 * 29];
  int64_t nlogits = (int64_t)B * T * 29, numel = 0;
  for (int w = 0; w < 2; w++) {
    mrl_model *m = model_for(e, w == 1);
    numel = m->numel;
    MUST(mrl_model_forward(m, tokens, lengths, B, T));
    mrl_tensor *z = NULL;
    MUST(mrl_model_logits(m, &z));
    logits[w] = malloc(sizeof(float) * (size_t)nlogits);
    memcpy(logits[w], mrl_tensor_data(z), sizeof(float) * (size_t)nlogits);
    mrl_tensor_free(z);
    MUST(mrl_model_zero_grad(m));
    MUST(mrl_model_backward(m, targets, dlogp, NULL));
    grads[w] = malloc(sizeof(float) * (size_t)numel);
    memcpy(grads[w], m->grads, sizeof(float) * (size_t)numel);
    mrl_kv_cache *c = NULL;
    MUST(mrl_kv_cache_new(m, 2, 80, &c));
    int slots[2] = {1, 0}, counts[2] = {40, 3};
    MUST(mrl_kv_cache_append(c, 2, slots, tokens, counts));
    memcpy(cache[w], mrl_kv_cache_logits(c, 0), sizeof(float) * 29);
    memcpy(cache[w] + 29, mrl_kv_cache_logits(c, 1), sizeof(float) * 29);
    mrl_kv_cache_free(c);
    mrl_model_free(m);
  }
  double gscale = 0.0;
  for (int64_t i = 0; i < numel; i++) gscale = fmax(gscale, fabs(grads[1][i]));
  double dz = max_diff(logits[0], logits[1], nlogits), dg = max_diff(grads[0], grads[1], numel);
  double dc = max_diff(cache[0], cache[1], 2 * 29);
  check_note("kernels vs reference: logits %.2e, gradients %.2e (largest %.2e), cache logits %.2e",
             dz, dg, gscale, dc);
  CHECK(dz < 1e-5 && dc < 1e-5 && dg < 1e-5 * fmax(1.0, gscale));
  for (int w = 0; w < 2; w++) {
    free(logits[w]);
    free(grads[w]);
  }
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static const test_case tests[] = {
    {"forward_matches_reference", test_forward_matches_reference},
    {"rows_alone_equal_rows_together", test_rows_alone_equal_rows_together},
    {"backward_matches_reference", test_backward_matches_reference},
    {"model_kernels_vs_reference", test_model_kernels_vs_reference},
    {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
