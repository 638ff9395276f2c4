/* kv_cache.c - incremental decoding: a key/value cache for many sequences, batched appends of
 * ragged token runs (prompts, sampled tokens, observations) through the decoder blocks of
 * block.c, and sampling (temperature, top-k, top-p, min-p, greedy) with one random stream per
 * sequence, a slot per unit of work on the engine's threads. */
#include "model.h"

#include <math.h>
#include <string.h>

struct mrl_kv_cache {
  mrl_model *model;
  int slots, capacity;
  /* per layer and slot: the keys transposed in blocks of MRL_ATTN_COLS positions (as attention
   * reads them; mrl_block_seq says how), key_ld positions in all, and the values, capacity rows
   * of kv_dim */
  float *keys, *values;
  int64_t key_ld;        /* capacity, padded as mrl__attn_key_columns asks */
  int *length;           /* tokens held per slot */
  bool *has_logits;      /* the slot's logits are those after its last token */
  float *logits;         /* slots x vocab */
  struct mrl_rng *rng;   /* one stream per slot */
  mrl_block_seq *seq;    /* slots: the runs of an append, as the block sees them */
  /* per-append rows, grown to the largest append */
  int64_t rows_cap;
  float *x, *xn, *qkv, *attn, *gate_up, *hidden;
  /* sampling: each listed slot's draw, kept aside until every slot has drawn (slots entries) */
  int32_t *drawn;
  float *drawn_logp;
  struct mrl_rng *drawn_rng;
  int64_t *bad_logit;    /* index of a non-finite logit, or -1 */
  bool apart;            /* batch-invariant appends: one matrix product per row */
  /* sampling scratch (mrl__sample_one's p and cand), vocab-sized per thread */
  int sample_threads;
  float *probs;
  mrl_candidate *order;
};

static int64_t key_floats(const mrl_kv_cache *c) {
  const mrl_model *m = c->model;
  return (int64_t)m->cfg.layers * c->slots * m->kv_dim * c->key_ld;
}

static int64_t value_floats(const mrl_kv_cache *c) {
  const mrl_model *m = c->model;
  return (int64_t)m->cfg.layers * c->slots * c->capacity * m->kv_dim;
}

/* The per-append row buffers, as a set: sizes (in floats) of each for R rows. */
enum { ROW_BUFFERS = 6 };
static void row_sizes(const mrl_model *m, int64_t R, int64_t size[ROW_BUFFERS]) {
  int64_t qkv_w = m->q_dim + 2 * (int64_t)m->kv_dim;
  size[0] = R * m->cfg.dim;
  size[1] = R * m->cfg.dim;
  size[2] = R * qkv_w;
  size[3] = R * m->q_dim;
  size[4] = R * 2 * m->cfg.ffn;
  size[5] = R * m->cfg.ffn;
}

static void free_buffers(mrl_engine *e, float **p, const int64_t *size, int count) {
  for (int i = 0; i < count; i++) mrl__free(e, p[i], sizeof(float) * (size_t)size[i]);
}

/* Row buffers for R rows in p, allocated but not yet the cache's (install_rows makes them so);
 * nothing to allocate when the cache has room already. False when out of memory. */
static bool alloc_rows(mrl_kv_cache *c, int64_t R, float *p[ROW_BUFFERS]) {
  for (int i = 0; i < ROW_BUFFERS; i++) p[i] = NULL;
  if (R <= c->rows_cap) return true;
  mrl_engine *e = c->model->engine;
  int64_t size[ROW_BUFFERS];
  row_sizes(c->model, R, size);
  for (int i = 0; i < ROW_BUFFERS; i++)
    if (!(p[i] = mrl__alloc(e, sizeof(float) * (size_t)size[i]))) {
      free_buffers(e, p, size, ROW_BUFFERS);
      return false;
    }
  return true;
}

/* Frees the cache's row buffers and puts those of alloc_rows (for R rows) in their place;
 * keep = true drops the new ones instead (a later step failed). */
