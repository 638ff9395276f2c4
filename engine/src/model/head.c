/* head.c - the LM head over the rows of the last forward pass: the log-probability of each
 * scored row's target and its distribution's entropy (mrl_model_score), the head's backward
 * (mrl__model_head_backward: gradients of the head weights and of the final hidden states), and
 * the logits of every row (mrl_model_logits).
 *
 * Only the rows that need the head go through it: those with a target (scoring) or with a
 * non-zero gradient (backward), gathered MRL_HEAD_BLOCK at a time, so a batch whose prompts and
 * observations are unscored pays for its scored rows only, and a block's logits never exist for
 * more rows than that. The per-row work on a block of logits (max, log-sum-exp, entropy, the
 * softmax gradient) runs one row per unit on the engine's threads, with the vectorizable exp of
 * kernel_math.h and sums in double lanes of one fixed order, so results do not depend on the
 * thread count. Beside it stays the reference the tests compare against (m->reference_head):
 * the head over every row and the statistics with libm's exp in double, on the calling thread. */
#include "kernel_math.h"
#include "model.h"

#include <math.h>
#include <string.h>

enum { LANES = 16 };

/* ---- row kernels ---- */

/* the largest of z[0..V) */
MRL_KERNEL static float row_max(const float *restrict z, int64_t V) {
  float lane[LANES];
  for (int u = 0; u < LANES; u++) lane[u] = z[0];
  int64_t whole = V / LANES * LANES;
  for (int64_t j = 0; j < whole; j += LANES)
    for (int u = 0; u < LANES; u++) lane[u] = z[j + u] > lane[u] ? z[j + u] : lane[u];
  float mx = z[0];
  for (int u = 0; u < LANES; u++) mx = lane[u] > mx ? lane[u] : mx;
  for (int64_t j = whole; j < V; j++) mx = z[j] > mx ? z[j] : mx;
  return mx;
}

/* *sum = sum_j e_j and *dot = sum_j e_j (z_j - mx), e_j = e^(z_j - mx), in double lanes added in
 * lane order; with keep, e_j replaces z_j. */
MRL_KERNEL static void row_exp_sums(float *restrict z, int64_t V, float mx, bool keep,
                                    double *sum, double *dot) {
  double ls[LANES] = {0}, ld[LANES] = {0};
  int64_t whole = V / LANES * LANES;
  for (int64_t j = 0; j < whole; j += LANES)
    for (int u = 0; u < LANES; u++) {
      float d = z[j + u] - mx, e = mrl__exp_kernel(d);
      ls[u] += e;
      ld[u] += (double)(e * d);
      if (keep) z[j + u] = e;
    }
  for (int64_t j = whole; j < V; j++) {
    float d = z[j] - mx, e = mrl__exp_kernel(d);
    ls[j - whole] += e;
    ld[j - whole] += (double)(e * d);
    if (keep) z[j] = e;
  }
  double s = 0.0, t = 0.0;
  for (int u = 0; u < LANES; u++) {
    s += ls[u];
    t += ld[u];
  }
  *sum = s;
  *dot = t;
}

/* z_j = -g p_j - gh p_j (log p_j + H) for log p_j = z_j - mx - l: the gradient of
 * g log p_target + gh H, but for the target's own term. */
MRL_KERNEL static void row_softmax_grad(float *restrict z, int64_t V, float mx, float l, float ent,
                                        float g, float gh) {
  for (int64_t j = 0; j < V; j++) {
    float logp = (z[j] - mx) - l, p = mrl__exp_kernel(logp);
    z[j] = -g * p - gh * p * (logp + ent);
  }
}

MRL_KERNEL static void row_scale(float *restrict z, int64_t V, float s) {
  for (int64_t j = 0; j < V; j++) z[j] *= s;
}

