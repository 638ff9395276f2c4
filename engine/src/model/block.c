/* block.c - one decoder block (RMSNorm, attention with RoPE and grouped-query heads, residual,
 * RMSNorm, SwiGLU MLP, residual) over a set of rows: the one implementation that the training
 * forward pass (right-padded batches, keeping what the backward pass needs) and the KV cache
 * (ragged runs appended to slots) both run; and the row kernels it is made of. */
#include "model.h"

#include <math.h>
#include <string.h>

/* ---- row kernels (outputs first, then inputs, then sizes; shapes in comments) ---- */

void mrl__rmsnorm_apply(float *out, const float *rstd, const float *x, const float *w, int64_t n,
                        int64_t d) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < d; j++) out[i * d + j] = x[i * d + j] * rstd[i] * w[j];
}

void mrl__rmsnorm(float *out, float *rstd, const float *x, const float *w, int64_t n, int64_t d,
                  float eps) {
  for (int64_t i = 0; i < n; i++) {
    const float *xi = x + i * d;
    double ss = 0.0;
    for (int64_t j = 0; j < d; j++) ss += (double)xi[j] * xi[j];
    float r = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    if (rstd) rstd[i] = r;
    mrl__rmsnorm_apply(out + i * d, &r, xi, w, 1, d);
  }
}

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

void mrl__swiglu(float *hidden, const float *gate_up, int64_t n, int64_t f) {
  for (int64_t i = 0; i < n; i++) {
    const float *g = gate_up + i * 2 * f, *u = g + f;
    float *h = hidden + i * f;
    for (int64_t j = 0; j < f; j++) h[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  }
}

/* ---- the block ---- */

/* Attention of head h of sequence `seq`. */
static void attention_head(const mrl_model *m, const mrl_block_io *io, int seq, int h) {
  int H = m->cfg.heads, hd = m->head_dim, g = h / (H / m->cfg.kv_heads);
  const mrl_block_seq *sq = &io->seq[seq];
  int64_t qkv_w = m->q_dim + 2 * (int64_t)m->kv_dim;
  const float *rows = io->qkv + sq->row * qkv_w;
  const float *k = sq->k ? sq->k : rows + m->q_dim, *v = sq->v ? sq->v : rows + m->q_dim + m->kv_dim;
  int64_t ldkv = sq->k ? m->kv_dim : qkv_w;
  float *out = io->attn + sq->row * m->q_dim + (int64_t)h * hd;
  int64_t W = io->probs_width;
  float *probs = sq->probs ? sq->probs + (int64_t)h * sq->rows * W : NULL;
  mrl__attn_forward_ref(out, m->q_dim, probs, W, (int)W, rows + (int64_t)h * hd, qkv_w,
                        k + (int64_t)g * hd, v + (int64_t)g * hd, ldkv, sq->len, sq->pos, hd,
                        io->work);
  /* rows past len (right padding) attend to nothing */
  for (int t = sq->len; t < sq->rows; t++) {
    memset(out + (int64_t)t * m->q_dim, 0, sizeof(float) * (size_t)hd);
    if (probs) memset(probs + (int64_t)t * W, 0, sizeof(float) * (size_t)W);
  }
}

void mrl__block_forward(mrl_model *m, int layer, const mrl_block_io *io) {
  const mrl_model_config *c = &m->cfg;
  const mrl_layer_params *P = &m->layer[layer];
  const float *W = m->weights;
  int64_t n = io->rows, D = c->dim, F = c->ffn;
  int64_t qkv_w = m->q_dim + 2 * (int64_t)m->kv_dim, qk_w = m->q_dim + (int64_t)m->kv_dim;
  int hd = m->head_dim, half = hd / 2;

  mrl__rmsnorm(io->xn, io->rstd_attn, io->x, W + P->attn_norm, n, D, c->norm_eps);
  /* q | k | v side by side in each row of qkv, from the adjacent wq | wk | wv */
  mrl__gemm(false, true, n, qkv_w, D, 1.0f, io->xn, D, W + P->wq, D, 0.0f, io->qkv, qkv_w);
  for (int i = 0; i < io->nseq; i++) {
    const mrl_block_seq *sq = &io->seq[i];
    for (int t = 0; t < sq->rows; t++) {
      int64_t r = sq->row + t;
      int pos = sq->pos + t;
      float *row = io->qkv + r * qkv_w;
      if (c->qkv_bias) {
        for (int j = 0; j < m->q_dim; j++) row[j] += W[P->bq + j];
        for (int j = 0; j < m->kv_dim; j++) row[m->q_dim + j] += W[P->bk + j];
        for (int j = 0; j < m->kv_dim; j++) row[m->q_dim + m->kv_dim + j] += W[P->bv + j];
      }
      if (c->qk_norm) {
        /* per-head RMSNorm of q and k, in place; keeping the inputs and scales when asked */
        float *rs = io->rstd_qk ? io->rstd_qk + r * (c->heads + c->kv_heads) : NULL;
        if (io->qk_pre) memcpy(io->qk_pre + r * qk_w, row, sizeof(float) * (size_t)qk_w);
        mrl__rmsnorm(row, rs, row, W + P->q_norm, c->heads, hd, c->norm_eps);
        mrl__rmsnorm(row + m->q_dim, rs ? rs + c->heads : NULL, row + m->q_dim, W + P->k_norm,
                     c->kv_heads, hd, c->norm_eps);
      }
      const float *cs = m->rope_cos + (int64_t)pos * half, *sn = m->rope_sin + (int64_t)pos * half;
      mrl__rope(row, c->heads, hd, cs, sn, 1.0f);
      mrl__rope(row + m->q_dim, c->kv_heads, hd, cs, sn, 1.0f);
      if (sq->k && t < sq->len) { /* into the cache, where attention reads every key */
        memcpy(sq->k + (int64_t)pos * m->kv_dim, row + m->q_dim, sizeof(float) * (size_t)m->kv_dim);
        memcpy(sq->v + (int64_t)pos * m->kv_dim, row + m->q_dim + m->kv_dim,
               sizeof(float) * (size_t)m->kv_dim);
      }
    }
  }
  int threads = mrl__blas_single();
  for (int i = 0; i < io->nseq; i++)
    for (int h = 0; h < c->heads; h++) attention_head(m, io, i, h);
  mrl__blas_restore(threads);

  /* x_mid = x + attn Wo^T */
  if (io->x_mid != io->x) memcpy(io->x_mid, io->x, sizeof(float) * (size_t)(n * D));
  mrl__gemm(false, true, n, D, m->q_dim, 1.0f, io->attn, m->q_dim, W + P->wo, m->q_dim, 1.0f,
            io->x_mid, D);
  mrl__rmsnorm(io->xn, io->rstd_mlp, io->x_mid, W + P->mlp_norm, n, D, c->norm_eps);
  mrl__gemm(false, true, n, 2 * F, D, 1.0f, io->xn, D, W + P->w_gate, D, 0.0f, io->gate_up,
            2 * F);
  mrl__swiglu(io->hidden, io->gate_up, n, F);
  /* x_out = x_mid + hidden Wd^T */
  if (io->x_out != io->x_mid) memcpy(io->x_out, io->x_mid, sizeof(float) * (size_t)(n * D));
  mrl__gemm(false, true, n, D, F, 1.0f, io->hidden, F, W + P->w_down, F, 1.0f, io->x_out, D);
}
