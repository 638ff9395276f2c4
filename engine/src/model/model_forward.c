/* model_forward.c - the decoder's forward pass over a right-padded batch, keeping the activations
 * the backward pass needs, and the LM head (log-probabilities, entropies, logits) computed in
 * blocks of rows so that the (positions x vocab) logits never have to exist at once. */
#include "model.h"

#include <math.h>
#include <string.h>


/* ---- kernels (outputs first, then inputs, then sizes; shapes in comments) ---- */

void mrl__gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
               int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  mrl_sgemm_fn sgemm = mrl__blas_sgemm();
  if (sgemm)
    sgemm(101, ta ? 112 : 111, tb ? 112 : 111, (int)m, (int)n, (int)k, alpha, a, (int)lda, b,
          (int)ldb, beta, c, (int)ldc);
  else
    mrl__sgemm_naive(ta, tb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c,
                     (int)ldc);
}

/* out (n, d) = x / rms(x) * w; rstd (n) = 1 / rms(x) */
static void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t n,
                            int64_t d, float eps) {
  for (int64_t i = 0; i < n; i++) {
    const float *xi = x + i * d;
    double ss = 0.0;
    for (int64_t j = 0; j < d; j++) ss += (double)xi[j] * xi[j];
    float r = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    rstd[i] = r;
    float *oi = out + i * d;
    for (int64_t j = 0; j < d; j++) oi[j] = xi[j] * r * w[j];
  }
}

/* Normalised input again from x and the kept rstd (so the forward need not keep it). */
void mrl__rmsnorm_apply(float *out, const float *rstd, const float *x, const float *w, int64_t n,
                        int64_t d) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < d; j++) out[i * d + j] = x[i * d + j] * rstd[i] * w[j];
}

/* Rotates each head of one row (heads x hd, row stride hd) by the angles of position pos;
 * sign -1 rotates back (the backward pass). Pairs are (i, i + hd/2) as in Hugging Face. */
void mrl__rope(float *v, int heads, int hd, const float *cos_t, const float *sin_t, float sign) {
  int half = hd / 2;
  for (int h = 0; h < heads; h++) {
    float *x = v + (int64_t)h * hd;
    for (int i = 0; i < half; i++) {
      float c = cos_t[i], s = sign * sin_t[i];
      float a = x[i], b = x[i + half];
      x[i] = a * c - b * s;
      x[i + half] = b * c + a * s;
    }
  }
}

void mrl__softmax_causal(float *row, int last, int width) {
  float mx = row[0];
  for (int s = 1; s <= last; s++)
    if (row[s] > mx) mx = row[s];
  double sum = 0.0;
  for (int s = 0; s <= last; s++) {
    row[s] = expf(row[s] - mx);
    sum += row[s];
  }
  float inv = (float)(1.0 / sum);
  for (int s = 0; s <= last; s++) row[s] *= inv;
  for (int s = last + 1; s < width; s++) row[s] = 0.0f; /* causal (and padding) mask */
}

