/* block.c - one decoder block (RMSNorm, attention with RoPE and grouped-query heads, residual,
 * RMSNorm, SwiGLU MLP, residual) over a set of rows: the one implementation that the training
 * forward pass (right-padded batches, keeping what the backward pass needs) and the KV cache
 * (ragged runs appended to slots) both run; and the row kernels it is made of. */
#include "kernel_math.h"
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

/* (the exp of kernel_math.h, which vectorizes: within a few ulp of expf) */
MRL_KERNEL void mrl__swiglu(float *restrict hidden, const float *restrict gate_up, int64_t n,
                            int64_t f) {
  for (int64_t i = 0; i < n; i++) {
    const float *g = gate_up + i * 2 * f, *u = g + f;
    float *h = hidden + i * f;
    for (int64_t j = 0; j < f; j++) h[j] = g[j] / (1.0f + mrl__exp_kernel(-g[j])) * u[j];
  }
}

MRL_KERNEL static void swiglu_backward(float *restrict dgate_up, const float *restrict dhidden,
                                       const float *restrict gate_up, int64_t n, int64_t f) {
  for (int64_t i = 0; i < n; i++) {
    const float *g = gate_up + i * 2 * f, *up = g + f, *dh = dhidden + i * f;
    float *dg = dgate_up + i * 2 * f, *du = dg + f;
    for (int64_t j = 0; j < f; j++) {
      float sg = 1.0f / (1.0f + mrl__exp_kernel(-g[j]));
      du[j] = dh[j] * g[j] * sg;
      dg[j] = dh[j] * up[j] * sg * (1.0f + g[j] * (1.0f - sg));
    }
  }
}

/* SwiGLU and its backward over blocks of rows on the engine's threads (elementwise: the same
 * bits whichever thread does a row). */
enum { SWIGLU_ROWS = 64 };

typedef struct {
  float *out, *dout;     /* hidden (n, f); or dgate_up (n, 2f) for the backward */
  const float *gate_up;  /* (n, 2f) */
  const float *dhidden;  /* (n, f) for the backward; NULL for the forward */
  int64_t n, f;
} swiglu_job;

static void swiglu_unit(void *ctx, int64_t u, int worker) {
  (void)worker;
  const swiglu_job *job = ctx;
  int64_t r0 = u * SWIGLU_ROWS, rows = job->n - r0 < SWIGLU_ROWS ? job->n - r0 : SWIGLU_ROWS;
  int64_t f = job->f;
  if (!job->dhidden) {
    mrl__swiglu(job->out + r0 * f, job->gate_up + r0 * 2 * f, rows, f);
    return;
  }
  swiglu_backward(job->dout + r0 * 2 * f, job->dhidden + r0 * f, job->gate_up + r0 * 2 * f, rows,
                  f);
}

void mrl__swiglu_rows(mrl_engine *e, float *hidden, const float *gate_up, int64_t n, int64_t f) {
  swiglu_job job = {hidden, NULL, gate_up, NULL, n, f};
  mrl__pool_run(e, (n + SWIGLU_ROWS - 1) / SWIGLU_ROWS, 20.0 * (double)(n * f), swiglu_unit, &job);
}

void mrl__swiglu_backward_rows(mrl_engine *e, float *dgate_up, const float *dhidden,
                               const float *gate_up, int64_t n, int64_t f) {
  swiglu_job job = {NULL, dgate_up, gate_up, dhidden, n, f};
  mrl__pool_run(e, (n + SWIGLU_ROWS - 1) / SWIGLU_ROWS, 30.0 * (double)(n * f), swiglu_unit, &job);
}

/* ---- the block ---- */

int64_t mrl__block_work(const mrl_model *m, int max_rows, int max_keys) {
  /* the attention's own, after room for a sequence's transposed keys */
  return (int64_t)m->head_dim * mrl__attn_key_columns(max_keys) +
         (m->reference_attention ? mrl__attn_forward_ref_work(max_rows, max_keys)
                                 : mrl__attn_forward_work(m->head_dim, max_keys));
}

typedef struct {
  const mrl_model *m;
  const mrl_block_io *io;
} attention_job;

