/* lua_model.c - the Lua model class (`rl.model`): create, load and save, configuration,
 * logits, per-token log-probabilities and entropies, SFT steps (with gradient accumulation),
 * generation (mrl_model_generate, with a KV cache kept between calls), and parameter views.
 * Token ids are 0-based, as in Hugging Face files; positions and sequences are 1-based Lua
 * tables. */
#include "lua_internal.h"
#include "model.h"

#include <math.h>
#include <string.h>

#define MODEL_MT "moonrl.model"

typedef struct {
  mrl_model *m;
  mrl_kv_cache *cache; /* generation cache, kept between calls and regrown as needed */
  int cache_slots, cache_capacity;
} lmodel;

static lmodel *check_lmodel(lua_State *L, int idx) {
  lmodel *b = luaL_checkudata(L, idx, MODEL_MT);
  if (!b->m) luaL_argerror(L, idx, "model is closed");
  return b;
}

static mrl_model *check_model(lua_State *L, int idx) { return check_lmodel(L, idx)->m; }

mrl_model *mrl__lua_check_model(lua_State *L, int idx, const char *name) {
  lmodel *b = luaL_testudata(L, idx, MODEL_MT);
  if (!b || !b->m)
    luaL_error(L, "%s: %s expected, got %s", name, b ? "an open model" : "an rl.model",
               b ? "a closed one" : luaL_typename(L, idx));
  return b->m;
}

static int raise_model(lua_State *L, mrl_model *m, mrl_status st, int arg) {
  return mrl__lua_raise(L, m->engine, st, arg);
}

/* ---- tables of options ---- */