/* hidden (n, f) = silu(gate) * up, from rows of gate | up (n, 2f) */
void mrl__swiglu(float *hidden, const float *gate_up, int64_t n, int64_t f) {
  for (int64_t i = 0; i < n; i++) {
    const float *g = gate_up + i * 2 * f, *u = g + f;
    float *h = hidden + i * f;
    for (int64_t j = 0; j < f; j++) h[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  }
}

/* ---- activations ---- */

void mrl__model_free_activations(mrl_model *m) {
  mrl_activations *a = m->act;
  if (!a) return;
  mrl_engine *e = m->engine;
  const mrl_model_config *c = &m->cfg;
  int64_t n = a->rows_cap, L = c->layers;
  int64_t qkv = m->q_dim + 2 * (int64_t)m->kv_dim, qk = m->q_dim + (int64_t)m->kv_dim;
  mrl__free(e, a->tokens, sizeof(int32_t) * (size_t)n);
  mrl__free(e, a->lengths, sizeof(int32_t) * (size_t)n);
  mrl__free(e, a->x, sizeof(float) * (size_t)((L + 1) * n * c->dim));
  mrl__free(e, a->rstd_attn, sizeof(float) * (size_t)(L * n));
  mrl__free(e, a->qkv, sizeof(float) * (size_t)(L * n * qkv));
  if (c->qk_norm) {
    mrl__free(e, a->qk_pre, sizeof(float) * (size_t)(L * n * qk));
    mrl__free(e, a->rstd_qk, sizeof(float) * (size_t)(L * n * (c->heads + c->kv_heads)));
  }
  mrl__free(e, a->probs, sizeof(float) * (size_t)(L * a->probs_cap));
  mrl__free(e, a->attn, sizeof(float) * (size_t)(L * n * m->q_dim));
  mrl__free(e, a->x_mid, sizeof(float) * (size_t)(L * n * c->dim));
  mrl__free(e, a->rstd_mlp, sizeof(float) * (size_t)(L * n));
  mrl__free(e, a->gate_up, sizeof(float) * (size_t)(L * n * 2 * c->ffn));
  mrl__free(e, a->rstd_final, sizeof(float) * (size_t)n);
  mrl__free(e, a->xf, sizeof(float) * (size_t)(n * c->dim));
  mrl__free(e, a, sizeof *a);
  m->act = NULL;
}

/* Makes sure the activation buffers hold n rows and `probs` attention entries per layer. */
static mrl_status ensure_activations(mrl_model *m, const char *fn, int64_t n, int64_t probs) {
  if (m->act && m->act->rows_cap >= n && m->act->probs_cap >= probs) return MRL_OK;
  mrl__model_free_activations(m);
  mrl_engine *e = m->engine;
  const mrl_model_config *c = &m->cfg;
  int64_t L = c->layers;
  int64_t qkv = m->q_dim + 2 * (int64_t)m->kv_dim, qk = m->q_dim + (int64_t)m->kv_dim;
  /* the largest block, in floats, must fit size_t bytes */
  double biggest = (double)L * (double)probs + (double)(L + 1) * (double)n * (double)qkv;
  if (biggest * sizeof(float) > (double)SIZE_MAX / 4)
    return mrl__fail(e, MRL_ERR_OVERFLOW, fn, "batch too large for the activations");
  mrl_activations *a = mrl__alloc(e, sizeof *a);
  if (!a) return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate activations");
  memset(a, 0, sizeof *a);
  a->rows_cap = n;
  a->probs_cap = probs;
  m->act = a;
  bool ok = (a->tokens = mrl__alloc(e, sizeof(int32_t) * (size_t)n)) &&
            (a->lengths = mrl__alloc(e, sizeof(int32_t) * (size_t)n)) &&
            (a->x = mrl__alloc(e, sizeof(float) * (size_t)((L + 1) * n * c->dim))) &&
            (a->rstd_attn = mrl__alloc(e, sizeof(float) * (size_t)(L * n))) &&
            (a->qkv = mrl__alloc(e, sizeof(float) * (size_t)(L * n * qkv))) &&
            (!c->qk_norm || ((a->qk_pre = mrl__alloc(e, sizeof(float) * (size_t)(L * n * qk))) &&
                             (a->rstd_qk = mrl__alloc(e, sizeof(float) *
                                                             (size_t)(L * n * (c->heads +
                                                                               c->kv_heads)))))) &&
            (a->probs = mrl__alloc(e, sizeof(float) * (size_t)(L * probs))) &&
            (a->attn = mrl__alloc(e, sizeof(float) * (size_t)(L * n * m->q_dim))) &&
            (a->x_mid = mrl__alloc(e, sizeof(float) * (size_t)(L * n * c->dim))) &&
            (a->rstd_mlp = mrl__alloc(e, sizeof(float) * (size_t)(L * n))) &&
            (a->gate_up = mrl__alloc(e, sizeof(float) * (size_t)(L * n * 2 * c->ffn))) &&
            (a->rstd_final = mrl__alloc(e, sizeof(float) * (size_t)n)) &&
            (a->xf = mrl__alloc(e, sizeof(float) * (size_t)(n * c->dim)));
  if (!ok) {
    /* free what was allocated: mrl__free ignores NULL, sizes are those of the full request */
    mrl__model_free_activations(m);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate activations for %lld positions",
                     (long long)n);
  }
  return MRL_OK;
}

/* ---- forward ---- */

