/* model.c - the policy model's configuration, parameter layout (one flat buffer with named
 * views), initialisation, lifetime and parameter access. */
#include "model.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void mrl_model_config_default(mrl_model_config *cfg) {
  if (!cfg) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->vocab = 264; /* 256 bytes + the byte tokenizer's 8 special tokens */
  cfg->dim = 128;
  cfg->layers = 4;
  cfg->heads = 4;
  cfg->kv_heads = 4;
  cfg->ffn = 384;
  cfg->ctx = 512;
  cfg->rope_theta = 10000.0f;
  cfg->norm_eps = 1e-5f;
  cfg->tie_embeddings = 1;
}

mrl_status mrl__model_check_config(mrl_engine *e, const char *fn, const mrl_model_config *c,
                                   int *head_dim) {
#define POSITIVE(field)                                                                            \
  if (c->field <= 0) return mrl__fail(e, MRL_ERR_INVALID, fn, #field " must be positive, got %d", c->field)
  POSITIVE(vocab);
  POSITIVE(dim);
  POSITIVE(layers);
  POSITIVE(heads);
  POSITIVE(kv_heads);
  POSITIVE(ffn);
  POSITIVE(ctx);
#undef POSITIVE
  if (c->heads % c->kv_heads != 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "kv_heads (%d) must divide heads (%d)", c->kv_heads,
                     c->heads);
  int hd = c->head_dim;
  if (hd < 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "head_dim must be >= 0, got %d", hd);
  if (hd == 0) {
    if (c->dim % c->heads != 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn,
                       "heads (%d) must divide dim (%d) unless head_dim is given", c->heads,
                       c->dim);
    hd = c->dim / c->heads;
  }
  if (hd % 2 != 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "head_dim must be even for RoPE, got %d", hd);
  if (!(c->rope_theta > 0.0f) || !isfinite(c->rope_theta))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "rope_theta must be positive, got %g",
                     (double)c->rope_theta);
  if (!(c->norm_eps > 0.0f) || !isfinite(c->norm_eps))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "norm_eps must be positive, got %g",
                     (double)c->norm_eps);
  if (c->rope_llama3_factor < 0.0f || !isfinite(c->rope_llama3_factor))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "rope_llama3_factor must be >= 0");
  if (c->rope_llama3_factor > 0.0f &&
      (c->rope_llama3_original_ctx <= 0 ||
       !(c->rope_llama3_high_freq_factor > c->rope_llama3_low_freq_factor) ||
       !(c->rope_llama3_low_freq_factor > 0.0f)))
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "llama3 RoPE scaling needs original_ctx > 0 and high_freq_factor > "
                     "low_freq_factor > 0");
  /* kernels index rows and columns with int and whole matrices with int64 */
  int64_t widest = (int64_t)c->heads * hd;
  if (widest > INT_MAX / 4 || (int64_t)c->kv_heads * hd > INT_MAX / 4 || c->ffn > INT_MAX / 4 ||
      c->vocab > INT_MAX / 4 || c->dim > INT_MAX / 4)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "dimensions are too large");
  *head_dim = hd;
  return MRL_OK;
}