static void install_rows(mrl_kv_cache *c, int64_t R, float *p[ROW_BUFFERS], bool keep) {
  if (!p[0]) return;
  mrl_engine *e = c->model->engine;
  int64_t size[ROW_BUFFERS], old[ROW_BUFFERS];
  row_sizes(c->model, R, size);
  row_sizes(c->model, c->rows_cap, old);
  if (keep) {
    free_buffers(e, p, size, ROW_BUFFERS);
    return;
  }
  float **mine[ROW_BUFFERS] = {&c->x, &c->xn, &c->qkv, &c->attn, &c->gate_up, &c->hidden};
  for (int i = 0; i < ROW_BUFFERS; i++) {
    mrl__free(e, *mine[i], sizeof(float) * (size_t)old[i]);
    *mine[i] = p[i];
  }
  c->rows_cap = R;
}

/* Vocabulary-sized sampling scratch for `threads` threads; on failure the old stays. */
static bool grow_sampling(mrl_kv_cache *c, int threads) {
  if (threads <= c->sample_threads) return true;
  mrl_engine *e = c->model->engine;
  size_t V = (size_t)c->model->cfg.vocab;
  float *probs = mrl__alloc(e, sizeof(float) * V * (size_t)threads);
  mrl_candidate *order = probs ? mrl__alloc(e, sizeof(mrl_candidate) * V * (size_t)threads)
                                  : NULL;
  if (!order) {
    mrl__free(e, probs, sizeof(float) * V * (size_t)threads);
    return false;
  }
  mrl__free(e, c->probs, sizeof(float) * V * (size_t)c->sample_threads);
  mrl__free(e, c->order, sizeof(mrl_candidate) * V * (size_t)c->sample_threads);
  c->probs = probs;
  c->order = order;
  c->sample_threads = threads;
  return true;
}

void mrl_kv_cache_free(mrl_kv_cache *c) {
  if (!c) return;
  mrl_engine *e = c->model->engine;
  int64_t V = c->model->cfg.vocab;
  size_t S = (size_t)c->slots;
  int64_t size[ROW_BUFFERS];
  row_sizes(c->model, c->rows_cap, size);
  float *rows[ROW_BUFFERS] = {c->x, c->xn, c->qkv, c->attn, c->gate_up, c->hidden};
  free_buffers(e, rows, size, ROW_BUFFERS);
  mrl__free(e, c->keys, sizeof(float) * (size_t)key_floats(c));
  mrl__free(e, c->values, sizeof(float) * (size_t)value_floats(c));
  mrl__free(e, c->length, sizeof(int) * S);
  mrl__free(e, c->has_logits, sizeof(bool) * S);
  mrl__free(e, c->logits, sizeof(float) * S * (size_t)V);
  mrl__free(e, c->rng, sizeof(struct mrl_rng) * S);
  mrl__free(e, c->seq, sizeof(mrl_block_seq) * S);
  mrl__free(e, c->drawn, sizeof(int32_t) * S);
  mrl__free(e, c->drawn_logp, sizeof(float) * S);
  mrl__free(e, c->drawn_rng, sizeof(struct mrl_rng) * S);
  mrl__free(e, c->bad_logit, sizeof(int64_t) * S);
  mrl__free(e, c->probs, sizeof(float) * (size_t)V * (size_t)c->sample_threads);
  mrl__free(e, c->order, sizeof(mrl_candidate) * (size_t)V * (size_t)c->sample_threads);
  mrl__free(e, c, sizeof *c);
}