/* Attention of one layer for sequence b, all heads: fills probs (heads x T x T) and out rows. */
static void attention_forward(mrl_model *m, float *out, float *probs, const float *qkv, int b,
                              int T, int len) {
  const mrl_model_config *c = &m->cfg;
  int hd = m->head_dim, H = c->heads, group = c->heads / c->kv_heads;
  int64_t stride = m->q_dim + 2 * (int64_t)m->kv_dim;
  const float *rows = qkv + (int64_t)b * T * stride;
  float scale = 1.0f / sqrtf((float)hd);
  for (int h = 0; h < H; h++) {
    int g = h / group;
    const float *q = rows + (int64_t)h * hd;
    const float *k = rows + m->q_dim + (int64_t)g * hd;
    const float *v = rows + m->q_dim + m->kv_dim + (int64_t)g * hd;
    float *p = probs + (int64_t)h * T * T;
    /* scores of the len real positions: p[t][s] = q_t . k_s * scale, computed a block of
     * query rows at a time against the keys up to the block's end (causal: the rest is 0) */
    for (int r0 = 0; r0 < len; r0 += MRL_ATTN_BLOCK) {
      int r1 = r0 + MRL_ATTN_BLOCK < len ? r0 + MRL_ATTN_BLOCK : len;
      mrl__gemm(false, true, r1 - r0, r1, hd, scale, q + (int64_t)r0 * stride, stride, k, stride,
                0.0f, p + (int64_t)r0 * T, T);
    }
    for (int t = 0; t < len; t++) mrl__softmax_causal(p + (int64_t)t * T, t, T);
    for (int t = len; t < T; t++) memset(p + (int64_t)t * T, 0, sizeof(float) * (size_t)T);
    /* out_t = sum_s p[t][s] v_s over the real positions; padded rows stay zero */
    float *o = out + (int64_t)b * T * m->q_dim + (int64_t)h * hd;
    for (int r0 = 0; r0 < len; r0 += MRL_ATTN_BLOCK) {
      int r1 = r0 + MRL_ATTN_BLOCK < len ? r0 + MRL_ATTN_BLOCK : len;
      mrl__gemm(false, false, r1 - r0, hd, r1, 1.0f, p + (int64_t)r0 * T, T, v, stride, 0.0f,
                o + (int64_t)r0 * m->q_dim, m->q_dim);
    }
    for (int t = len; t < T; t++) memset(o + (int64_t)t * m->q_dim, 0, sizeof(float) * (size_t)hd);
  }
}

/* Per-head RMSNorm of q or k in place (qk_norm), keeping the input and the scales. */
static void head_norm_forward(float *v, float *pre, float *rstd, const float *w, int heads, int hd,
                              float eps) {
  memcpy(pre, v, sizeof(float) * (size_t)heads * (size_t)hd);
  rmsnorm_forward(v, rstd, pre, w, heads, hd, eps);
}

static mrl_status check_batch(mrl_model *m, const char *fn, const int32_t *tokens,
                              const int32_t *lengths, int batch, int steps) {
  mrl_engine *e = m->engine;
  if (!tokens || !lengths)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", tokens ? "lengths" : "tokens");
  if (batch <= 0 || steps <= 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "batch and steps must be positive, got %d and %d",
                     batch, steps);
  if (steps > m->cfg.ctx)
    return mrl__fail(e, MRL_ERR_RANGE, fn, "steps %d exceed the model's context of %d", steps,
                     m->cfg.ctx);
  for (int b = 0; b < batch; b++) {
    if (lengths[b] < 1 || lengths[b] > steps)
      return mrl__fail(e, MRL_ERR_RANGE, fn, "lengths[%d] = %d is outside 1..%d", b, lengths[b],
                       steps);
    for (int t = 0; t < lengths[b]; t++) {
      int32_t id = tokens[(int64_t)b * steps + t];
      if (id < 0 || id >= m->cfg.vocab)
        return mrl__fail(e, MRL_ERR_RANGE, fn, "token %d at (%d, %d) is outside 0..%d", id, b, t,
                         m->cfg.vocab - 1);
    }
  }
  return MRL_OK;
}

