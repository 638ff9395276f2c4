/* model_backward.c - the backward pass of the decoder (gradients of every parameter, added to
 * the gradient buffer), gradient clipping, AdamW and learning-rate schedules. */
#include "model.h"

#include <math.h>
#include <string.h>

/* ---- kernels ---- */

/* RMSNorm y = x r w backward for n rows of d: dx (n, d) = or += (when accumulate) the input
 * gradient, dw (d) += the weight gradient. dy (n, d), x (n, d), rstd (n). */
static void rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x,
                             const float *rstd, const float *w, int64_t n, int64_t d,
                             bool accumulate) {
  for (int64_t i = 0; i < n; i++) {
    const float *dyi = dy + i * d, *xi = x + i * d;
    float r = rstd[i];
    double dot = 0.0; /* sum_j dy_j w_j x_j */
    for (int64_t j = 0; j < d; j++) {
      dot += (double)dyi[j] * w[j] * xi[j];
      dw[j] += dyi[j] * xi[j] * r;
    }
    float coef = (float)(dot * r * r * r / (double)d);
    float *dxi = dx + i * d;
    for (int64_t j = 0; j < d; j++) {
      float g = dyi[j] * w[j] * r - xi[j] * coef;
      dxi[j] = accumulate ? dxi[j] + g : g;
    }
  }
}

/* The attention backward of one layer, a unit per (sequence, key/value head): the heads of a
 * group add into the same dk and dv rows, so one thread does them all, in order. */
typedef struct {
  const mrl_model *m;
  float *dqkv;        /* rows of dq | dk | dv: dq written, dk and dv added to */
  const float *dattn; /* gradient of the attention output, (n, q_dim) */
  const float *qkv, *probs;
  const int32_t *lengths;
  int T;
  float *work;
  int64_t work_per_thread;
} attention_backward_job;

static void attention_backward_unit(void *ctx, int64_t u, int worker) {
  const attention_backward_job *job = ctx;
  const mrl_model *m = job->m;
  int KV = m->cfg.kv_heads, group = m->cfg.heads / KV, hd = m->head_dim, T = job->T;
  int b = (int)(u / KV), g = (int)(u % KV);
  int64_t stride = m->q_dim + 2 * (int64_t)m->kv_dim, first = (int64_t)b * T;
  const float *rows = job->qkv + first * stride;
  float *drows = job->dqkv + first * stride;
  const float *k = rows + m->q_dim + (int64_t)g * hd, *v = k + m->kv_dim;
  float *dk = drows + m->q_dim + (int64_t)g * hd, *dv = dk + m->kv_dim;
  float *work = job->work + (int64_t)worker * job->work_per_thread;
  for (int h = g * group; h < (g + 1) * group; h++) {
    const float *p = job->probs + ((int64_t)b * m->cfg.heads + h) * T * T;
    const float *dout = job->dattn + first * m->q_dim + (int64_t)h * hd;
    (m->reference_attention ? mrl__attn_backward_ref : mrl__attn_backward)(
        drows + (int64_t)h * hd, stride, dk, dv, stride, dout, m->q_dim, p, T,
        rows + (int64_t)h * hd, stride, k, v, stride, job->lengths[b], hd, work);
  }
}

/* dW (out, in) += dY^T X and dX (n, in) (+)= dY W, for Y = X W^T with n rows. */
static void linear_backward(float *dx, float *dw, const float *dy, const float *x, const float *w,
                            int64_t n, int64_t in, int64_t out, int64_t ldx, int64_t lddy,
                            bool accumulate_dx) {
  mrl__gemm(true, false, out, in, n, 1.0f, dy, lddy, x, ldx, 1.0f, dw, in);
  mrl__gemm(false, false, n, in, out, 1.0f, dy, lddy, w, in, accumulate_dx ? 1.0f : 0.0f, dx, ldx);
}

mrl_status mrl_model_backward(mrl_model *m, const int32_t *targets, const float *dlogprobs,
                              const float *dentropy) {
  return mrl_model_backward_hidden(m, targets, dlogprobs, dentropy, NULL);
}