mrl_status mrl_kv_cache_new(mrl_model *m, int slots, int capacity, mrl_kv_cache **out) {
  const char *fn = "mrl_kv_cache_new";
  if (!m) return MRL_ERR_NULL;
  mrl_engine *e = m->engine;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  if (slots <= 0 || capacity <= 0 || capacity > m->cfg.ctx)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "need slots > 0 and 0 < capacity <= ctx (%d), got %d and %d", m->cfg.ctx,
                     slots, capacity);
  int64_t key_ld = mrl__attn_key_columns(capacity);
  double floats = (double)m->cfg.layers * slots * (double)(capacity + key_ld) * m->kv_dim;
  if (floats * sizeof(float) > (double)SIZE_MAX / 4)
    return mrl__fail(e, MRL_ERR_OVERFLOW, fn, "cache too large");
  mrl_kv_cache *c = mrl__alloc(e, sizeof *c);
  if (!c) return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a cache");
  memset(c, 0, sizeof *c);
  c->model = m;
  c->slots = slots;
  c->capacity = capacity;
  c->key_ld = key_ld;
  int64_t V = m->cfg.vocab;
  c->keys = mrl__alloc(e, sizeof(float) * (size_t)key_floats(c));
  c->values = mrl__alloc(e, sizeof(float) * (size_t)value_floats(c));
  c->length = mrl__alloc(e, sizeof(int) * (size_t)slots);
  c->has_logits = mrl__alloc(e, sizeof(bool) * (size_t)slots);
  c->logits = mrl__alloc(e, sizeof(float) * (size_t)(slots * V));
  c->rng = mrl__alloc(e, sizeof(struct mrl_rng) * (size_t)slots);
  c->seq = mrl__alloc(e, sizeof(mrl_block_seq) * (size_t)slots);
  c->drawn = mrl__alloc(e, sizeof(int32_t) * (size_t)slots);
  c->drawn_logp = mrl__alloc(e, sizeof(float) * (size_t)slots);
  c->drawn_rng = mrl__alloc(e, sizeof(struct mrl_rng) * (size_t)slots);
  c->bad_logit = mrl__alloc(e, sizeof(int64_t) * (size_t)slots);
  if (!c->keys || !c->values || !c->length || !c->has_logits || !c->logits || !c->rng ||
      !c->seq || !c->drawn || !c->drawn_logp || !c->drawn_rng || !c->bad_logit) {
    mrl_kv_cache_free(c);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a cache of %d x %d tokens", slots,
                     capacity);
  }
  /* attention reads whole tiles of key columns, past a slot's length too: defined values */
  memset(c->keys, 0, sizeof(float) * (size_t)key_floats(c));
  for (int s = 0; s < slots; s++) {
    c->length[s] = 0;
    c->has_logits[s] = false;
    mrl__rng_seed(&c->rng[s], (uint64_t)s);
  }
  *out = c;
  return MRL_OK;
}

static mrl_status check_slot(const mrl_kv_cache *c, const char *fn, int slot) {
  if (slot < 0 || slot >= c->slots)
    return mrl__fail(c->model->engine, MRL_ERR_RANGE, fn, "slot %d is outside 0..%d", slot,
                     c->slots - 1);
  return MRL_OK;
}

mrl_status mrl_kv_cache_reset(mrl_kv_cache *c, int slot, uint64_t seed) {
  if (!c) return MRL_ERR_NULL;
  mrl_status st = check_slot(c, "mrl_kv_cache_reset", slot);
  if (st) return st;
  c->length[slot] = 0;
  c->has_logits[slot] = false;
  mrl__rng_seed(&c->rng[slot], seed);
  return MRL_OK;
}

int mrl_kv_cache_length(const mrl_kv_cache *c, int slot) {
  if (!c || slot < 0 || slot >= c->slots) return -1;
  return c->length[slot];
}

const float *mrl_kv_cache_logits(const mrl_kv_cache *c, int slot) {
  if (!c || slot < 0 || slot >= c->slots || !c->has_logits[slot]) return NULL;
  return c->logits + (int64_t)slot * c->model->cfg.vocab;
}

mrl_status mrl_kv_cache_set_batch_invariant(mrl_kv_cache *c, int on) {
  if (!c) return MRL_ERR_NULL;
  c->apart = on != 0;
  return MRL_OK;
}

mrl_status mrl_kv_cache_truncate(mrl_kv_cache *c, int slot, int length, const float *logits) {
  const char *fn = "mrl_kv_cache_truncate";
  if (!c) return MRL_ERR_NULL;
  mrl_status st = check_slot(c, fn, slot);
  if (st) return st;
  if (!logits) return mrl__fail(c->model->engine, MRL_ERR_NULL, fn, "logits is NULL");
  if (length < 1 || length > c->length[slot])
    return mrl__fail(c->model->engine, MRL_ERR_RANGE, fn,
                     "length %d is outside 1..%d (slot %d's tokens)", length, c->length[slot],
                     slot);
  int64_t V = c->model->cfg.vocab;
  float *dst = c->logits + (int64_t)slot * V;
  if (dst != logits) memmove(dst, logits, sizeof(float) * (size_t)V);
  c->length[slot] = length;
  c->has_logits[slot] = true;
  return MRL_OK;
}