mrl_status mrl_model_forward(mrl_model *m, const int32_t *tokens, const int32_t *lengths,
                             int batch, int steps) {
  const char *fn = "mrl_model_forward";
  if (!m) return MRL_ERR_NULL;
  mrl_status st = check_batch(m, fn, tokens, lengths, batch, steps);
  if (st) return st;
  const mrl_model_config *c = &m->cfg;
  int64_t n = (int64_t)batch * steps, D = c->dim, F = c->ffn, T = steps;
  int64_t probs = (int64_t)batch * c->heads * T * T;
  if ((st = ensure_activations(m, fn, n, probs))) return st;
  mrl_activations *a = m->act;
  a->batch = batch;
  a->steps = steps;
  a->valid = false;
  memcpy(a->tokens, tokens, sizeof(int32_t) * (size_t)n);
  memcpy(a->lengths, lengths, sizeof(int32_t) * (size_t)batch);

  float *xn = mrl__model_scratch(m, SCRATCH_XN, n * D);
  float *hidden = mrl__model_scratch(m, SCRATCH_HIDDEN, n * F);
  if (!xn || !hidden) return mrl__fail(m->engine, MRL_ERR_NOMEM, fn, "cannot allocate scratch");

  const float *W = m->weights;
  /* embedding; padded positions embed token 0 (they never reach a real position) */
  for (int b = 0; b < batch; b++)
    for (int64_t t = 0; t < T; t++) {
      int32_t id = t < lengths[b] ? tokens[b * T + t] : 0;
      memcpy(a->x + (b * T + t) * D, W + m->embed + (int64_t)id * D, sizeof(float) * (size_t)D);
    }

  int64_t qkv_w = m->q_dim + 2 * (int64_t)m->kv_dim, qk_w = m->q_dim + (int64_t)m->kv_dim;
  int half = m->head_dim / 2;
  for (int l = 0; l < c->layers; l++) {
    const mrl_layer_params *P = &m->layer[l];
    float *x = a->x + l * n * D, *x_next = a->x + (l + 1) * n * D;
    float *qkv = a->qkv + l * n * qkv_w;
    float *attn = a->attn + l * n * m->q_dim;
    float *x_mid = a->x_mid + l * n * D;
    float *gate_up = a->gate_up + l * n * 2 * F;

    rmsnorm_forward(xn, a->rstd_attn + l * n, x, W + P->attn_norm, n, D, c->norm_eps);
    /* q | k | v side by side in each row of qkv, from the adjacent wq | wk | wv */
    mrl__gemm(false, true, n, qkv_w, D, 1.0f, xn, D, W + P->wq, D, 0.0f, qkv, qkv_w);
    for (int64_t i = 0; i < n; i++) {
      float *row = qkv + i * qkv_w;
      if (c->qkv_bias) {
        for (int j = 0; j < m->q_dim; j++) row[j] += W[P->bq + j];
        for (int j = 0; j < m->kv_dim; j++) row[m->q_dim + j] += W[P->bk + j];
        for (int j = 0; j < m->kv_dim; j++) row[m->q_dim + m->kv_dim + j] += W[P->bv + j];
      }
      if (c->qk_norm) {
        float *pre = a->qk_pre + (l * n + i) * qk_w;
        float *rs = a->rstd_qk + (l * n + i) * (c->heads + c->kv_heads);
        head_norm_forward(row, pre, rs, W + P->q_norm, c->heads, m->head_dim, c->norm_eps);
        head_norm_forward(row + m->q_dim, pre + m->q_dim, rs + c->heads, W + P->k_norm,
                          c->kv_heads, m->head_dim, c->norm_eps);
      }
      int64_t pos = i % T;
      const float *cs = m->rope_cos + pos * half, *sn = m->rope_sin + pos * half;
      mrl__rope(row, c->heads, m->head_dim, cs, sn, 1.0f);
      mrl__rope(row + m->q_dim, c->kv_heads, m->head_dim, cs, sn, 1.0f);
    }
    int threads = mrl__blas_single();
    for (int b = 0; b < batch; b++)
      attention_forward(m, attn, a->probs + l * probs + (int64_t)b * c->heads * T * T, qkv, b,
                        (int)T, lengths[b]);
    mrl__blas_restore(threads);
    /* x_mid = x + attn Wo^T */
    memcpy(x_mid, x, sizeof(float) * (size_t)(n * D));
    mrl__gemm(false, true, n, D, m->q_dim, 1.0f, attn, m->q_dim, W + P->wo, m->q_dim, 1.0f, x_mid,
              D);
    rmsnorm_forward(xn, a->rstd_mlp + l * n, x_mid, W + P->mlp_norm, n, D, c->norm_eps);
    mrl__gemm(false, true, n, 2 * F, D, 1.0f, xn, D, W + P->w_gate, D, 0.0f, gate_up, 2 * F);
    mrl__swiglu(hidden, gate_up, n, F);
    memcpy(x_next, x_mid, sizeof(float) * (size_t)(n * D));
    mrl__gemm(false, true, n, D, F, 1.0f, hidden, F, W + P->w_down, F, 1.0f, x_next, D);
  }
  rmsnorm_forward(a->xf, a->rstd_final, a->x + (int64_t)c->layers * n * D, W + m->final_norm, n, D,
                  c->norm_eps);
  a->valid = true;
  return MRL_OK;
}