/* One unit: head h of sequence u / heads. */
static void attention_unit(void *ctx, int64_t u, int worker) {
  const attention_job *job = ctx;
  const mrl_model *m = job->m;
  const mrl_block_io *io = job->io;
  int H = m->cfg.heads, hd = m->head_dim, h = (int)(u % H), g = h / (H / m->cfg.kv_heads);
  const mrl_block_seq *sq = &io->seq[u / H];
  int64_t qkv_w = m->q_dim + 2 * (int64_t)m->kv_dim;
  const float *rows = io->qkv + sq->row * qkv_w;
  float *work = io->work + (int64_t)worker * io->work_per_thread;
  const int C = MRL_ATTN_COLS;
  const float *kt, *v;
  int64_t ldkt, ldkc = C, ldv;
  if (sq->k) { /* a cache slot's: stored transposed, in blocks of C positions */
    kt = sq->k + (int64_t)g * hd * C;
    ldkt = C;
    ldkc = (int64_t)m->kv_dim * C;
    v = sq->v + (int64_t)g * hd;
    ldv = m->kv_dim;
    if (m->reference_attention) { /* which takes plain rows: into the front of the work */
      int keys = sq->pos + sq->len;
      int64_t cols = mrl__attn_key_columns(keys);
      for (int d = 0; d < hd; d++)
        for (int s = 0; s < keys; s++) work[d * cols + s] = kt[s / C * ldkc + d * C + s % C];
      kt = work;
      ldkt = cols;
      ldkc = C;
      work += (int64_t)hd * cols;
    }
  } else { /* the sequence's own rows: transposed into the front of the thread's work */
    ldkt = mrl__attn_key_columns(sq->len);
    mrl__attn_transpose_keys(work, ldkt, rows + m->q_dim + (int64_t)g * hd, qkv_w, sq->len, hd);
    kt = work;
    work += (int64_t)hd * ldkt;
    v = rows + m->q_dim + m->kv_dim + (int64_t)g * hd;
    ldv = qkv_w;
  }
  float *out = io->attn + sq->row * m->q_dim + (int64_t)h * hd;
  int64_t W = io->probs_width;
  float *probs = sq->probs ? sq->probs + (int64_t)h * sq->rows * W : NULL;
  if (m->reference_attention)
    mrl__attn_forward_ref(out, m->q_dim, probs, W, (int)W, rows + (int64_t)h * hd, qkv_w, kt,
                          ldkt, v, ldv, sq->len, sq->pos, hd, work);
  else
    mrl__attn_forward(out, m->q_dim, probs, W, (int)W, rows + (int64_t)h * hd, qkv_w, kt, ldkt,
                      ldkc, v, ldv, sq->len, sq->pos, hd, work);
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
  bool apart = io->rows_apart;
  mrl__project(m, apart, io->decode_bf16, io->qkv, qkv_w, io->xn, D, P->wq, n, qkv_w, D, 0.0f);
  double attention_flops = 0.0;
  for (int i = 0; i < io->nseq; i++) {
    const mrl_block_seq *sq = &io->seq[i];
    attention_flops += 4.0 * c->heads * hd * sq->len * (sq->pos + 0.5 * sq->len);
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
        float *kb = sq->k + (int64_t)(pos / MRL_ATTN_COLS) * m->kv_dim * MRL_ATTN_COLS +
                    pos % MRL_ATTN_COLS;
        for (int j = 0; j < m->kv_dim; j++) kb[(int64_t)j * MRL_ATTN_COLS] = row[m->q_dim + j];
        memcpy(sq->v + (int64_t)pos * m->kv_dim, row + m->q_dim + m->kv_dim,
               sizeof(float) * (size_t)m->kv_dim);
      }
    }
  }
  attention_job job = {m, io};
  int64_t units = (int64_t)io->nseq * c->heads;
  if (m->reference_attention) /* OpenBLAS products: the calling thread only */
    for (int64_t u = 0; u < units; u++) attention_unit(&job, u, 0);
  else
    mrl__pool_run(m->engine, units, attention_flops, attention_unit, &job);

  /* x_mid = x + attn Wo^T */
  if (io->x_mid != io->x) memcpy(io->x_mid, io->x, sizeof(float) * (size_t)(n * D));
  mrl__project(m, apart, io->decode_bf16, io->x_mid, D, io->attn, m->q_dim, P->wo, n, D, m->q_dim, 1.0f);
  mrl__rmsnorm(io->xn, io->rstd_mlp, io->x_mid, W + P->mlp_norm, n, D, c->norm_eps);
  mrl__project(m, apart, io->decode_bf16, io->gate_up, 2 * F, io->xn, D, P->w_gate, n, 2 * F, D, 0.0f);
  mrl__swiglu_rows(m->engine, io->hidden, io->gate_up, n, F);
  /* x_out = x_mid + hidden Wd^T */
  if (io->x_out != io->x_mid) memcpy(io->x_out, io->x_mid, sizeof(float) * (size_t)(n * D));
  mrl__project(m, apart, io->decode_bf16, io->x_out, D, io->hidden, F, P->w_down, n, D, F, 1.0f);
}