mrl_status mrl_model_backward_hidden(mrl_model *m, const int32_t *targets,
                                     const float *dlogprobs, const float *dentropy,
                                     const float *dhidden) {
  const char *fn = "mrl_model_backward";
  if (!m) return MRL_ERR_NULL;
  mrl_status st = mrl__model_check_head(m, fn, targets);
  if (st) return st;
  const mrl_model_config *c = &m->cfg;
  mrl_activations *a = m->act;
  int B = a->batch, T = a->steps;
  int64_t n = (int64_t)B * T, D = c->dim, F = c->ffn;
  int64_t qkv_w = m->q_dim + 2 * (int64_t)m->kv_dim, qk_w = m->q_dim + (int64_t)m->kv_dim;
  int64_t probs_per_layer = (int64_t)B * c->heads * T * T;
  int threads = m->reference_attention ? 1 : m->engine->threads;
  int64_t work = m->reference_attention ? mrl__attn_backward_ref_work(T)
                                        : mrl__attn_backward_work(m->head_dim, T);
  /* everything that can fail comes before the first gradient changes */
  mrl_scratch_slot slots[] = {SCRATCH_DX,   SCRATCH_DMID,  SCRATCH_DXN,      SCRATCH_XN,
                              SCRATCH_HIDDEN, SCRATCH_DQKV, SCRATCH_DATTN, SCRATCH_DGATE_UP,
                              SCRATCH_HEAD, SCRATCH_HEAD_ROWS, SCRATCH_ATTN_WORK};
  int64_t sizes[] = {n * D, n * D, n * D, n * D, n * F, n * qkv_w, n * m->q_dim, n * 2 * F,
                     MRL_HEAD_BLOCK * (int64_t)c->vocab, 2 * MRL_HEAD_BLOCK * D, threads * work};
  if ((!m->reference_attention || !m->reference_head) && (st = mrl__pool_start(m->engine, fn)))
    return st;
  if (!mrl__model_reserve(m, (int)(sizeof slots / sizeof *slots), slots, sizes))
    return mrl__fail(m->engine, MRL_ERR_NOMEM, fn, "cannot allocate gradient buffers");
  float *dx = m->scratch[SCRATCH_DX].p, *dmid = m->scratch[SCRATCH_DMID].p;
  float *dxn = m->scratch[SCRATCH_DXN].p, *xn = m->scratch[SCRATCH_XN].p;
  float *hidden = m->scratch[SCRATCH_HIDDEN].p, *dqkv = m->scratch[SCRATCH_DQKV].p;
  float *dattn = m->scratch[SCRATCH_DATTN].p, *dgate_up = m->scratch[SCRATCH_DGATE_UP].p;
  const float *W = m->weights;
  float *G = m->grads;

  /* LM head, then the final norm */
  mrl__model_head_backward(m, dxn, targets, dlogprobs, dentropy);
  if (dhidden)
    for (int64_t i = 0; i < n * D; i++) dxn[i] += dhidden[i];
  rmsnorm_backward(dx, G + m->final_norm, dxn, a->x + (int64_t)c->layers * n * D, a->rstd_final,
                   W + m->final_norm, n, D, false);

  int half = m->head_dim / 2;
  for (int l = c->layers - 1; l >= 0; l--) {
    const mrl_layer_params *P = &m->layer[l];
    const float *x = a->x + l * n * D, *x_mid = a->x_mid + l * n * D;
    const float *qkv = a->qkv + l * n * qkv_w, *attn = a->attn + l * n * m->q_dim;
    const float *gate_up = a->gate_up + l * n * 2 * F;

    /* MLP: x_next = x_mid + (silu(gate) * up) Wd^T, with dx = d x_next */
    mrl__swiglu_rows(m->engine, hidden, gate_up, n, F);
    /* d hidden goes into the hidden buffer, which the down projection's gradient used last */
    mrl__gemm(true, false, D, F, n, 1.0f, dx, D, hidden, F, 1.0f, G + P->w_down, F);
    mrl__gemm(false, false, n, F, D, 1.0f, dx, D, W + P->w_down, F, 0.0f, hidden, F);
    mrl__swiglu_backward_rows(m->engine, dgate_up, hidden, gate_up, n, F);
    mrl__rmsnorm_apply(xn, a->rstd_mlp + l * n, x_mid, W + P->mlp_norm, n, D);
    linear_backward(dxn, G + P->w_gate, dgate_up, xn, W + P->w_gate, n, D, 2 * F, D, 2 * F, false);
    memcpy(dmid, dx, sizeof(float) * (size_t)(n * D));
    rmsnorm_backward(dmid, G + P->mlp_norm, dxn, x_mid, a->rstd_mlp + l * n, W + P->mlp_norm, n,
                     D, true);

    /* attention: x_mid = x + attn Wo^T */
    linear_backward(dattn, G + P->wo, dmid, attn, W + P->wo, n, m->q_dim, D, m->q_dim, D, false);
    memset(dqkv, 0, sizeof(float) * (size_t)(n * qkv_w));
    attention_backward_job job = {m,     dqkv, dattn, qkv, a->probs + l * probs_per_layer,
                                  a->lengths, T, m->scratch[SCRATCH_ATTN_WORK].p, work};
    double flops = 0.0;
    for (int b = 0; b < B; b++)
      flops += 4.0 * c->heads * m->head_dim * a->lengths[b] * a->lengths[b];
    int64_t units = (int64_t)B * c->kv_heads;
    if (m->reference_attention) /* OpenBLAS products: the calling thread only */
      for (int64_t u = 0; u < units; u++) attention_backward_unit(&job, u, 0);
    else
      mrl__pool_run(m->engine, units, flops, attention_backward_unit, &job);
    for (int64_t i = 0; i < n; i++) {
      float *row = dqkv + i * qkv_w;
      int64_t pos = i % T;
      const float *cs = m->rope_cos + pos * half, *sn = m->rope_sin + pos * half;
      mrl__rope(row, c->heads, m->head_dim, cs, sn, -1.0f);
      mrl__rope(row + m->q_dim, c->kv_heads, m->head_dim, cs, sn, -1.0f);
      if (c->qk_norm) {
        /* the row holds dq for the query heads, then dk for the key heads: one head norm each
         * (rmsnorm_backward may write its input gradient over its output gradient) */
        const float *pre = a->qk_pre + (l * n + i) * qk_w;
        const float *rs = a->rstd_qk + (l * n + i) * (c->heads + c->kv_heads);
        for (int h = 0; h < c->heads + c->kv_heads; h++) {
          int64_t norm = h < c->heads ? P->q_norm : P->k_norm;
          float *d = row + (int64_t)h * m->head_dim;
          rmsnorm_backward(d, G + norm, d, pre + (int64_t)h * m->head_dim, rs + h, W + norm, 1,
                           m->head_dim, false);
        }
      }
      if (c->qkv_bias) {
        for (int j = 0; j < m->q_dim; j++) G[P->bq + j] += row[j];
        for (int j = 0; j < m->kv_dim; j++) G[P->bk + j] += row[m->q_dim + j];
        for (int j = 0; j < m->kv_dim; j++) G[P->bv + j] += row[m->q_dim + m->kv_dim + j];
      }
    }
    mrl__rmsnorm_apply(xn, a->rstd_attn + l * n, x, W + P->attn_norm, n, D);
    linear_backward(dxn, G + P->wq, dqkv, xn, W + P->wq, n, D, qkv_w, D, qkv_w, false);
    memcpy(dx, dmid, sizeof(float) * (size_t)(n * D));
    rmsnorm_backward(dx, G + P->attn_norm, dxn, x, a->rstd_attn + l * n, W + P->attn_norm, n, D,
                     true);
  }
  /* embedding rows of the real tokens */
  for (int b = 0; b < B; b++)
    for (int t = 0; t < a->lengths[b]; t++) {
      int64_t i = (int64_t)b * T + t;
      float *ge = G + m->embed + (int64_t)a->tokens[i] * D;
      for (int64_t j = 0; j < D; j++) ge[j] += dx[i * D + j];
    }
  return MRL_OK;
}