/* ---- the LM head ---- */

mrl_status mrl__model_check_head(mrl_model *m, const char *fn, const int32_t *targets) {
  if (!m->act || !m->act->valid)
    return mrl__fail(m->engine, MRL_ERR_INVALID, fn,
                     "no forward pass to use: call mrl_model_forward first (again after an "
                     "optimizer step)");
  if (!targets) return mrl__fail(m->engine, MRL_ERR_NULL, fn, "targets is NULL");
  int64_t n = (int64_t)m->act->batch * m->act->steps;
  for (int64_t i = 0; i < n; i++)
    if (targets[i] < -1 || targets[i] >= m->cfg.vocab)
      return mrl__fail(m->engine, MRL_ERR_RANGE, fn, "targets[%lld] = %d is outside -1..%d",
                       (long long)i, targets[i], m->cfg.vocab - 1);
  return MRL_OK;
}

/* Logits of rows [r0, r0 + rows) of the last forward: out (rows, vocab). */
void mrl__model_head_logits(mrl_model *m, float *out, int64_t r0, int64_t rows) {
  int64_t D = m->cfg.dim, V = m->cfg.vocab;
  mrl__gemm(false, true, rows, V, D, 1.0f, m->act->xf + r0 * D, D, m->weights + m->lm_head, D,
            0.0f, out, V);
}

/* log-sum-exp and entropy of one row of logits. */
void mrl__row_stats(const float *z, int64_t V, float *lse, float *entropy) {
  float mx = z[0];
  for (int64_t j = 1; j < V; j++)
    if (z[j] > mx) mx = z[j];
  double sum = 0.0, dot = 0.0;
  for (int64_t j = 0; j < V; j++) {
    double ez = exp((double)(z[j] - mx));
    sum += ez;
    dot += ez * (double)(z[j] - mx);
  }
  double l = log(sum);
  *lse = mx + (float)l;
  /* H = lse - sum_j p_j z_j, computed relative to the max for stability */
  *entropy = (float)(l - dot / sum);
}

mrl_status mrl_model_score(mrl_model *m, const int32_t *targets, float *logprobs,
                           float *entropy) {
  const char *fn = "mrl_model_score";
  if (!m) return MRL_ERR_NULL;
  mrl_status st = mrl__model_check_head(m, fn, targets);
  if (st) return st;
  int64_t n = (int64_t)m->act->batch * m->act->steps, V = m->cfg.vocab;
  float *block = mrl__model_scratch(m, SCRATCH_HEAD, MRL_HEAD_BLOCK * V);
  if (!block) return mrl__fail(m->engine, MRL_ERR_NOMEM, fn, "cannot allocate logits");
  for (int64_t r0 = 0; r0 < n; r0 += MRL_HEAD_BLOCK) {
    int64_t rows = n - r0 < MRL_HEAD_BLOCK ? n - r0 : MRL_HEAD_BLOCK;
    mrl__model_head_logits(m, block, r0, rows);
    for (int64_t i = 0; i < rows; i++) {
      int32_t tgt = targets[r0 + i];
      float lse = 0.0f, h = 0.0f;
      if (tgt >= 0) mrl__row_stats(block + i * V, V, &lse, &h);
      if (logprobs) logprobs[r0 + i] = tgt >= 0 ? block[i * V + tgt] - lse : 0.0f;
      if (entropy) entropy[r0 + i] = tgt >= 0 ? h : 0.0f;
    }
  }
  return MRL_OK;
}

mrl_status mrl_model_logits(mrl_model *m, mrl_tensor **out) {
  const char *fn = "mrl_model_logits";
  if (!m) return MRL_ERR_NULL;
  if (!out) return mrl__fail(m->engine, MRL_ERR_NULL, fn, "out is NULL");
  if (!m->act || !m->act->valid)
    return mrl__fail(m->engine, MRL_ERR_INVALID, fn, "no forward pass: call mrl_model_forward");
  int64_t shape[3] = {m->act->batch, m->act->steps, m->cfg.vocab};
  mrl_tensor *t;
  mrl_status st = mrl__tensor_alloc(m->engine, fn, 3, shape, &t);
  if (st) return st;
  mrl__model_head_logits(m, t->data, 0, shape[0] * shape[1]);
  *out = t;
  return MRL_OK;
}

const float *mrl_model_hidden(const mrl_model *m) {
  return m && m->act && m->act->valid ? m->act->xf : NULL;
}