/* Appends a parameter to the table; returns its offset. */
static int64_t add_param(mrl_model *m, const char *name, int rank, int64_t d0, int64_t d1,
                         bool decay) {
  mrl_param *p = &m->params[m->nparams++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->rank = rank;
  p->shape[0] = d0;
  p->shape[1] = rank == 2 ? d1 : 1;
  p->numel = d0 * p->shape[1];
  p->offset = m->numel;
  p->decay = decay;
  m->numel += p->numel;
  return p->offset;
}

static int64_t add_layer_param(mrl_model *m, int layer, const char *suffix, int rank, int64_t d0,
                               int64_t d1, bool decay) {
  char name[MRL_PARAM_NAME_CAP];
  snprintf(name, sizeof name, "model.layers.%d.%s", layer, suffix);
  return add_param(m, name, rank, d0, d1, decay);
}

/* Builds the parameter table in Hugging Face order. */
static void layout(mrl_model *m) {
  const mrl_model_config *c = &m->cfg;
  int64_t D = c->dim, F = c->ffn, V = c->vocab, hd = m->head_dim;
  m->embed = add_param(m, "model.embed_tokens.weight", 2, V, D, true);
  for (int l = 0; l < c->layers; l++) {
    mrl_layer_params *L = &m->layer[l];
    L->attn_norm = add_layer_param(m, l, "input_layernorm.weight", 1, D, 1, false);
    L->wq = add_layer_param(m, l, "self_attn.q_proj.weight", 2, m->q_dim, D, true);
    L->wk = add_layer_param(m, l, "self_attn.k_proj.weight", 2, m->kv_dim, D, true);
    L->wv = add_layer_param(m, l, "self_attn.v_proj.weight", 2, m->kv_dim, D, true);
    L->bq = L->bk = L->bv = L->q_norm = L->k_norm = -1;
    if (c->qkv_bias) {
      L->bq = add_layer_param(m, l, "self_attn.q_proj.bias", 1, m->q_dim, 1, false);
      L->bk = add_layer_param(m, l, "self_attn.k_proj.bias", 1, m->kv_dim, 1, false);
      L->bv = add_layer_param(m, l, "self_attn.v_proj.bias", 1, m->kv_dim, 1, false);
    }
    if (c->qk_norm) {
      L->q_norm = add_layer_param(m, l, "self_attn.q_norm.weight", 1, hd, 1, false);
      L->k_norm = add_layer_param(m, l, "self_attn.k_norm.weight", 1, hd, 1, false);
    }
    L->wo = add_layer_param(m, l, "self_attn.o_proj.weight", 2, D, m->q_dim, true);
    L->mlp_norm = add_layer_param(m, l, "post_attention_layernorm.weight", 1, D, 1, false);
    L->w_gate = add_layer_param(m, l, "mlp.gate_proj.weight", 2, F, D, true);
    L->w_up = add_layer_param(m, l, "mlp.up_proj.weight", 2, F, D, true);
    L->w_down = add_layer_param(m, l, "mlp.down_proj.weight", 2, D, F, true);
  }
  m->final_norm = add_param(m, "model.norm.weight", 1, D, 1, false);
  m->lm_head = c->tie_embeddings ? m->embed : add_param(m, "lm_head.weight", 2, V, D, true);
}

/* RoPE angle tables: position p, frequency i -> cos/sin(p * inv_freq[i]), inv_freq as in the
 * Hugging Face implementations (with Llama-3.1 scaling when configured). */
static void rope_tables(mrl_model *m) {
  const mrl_model_config *c = &m->cfg;
  int half = m->head_dim / 2;
  for (int i = 0; i < half; i++) {
    double inv = 1.0 / pow((double)c->rope_theta, (double)(2 * i) / (double)m->head_dim);
    if (c->rope_llama3_factor > 0.0f) {
      double factor = c->rope_llama3_factor, lo = c->rope_llama3_low_freq_factor,
             hi = c->rope_llama3_high_freq_factor, old = c->rope_llama3_original_ctx;
      double wavelen = 2.0 * 3.14159265358979323846 / inv;
      if (wavelen > old / lo) {
        inv /= factor;
      } else if (wavelen >= old / hi) {
        double smooth = (old / wavelen - lo) / (hi - lo);
        inv = (1.0 - smooth) * inv / factor + smooth * inv;
      }
    }
    for (int p = 0; p < c->ctx; p++) {
      double angle = (double)p * (double)(float)inv;
      m->rope_cos[(int64_t)p * half + i] = (float)cos(angle);
      m->rope_sin[(int64_t)p * half + i] = (float)sin(angle);
    }
  }
}

mrl_status mrl__model_alloc(mrl_engine *e, const char *fn, const mrl_model_config *cfg,
                            mrl_model **out) {
  int hd;
  mrl_status st = mrl__model_check_config(e, fn, cfg, &hd);
  if (st) return st;
  mrl_model *m = mrl__alloc(e, sizeof *m);
  if (!m) return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a model");
  memset(m, 0, sizeof *m);
  m->engine = e;
  m->cfg = *cfg;
  m->cfg.head_dim = hd;
  m->head_dim = hd;
  m->q_dim = cfg->heads * hd;
  m->kv_dim = cfg->kv_heads * hd;
  int max_params = 3 + 14 * cfg->layers;
  m->params = mrl__alloc(e, sizeof *m->params * (size_t)max_params);
  m->layer = mrl__alloc(e, sizeof *m->layer * (size_t)cfg->layers);
  int64_t rope = (int64_t)cfg->ctx * (hd / 2);
  m->rope_cos = mrl__alloc(e, sizeof(float) * (size_t)rope);
  m->rope_sin = mrl__alloc(e, sizeof(float) * (size_t)rope);
  mrl__engine_retain(e);
  st = MRL_ERR_NOMEM;
  if (m->params && m->layer && m->rope_cos && m->rope_sin) {
    layout(m);
    /* the buffers are tensors, so parameter views handed out keep them alive */
    if ((st = mrl__tensor_alloc(e, fn, 1, &m->numel, &m->weights_t)) == MRL_OK &&
        (st = mrl__tensor_alloc(e, fn, 1, &m->numel, &m->grads_t)) == MRL_OK) {
      m->weights = m->weights_t->data;
      m->grads = m->grads_t->data;
    }
  }
  if (st) {
    mrl_model_free(m);
    return mrl__fail(e, st, fn, "cannot allocate a model of %lld parameters",
                     (long long)m->numel);
  }
  rope_tables(m);
  *out = m;
  return MRL_OK;
}

mrl_status mrl_model_new(mrl_engine *e, const mrl_model_config *cfg, uint64_t seed,
                         mrl_model **out) {
  const char *fn = "mrl_model_new";
  if (!e) return MRL_ERR_NULL;
  if (!cfg || !out) return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", cfg ? "out" : "cfg");
  mrl_model *m;
  mrl_status st = mrl__model_alloc(e, fn, cfg, &m);
  if (st) return st;
  struct mrl_rng rng;
  mrl__rng_seed(&rng, seed);
  float out_scale = 1.0f / sqrtf(2.0f * (float)cfg->layers);
  for (int i = 0; i < m->nparams; i++) {
    mrl_param *p = &m->params[i];
    float *w = m->weights + p->offset;
    bool norm = strstr(p->name, "norm") != NULL;
    bool bias = strstr(p->name, ".bias") != NULL;
    if (norm) {
      for (int64_t k = 0; k < p->numel; k++) w[k] = 1.0f;
    } else if (!bias) {
      bool residual_out = strstr(p->name, "o_proj") || strstr(p->name, "down_proj");
      float std = 0.02f * (residual_out ? out_scale : 1.0f);
      for (int64_t k = 0; k < p->numel; k++) w[k] = std * (float)mrl__rng_normal(&rng);
    }
  }
  *out = m;
  return MRL_OK;
}

mrl_status mrl_model_clone(const mrl_model *m, mrl_model **out) {
  const char *fn = "mrl_model_clone";
  if (!m) return MRL_ERR_NULL;
  if (!out) return mrl__fail(m->engine, MRL_ERR_NULL, fn, "out is NULL");
  mrl_model *c;
  mrl_status st = mrl__model_alloc(m->engine, fn, &m->cfg, &c);
  if (st) return st;
  memcpy(c->weights, m->weights, sizeof(float) * (size_t)m->numel);
  *out = c;
  return MRL_OK;
}

mrl_status mrl_model_set_decode_bf16(mrl_model *m, int on) {
  if (!m) return MRL_ERR_NULL;
  if (!on) {
    mrl__free(m->engine, m->decode_bf16, sizeof(uint16_t) * (size_t)(m->decode_bf16 ? m->numel : 0));
    m->decode_bf16 = NULL;
    return MRL_OK;
  }
  if (!m->decode_bf16 && !(m->decode_bf16 = mrl__alloc(m->engine, sizeof(uint16_t) * (size_t)m->numel)))
    return mrl__fail(m->engine, MRL_ERR_NOMEM, "mrl_model_set_decode_bf16",
                     "cannot allocate a bfloat16 copy of %lld weights", (long long)m->numel);
  mrl__model_refresh_bf16(m);
  return MRL_OK;
}

int mrl_model_decode_bf16(const mrl_model *m) { return m && m->decode_bf16 ? 1 : 0; }

mrl_status mrl_model_reset_optimizer(mrl_model *m) {
  if (!m) return MRL_ERR_NULL;
  mrl_tensor_free(m->adam_m_t);
  mrl_tensor_free(m->adam_v_t);
  m->adam_m_t = m->adam_v_t = NULL;
  m->adam_m = m->adam_v = NULL;
  m->adam_step = 0;
  return MRL_OK;
}

float *mrl__model_scratch(mrl_model *m, mrl_scratch_slot slot, int64_t floats) {
  mrl_scratch *s = &m->scratch[slot];
  if (s->cap >= floats) return s->p;
  if ((uint64_t)floats > SIZE_MAX / sizeof(float)) return NULL;
  float *p = mrl__alloc(m->engine, sizeof(float) * (size_t)floats);
  if (!p) return NULL;
  mrl__free(m->engine, s->p, sizeof(float) * (size_t)s->cap);
  s->p = p;
  s->cap = floats;
  return p;
}

bool mrl__scratch_prepare(mrl_model *m, mrl_scratch_plan *plan, int count,
                          const mrl_scratch_slot *slots, const int64_t *floats) {
  memset(plan, 0, sizeof *plan);
  if (count > SCRATCH_COUNT) return false;
  plan->count = count;
  for (int i = 0; i < count; i++) {
    plan->slot[i] = slots[i];
    plan->floats[i] = floats[i];
    if (m->scratch[slots[i]].cap >= floats[i]) continue;
    if ((uint64_t)floats[i] > SIZE_MAX / sizeof(float) ||
        !(plan->fresh[i] = mrl__alloc(m->engine, sizeof(float) * (size_t)floats[i]))) {
      mrl__scratch_finish(m, plan, false);
      return false;
    }
  }
  return true;
}

void mrl__scratch_finish(mrl_model *m, mrl_scratch_plan *plan, bool commit) {
  for (int i = 0; i < plan->count; i++) {
    if (!plan->fresh[i]) continue;
    mrl_scratch *s = &m->scratch[plan->slot[i]];
    if (commit) {
      mrl__free(m->engine, s->p, sizeof(float) * (size_t)s->cap);
      s->p = plan->fresh[i];
      s->cap = plan->floats[i];
    } else {
      mrl__free(m->engine, plan->fresh[i], sizeof(float) * (size_t)plan->floats[i]);
    }
    plan->fresh[i] = NULL;
  }
}

bool mrl__model_reserve(mrl_model *m, int count, const mrl_scratch_slot *slots,
                        const int64_t *floats) {
  mrl_scratch_plan plan;
  if (!mrl__scratch_prepare(m, &plan, count, slots, floats)) return false;
  mrl__scratch_finish(m, &plan, true);
  return true;
}

void mrl_model_free(mrl_model *m) {
  if (!m) return;
  mrl_engine *e = m->engine;
  mrl__model_free_activations(m);
  for (int i = 0; i < SCRATCH_COUNT; i++)
    mrl__free(e, m->scratch[i].p, sizeof(float) * (size_t)m->scratch[i].cap);
  mrl_tensor_free(m->weights_t);
  mrl_tensor_free(m->grads_t);
  mrl_tensor_free(m->adam_m_t);
  mrl_tensor_free(m->adam_v_t);
  mrl__free(e, m->decode_bf16, sizeof(uint16_t) * (size_t)(m->decode_bf16 ? m->numel : 0));
  int64_t rope = (int64_t)m->cfg.ctx * (m->head_dim / 2);
  mrl__free(e, m->rope_cos, sizeof(float) * (size_t)rope);
  mrl__free(e, m->rope_sin, sizeof(float) * (size_t)rope);
  mrl__free(e, m->params, sizeof *m->params * (size_t)(3 + 14 * m->cfg.layers));
  mrl__free(e, m->layer, sizeof *m->layer * (size_t)m->cfg.layers);
  mrl__free(e, m, sizeof *m);
  mrl__engine_release(e);
}

mrl_status mrl_model_config_get(const mrl_model *m, mrl_model_config *out) {
  if (!m) return MRL_ERR_NULL;
  if (!out) return mrl__fail(m->engine, MRL_ERR_NULL, "mrl_model_config_get", "out is NULL");
  *out = m->cfg;
  return MRL_OK;
}

mrl_engine *mrl_model_engine(const mrl_model *m) { return m ? m->engine : NULL; }

int mrl_model_param_count(const mrl_model *m) { return m ? m->nparams : -1; }
int64_t mrl_model_numel(const mrl_model *m) { return m ? m->numel : -1; }

int mrl__model_find_param(const mrl_model *m, const char *name) {
  for (int i = 0; i < m->nparams; i++)
    if (strcmp(m->params[i].name, name) == 0) return i;
  return -1;
}

mrl_status mrl__model_param_view(const mrl_param *p, mrl_tensor *buffer, mrl_tensor **out) {
  mrl_tensor *flat;
  mrl_status st = mrl_tensor_narrow(buffer, 0, p->offset, p->numel, &flat);
  if (st) return st;
  st = mrl_tensor_reshape(flat, p->rank, p->shape, out);
  mrl_tensor_free(flat);
  return st;
}

mrl_status mrl_model_param(mrl_model *m, int i, const char **name, mrl_tensor **weights,
                           mrl_tensor **grads) {
  const char *fn = "mrl_model_param";
  if (!m) return MRL_ERR_NULL;
  if (i < 0 || i >= m->nparams)
    return mrl__fail(m->engine, MRL_ERR_RANGE, fn, "parameter %d is outside 0..%d", i,
                     m->nparams - 1);
  const mrl_param *p = &m->params[i];
  mrl_tensor *w = NULL, *g = NULL;
  mrl_status st;
  if (weights && (st = mrl__model_param_view(p, m->weights_t, &w))) return st;
  if (grads && (st = mrl__model_param_view(p, m->grads_t, &g))) {
    mrl_tensor_free(w);
    return st;
  }
  if (name) *name = p->name;
  if (weights) *weights = w;
  if (grads) *grads = g;
  return MRL_OK;
}