/* The transposed keys of a layer and slot: key_ld / MRL_ATTN_COLS blocks of kv_dim x
 * MRL_ATTN_COLS. */
static float *slot_keys(const mrl_kv_cache *c, int layer, int slot) {
  return c->keys + ((int64_t)layer * c->slots + slot) * c->model->kv_dim * c->key_ld;
}

/* The value row of a layer, slot and position. */
static float *slot_values(const mrl_kv_cache *c, int layer, int slot, int pos) {
  return c->values + (((int64_t)layer * c->slots + slot) * c->capacity + pos) * c->model->kv_dim;
}

mrl_status mrl_kv_cache_copy(mrl_kv_cache *c, int src, int dst, uint64_t seed) {
  const char *fn = "mrl_kv_cache_copy";
  if (!c) return MRL_ERR_NULL;
  mrl_status st = check_slot(c, fn, src);
  if (st || (st = check_slot(c, fn, dst))) return st;
  if (src == dst) return mrl__fail(c->model->engine, MRL_ERR_INVALID, fn, "src and dst are the same");
  int kv = c->model->kv_dim, len = c->length[src];
  size_t key_blocks = (size_t)(len + MRL_ATTN_COLS - 1) / MRL_ATTN_COLS;
  for (int l = 0; l < c->model->cfg.layers; l++) {
    memcpy(slot_keys(c, l, dst), slot_keys(c, l, src),
           sizeof(float) * key_blocks * (size_t)kv * MRL_ATTN_COLS);
    memcpy(slot_values(c, l, dst, 0), slot_values(c, l, src, 0),
           sizeof(float) * (size_t)kv * (size_t)len);
  }
  int64_t V = c->model->cfg.vocab;
  memcpy(c->logits + (int64_t)dst * V, c->logits + (int64_t)src * V, sizeof(float) * (size_t)V);
  c->length[dst] = c->length[src];
  c->has_logits[dst] = c->has_logits[src];
  mrl__rng_seed(&c->rng[dst], seed);
  return MRL_OK;
}