/* The reference: log-sum-exp and entropy of one row, exp in double. */
static void row_stats_ref(const float *z, int64_t V, float *lse, float *entropy) {
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

/* ---- blocks of gathered rows ---- */

/* Row i needs the head: it has a target and, in the backward pass (g or gh given), a non-zero
 * coefficient. */
static bool row_needed(const int32_t *targets, const float *g, const float *gh, int64_t i) {
  if (targets[i] < 0) return false;
  if (!g && !gh) return true;
  return (g && g[i] != 0.0f) || (gh && gh[i] != 0.0f);
}

/* The next block of rows from *next on that need the head: their indices into idx (up to
 * MRL_HEAD_BLOCK), their final hidden states into xg (rows, dim); *next moves past them.
 * Returns how many. */
static int gather_rows(const mrl_model *m, const int32_t *targets, const float *g,
                       const float *gh, int64_t n, int64_t *next, int64_t *idx, float *xg) {
  int64_t D = m->cfg.dim;
  int rows = 0;
  for (; *next < n && rows < MRL_HEAD_BLOCK; ++*next)
    if (row_needed(targets, g, gh, *next)) {
      memcpy(xg + rows * D, m->act->xf + *next * D, sizeof(float) * (size_t)D);
      idx[rows++] = *next;
    }
  return rows;
}

/* logits (rows, vocab) = xg (rows, dim) W_head^T */
static void block_logits(const mrl_model *m, float *block, const float *xg, int rows) {
  int64_t D = m->cfg.dim, V = m->cfg.vocab;
  mrl__gemm(false, true, rows, V, D, 1.0f, xg, D, m->weights + m->lm_head, D, 0.0f, block, V);
}

typedef struct {
  float *block;          /* (rows, vocab) logits, replaced by their gradient in the backward */
  int64_t V;
  const int64_t *idx;    /* the block's rows */
  const int32_t *targets;
  const float *g, *gh;   /* backward: coefficients of log p and of the entropy (may be NULL) */
  float *logprobs, *entropy; /* scoring: outputs (may be NULL) */
} head_job;

/* One unit: row u of the block. */
static void score_unit(void *ctx, int64_t u, int worker) {
  (void)worker;
  const head_job *job = ctx;
  float *z = job->block + u * job->V;
  int64_t i = job->idx[u];
  float mx = row_max(z, job->V);
  double sum, dot;
  row_exp_sums(z, job->V, mx, false, &sum, &dot);
  double l = log(sum);
  if (job->logprobs) job->logprobs[i] = z[job->targets[i]] - (mx + (float)l);
  if (job->entropy) job->entropy[i] = (float)(l - dot / sum);
}

static void grad_unit(void *ctx, int64_t u, int worker) {
  (void)worker;
  const head_job *job = ctx;
  float *z = job->block + u * job->V;
  int64_t i = job->idx[u];
  int32_t tgt = job->targets[i];
  float g = job->g ? job->g[i] : 0.0f, gh = job->gh ? job->gh[i] : 0.0f;
  float mx = row_max(z, job->V);
  double sum, dot;
  if (gh == 0.0f) { /* -g p_j: the exponentials once, kept in place */
    row_exp_sums(z, job->V, mx, true, &sum, &dot);
    row_scale(z, job->V, (float)(-(double)g / sum));
  } else {
    row_exp_sums(z, job->V, mx, false, &sum, &dot);
    double l = log(sum);
    row_softmax_grad(z, job->V, mx, (float)l, (float)(l - dot / sum), g, gh);
  }
  z[tgt] += g;
}

/* ---- the reference ---- */

static void score_ref(mrl_model *m, float *block, const int32_t *targets, float *logprobs,
                      float *entropy) {
  int64_t n = (int64_t)m->act->batch * m->act->steps, V = m->cfg.vocab;
  for (int64_t r0 = 0; r0 < n; r0 += MRL_HEAD_BLOCK) {
    int64_t rows = n - r0 < MRL_HEAD_BLOCK ? n - r0 : MRL_HEAD_BLOCK;
    mrl__model_head_logits(m, block, r0, rows);
    for (int64_t i = 0; i < rows; i++) {
      int32_t tgt = targets[r0 + i];
      float lse = 0.0f, h = 0.0f;
      if (tgt >= 0) row_stats_ref(block + i * V, V, &lse, &h);
      if (logprobs) logprobs[r0 + i] = tgt >= 0 ? block[i * V + tgt] - lse : 0.0f;
      if (entropy) entropy[r0 + i] = tgt >= 0 ? h : 0.0f;
    }
  }
}

static void head_backward_ref(mrl_model *m, float *block, float *dxf, const int32_t *targets,
                              const float *dlogprobs, const float *dentropy) {
  int64_t n = (int64_t)m->act->batch * m->act->steps, V = m->cfg.vocab, D = m->cfg.dim;
  for (int64_t r0 = 0; r0 < n; r0 += MRL_HEAD_BLOCK) {
    int64_t rows = n - r0 < MRL_HEAD_BLOCK ? n - r0 : MRL_HEAD_BLOCK;
    mrl__model_head_logits(m, block, r0, rows);
    for (int64_t i = 0; i < rows; i++) {
      float *z = block + i * V;
      int32_t tgt = targets[r0 + i];
      float g = dlogprobs && tgt >= 0 ? dlogprobs[r0 + i] : 0.0f;
      float gh = dentropy && tgt >= 0 ? dentropy[r0 + i] : 0.0f;
      if (g == 0.0f && gh == 0.0f) {
        memset(z, 0, sizeof(float) * (size_t)V);
        continue;
      }
      float lse, ent;
      row_stats_ref(z, V, &lse, &ent);
      /* d logp / dz_j = 1[j = target] - p_j;  d H / dz_j = -p_j (log p_j + H) */
      for (int64_t j = 0; j < V; j++) {
        float logp = z[j] - lse, p = expf(logp);
        z[j] = -g * p - gh * p * (logp + ent);
      }
      z[tgt] += g;
    }
    mrl__gemm(true, false, V, D, rows, 1.0f, block, V, m->act->xf + r0 * D, D, 1.0f,
              m->grads + m->lm_head, D);
    mrl__gemm(false, false, rows, D, V, 1.0f, block, V, m->weights + m->lm_head, D, 0.0f,
              dxf + r0 * D, D);
  }
}

/* ---- the entry points ---- */

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

mrl_status mrl__model_head_reserve(mrl_model *m, const char *fn) {
  mrl_scratch_slot slots[] = {SCRATCH_HEAD, SCRATCH_HEAD_ROWS};
  int64_t sizes[] = {MRL_HEAD_BLOCK * (int64_t)m->cfg.vocab, 2 * MRL_HEAD_BLOCK * (int64_t)m->cfg.dim};
  if (!mrl__model_reserve(m, 2, slots, sizes))
    return mrl__fail(m->engine, MRL_ERR_NOMEM, fn, "cannot allocate logits");
  return m->reference_head ? MRL_OK : mrl__pool_start(m->engine, fn);
}

mrl_status mrl_model_score(mrl_model *m, const int32_t *targets, float *logprobs,
                           float *entropy) {
  const char *fn = "mrl_model_score";
  if (!m) return MRL_ERR_NULL;
  mrl_status st = mrl__model_check_head(m, fn, targets);
  if (!st) st = mrl__model_head_reserve(m, fn);
  if (st) return st;
  int64_t n = (int64_t)m->act->batch * m->act->steps, V = m->cfg.vocab;
  float *block = m->scratch[SCRATCH_HEAD].p, *xg = m->scratch[SCRATCH_HEAD_ROWS].p;
  if (m->reference_head) {
    score_ref(m, block, targets, logprobs, entropy);
    return MRL_OK;
  }
  if (logprobs) memset(logprobs, 0, sizeof(float) * (size_t)n);
  if (entropy) memset(entropy, 0, sizeof(float) * (size_t)n);
  int64_t idx[MRL_HEAD_BLOCK], next = 0;
  head_job job = {block, V, idx, targets, NULL, NULL, logprobs, entropy};
  int rows;
  while ((rows = gather_rows(m, targets, NULL, NULL, n, &next, idx, xg)) > 0) {
    block_logits(m, block, xg, rows);
    mrl__pool_run(m->engine, rows, 12.0 * (double)rows * (double)V, score_unit, &job);
  }
  return MRL_OK;
}

void mrl__model_head_backward(mrl_model *m, float *dxf, const int32_t *targets,
                              const float *dlogprobs, const float *dentropy) {
  int64_t n = (int64_t)m->act->batch * m->act->steps, V = m->cfg.vocab, D = m->cfg.dim;
  float *block = m->scratch[SCRATCH_HEAD].p, *xg = m->scratch[SCRATCH_HEAD_ROWS].p;
  float *dxg = xg + MRL_HEAD_BLOCK * D;
  if (m->reference_head) {
    head_backward_ref(m, block, dxf, targets, dlogprobs, dentropy);
    return;
  }
  memset(dxf, 0, sizeof(float) * (size_t)(n * D));
  if (!dlogprobs && !dentropy) return;
  int64_t idx[MRL_HEAD_BLOCK], next = 0;
  head_job job = {block, V, idx, targets, dlogprobs, dentropy, NULL, NULL};
  int rows;
  while ((rows = gather_rows(m, targets, dlogprobs, dentropy, n, &next, idx, xg)) > 0) {
    block_logits(m, block, xg, rows);
    mrl__pool_run(m->engine, rows, 16.0 * (double)rows * (double)V, grad_unit, &job);
    mrl__gemm(true, false, V, D, rows, 1.0f, block, V, xg, D, 1.0f, m->grads + m->lm_head, D);
    mrl__gemm(false, false, rows, D, V, 1.0f, block, V, m->weights + m->lm_head, D, 0.0f, dxg, D);
    for (int i = 0; i < rows; i++)
      memcpy(dxf + idx[i] * D, dxg + (int64_t)i * D, sizeof(float) * (size_t)D);
  }
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