/* ---- gradients and the optimizer ---- */

mrl_status mrl_model_zero_grad(mrl_model *m) {
  if (!m) return MRL_ERR_NULL;
  memset(m->grads, 0, sizeof(float) * (size_t)m->numel);
  return MRL_OK;
}

mrl_status mrl_model_clip_grad(mrl_model *m, double max_norm, double *norm) {
  if (!m) return MRL_ERR_NULL;
  if (!(max_norm >= 0.0))
    return mrl__fail(m->engine, MRL_ERR_INVALID, "mrl_model_clip_grad",
                     "max_norm must be >= 0, got %g", max_norm);
  double ss = 0.0;
  for (int64_t i = 0; i < m->numel; i++) ss += (double)m->grads[i] * m->grads[i];
  double total = sqrt(ss);
  if (norm) *norm = total;
  if (max_norm > 0.0 && total > max_norm) {
    float s = (float)(max_norm / (total + 1e-6));
    for (int64_t i = 0; i < m->numel; i++) m->grads[i] *= s;
  }
  return MRL_OK;
}

mrl_status mrl__model_alloc_adam(mrl_model *m, const char *fn) {
  if (m->adam_m) return MRL_OK;
  mrl_status st;
  if ((st = mrl__tensor_alloc(m->engine, fn, 1, &m->numel, &m->adam_m_t))) return st;
  if ((st = mrl__tensor_alloc(m->engine, fn, 1, &m->numel, &m->adam_v_t))) {
    mrl_tensor_free(m->adam_m_t);
    m->adam_m_t = NULL;
    return st;
  }
  m->adam_m = m->adam_m_t->data;
  m->adam_v = m->adam_v_t->data;
  return MRL_OK;
}