mrl_status mrl_kv_cache_append(mrl_kv_cache *c, int n, const int *slots, const int32_t *tokens,
                               const int *counts) {
  const char *fn = "mrl_kv_cache_append";
  if (!c) return MRL_ERR_NULL;
  mrl_model *m = c->model;
  mrl_engine *e = m->engine;
  if (n < 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "n is negative");
  if (n == 0) return MRL_OK;
  if (!slots || !tokens || !counts)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL",
                     !slots ? "slots" : !tokens ? "tokens" : "counts");
  const mrl_model_config *cfg = &m->cfg;
  int64_t R = 0;
  for (int i = 0; i < n; i++) {
    mrl_status st = check_slot(c, fn, slots[i]);
    if (st) return st;
    if (counts[i] <= 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "counts[%d] = %d must be positive", i, counts[i]);
    for (int j = 0; j < i; j++)
      if (slots[j] == slots[i])
        return mrl__fail(e, MRL_ERR_INVALID, fn, "slot %d is listed twice", slots[i]);
    if (counts[i] > c->capacity - c->length[slots[i]])
      return mrl__fail(e, MRL_ERR_RANGE, fn, "slot %d would hold %d tokens, capacity %d",
                       slots[i], c->length[slots[i]] + counts[i], c->capacity);
    for (int k = 0; k < counts[i]; k++)
      if (tokens[R + k] < 0 || tokens[R + k] >= cfg->vocab)
        return mrl__fail(e, MRL_ERR_RANGE, fn, "token %d is outside 0..%d", tokens[R + k],
                         cfg->vocab - 1);
    R += counts[i];
  }
  int threads = m->reference_attention ? 1 : e->threads, max_rows = 0, max_keys = 0;
  for (int i = 0; i < n; i++) {
    if (counts[i] > max_rows) max_rows = counts[i];
    if (c->length[slots[i]] + counts[i] > max_keys) max_keys = c->length[slots[i]] + counts[i];
  }
  int64_t V = cfg->vocab, work = mrl__block_work(m, max_rows, max_keys);
  /* every step that can fail, before the cache changes */
  mrl_scratch_slot scratch[2] = {SCRATCH_HEAD, SCRATCH_ATTN_WORK};
  int64_t sizes[2] = {(int64_t)n * V, threads * work};
  mrl_status st;
  float *rows[ROW_BUFFERS];
  if ((st = mrl__pool_start(e, fn))) return st;
  if (!alloc_rows(c, R, rows))
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate %lld rows", (long long)R);
  if (!mrl__model_reserve(m, 2, scratch, sizes)) {
    install_rows(c, R, rows, true);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate logits for %d runs", n);
  }
  install_rows(c, R, rows, false);

  int64_t D = cfg->dim;
  const float *W = m->weights;
  for (int i = 0, r = 0; i < n; r += counts[i], i++) {
    c->seq[i] = (mrl_block_seq){.row = r, .rows = counts[i], .len = counts[i],
                                .pos = c->length[slots[i]]};
    for (int k = 0; k < counts[i]; k++)
      memcpy(c->x + (int64_t)(r + k) * D, W + m->embed + (int64_t)tokens[r + k] * D,
             sizeof(float) * (size_t)D);
  }
  mrl_block_io io = {.rows = R, .nseq = n, .seq = c->seq, .x = c->x, .x_mid = c->x,
                     .x_out = c->x, .xn = c->xn, .qkv = c->qkv, .attn = c->attn,
                     .gate_up = c->gate_up, .hidden = c->hidden,
                     .work = m->scratch[SCRATCH_ATTN_WORK].p, .work_per_thread = work,
                     .rows_apart = c->apart, .decode_bf16 = true};
  for (int l = 0; l < cfg->layers; l++) {
    for (int i = 0; i < n; i++) {
      c->seq[i].k = slot_keys(c, l, slots[i]);
      c->seq[i].v = slot_values(c, l, slots[i], 0);
    }
    mrl__block_forward(m, l, &io);
  }
  /* logits after the last token of each run: the final norm of those rows into xn, one product
   * for all runs, then each slot's row into place */
  for (int i = 0, r = 0; i < n; i++) {
    r += counts[i];
    mrl__rmsnorm(c->xn + (int64_t)i * D, NULL, c->x + (int64_t)(r - 1) * D, W + m->final_norm, 1,
                 D, cfg->norm_eps);
  }
  float *block = m->scratch[SCRATCH_HEAD].p;
  mrl__project(m, c->apart, true, block, V, c->xn, D, m->lm_head, n, V, D, 0.0f);
  for (int i = 0; i < n; i++) {
    memcpy(c->logits + (int64_t)slots[i] * V, block + (int64_t)i * V, sizeof(float) * (size_t)V);
    c->length[slots[i]] += counts[i];
    c->has_logits[slots[i]] = true;
  }
  return MRL_OK;
}

/* ---- sampling ---- */

typedef struct {
  mrl_kv_cache *c;
  const int *slots;
  const mrl_sampling *sampling;
} sample_job;

/* One unit: the draw of the u-th listed slot, from a copy of its stream (committed later). */
static void sample_unit(void *ctx, int64_t u, int worker) {
  const sample_job *job = ctx;
  mrl_kv_cache *c = job->c;
  int64_t V = c->model->cfg.vocab;
  int slot = job->slots[u];
  c->drawn_rng[u] = c->rng[slot];
  c->bad_logit[u] = -1;
  c->drawn[u] = mrl__sample_one(c->logits + (int64_t)slot * V, V, job->sampling, NULL,
                                &c->drawn_rng[u], c->probs + (int64_t)worker * V,
                                c->order + (int64_t)worker * V, &c->drawn_logp[u],
                                &c->bad_logit[u], NULL);
}