static int opt_bool_field(lua_State *L, int idx, const char *key, int dflt) {
  int type = lua_getfield(L, idx, key);
  int v = dflt;
  if (type != LUA_TNIL) {
    if (type != LUA_TBOOLEAN)
      luaL_argerror(L, idx, lua_pushfstring(L, "%s: boolean expected, got %s", key,
                                            luaL_typename(L, -1)));
    v = lua_toboolean(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

static int positive_int(lua_State *L, int idx, const char *key, lua_Integer v) {
  if (v <= 0 || v > 0x7fffffff)
    return luaL_argerror(L, idx, lua_pushfstring(L, "%s: positive integer expected, got %I", key,
                                                 v));
  return (int)v;
}

/* ---- token batches ---- */

/* A batch read from the table of token-id tables at stack index idx (ragged allowed):
 * right-padded row-major ids, lengths, and the widest length. Errors name argument `arg`.
 * Memory in userdata left on the stack (two values). */
typedef struct {
  int batch, steps;
  int32_t *tokens, *lengths;
} token_batch;

static token_batch read_batch(lua_State *L, int idx, int arg, const char *name, int vocab,
                              int ctx) {
  token_batch tb = {0, 0, NULL, NULL};
  if (!lua_istable(L, idx))
    luaL_argerror(L, arg, lua_pushfstring(L, "%s: table of token-id tables expected, got %s",
                                          name, luaL_typename(L, idx)));
  lua_Integer n = luaL_len(L, idx);
  if (n < 1 || n > 1 << 20)
    luaL_argerror(L, arg, lua_pushfstring(L, "%s: 1 or more sequences expected", name));
  tb.batch = (int)n;
  for (int b = 0; b < tb.batch; b++) {
    if (lua_geti(L, idx, b + 1) != LUA_TTABLE)
      luaL_argerror(L, arg, lua_pushfstring(L, "%s[%d]: table of token ids expected, got %s",
                                            name, b + 1, luaL_typename(L, -1)));
    lua_Integer len = luaL_len(L, -1);
    lua_pop(L, 1);
    if (len < 1 || len > ctx)
      luaL_argerror(L, arg, lua_pushfstring(L, "%s[%d]: length %I is outside 1..%d (the "
                                            "model's context)", name, b + 1, len, ctx));
    if (len > tb.steps) tb.steps = (int)len;
  }
  tb.tokens = lua_newuserdatauv(L, sizeof(int32_t) * (size_t)tb.batch * (size_t)tb.steps, 0);
  tb.lengths = lua_newuserdatauv(L, sizeof(int32_t) * (size_t)tb.batch, 0);
  for (int b = 0; b < tb.batch; b++) {
    lua_geti(L, idx, b + 1);
    int len = (int)luaL_len(L, -1);
    tb.lengths[b] = len;
    for (int t = 0; t < tb.steps; t++) {
      int32_t id = 0;
      if (t < len) {
        lua_geti(L, -1, t + 1);
        int ok;
        lua_Integer v = lua_tointegerx(L, -1, &ok);
        if (!ok || lua_type(L, -1) != LUA_TNUMBER || v < 0 || v >= vocab)
          luaL_argerror(L, arg, lua_pushfstring(L, "%s[%d][%d]: token id in 0..%d expected, "
                                                "got %s", name, b + 1, t + 1, vocab - 1,
                                                luaL_tolstring(L, -1, NULL)));
        lua_pop(L, 1);
        id = (int32_t)v;
      }
      tb.tokens[(int64_t)b * tb.steps + t] = id;
    }
    lua_pop(L, 1);
  }
  return tb;
}

/* Next-token targets of a batch (-1 past each sequence), with an optional mask table of the
 * same shape as the tokens: mask[b][t] true/1 keeps the prediction of token t. Returns the
 * number of scored positions. Memory in a userdata left on the stack. */
static int64_t read_targets(lua_State *L, int mask_idx, int arg, const token_batch *tb,
                            int32_t **out) {
  int64_t n = (int64_t)tb->batch * tb->steps, scored = 0;
  int32_t *targets = lua_newuserdatauv(L, sizeof(int32_t) * (size_t)n, 0);
  bool masked = mask_idx > 0 && !lua_isnil(L, mask_idx);
  if (masked && !lua_istable(L, mask_idx))
    luaL_argerror(L, arg, "mask: table of 0/1 tables expected");
  for (int b = 0; b < tb->batch; b++) {
    if (masked) lua_geti(L, mask_idx, b + 1);
    for (int t = 0; t < tb->steps; t++) {
      int64_t i = (int64_t)b * tb->steps + t;
      bool keep = t + 1 < tb->lengths[b];
      if (keep && masked) {
        if (!lua_istable(L, -1))
          luaL_argerror(L, arg, lua_pushfstring(L, "mask[%d]: table expected", b + 1));
        lua_geti(L, -1, t + 2); /* the mask of the predicted token */
        keep = lua_isboolean(L, -1) ? lua_toboolean(L, -1) : lua_tonumber(L, -1) != 0;
        lua_pop(L, 1);
      }
      targets[i] = keep ? tb->tokens[i + 1] : -1;
      scored += keep;
    }
    if (masked) lua_pop(L, 1);
  }
  *out = targets;
  return scored;
}

/* ---- construction ---- */

static lmodel *push_model(lua_State *L, mrl_model *m) {
  lmodel *b = lua_newuserdatauv(L, sizeof *b, 0);
  memset(b, 0, sizeof *b);
  b->m = m;
  luaL_setmetatable(L, MODEL_MT);
  return b;
}

/* rl.model.new{arch = "llama"|"qwen2"|"qwen3", vocab=, dim=, layers=, heads=, kv_heads=, ffn=,
 * ctx=, head_dim=, rope_theta=, norm_eps=, tie=, seed=} */
static int l_new(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  mrl_model_config c;
  mrl_model_config_default(&c);
  lua_getfield(L, 1, "arch");
  const char *arch = luaL_optstring(L, -1, "llama");
  if (!strcmp(arch, "qwen2")) {
    c.qkv_bias = 1;
  } else if (!strcmp(arch, "qwen3")) {
    c.qk_norm = 1;
  } else if (strcmp(arch, "llama") != 0) {
    return luaL_argerror(L, 1, lua_pushfstring(L, "arch: \"llama\", \"qwen2\" or \"qwen3\" "
                                               "expected, got \"%s\"", arch));
  }
  lua_pop(L, 1);
  c.vocab = positive_int(L, 1, "vocab", mrl__lua_opt_integer(L, 1, "vocab", c.vocab));
  c.dim = positive_int(L, 1, "dim", mrl__lua_opt_integer(L, 1, "dim", c.dim));
  c.layers = positive_int(L, 1, "layers", mrl__lua_opt_integer(L, 1, "layers", c.layers));
  c.heads = positive_int(L, 1, "heads", mrl__lua_opt_integer(L, 1, "heads", c.heads));
  c.kv_heads = positive_int(L, 1, "kv_heads", mrl__lua_opt_integer(L, 1, "kv_heads", c.heads));
  c.ffn = positive_int(L, 1, "ffn", mrl__lua_opt_integer(L, 1, "ffn", 3 * c.dim));
  c.ctx = positive_int(L, 1, "ctx", mrl__lua_opt_integer(L, 1, "ctx", c.ctx));
  lua_Integer hd = mrl__lua_opt_integer(L, 1, "head_dim", 0);
  if (hd < 0 || hd > 1 << 16) return luaL_argerror(L, 1, "head_dim: must be >= 0");
  c.head_dim = (int)hd;
  c.rope_theta = (float)mrl__lua_opt_number(L, 1, "rope_theta", c.rope_theta);
  c.norm_eps = (float)mrl__lua_opt_number(L, 1, "norm_eps", c.norm_eps);
  c.tie_embeddings = opt_bool_field(L, 1, "tie", !strcmp(arch, "llama"));
  c.qkv_bias = opt_bool_field(L, 1, "qkv_bias", c.qkv_bias);
  c.qk_norm = opt_bool_field(L, 1, "qk_norm", c.qk_norm);
  lua_Integer seed = mrl__lua_opt_integer(L, 1, "seed", 0);
  mrl_engine *e = mrl__lua_engine(L);
  lmodel *b = push_model(L, NULL);
  mrl_status st = mrl_model_new(e, &c, (uint64_t)seed, &b->m);
  if (st) return mrl__lua_raise(L, e, st, 1);
  return 1;
}

/* rl.model.load(dir) -> model, or nil and a message */
static int l_load(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  mrl_engine *e = mrl__lua_engine(L);
  lmodel *b = push_model(L, NULL);
  mrl_status st = mrl_model_load(e, dir, &b->m);
  if (st) {
    luaL_pushfail(L);
    const char *msg = mrl_engine_last_error(e);
    lua_pushstring(L, *msg ? msg : mrl_strerror(st));
    mrl_engine_clear_error(e);
    return 2;
  }
  return 1;
}

/* m:save(dir [, {dtype = "f32"|"bf16"}]) -> true, or nil and a message */
static int m_save(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  const char *dir = luaL_checkstring(L, 2);
  mrl_dtype dtype = MRL_DTYPE_F32;
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_getfield(L, 3, "dtype");
    const char *d = luaL_optstring(L, -1, "f32");
    if (!strcmp(d, "bf16"))
      dtype = MRL_DTYPE_BF16;
    else if (strcmp(d, "f32") != 0)
      return luaL_argerror(L, 3, "dtype: \"f32\" or \"bf16\" expected");
    lua_pop(L, 1);
  }
  mrl_status st = mrl_model_save(m, dir, dtype);
  if (st) {
    luaL_pushfail(L);
    lua_pushstring(L, mrl_engine_last_error(m->engine));
    mrl_engine_clear_error(m->engine);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int m_config(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  const mrl_model_config *c = &m->cfg;
  lua_createtable(L, 0, 16);
  const char *arch = c->qk_norm ? "qwen3" : c->qkv_bias ? "qwen2" : "llama";
  lua_pushstring(L, arch);
  lua_setfield(L, -2, "arch");
#define INT_FIELD(name, value) (lua_pushinteger(L, value), lua_setfield(L, -2, name))
  INT_FIELD("vocab", c->vocab);
  INT_FIELD("dim", c->dim);
  INT_FIELD("layers", c->layers);
  INT_FIELD("heads", c->heads);
  INT_FIELD("kv_heads", c->kv_heads);
  INT_FIELD("head_dim", c->head_dim);
  INT_FIELD("ffn", c->ffn);
  INT_FIELD("ctx", c->ctx);
  INT_FIELD("params", m->numel);
#undef INT_FIELD
  lua_pushnumber(L, c->rope_theta);
  lua_setfield(L, -2, "rope_theta");
  lua_pushnumber(L, c->norm_eps);
  lua_setfield(L, -2, "norm_eps");
  lua_pushboolean(L, c->tie_embeddings);
  lua_setfield(L, -2, "tie");
  lua_pushboolean(L, c->qkv_bias);
  lua_setfield(L, -2, "qkv_bias");
  lua_pushboolean(L, c->qk_norm);
  lua_setfield(L, -2, "qk_norm");
  return 1;
}

/* ---- scoring ---- */

static void forward_batch(lua_State *L, mrl_model *m, const token_batch *tb) {
  mrl_status st = mrl_model_forward(m, tb->tokens, tb->lengths, tb->batch, tb->steps);
  if (st) raise_model(L, m, st, 2);
}

/* m:logits(tokens) -> tensor (batch, steps, vocab); sequences must have equal lengths */
static int m_logits(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  token_batch tb = read_batch(L, 2, 2, "tokens", m->cfg.vocab, m->cfg.ctx);
  for (int b = 0; b < tb.batch; b++)
    if (tb.lengths[b] != tb.steps)
      return luaL_argerror(L, 2, "tokens: sequences of equal length expected (use logprobs for "
                                 "ragged batches)");
  forward_batch(L, m, &tb);
  mrl_tensor *t = NULL;
  mrl_status st = mrl_model_logits(m, &t);
  if (st) return raise_model(L, m, st, 0);
  mrl__lua_push_tensor(L, t);
  int64_t kb = mrl_tensor_numel(t) * 4 / 1024;
  if (kb > 0) lua_gc(L, LUA_GCSTEP, kb > 0x7fffffff ? 0x7fffffff : (int)kb);
  return 1;
}

/* Pushes a table of per-sequence tables of values[b][t] for t = 1..lengths[b]-1. */
static void push_per_token(lua_State *L, const token_batch *tb, const float *values) {
  lua_createtable(L, tb->batch, 0);
  for (int b = 0; b < tb->batch; b++) {
    int n = tb->lengths[b] - 1;
    lua_createtable(L, n, 0);
    for (int t = 0; t < n; t++) {
      lua_pushnumber(L, values[(int64_t)b * tb->steps + t]);
      lua_rawseti(L, -2, t + 1);
    }
    lua_rawseti(L, -2, b + 1);
  }
}

/* m:logprobs{tokens = {{...}, ...} [, entropy = true]} -> logprobs [, entropies]: for each
 * sequence, the log-probability of tokens 2..n given what precedes them (n - 1 values). */
static int m_logprobs(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  int want_entropy = opt_bool_field(L, 2, "entropy", 0);
  lua_getfield(L, 2, "tokens");
  int tok_idx = lua_gettop(L);
  token_batch tb = read_batch(L, tok_idx, 2, "tokens", m->cfg.vocab, m->cfg.ctx);
  int32_t *targets;
  read_targets(L, 0, 2, &tb, &targets);
  int64_t n = (int64_t)tb.batch * tb.steps;
  float *logp = lua_newuserdatauv(L, sizeof(float) * (size_t)n, 0);
  float *ent = want_entropy ? lua_newuserdatauv(L, sizeof(float) * (size_t)n, 0) : NULL;
  forward_batch(L, m, &tb);
  mrl_status st = mrl_model_score(m, targets, logp, ent);
  if (st) return raise_model(L, m, st, 2);
  push_per_token(L, &tb, logp);
  if (!ent) return 1;
  push_per_token(L, &tb, ent);
  return 2;
}

/* ---- training ---- */

/* m:accumulate{tokens=, mask= [, scale = 1]} -> mean loss: adds the gradient of scale * the
 * mean masked next-token cross-entropy over the batch. */
static int accumulate(lua_State *L, mrl_model *m, int opts, double *loss, int64_t *count) {
  double scale = mrl__lua_opt_number(L, opts, "scale", 1.0);
  lua_getfield(L, opts, "tokens");
  int tok_idx = lua_gettop(L);
  token_batch tb = read_batch(L, tok_idx, opts, "tokens", m->cfg.vocab, m->cfg.ctx);
  lua_getfield(L, opts, "mask");
  int mask_idx = lua_gettop(L);
  int32_t *targets;
  int64_t scored = read_targets(L, mask_idx, opts, &tb, &targets);
  int64_t n = (int64_t)tb.batch * tb.steps;
  float *logp = lua_newuserdatauv(L, sizeof(float) * (size_t)n, 0);
  float *dlogp = lua_newuserdatauv(L, sizeof(float) * (size_t)n, 0);
  forward_batch(L, m, &tb);
  mrl_status st = mrl_model_score(m, targets, logp, NULL);
  if (st) return raise_model(L, m, st, opts);
  double total = 0.0;
  for (int64_t i = 0; i < n; i++) {
    total -= targets[i] >= 0 ? logp[i] : 0.0;
    dlogp[i] = targets[i] >= 0 && scored ? (float)(-scale / (double)scored) : 0.0f;
  }
  if (scored && (st = mrl_model_backward(m, targets, dlogp, NULL))) return raise_model(L, m, st, 0);
  *loss = scored ? total / (double)scored : 0.0;
  *count = scored;
  return 0;
}

static int m_accumulate(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  double loss;
  int64_t count;
  accumulate(L, m, 2, &loss, &count);
  lua_pushnumber(L, loss);
  lua_pushinteger(L, count);
  return 2;
}

/* m:step{lr=, weight_decay = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, clip = 1.0} -> grad norm:
 * clips, takes an AdamW step and zeroes the gradients. */
static double optimizer_step(lua_State *L, mrl_model *m, int opts) {
  mrl_adamw opt;
  opt.lr = (float)mrl__lua_opt_number(L, opts, "lr", 1e-3);
  opt.weight_decay = (float)mrl__lua_opt_number(L, opts, "weight_decay", 0.0);
  opt.beta1 = (float)mrl__lua_opt_number(L, opts, "beta1", 0.9);
  opt.beta2 = (float)mrl__lua_opt_number(L, opts, "beta2", 0.95);
  opt.eps = (float)mrl__lua_opt_number(L, opts, "eps", 1e-8);
  double clip = mrl__lua_opt_number(L, opts, "clip", 1.0), norm = 0.0;
  mrl_status st = mrl_model_clip_grad(m, clip, &norm);
  if (st == MRL_OK) st = mrl_model_adamw_step(m, &opt);
  if (st) raise_model(L, m, st, opts);
  mrl_model_zero_grad(m);
  return norm;
}

static int m_step(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_pushnumber(L, optimizer_step(L, m, 2));
  return 1;
}

/* m:sft_step{tokens=, mask=, lr=, ...} -> {loss=, grad_norm=, tokens=}: one accumulate and one
 * step on a fresh gradient. */
static int m_sft_step(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  mrl_model_zero_grad(m);
  double loss;
  int64_t count;
  accumulate(L, m, 2, &loss, &count);
  double norm = optimizer_step(L, m, 2);
  lua_createtable(L, 0, 3);
  lua_pushnumber(L, loss);
  lua_setfield(L, -2, "loss");
  lua_pushnumber(L, norm);
  lua_setfield(L, -2, "grad_norm");
  lua_pushinteger(L, count);
  lua_setfield(L, -2, "tokens");
  return 1;
}

/* ---- scoring and gradients over a flat trajectory batch ---- */

/* A minibatch of episodes from flat batch tensors (tokens, mask: float, concatenated) with the
 * offsets table ({0, end1, end2, ...}) and a list of 1-based episode numbers: the padded token
 * rows, lengths, targets (the next token where the mask says it was sampled, else -1) and, for
 * each padded position, its flat index of the predicted token (-1 for none). Arrays live in
 * userdata left on the stack. */
typedef struct {
  token_batch tb;
  int32_t *targets;
  int64_t *flat;      /* batch x steps */
  int64_t total;      /* length of the flat tensors */
} flat_batch;

static flat_batch read_flat_batch(lua_State *L, int opts, const mrl_model *m) {
  flat_batch fb;
  memset(&fb, 0, sizeof fb);
  lua_getfield(L, opts, "tokens");
  mrl_tensor *tokens = mrl__lua_check_tensor(L, -1, "tokens");
  lua_getfield(L, opts, "mask");
  mrl_tensor *mask = mrl__lua_check_tensor(L, -1, "mask");
  if (lua_getfield(L, opts, "offsets") != LUA_TTABLE) luaL_argerror(L, opts, "offsets: a list expected");
  int offsets = lua_gettop(L);
  if (lua_getfield(L, opts, "episodes") != LUA_TTABLE) luaL_argerror(L, opts, "episodes: a list expected");
  int eps = lua_gettop(L);
  if (mrl_tensor_rank(tokens) != 1 || !mrl_tensor_is_contiguous(tokens) ||
      mrl_tensor_rank(mask) != 1 || mrl_tensor_numel(mask) != mrl_tensor_numel(tokens) ||
      !mrl_tensor_is_contiguous(mask))
    luaL_argerror(L, opts, "tokens, mask: contiguous 1-D tensors of one length expected");
  fb.total = mrl_tensor_numel(tokens);
  int n_offsets = (int)luaL_len(L, offsets);
  int n = (int)luaL_len(L, eps);
  if (n < 1) luaL_argerror(L, opts, "episodes: at least one expected");
  const float *tok = mrl_tensor_data(tokens), *msk = mrl_tensor_data(mask);
  int64_t *starts = lua_newuserdatauv(L, sizeof(int64_t) * (size_t)n * 2, 0);
  fb.tb.batch = n;
  for (int i = 0; i < n; i++) {
    lua_geti(L, eps, i + 1);
    int ok;
    lua_Integer e = lua_tointegerx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok || e < 1 || e >= n_offsets)
      luaL_argerror(L, opts, lua_pushfstring(L, "episodes[%d]: an episode number in 1..%d "
                                             "expected", i + 1, n_offsets - 1));
    lua_geti(L, offsets, e);
    lua_geti(L, offsets, e + 1);
    int64_t a = lua_tointeger(L, -2), b = lua_tointeger(L, -1);
    lua_pop(L, 2);
    if (a < 0 || b <= a || b > fb.total || b - a > m->cfg.ctx)
      luaL_argerror(L, opts, lua_pushfstring(L, "offsets of episode %d do not fit the tensors "
                                             "or the model's context", (int)e));
    starts[2 * i] = a;
    starts[2 * i + 1] = b;
    if (b - a > fb.tb.steps) fb.tb.steps = (int)(b - a);
  }
  int64_t cells = (int64_t)n * fb.tb.steps;
  fb.tb.tokens = lua_newuserdatauv(L, sizeof(int32_t) * (size_t)cells, 0);
  fb.tb.lengths = lua_newuserdatauv(L, sizeof(int32_t) * (size_t)n, 0);
  fb.targets = lua_newuserdatauv(L, sizeof(int32_t) * (size_t)cells, 0);
  fb.flat = lua_newuserdatauv(L, sizeof(int64_t) * (size_t)cells, 0);
  for (int i = 0; i < n; i++) {
    int64_t a = starts[2 * i], len = starts[2 * i + 1] - a;
    fb.tb.lengths[i] = (int32_t)len;
    for (int t = 0; t < fb.tb.steps; t++) {
      int64_t c = (int64_t)i * fb.tb.steps + t;
      float id = t < len ? tok[a + t] : 0.0f;
      if (!(id >= 0.0f && id < (float)m->cfg.vocab) || id != (float)(int32_t)id)
        luaL_argerror(L, opts, "tokens: ids of the model's vocabulary expected");
      fb.tb.tokens[c] = (int32_t)id;
      bool scored = t + 1 < len && msk[a + t + 1] != 0.0f;
      fb.targets[c] = scored ? (int32_t)tok[a + t + 1] : -1;
      fb.flat[c] = scored ? a + t + 1 : -1;
    }
  }
  return fb;
}

/* The value head of opts.value = {w = tensor of dim floats [, b = number]}, or NULL when the
 * options have none. */
static const float *value_head(lua_State *L, int opts, const mrl_model *m, double *bias) {
  if (lua_getfield(L, opts, "value") == LUA_TNIL) {
    lua_pop(L, 1);
    return NULL;
  }
  if (!lua_istable(L, -1)) luaL_argerror(L, opts, "value: a table {w =, b =} expected");
  int vi = lua_gettop(L);
  lua_getfield(L, vi, "w");
  mrl_tensor *w = mrl__lua_check_tensor(L, -1, "value.w");
  if (mrl_tensor_rank(w) != 1 || !mrl_tensor_is_contiguous(w) || mrl_tensor_numel(w) != m->cfg.dim)
    luaL_argerror(L, opts, lua_pushfstring(L, "value.w: a contiguous 1-D tensor of %d (the "
                                           "model's dim) expected", m->cfg.dim));
  lua_getfield(L, vi, "b");
  if (!lua_isnil(L, -1) && !lua_isnumber(L, -1)) luaL_argerror(L, opts, "value.b: a number expected");
  *bias = lua_isnil(L, -1) ? 0.0 : lua_tonumber(L, -1);
  lua_pop(L, 3); /* the options table keeps w alive */
  return mrl_tensor_data(w);
}

/* m:forward_batch{tokens =, mask =, offsets =, episodes = {...} [, value = {w =, b =}]}
 * -> logprobs, entropy [, values]: flat tensors as long as tokens holding, at each sampled
 * position of the listed episodes, the current policy's log-probability of that token and the
 * entropy of its distribution (0 elsewhere); with a value head, values = w . h + b where h is
 * the final hidden state the token was predicted from (the critic's V of the state before the
 * token). Keeps what m:backward_batch needs. */
static int m_forward_batch(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  flat_batch fb = read_flat_batch(L, 2, m);
  int64_t cells = (int64_t)fb.tb.batch * fb.tb.steps;
  float *lp = lua_newuserdatauv(L, sizeof(float) * (size_t)cells, 0);
  float *ent = lua_newuserdatauv(L, sizeof(float) * (size_t)cells, 0);
  double bias = 0.0;
  const float *w = value_head(L, 2, m, &bias);
  forward_batch(L, m, &fb.tb);
  mrl_status st = mrl_model_score(m, fb.targets, lp, ent);
  if (st) return raise_model(L, m, st, 2);
  int outs = w ? 3 : 2;
  mrl_tensor *out[3] = {NULL, NULL, NULL};
  for (int k = 0; k < outs; k++) {
    if ((st = mrl_tensor_new(m->engine, 1, &fb.total, &out[k]))) return raise_model(L, m, st, 0);
    mrl__lua_push_tensor(L, out[k]);
  }
  float *dl = mrl_tensor_data(out[0]), *de = mrl_tensor_data(out[1]);
  float *dv = w ? mrl_tensor_data(out[2]) : NULL;
  const float *h = mrl_model_hidden(m);
  int64_t D = m->cfg.dim;
  for (int64_t c = 0; c < cells; c++)
    if (fb.flat[c] >= 0) {
      dl[fb.flat[c]] = lp[c];
      de[fb.flat[c]] = ent[c];
      if (dv) {
        double v = bias;
        for (int64_t j = 0; j < D; j++) v += (double)w[j] * h[c * D + j];
        dv[fb.flat[c]] = (float)v;
      }
    }
  return outs;
}

/* m:backward_batch{tokens =, mask =, offsets =, episodes =, dlogprobs =, dentropy =
 * [, value = {w =}, dvalues =]} adds to the gradients the effect of a loss with these
 * derivatives (flat tensors like forward_batch's outputs; dentropy optional). With a value head
 * and dvalues it also backpropagates the values into the model and returns dw (a new tensor of
 * dim floats) and db, the value head's own gradients. Call it right after m:forward_batch on
 * the same episodes. */
static int m_backward_batch(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  flat_batch fb = read_flat_batch(L, 2, m);
  lua_getfield(L, 2, "dlogprobs");
  mrl_tensor *dl = mrl__lua_check_tensor(L, -1, "dlogprobs");
  mrl_tensor *de = NULL;
  if (lua_getfield(L, 2, "dentropy") != LUA_TNIL) de = mrl__lua_check_tensor(L, -1, "dentropy");
  if (mrl_tensor_numel(dl) != fb.total || !mrl_tensor_is_contiguous(dl) ||
      (de && (mrl_tensor_numel(de) != fb.total || !mrl_tensor_is_contiguous(de))))
    return luaL_argerror(L, 2, "dlogprobs, dentropy: contiguous tensors as long as tokens expected");
  double bias;
  const float *w = value_head(L, 2, m, &bias);
  mrl_tensor *dvt = NULL;
  if (lua_getfield(L, 2, "dvalues") != LUA_TNIL) dvt = mrl__lua_check_tensor(L, -1, "dvalues");
  if ((w == NULL) != (dvt == NULL)) return luaL_argerror(L, 2, "value and dvalues: give both or neither");
  if (dvt && (mrl_tensor_numel(dvt) != fb.total || !mrl_tensor_is_contiguous(dvt)))
    return luaL_argerror(L, 2, "dvalues: a contiguous tensor as long as tokens expected");
  int64_t cells = (int64_t)fb.tb.batch * fb.tb.steps;
  float *g = lua_newuserdatauv(L, sizeof(float) * (size_t)cells, 0);
  float *gh = de ? lua_newuserdatauv(L, sizeof(float) * (size_t)cells, 0) : NULL;
  const float *pdl = mrl_tensor_data(dl), *pde = de ? mrl_tensor_data(de) : NULL;
  for (int64_t c = 0; c < cells; c++) {
    g[c] = fb.flat[c] >= 0 ? pdl[fb.flat[c]] : 0.0f;
    if (gh) gh[c] = fb.flat[c] >= 0 ? pde[fb.flat[c]] : 0.0f;
  }
  /* the activations must be those of this minibatch */
  const mrl_activations *a = m->act;
  bool same = a && a->valid && a->batch == fb.tb.batch && a->steps == fb.tb.steps &&
              memcmp(a->tokens, fb.tb.tokens, sizeof(int32_t) * (size_t)cells) == 0 &&
              memcmp(a->lengths, fb.tb.lengths, sizeof(int32_t) * (size_t)fb.tb.batch) == 0;
  if (!same)
    return luaL_error(L, "backward_batch: call forward_batch on the same episodes first (and "
                         "not after an optimizer step)");
  if (!w) {
    mrl_status st = mrl_model_backward(m, fb.targets, g, gh);
    if (st) return raise_model(L, m, st, 2);
    return 0;
  }
  /* the value head: dh = dv w at each predicting cell; dw = sum dv h, db = sum dv */
  int64_t D = m->cfg.dim, size = D;
  const float *h = mrl_model_hidden(m), *pdv = mrl_tensor_data(dvt);
  float *dh = lua_newuserdatauv(L, sizeof(float) * (size_t)(cells * D), 0);
  mrl_tensor *dwt = NULL;
  mrl_status st = mrl_tensor_new(m->engine, 1, &size, &dwt);
  if (st) return raise_model(L, m, st, 0);
  mrl__lua_push_tensor(L, dwt);
  float *dw = mrl_tensor_data(dwt);
  double *acc = lua_newuserdatauv(L, sizeof(double) * (size_t)D, 0);
  memset(acc, 0, sizeof(double) * (size_t)D);
  double db = 0.0;
  for (int64_t c = 0; c < cells; c++) {
    float d = fb.flat[c] >= 0 ? pdv[fb.flat[c]] : 0.0f;
    for (int64_t j = 0; j < D; j++) dh[c * D + j] = d * w[j];
    if (d != 0.0f) {
      for (int64_t j = 0; j < D; j++) acc[j] += (double)d * h[c * D + j];
      db += d;
    }
  }
  for (int64_t j = 0; j < D; j++) dw[j] = (float)acc[j];
  lua_pop(L, 1); /* acc */
  if ((st = mrl_model_backward_hidden(m, fb.targets, g, gh, dh))) return raise_model(L, m, st, 2);
  lua_pushnumber(L, db);
  return 2;
}

/* ---- generation ---- */

static mrl_kv_cache *generation_cache(lua_State *L, lmodel *b, int slots, int capacity) {
  if (!b->cache || b->cache_slots < slots || b->cache_capacity < capacity) {
    mrl_kv_cache_free(b->cache);
    b->cache = NULL;
    mrl_status st = mrl_kv_cache_new(b->m, slots, capacity, &b->cache);
    if (st) raise_model(L, b->m, st, 2);
    b->cache_slots = slots;
    b->cache_capacity = capacity;
  }
  return b->cache;
}

/* Stop strings of the options table at opts, kept alive by the table. */
enum { STOP_IDS_MAX = 64, STOP_STRINGS_MAX = 16, STOP_STRING_MAX_LEN = 256 };
typedef struct {
  int n;
  const char *text[STOP_STRINGS_MAX];
  size_t len[STOP_STRINGS_MAX];
  mrl_tokenizer *tok;
} stop_strings;

static void read_stop_strings(lua_State *L, int opts, stop_strings *ss) {
  memset(ss, 0, sizeof *ss);
  int type = lua_getfield(L, opts, "stop_strings");
  if (type == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  if (type != LUA_TTABLE) luaL_argerror(L, opts, "stop_strings: table of strings expected");
  lua_Integer n = luaL_len(L, -1);
  if (n > STOP_STRINGS_MAX) luaL_argerror(L, opts, "stop_strings: at most 16 strings");
  for (int i = 0; i < n; i++) {
    lua_geti(L, -1, i + 1);
    size_t len;
    const char *text = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
    if (!text || len == 0 || len > STOP_STRING_MAX_LEN)
      luaL_argerror(L, opts, "stop_strings: non-empty strings of at most 256 bytes expected");
    ss->text[i] = text; /* kept alive by the options table */
    ss->len[i] = len;
    lua_pop(L, 1);
  }
  ss->n = (int)n;
  lua_pop(L, 1);
  if (ss->n == 0) return;
  lua_getfield(L, opts, "tokenizer");
  ss->tok = mrl__lua_test_tokenizer(L, -1);
  lua_pop(L, 1);
  if (!ss->tok) luaL_argerror(L, opts, "tokenizer: stop_strings need the rl.tokenizer to decode with");
}

/* m:generate{prompts = {{ids}, ...}, max_new_tokens = 64, temperature = 1, top_k = 0,
 * top_p = 1, min_p = 0, seed = 0, stop = {ids}, stop_strings = {...}, tokenizer = tok} ->
 * {tokens = {{...}}, logprobs = {{...}}, stop = {"stop"|"length", ...}} (mrl_model_generate).
 * Sequence i samples with seed + i - 1, wrapping around at the integer limits (math.maxinteger
 * + 1 is math.mininteger). A sequence stops after the token that completes a stop id or a stop
 * string (the token is kept). */
static int m_generate(lua_State *L) {
  static const char *const fields[] = {"prompts", "max_new_tokens", "temperature", "top_k",
                                       "top_p",   "min_p",          "seed",        "stop",
                                       "stop_strings", "tokenizer", NULL};
  lmodel *lm = check_lmodel(L, 1);
  mrl_model *m = lm->m;
  luaL_checktype(L, 2, LUA_TTABLE);
  mrl__lua_check_fields(L, 2, fields);
  mrl_generate_options o;
  memset(&o, 0, sizeof o);
  o.sampling.temperature = (float)mrl__lua_opt_number(L, 2, "temperature", 1.0);
  o.sampling.top_k = (int)mrl__lua_opt_integer(L, 2, "top_k", 0);
  o.sampling.top_p = (float)mrl__lua_opt_number(L, 2, "top_p", 1.0);
  o.sampling.min_p = (float)mrl__lua_opt_number(L, 2, "min_p", 0.0);
  lua_Integer max_new = mrl__lua_opt_integer(L, 2, "max_new_tokens", 64);
  o.seed = (uint64_t)mrl__lua_opt_integer(L, 2, "seed", 0);
  if (max_new < 1) return luaL_argerror(L, 2, "max_new_tokens: must be >= 1");
  /* no sequence outgrows the context: more than ctx new tokens change nothing */
  o.max_new_tokens = max_new > m->cfg.ctx ? m->cfg.ctx : (int)max_new;
  lua_getfield(L, 2, "prompts");
  int p_idx = lua_gettop(L);
  token_batch tb = read_batch(L, p_idx, 2, "prompts", m->cfg.vocab, m->cfg.ctx);
  int32_t stop[STOP_IDS_MAX];
  if (lua_getfield(L, 2, "stop") == LUA_TTABLE) {
    lua_Integer k = luaL_len(L, -1);
    if (k > STOP_IDS_MAX) return luaL_argerror(L, 2, "stop: at most 64 token ids");
    for (int i = 0; i < k; i++) {
      lua_geti(L, -1, i + 1);
      int ok;
      lua_Integer v = lua_tointegerx(L, -1, &ok);
      if (!ok || v < 0 || v >= m->cfg.vocab) return luaL_argerror(L, 2, "stop: token ids expected");
      stop[o.n_stop++] = (int32_t)v;
      lua_pop(L, 1);
    }
  } else if (!lua_isnil(L, -1)) {
    return luaL_argerror(L, 2, "stop: table of token ids expected");
  }
  lua_pop(L, 1);
  o.stop = stop;
  stop_strings ss;
  read_stop_strings(L, 2, &ss);
  o.stop_strings = ss.text;
  o.stop_lengths = ss.len;
  o.n_stop_strings = ss.n;
  o.tokenizer = ss.tok;
  /* the prompts concatenated, as the C API takes them */
  int *lengths = lua_newuserdatauv(L, sizeof(int) * (size_t)tb.batch * 3, 0);
  int *reasons = lengths + tb.batch, *plen = lengths + 2 * tb.batch;
  int32_t *prompts = lua_newuserdatauv(L, sizeof(int32_t) * (size_t)tb.batch * (size_t)tb.steps, 0);
  int64_t off = 0;
  int longest = 0;
  for (int b = 0; b < tb.batch; b++) {
    plen[b] = tb.lengths[b];
    memcpy(prompts + off, tb.tokens + (int64_t)b * tb.steps, sizeof(int32_t) * (size_t)plen[b]);
    off += plen[b];
    if (plen[b] > longest) longest = plen[b];
  }
  int64_t capacity = (int64_t)longest + o.max_new_tokens;
  if (capacity > m->cfg.ctx) capacity = m->cfg.ctx;
  o.cache = generation_cache(L, lm, tb.batch, (int)capacity);
  size_t cells = (size_t)tb.batch * (size_t)o.max_new_tokens;
  int32_t *tok = lua_newuserdatauv(L, sizeof(int32_t) * cells, 0);
  float *lp = lua_newuserdatauv(L, sizeof(float) * cells, 0);
  mrl_status st = mrl_model_generate(m, tb.batch, prompts, plen, &o, tok, lp, lengths, reasons);
  if (st) return raise_model(L, m, st, 2);
  lua_createtable(L, 0, 3);
  static const char *const outputs[] = {"tokens", "logprobs"};
  for (int f = 0; f < 2; f++) {
    lua_createtable(L, tb.batch, 0);
    for (int b = 0; b < tb.batch; b++) {
      lua_createtable(L, lengths[b], 0);
      size_t row = (size_t)b * (size_t)o.max_new_tokens;
      for (int i = 0; i < lengths[b]; i++) {
        if (f == 0)
          lua_pushinteger(L, tok[row + (size_t)i]);
        else
          lua_pushnumber(L, lp[row + (size_t)i]);
        lua_rawseti(L, -2, i + 1);
      }
      lua_rawseti(L, -2, b + 1);
    }
    lua_setfield(L, -2, outputs[f]);
  }
  lua_createtable(L, tb.batch, 0);
  for (int b = 0; b < tb.batch; b++) {
    lua_pushstring(L, reasons[b] == MRL_TURN_STOP ? "stop" : "length");
    lua_rawseti(L, -2, b + 1);
  }
  lua_setfield(L, -2, "stop");
  return 1;
}

/* ---- checkpoints ---- */

/* m:save_checkpoint(path [, step]) -> true, or nil and a message: weights, AdamW state and the
 * step, in one file written atomically. */
static int m_save_checkpoint(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  const char *path = luaL_checkstring(L, 2);
  lua_Integer step = luaL_optinteger(L, 3, 0);
  mrl_status st = mrl_model_save_checkpoint(m, path, step, NULL);
  if (st) {
    luaL_pushfail(L);
    lua_pushstring(L, mrl_engine_last_error(m->engine));
    mrl_engine_clear_error(m->engine);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* m:load_checkpoint(path) -> step, or nil and a message (the model is unchanged then). */
static int m_load_checkpoint(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  const char *path = luaL_checkstring(L, 2);
  int64_t step = 0;
  mrl_status st = mrl_model_load_checkpoint(m, path, &step, NULL);
  if (st) {
    luaL_pushfail(L);
    lua_pushstring(L, mrl_engine_last_error(m->engine));
    mrl_engine_clear_error(m->engine);
    return 2;
  }
  lua_pushinteger(L, step);
  return 1;
}

/* m:clone() -> a new model with a copy of the weights (no gradients or optimizer state). */
static int m_clone(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  lmodel *b = push_model(L, NULL);
  mrl_status st = mrl_model_clone(m, &b->m);
  if (st) return raise_model(L, m, st, 0);
  return 1;
}

/* m:decode_bf16(on) -> true: decoding (sampling, rollouts, generation, serving) reads a bfloat16
 * copy of the weights (mrl_model_set_decode_bf16; each m:step refreshes it; call again after
 * writing weights through m:parameters()); m:decode_bf16(false) frees it. m:decode_bf16() -> on */
static int m_decode_bf16(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  if (lua_isnoneornil(L, 2)) {
    lua_pushboolean(L, mrl_model_decode_bf16(m));
    return 1;
  }
  luaL_checktype(L, 2, LUA_TBOOLEAN);
  mrl_status st = mrl_model_set_decode_bf16(m, lua_toboolean(L, 2));
  if (st) return raise_model(L, m, st, 0);
  lua_pushboolean(L, 1);
  return 1;
}

/* m:reset_optimizer(): the next m:step starts fresh AdamW moments. */
static int m_reset_optimizer(lua_State *L) {
  mrl_model_reset_optimizer(check_model(L, 1));
  return 0;
}

/* ---- parameters and lifetime ---- */

/* m:parameters() -> {name = tensor view of the weights, ...} (views keep the memory alive). */
static int m_parameters(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  int want_grads = lua_toboolean(L, 2);
  lua_createtable(L, 0, m->nparams);
  for (int i = 0; i < m->nparams; i++) {
    const char *name;
    mrl_tensor *w = NULL, *g = NULL;
    mrl_status st = mrl_model_param(m, i, &name, want_grads ? NULL : &w, want_grads ? &g : NULL);
    if (st) return raise_model(L, m, st, 0);
    mrl__lua_push_tensor(L, want_grads ? g : w);
    lua_setfield(L, -2, name);
  }
  return 1;
}

static int m_gradients(lua_State *L) {
  lua_settop(L, 1);
  lua_pushboolean(L, 1);
  return m_parameters(L);
}

static int m_free(lua_State *L) {
  lmodel *b = luaL_checkudata(L, 1, MODEL_MT);
  mrl_kv_cache_free(b->cache);
  mrl_model_free(b->m);
  b->cache = NULL;
  b->m = NULL;
  return 0;
}

static int m_tostring(lua_State *L) {
  lmodel *b = luaL_checkudata(L, 1, MODEL_MT);
  if (!b->m) {
    lua_pushstring(L, "model(closed)");
    return 1;
  }
  const mrl_model_config *c = &b->m->cfg;
  lua_pushfstring(L, "model(%s, %I parameters: vocab %d, dim %d, layers %d, heads %d/%d, ffn %d, "
                     "ctx %d)", c->qk_norm ? "qwen3" : c->qkv_bias ? "qwen2" : "llama",
                  (lua_Integer)b->m->numel, c->vocab, c->dim, c->layers, c->heads, c->kv_heads,
                  c->ffn, c->ctx);
  return 1;
}

/* ---- data parallelism (core.comm) ---- */

/* m:broadcast([root = 0]): the weights, and the AdamW moments and step where root has them, of
 * rank root copied into m on every rank (initial weights of a data-parallel run). Every rank's
 * model must have root's configuration; a rank whose optimizer state differs from root's in
 * being allocated gets root's. */
static int m_broadcast(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  mrl_comm *c = mrl__lua_comm(L);
  lua_Integer root = luaL_optinteger(L, 2, 0);
  if (root < 0 || root >= mrl_comm_size(c))
    return luaL_argerror(L, 2, lua_pushfstring(L, "root: a rank in 0..%d expected", mrl_comm_size(c) - 1));
  /* what root has: numel and whether its moments exist, checked on every rank first */
  double head[3] = {(double)m->numel, m->adam_m ? 1.0 : 0.0, (double)m->adam_step};
  mrl_status st = mrl_comm_bcast(c, head, sizeof head, (int)root);
  if (st) return mrl__lua_raise(L, m->engine, st, 0);
  if (head[0] != (double)m->numel)
    return luaL_error(L, "broadcast: this rank's model has %I parameters, rank %d's %I",
                      (lua_Integer)m->numel, (int)root, (lua_Integer)head[0]);
  if (head[1] != 0.0 && !m->adam_m && (st = mrl__model_alloc_adam(m, "broadcast")))
    return raise_model(L, m, st, 0);
  if ((st = mrl_comm_bcast(c, m->weights, m->numel * (int64_t)sizeof(float), (int)root)))
    return mrl__lua_raise(L, m->engine, st, 0);
  if (head[1] != 0.0) {
    if ((st = mrl_comm_bcast(c, m->adam_m, m->numel * (int64_t)sizeof(float), (int)root)) ||
        (st = mrl_comm_bcast(c, m->adam_v, m->numel * (int64_t)sizeof(float), (int)root)))
      return mrl__lua_raise(L, m->engine, st, 0);
    m->adam_step = (int64_t)head[2];
  }
  if (m->act) m->act->valid = false; /* the weights may have changed under the last forward */
  if (m->decode_bf16) mrl__model_refresh_bf16(m);
  return 0;
}

/* m:allreduce_grads(): the gradients summed over the ranks, in place (before m:step). */
static int m_allreduce_grads(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  mrl_status st = mrl_comm_allreduce_f32(mrl__lua_comm(L), m->grads, m->numel);
  if (st) return mrl__lua_raise(L, m->engine, st, 0);
  return 0;
}

/* m:digest() -> 16 hex digits: FNV-1a over the bytes of the weights, then the AdamW moments and
 * step when they exist. Equal digests on two ranks mean bit-identical replicas. */
static int m_digest(lua_State *L) {
  mrl_model *m = check_model(L, 1);
  uint64_t h = 0xcbf29ce484222325ULL;
  const float *bufs[3] = {m->weights, m->adam_m, m->adam_v};
  for (int k = 0; k < 3; k++) {
    if (!bufs[k]) continue;
    const unsigned char *p = (const unsigned char *)bufs[k];
    for (int64_t i = 0; i < m->numel * (int64_t)sizeof(float); i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  }
  int64_t step = m->adam_m ? m->adam_step : -1;
  for (int i = 0; i < 8; i++) h = (h ^ (unsigned char)(step >> (8 * i))) * 0x100000001b3ULL;
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  lua_pushstring(L, hex);
  return 1;
}

static const luaL_Reg model_methods[] = {
    {"save", m_save},           {"config", m_config},       {"logits", m_logits},
    {"logprobs", m_logprobs},   {"accumulate", m_accumulate}, {"step", m_step},
    {"sft_step", m_sft_step},   {"generate", m_generate},   {"parameters", m_parameters},
    {"gradients", m_gradients}, {"save_checkpoint", m_save_checkpoint},
    {"load_checkpoint", m_load_checkpoint}, {"forward_batch", m_forward_batch},
    {"backward_batch", m_backward_batch}, {"clone", m_clone},
    {"reset_optimizer", m_reset_optimizer}, {"decode_bf16", m_decode_bf16},
    {"broadcast", m_broadcast}, {"allreduce_grads", m_allreduce_grads}, {"digest", m_digest},
    {"free", m_free}, {NULL, NULL}};

static const luaL_Reg model_meta[] = {
    {"__gc", m_free}, {"__close", m_free}, {"__tostring", m_tostring}, {NULL, NULL}};

static const luaL_Reg model_funcs[] = {{"new", l_new}, {"load", l_load}, {NULL, NULL}};

void mrl__lua_open_model(lua_State *L) {
  luaL_newmetatable(L, MODEL_MT);
  luaL_setfuncs(L, model_meta, 0);
  luaL_newlib(L, model_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, model_funcs);
}