mrl_status mrl_model_adamw_step(mrl_model *m, const mrl_adamw *opt) {
  const char *fn = "mrl_model_adamw_step";
  if (!m) return MRL_ERR_NULL;
  if (!opt) return mrl__fail(m->engine, MRL_ERR_NULL, fn, "opt is NULL");
  if (!(opt->lr >= 0.0f) || !(opt->beta1 >= 0.0f && opt->beta1 < 1.0f) ||
      !(opt->beta2 >= 0.0f && opt->beta2 < 1.0f) || !(opt->eps > 0.0f) ||
      !(opt->weight_decay >= 0.0f))
    return mrl__fail(m->engine, MRL_ERR_INVALID, fn,
                     "need lr >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0");
  mrl_status st = mrl__model_alloc_adam(m, fn);
  if (st) return st;
  m->adam_step++;
  double t = (double)m->adam_step;
  float bc1 = (float)(1.0 - pow(opt->beta1, t)), bc2 = (float)(1.0 - pow(opt->beta2, t));
  float step_size = opt->lr / bc1, bc2_sqrt = sqrtf(bc2);
  for (int i = 0; i < m->nparams; i++) {
    const mrl_param *p = &m->params[i];
    float decay = p->decay ? 1.0f - opt->lr * opt->weight_decay : 1.0f;
    float *w = m->weights + p->offset, *g = m->grads + p->offset;
    float *mo = m->adam_m + p->offset, *vo = m->adam_v + p->offset;
    for (int64_t k = 0; k < p->numel; k++) {
      mo[k] = opt->beta1 * mo[k] + (1.0f - opt->beta1) * g[k];
      vo[k] = opt->beta2 * vo[k] + (1.0f - opt->beta2) * g[k] * g[k];
      w[k] = w[k] * decay - step_size * mo[k] / (sqrtf(vo[k]) / bc2_sqrt + opt->eps);
    }
  }
  if (m->act) m->act->valid = false; /* the kept activations belong to the old weights */
  mrl__model_refresh_bf16(m);         /* decoding follows the new weights */
  return MRL_OK;
}

double mrl_lr_at(mrl_lr_schedule kind, int64_t step, int64_t total, int64_t warmup, double base,
                 double min_lr) {
  if (step < 0) step = 0;
  if (warmup > 0 && step < warmup) return base * (double)(step + 1) / (double)warmup;
  if (kind != MRL_LR_COSINE || total <= warmup) return base;
  double progress = (double)(step - warmup) / (double)(total - warmup);
  if (progress > 1.0) progress = 1.0;
  return min_lr + 0.5 * (base - min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
}