mrl_status mrl_kv_cache_sample(mrl_kv_cache *c, int n, const int *slots,
                               const mrl_sampling *sampling, int32_t *tokens, float *logprobs) {
  const char *fn = "mrl_kv_cache_sample";
  if (!c) return MRL_ERR_NULL;
  mrl_engine *e = c->model->engine;
  if (n < 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "n is negative");
  if (n == 0) return MRL_OK;
  if (!slots || !sampling || !tokens)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL",
                     !slots ? "slots" : !sampling ? "sampling" : "tokens");
  if (!(sampling->temperature >= 0.0f) || sampling->top_k < 0 ||
      !(sampling->top_p >= 0.0f && sampling->top_p <= 1.0f) ||
      !(sampling->min_p >= 0.0f && sampling->min_p <= 1.0f))
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "need temperature >= 0, top_k >= 0, top_p and min_p in [0, 1]");
  for (int i = 0; i < n; i++) {
    mrl_status st = check_slot(c, fn, slots[i]);
    if (st) return st;
    for (int j = 0; j < i; j++)
      if (slots[j] == slots[i])
        return mrl__fail(e, MRL_ERR_INVALID, fn, "slot %d is listed twice", slots[i]);
    if (!c->has_logits[slots[i]])
      return mrl__fail(e, MRL_ERR_INVALID, fn, "slot %d has no tokens to continue from",
                       slots[i]);
  }
  mrl_status st = mrl__pool_start(e, fn);
  if (st) return st;
  if (!grow_sampling(c, e->threads))
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate sampling scratch for %d threads",
                     e->threads);
  int64_t V = c->model->cfg.vocab;
  sample_job job = {c, slots, sampling};
  mrl__pool_run(e, n, 20.0 * (double)n * (double)V, sample_unit, &job);
  /* nothing changes unless every slot could draw */
  for (int i = 0; i < n; i++)
    if (c->bad_logit[i] >= 0) {
      float z = c->logits[(int64_t)slots[i] * V + c->bad_logit[i]];
      return mrl__fail(e, MRL_ERR_INVALID, fn,
                       "slot %d: logit %lld is %s; the model's outputs are not finite (NaN or "
                       "infinite weights or activations)",
                       slots[i], (long long)c->bad_logit[i], isnan(z) ? "NaN" : "infinite");
    }
  for (int i = 0; i < n; i++) {
    c->rng[slots[i]] = c->drawn_rng[i];
    tokens[i] = c->drawn[i];
    if (logprobs) logprobs[i] = c->drawn_logp[i];
  }
  return MRL_OK;
}

mrl_status mrl_kv_cache_sample_masked(mrl_kv_cache *c, int slot, const mrl_sampling *sampling,
                                      const uint8_t *allowed, int32_t *token, float *logprob) {
  const char *fn = "mrl_kv_cache_sample_masked";
  if (!c) return MRL_ERR_NULL;
  mrl_engine *e = c->model->engine;
  if (!sampling || !allowed || !token)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL",
                     !sampling ? "sampling" : !allowed ? "allowed" : "token");
  if (!(sampling->temperature >= 0.0f) || sampling->top_k < 0 ||
      !(sampling->top_p >= 0.0f && sampling->top_p <= 1.0f) ||
      !(sampling->min_p >= 0.0f && sampling->min_p <= 1.0f))
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "need temperature >= 0, top_k >= 0, top_p and min_p in [0, 1]");
  mrl_status st = check_slot(c, fn, slot);
  if (st) return st;
  if (!c->has_logits[slot])
    return mrl__fail(e, MRL_ERR_INVALID, fn, "slot %d has no tokens to continue from", slot);
  if (!grow_sampling(c, 1))
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate sampling scratch");
  int64_t V = c->model->cfg.vocab, bad = -1;
  struct mrl_rng rng = c->rng[slot];
  float lp = 0.0f;
  int32_t pick = mrl__sample_one(c->logits + (int64_t)slot * V, V, sampling, allowed, &rng,
                                 c->probs, c->order, &lp, &bad, NULL);
  if (pick == -2) return mrl__fail(e, MRL_ERR_INVALID, fn, "slot %d: no token is allowed", slot);
  if (pick < 0) {
    float z = c->logits[(int64_t)slot * V + bad];
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "slot %d: logit %lld is %s; the model's outputs are not finite (NaN or "
                     "infinite weights or activations)",
                     slot, (long long)bad, isnan(z) ? "NaN" : "infinite");
  }
  c->rng[slot] = rng;
  *token = pick;
  if (logprob) *logprob = lp;
  return MRL_OK;
}
