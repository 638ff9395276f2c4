/* model_forward.c - the decoder's forward pass over a right-padded batch (the blocks of block.c,
 * keeping the activations the backward pass needs, up to the final normalised hidden states that
 * the LM head of head.c reads). */
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

void mrl__gemm_rows(bool apart, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                    int64_t ldc) {
  if (!apart) {
    mrl__gemm(false, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  for (int64_t i = 0; i < m; i++)
    mrl__gemm(false, tb, 1, n, k, alpha, a + i * lda, lda, b, ldb, beta, c + i * ldc, ldc);
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
  mrl__free(e, a->seqs, sizeof *a->seqs * (size_t)n);
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
            (a->seqs = mrl__alloc(e, sizeof *a->seqs * (size_t)n)) &&
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
  mrl_engine *e = m->engine;
  const mrl_model_config *c = &m->cfg;
  int64_t n = (int64_t)batch * steps, D = c->dim, F = c->ffn, T = steps;
  int64_t probs = (int64_t)batch * c->heads * T * T;
  /* a forward that fails keeps none (not the previous one either) */
  if (m->act) m->act->valid = false;
  int threads = m->reference_attention ? 1 : e->threads;
  int64_t work = mrl__block_work(m, steps, steps);
  mrl_scratch_slot slots[3] = {SCRATCH_XN, SCRATCH_HIDDEN, SCRATCH_ATTN_WORK};
  int64_t sizes[3] = {n * D, n * F, threads * work};
  mrl_scratch_plan plan;
  if (!m->reference_attention && (st = mrl__pool_start(e, fn))) return st;
  if (!mrl__scratch_prepare(m, &plan, 3, slots, sizes))
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate scratch for %lld positions",
                     (long long)n);
  st = ensure_activations(m, fn, n, probs);
  mrl__scratch_finish(m, &plan, st == MRL_OK);
  if (st) return st;
  mrl_activations *a = m->act;
  a->batch = batch;
  a->steps = steps;
  memcpy(a->tokens, tokens, sizeof(int32_t) * (size_t)n);
  memcpy(a->lengths, lengths, sizeof(int32_t) * (size_t)batch);

  const float *W = m->weights;
  /* embedding; padded positions embed token 0 (they never reach a real position) */
  for (int b = 0; b < batch; b++)
    for (int64_t t = 0; t < T; t++) {
      int32_t id = t < lengths[b] ? tokens[b * T + t] : 0;
      memcpy(a->x + (b * T + t) * D, W + m->embed + (int64_t)id * D, sizeof(float) * (size_t)D);
    }

  int64_t qkv_w = m->q_dim + 2 * (int64_t)m->kv_dim, qk_w = m->q_dim + (int64_t)m->kv_dim;
  mrl_block_io io = {.rows = n, .nseq = batch, .seq = a->seqs,
                     .xn = m->scratch[SCRATCH_XN].p, .hidden = m->scratch[SCRATCH_HIDDEN].p,
                     .probs_width = steps, .work = m->scratch[SCRATCH_ATTN_WORK].p,
                     .work_per_thread = work};
  for (int l = 0; l < c->layers; l++) {
    for (int b = 0; b < batch; b++)
      a->seqs[b] = (mrl_block_seq){.row = b * T, .rows = steps, .len = lengths[b], .pos = 0,
                                   .probs = a->probs + l * probs + (int64_t)b * c->heads * T * T};
    io.x = a->x + l * n * D;
    io.x_mid = a->x_mid + l * n * D;
    io.x_out = a->x + (l + 1) * n * D;
    io.qkv = a->qkv + l * n * qkv_w;
    io.attn = a->attn + l * n * m->q_dim;
    io.gate_up = a->gate_up + l * n * 2 * F;
    io.rstd_attn = a->rstd_attn + l * n;
    io.rstd_mlp = a->rstd_mlp + l * n;
    io.qk_pre = c->qk_norm ? a->qk_pre + l * n * qk_w : NULL;
    io.rstd_qk = c->qk_norm ? a->rstd_qk + l * n * (c->heads + c->kv_heads) : NULL;
    mrl__block_forward(m, l, &io);
  }
  mrl__rmsnorm(a->xf, a->rstd_final, a->x + (int64_t)c->layers * n * D, W + m->final_norm, n, D,
               c->norm_eps);
  a->valid = true;
  return MRL_OK;
}

const float *mrl_model_hidden(const mrl_model *m) {
  return m && m->act && m->act->valid ? m->act->xf : NULL;
}
