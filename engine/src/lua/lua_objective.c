/* lua_objective.c - rl.objective: the Lua binding of the engine's advantages and losses that the
 * trainer calls, applied to a trajectory batch's ragged layout. Episodes are ranges of flat token
 * tensors (offsets); a function gathers each listed episode's sampled tokens (mask 1) into one
 * left-packed row, calls the engine on the (rows, cols) arrays and scatters per-token results back
 * to flat positions (0 at the other tokens). rl.advantage (lua_advantage.c) runs the spec's cases
 * through these same functions; the helpers it shares with them are declared in lua_objective.h. */
#include "lua_objective.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers shared with rl.advantage ---- */

void *mrl__obj_buffer(lua_State *L, int64_t count, size_t elem) {
  if (count < 0 || (uint64_t)count > (SIZE_MAX / 2) / elem)
    luaL_error(L, "%I elements is too many", (lua_Integer)count);
  luaL_checkstack(L, 2, "too many arrays");
  size_t size = count > 0 ? (size_t)count * elem : 1;
  void *p = lua_newuserdatauv(L, size, 0);
  memset(p, 0, size);
  return p;
}

/* Pushes "a, b, c" of a NULL-terminated list ("none" when empty). */
static const char *push_names(lua_State *L, const char *const *names) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (const char *const *k = names; *k; k++) {
    if (k != names) luaL_addstring(&b, ", ");
    luaL_addstring(&b, *k);
  }
  if (!*names) luaL_addstring(&b, "none");
  luaL_pushresult(&b);
  return lua_tostring(L, -1);
}

void mrl__obj_check_keys(lua_State *L, int idx, const char *what, const char *const *allowed) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    bool ok = false;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (const char *const *k = allowed; *k && !ok; k++)
        ok = strcmp(*k, lua_tostring(L, -1)) == 0;
    if (!ok) {
      const char *name = luaL_tolstring(L, -1, NULL), *expected = push_names(L, allowed);
      luaL_argerror(L, idx,
                    lua_pushfstring(L, "unknown %s '%s' (expected: %s)", what, name, expected));
    }
  }
}

mrl__idmap mrl__obj_idmap(lua_State *L, bool keep_values) {
  luaL_checkstack(L, 2, "too many arrays");
  mrl__idmap m = {0, 0, 0};
  lua_newtable(L);
  m.map = lua_gettop(L);
  if (keep_values) {
    lua_newtable(L);
    m.values = lua_gettop(L);
  }
  return m;
}

int64_t mrl__obj_take_id(lua_State *L, mrl__idmap *m, int arg, const char *what, int64_t i) {
  int t = lua_type(L, -1);
  if ((t != LUA_TNUMBER && t != LUA_TSTRING) || (t == LUA_TNUMBER && isnan(lua_tonumber(L, -1))))
    luaL_argerror(L, arg, lua_pushfstring(L, "%s[%I]: id (a number or a string) expected, got %s",
                                          what, (lua_Integer)i, luaL_typename(L, -1)));
  lua_pushvalue(L, -1);
  if (lua_rawget(L, m->map) == LUA_TNUMBER) {
    int64_t id = (int64_t)lua_tointeger(L, -1);
    lua_pop(L, 2);
    return id;
  }
  lua_pop(L, 1);
  int64_t id = m->count++;
  if (m->values) {
    lua_pushvalue(L, -1);
    lua_rawseti(L, m->values, (lua_Integer)id + 1);
  }
  lua_pushinteger(L, (lua_Integer)id);
  lua_rawset(L, m->map);
  return id;
}

void mrl__obj_push_doubles(lua_State *L, const double *x, int64_t n) {
  lua_createtable(L, n < INT32_MAX ? (int)n : 0, 0);
  for (int64_t i = 0; i < n; i++) {
    lua_pushnumber(L, x[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

int mrl__obj_option(lua_State *L, int arg, const char *key, const char *value,
                    const char *const *names) {
  for (int i = 0; names[i]; i++)
    if (strcmp(names[i], value) == 0) return i;
  const char *choices = push_names(L, names);
  return luaL_argerror(L, arg, lua_pushfstring(L, "%s: unknown value '%s' (expected one of: %s)",
                                               key, value, choices));
}

const char *const mrl__obj_agg_names[] = {"token-mean",          "seq-mean-token-sum",
                                          "seq-mean-token-mean", "seq-mean-token-sum-norm",
                                          "oat-drgrpo",          "token-sum",
                                          NULL};
/* moonrl's names first, then verl's spellings of the same estimators */
const char *const mrl__obj_kl_names[] = {"k1",  "abs",  "k2",  "k3",  "k1+",        "abs+",
                                         "k2+", "k3+",  "kl",  "mse", "low_var_kl", "kl+",
                                         "mse+", "low_var_kl+", NULL};
static const mrl_kl_kind kl_kinds[] = {
    MRL_KL_K1, MRL_KL_ABS, MRL_KL_K2, MRL_KL_K3, MRL_KL_K1_PLUS, MRL_KL_ABS_PLUS, MRL_KL_K2,
    MRL_KL_K3_PLUS, MRL_KL_K1, MRL_KL_K2, MRL_KL_K3, MRL_KL_K1_PLUS, MRL_KL_K2, MRL_KL_K3_PLUS};

mrl_kl_kind mrl__obj_kl_kind(lua_State *L, int arg, const char *key, const char *value) {
  return kl_kinds[mrl__obj_option(L, arg, key, value, mrl__obj_kl_names)];
}

/* ---- argument helpers ---- */

static bool opt_boolean(lua_State *L, int idx, const char *key, bool dflt) {
  int type = lua_getfield(L, idx, key);
  if (type != LUA_TNIL && type != LUA_TBOOLEAN)
    luaL_argerror(L, idx, lua_pushfstring(L, "%s: boolean expected, got %s", key,
                                          luaL_typename(L, -1)));
  bool v = type == LUA_TNIL ? dflt : lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* A list field of n numbers (n < 0: any length, written to *len). */
static double *num_list(lua_State *L, int opts, const char *key, int64_t *len, bool required) {
  if (lua_getfield(L, opts, key) != LUA_TTABLE) {
    lua_pop(L, 1);
    if (required) luaL_argerror(L, opts, lua_pushfstring(L, "%s: a list of numbers expected", key));
    return NULL;
  }
  int list = lua_gettop(L);
  int64_t n = (int64_t)luaL_len(L, list);
  if (*len >= 0 && n != *len)
    luaL_argerror(L, opts, lua_pushfstring(L, "%s: %d values expected, got %d", key, (int)*len, (int)n));
  double *out = mrl__obj_buffer(L, n, sizeof(double));
  for (int64_t i = 0; i < n; i++) {
    lua_geti(L, list, i + 1);
    int ok;
    out[i] = lua_tonumberx(L, -1, &ok);
    if (!ok || !isfinite(out[i]))
      luaL_argerror(L, opts, lua_pushfstring(L, "%s[%d]: a finite number expected", key, (int)i + 1));
    lua_pop(L, 1);
  }
  lua_replace(L, list); /* keep the scratch block, drop the list */
  *len = n;
  return out;
}

/* A list field of n ids as dense int64 labels (NULL when absent and not required). */
static int64_t *id_list(lua_State *L, int opts, const char *key, int64_t n, bool required) {
  if (lua_getfield(L, opts, key) != LUA_TTABLE) {
    lua_pop(L, 1);
    if (required) luaL_argerror(L, opts, lua_pushfstring(L, "%s: a list of ids expected", key));
    return NULL;
  }
  int list = lua_gettop(L);
  if ((int64_t)luaL_len(L, list) != n)
    luaL_argerror(L, opts, lua_pushfstring(L, "%s: %d ids expected", key, (int)n));
  int64_t *out = mrl__obj_buffer(L, n, sizeof(int64_t));
  mrl__idmap m = mrl__obj_idmap(L, false);
  for (int64_t i = 0; i < n; i++) {
    lua_geti(L, list, i + 1);
    out[i] = mrl__obj_take_id(L, &m, opts, key, i + 1);
  }
  lua_pop(L, 1); /* the map */
  lua_replace(L, list);
  return out;
}

static int raise(lua_State *L, mrl_status st) { return mrl__lua_raise(L, mrl__lua_engine(L), st, 1); }

/* Starts a call: one options table whose keys are all in `keys`. */
static void start(lua_State *L, const char *const *keys) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstack(L, 48, "objective");
  mrl__obj_check_keys(L, 1, "option", keys);
}

/* ---- per-row advantages ---- */

static const struct {
  const char *name;
  mrl_outcome_kind kind;
  int norm_by_std;
} outcome_methods[] = {{"grpo", MRL_ADV_GRPO, 1},
                       {"drgrpo", MRL_ADV_GRPO, 0},
                       {"grpo_passk", MRL_ADV_GRPO_PASSK, 1},
                       {"rloo", MRL_ADV_RLOO, 1},
                       {"opo", MRL_ADV_OPO, 1},
                       {"gpg", MRL_ADV_GPG, 1},
                       {"reinforce_plus_plus_baseline", MRL_ADV_REINFORCE_PP_BASELINE, 1},
                       /* not mrl_outcome_kinds: mrl_reinforce_pp and mrl_gdpo (below) */
                       {"reinforce_plus_plus", MRL_ADV_GRPO, 1},
                       {"gdpo", MRL_ADV_GRPO, 1}};

/* Reads field key, a list of lists of rows numbers each, into terms x rows doubles; *terms gets
 * the number of lists (NULL and 0 when the field is absent). */
static double *term_lists(lua_State *L, int opts, const char *key, int64_t rows, int64_t *terms) {
  *terms = 0;
  if (lua_getfield(L, opts, key) == LUA_TNIL) {
    lua_pop(L, 1);
    return NULL;
  }
  if (!lua_istable(L, -1))
    luaL_argerror(L, opts, lua_pushfstring(L, "%s: a list of lists of numbers expected", key));
  int list = lua_gettop(L);
  int64_t k = (int64_t)luaL_len(L, list);
  if (k < 1) luaL_argerror(L, opts, lua_pushfstring(L, "%s: at least one term expected", key));
  double *out = mrl__obj_buffer(L, k * rows, sizeof(double));
  for (int64_t j = 0; j < k; j++) {
    if (lua_geti(L, list, j + 1) != LUA_TTABLE || (int64_t)luaL_len(L, -1) != rows)
      luaL_argerror(L, opts, lua_pushfstring(L, "%s[%d]: a list of %d numbers expected", key,
                                             (int)j + 1, (int)rows));
    for (int64_t i = 0; i < rows; i++) {
      lua_geti(L, -1, i + 1);
      int ok;
      double v = lua_tonumberx(L, -1, &ok);
      if (!ok || !isfinite(v))
        luaL_argerror(L, opts, lua_pushfstring(L, "%s[%d][%d]: a finite number expected", key,
                                               (int)j + 1, (int)i + 1));
      out[j * rows + i] = v;
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_replace(L, list);
  *terms = k;
  return out;
}

/* rl.objective.advantage{method =, scores = {...}, groups = {...} [, counts = {...}, epsilon =,
 * norm_by_std =, f_norm =, singleton_zero = false, terms = {{...}, ...}, term_weights = {...}]}
 * -> {a1, a2, ...}: the outcome estimator's advantage of each row (an episode), which every
 * sampled token of the row gets. counts: the row's sampled-token count (OPO's lengths and the
 * token-weighted whitening of REINFORCE++ and GDPO; default 1 each). singleton_zero: RLOO gives a
 * group of one 0 instead of its score. gdpo: terms holds one list of row scores per reward term
 * (absent: scores is the one term), term_weights their weights (default 1 each). */
static int l_advantage(lua_State *L) {
  static const char *const keys[] = {"method", "scores", "groups", "counts", "epsilon",
                                     "norm_by_std", "f_norm", "singleton_zero", "terms",
                                     "term_weights", NULL};
  start(L, keys);
  const char *method = mrl__lua_opt_string(L, 1, "method", "grpo");
  size_t k = 0, n_methods = sizeof outcome_methods / sizeof outcome_methods[0];
  while (k < n_methods && strcmp(outcome_methods[k].name, method) != 0) k++;
  if (k == n_methods)
    return luaL_argerror(L, 1, lua_pushfstring(L, "method: unknown outcome estimator '%s' (grpo, "
                                               "drgrpo, grpo_passk, rloo, opo, gpg, "
                                               "reinforce_plus_plus_baseline, "
                                               "reinforce_plus_plus, gdpo)", method));
  int64_t rows = -1;
  double *scores = num_list(L, 1, "scores", &rows, true);
  int64_t *groups = id_list(L, 1, "groups", rows, true);
  int64_t crow = rows;
  double *counts = num_list(L, 1, "counts", &crow, false);
  int64_t cols = 1;
  for (int64_t i = 0; counts && i < rows; i++) {
    if (counts[i] < 0 || counts[i] != floor(counts[i]))
      return luaL_argerror(L, 1, "counts: non-negative integers expected");
    if ((int64_t)counts[i] > cols) cols = (int64_t)counts[i];
  }
  mrl_outcome_opts o;
  mrl_outcome_defaults(&o);
  o.epsilon = mrl__lua_opt_number(L, 1, "epsilon", o.epsilon);
  o.f_norm = mrl__lua_opt_number(L, 1, "f_norm", o.f_norm);
  o.norm_by_std = (int)mrl__lua_opt_number(L, 1, "norm_by_std", outcome_methods[k].norm_by_std);
  o.singleton_zero = opt_boolean(L, 1, "singleton_zero", false);
  float *rewards = mrl__obj_buffer(L, rows * cols, sizeof(float));
  float *mask = mrl__obj_buffer(L, rows * cols, sizeof(float));
  float *adv = mrl__obj_buffer(L, rows * cols, sizeof(float));
  double *out = mrl__obj_buffer(L, rows, sizeof(double));
  for (int64_t i = 0; i < rows; i++) {
    int64_t c = counts ? (int64_t)counts[i] : 1;
    rewards[i * cols] = (float)scores[i];
    for (int64_t t = 0; t < c; t++) mask[i * cols + t] = 1.0f;
  }
  mrl_status st;
  bool gdpo = strcmp(method, "gdpo") == 0;
  int64_t n_terms = 0, n_weights = -1;
  double *terms = term_lists(L, 1, "terms", rows, &n_terms);
  double *term_weights = num_list(L, 1, "term_weights", &n_weights, false);
  if (!gdpo && (terms || term_weights))
    return luaL_argerror(L, 1, "terms, term_weights: only for method gdpo");
  if (gdpo) {
    if (!terms) {
      terms = scores;
      n_terms = 1;
    }
    if (term_weights && n_weights != n_terms)
      return luaL_argerror(L, 1, lua_pushfstring(L, "term_weights: %d weights expected (one per "
                                                 "term), got %d", (int)n_terms, (int)n_weights));
    st = mrl_gdpo(mrl__lua_engine(L), &o, terms, term_weights, n_terms, mask, groups, rows, cols,
                  adv);
    if (st) return raise(L, st);
    for (int64_t i = 0; i < rows; i++) out[i] = adv[i * cols];
    mrl__obj_push_doubles(L, out, rows);
    return 1;
  }
  if (strcmp(method, "reinforce_plus_plus") == 0) {
    /* the score on the row's last sampled token; gamma 1: every sampled token's return is the
     * score, whitened over all sampled tokens of the batch (groups play no part) */
    float *returns = mrl__obj_buffer(L, rows * cols, sizeof(float));
    for (int64_t i = 0; i < rows; i++) {
      int64_t c = counts ? (int64_t)counts[i] : 1;
      rewards[i * cols] = 0.0f;
      if (c > 0) rewards[i * cols + c - 1] = (float)scores[i];
    }
    st = mrl_reinforce_pp(mrl__lua_engine(L), rewards, mask, rows, cols, 1.0, MRL_RETURN_CARRY,
                          adv, returns);
    if (st) return raise(L, st);
    for (int64_t i = 0; i < rows; i++) {
      int64_t c = counts ? (int64_t)counts[i] : 1;
      out[i] = c > 0 ? adv[i * cols] : 0.0;
    }
    mrl__obj_push_doubles(L, out, rows);
    return 1;
  }
  st = mrl_outcome_advantage(mrl__lua_engine(L), outcome_methods[k].kind, &o, rewards, mask,
                             groups, rows, cols, adv);
  if (st) return raise(L, st);
  /* a row without sampled tokens has adv 0 everywhere; the estimator's value is what it would get */
  for (int64_t i = 0; i < rows; i++) out[i] = adv[i * cols];
  mrl__obj_push_doubles(L, out, rows);
  return 1;
}

/* rl.objective.step_returns{rewards = {...}, traj = {...} [, env_step = {...}, gamma = 1]} ->
 * discounted returns of each row (a turn) within its trajectory, rows in order. Rows of one
 * trajectory with equal env_step ids are one environment step: they share its return. */
static int l_step_returns(lua_State *L) {
  static const char *const keys[] = {"rewards", "traj", "env_step", "gamma", NULL};
  start(L, keys);
  int64_t n = -1;
  double *rewards = num_list(L, 1, "rewards", &n, true);
  int64_t *traj = id_list(L, 1, "traj", n, true);
  int64_t *env_step = id_list(L, 1, "env_step", n, false);
  double gamma = mrl__lua_opt_number(L, 1, "gamma", 1.0);
  double *out = mrl__obj_buffer(L, n, sizeof(double));
  mrl_status st = mrl_step_returns(mrl__lua_engine(L), rewards, traj, env_step, n, gamma, out);
  if (st) return raise(L, st);
  mrl__obj_push_doubles(L, out, n);
  return 1;
}

/* rl.objective.gigpo{scores = {...}, step_rewards = {...}, groups = {...}, anchors = {...}
 * [, step_weight = 1, mode = "mean" | "mean_std", epsilon =, traj = {...}, dedup_traj = false]}
 * -> adv, episode_adv, step_adv: per row (a turn): the episode's score normalised in its prompt
 * group plus the weighted step return normalised among the group's turns that acted on the same
 * state (anchor). dedup_traj: the episode statistics count one row per trajectory (traj). */
static int l_gigpo(lua_State *L) {
  static const char *const keys[] = {"scores", "step_rewards", "groups", "anchors", "step_weight",
                                     "mode", "epsilon", "traj", "dedup_traj", NULL};
  start(L, keys);
  int64_t rows = -1;
  double *scores = num_list(L, 1, "scores", &rows, true);
  double *step_rewards = num_list(L, 1, "step_rewards", &rows, true);
  int64_t *groups = id_list(L, 1, "groups", rows, true);
  int64_t *anchors = id_list(L, 1, "anchors", rows, true);
  int64_t *traj = id_list(L, 1, "traj", rows, false);
  mrl_gigpo_opts o;
  mrl_gigpo_defaults(&o);
  o.step_weight = mrl__lua_opt_number(L, 1, "step_weight", o.step_weight);
  o.epsilon = mrl__lua_opt_number(L, 1, "epsilon", o.epsilon);
  o.dedup_traj = opt_boolean(L, 1, "dedup_traj", false);
  if (o.dedup_traj && !traj) return luaL_argerror(L, 1, "traj: needed with dedup_traj");
  static const char *const modes[] = {"mean", "mean_std", NULL};
  o.mode = mrl__obj_option(L, 1, "mode", mrl__lua_opt_string(L, 1, "mode", "mean"), modes) == 0
               ? MRL_NORM_MEAN
               : MRL_NORM_MEAN_STD;
  float *rewards = mrl__obj_buffer(L, rows, sizeof(float));
  float *mask = mrl__obj_buffer(L, rows, sizeof(float));
  float *adv = mrl__obj_buffer(L, rows, sizeof(float));
  float *ea = mrl__obj_buffer(L, rows, sizeof(float));
  float *sa = mrl__obj_buffer(L, rows, sizeof(float));
  for (int64_t i = 0; i < rows; i++) {
    rewards[i] = (float)scores[i];
    mask[i] = 1.0f;
  }
  mrl_status st = mrl_gigpo(mrl__lua_engine(L), &o, rewards, step_rewards, mask, groups, traj,
                            anchors, rows, 1, adv, ea, sa, NULL);
  if (st) return raise(L, st);
  double *d = mrl__obj_buffer(L, rows, sizeof(double));
  const float *src[3] = {adv, ea, sa};
  for (int k = 0; k < 3; k++) {
    for (int64_t i = 0; i < rows; i++) d[i] = src[k][i];
    mrl__obj_push_doubles(L, d, rows);
    lua_insert(L, -2); /* keep d on top */
  }
  lua_pop(L, 1);
  return 3;
}

/* The flat mask tensor of an options table: a contiguous 1-D tensor. */
static mrl_tensor *flat_mask(lua_State *L, int opts) {
  lua_getfield(L, opts, "mask");
  mrl_tensor *mt = mrl__lua_check_tensor(L, -1, "mask");
  lua_pop(L, 1); /* the options table keeps it alive */
  if (mrl_tensor_rank(mt) != 1 || !mrl_tensor_is_contiguous(mt))
    luaL_argerror(L, opts, "mask: a contiguous 1-D tensor expected");
  return mt;
}

/* rl.objective.broadcast{values = {...}, mask =, offsets =} -> a flat tensor like mask holding
 * values[i] at episode i's mask-1 tokens and 0 elsewhere (an episode's advantage on its tokens). */
static int l_broadcast(lua_State *L) {
  static const char *const keys[] = {"values", "mask", "offsets", NULL};
  start(L, keys);
  mrl_tensor *mt = flat_mask(L, 1);
  int64_t total = mrl_tensor_numel(mt);
  const float *mask = mrl_tensor_data(mt);
  int64_t n = -1;
  double *values = num_list(L, 1, "values", &n, true);
  int64_t n_off = n + 1;
  double *off = num_list(L, 1, "offsets", &n_off, true);
  for (int64_t i = 0; i < n; i++)
    if (off[i] < 0 || off[i + 1] < off[i] || off[i + 1] > (double)total || off[i] != floor(off[i]))
      return luaL_argerror(L, 1, lua_pushfstring(L, "offsets: entry %d does not fit mask", (int)i + 1));
  mrl_tensor *t = NULL;
  mrl_status st = mrl_tensor_new(mrl__lua_engine(L), 1, &total, &t);
  if (st) return raise(L, st);
  mrl__lua_push_tensor(L, t);
  float *d = mrl_tensor_data(t);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = (int64_t)off[i]; j < (int64_t)off[i + 1]; j++)
      d[j] = mask[j] != 0.0f ? (float)values[i] : 0.0f;
  return 1;
}

/* ---- the loss over a minibatch of episodes ---- */

typedef struct {
  int64_t rows, cols, total;
  int64_t *pos; /* rows x cols: flat position of each packed token, -1 for padding */
  float *mask;  /* rows x cols */
} packed;

static float *flat_tensor(lua_State *L, int opts, const char *key, int64_t total, bool required) {
  if (lua_getfield(L, opts, key) == LUA_TNIL) {
    lua_pop(L, 1);
    if (required) luaL_argerror(L, opts, lua_pushfstring(L, "%s: a tensor expected", key));
    return NULL;
  }
  mrl_tensor *t = mrl__lua_check_tensor(L, -1, key);
  if (mrl_tensor_rank(t) != 1 || !mrl_tensor_is_contiguous(t) || mrl_tensor_numel(t) != total)
    luaL_argerror(L, opts, lua_pushfstring(L, "%s: a contiguous 1-D tensor as long as mask "
                                           "expected", key));
  lua_pop(L, 1); /* the options table keeps it alive */
  return mrl_tensor_data(t);
}

/* The listed episodes' mask-1 positions, left-packed one row per episode; with span, each row
 * is instead the episode's positions from its first mask-1 token to its end, mask-0 tokens
 * included (as a response row of verl's, observations inside it). */
static packed pack_layout(lua_State *L, int opts, bool span) {
  packed p;
  memset(&p, 0, sizeof p);
  mrl_tensor *mt = flat_mask(L, opts);
  p.total = mrl_tensor_numel(mt);
  const float *mask = mrl_tensor_data(mt);
  if (lua_getfield(L, opts, "offsets") != LUA_TTABLE) luaL_argerror(L, opts, "offsets: a list expected");
  int offsets = lua_gettop(L);
  if (lua_getfield(L, opts, "episodes") != LUA_TTABLE) luaL_argerror(L, opts, "episodes: a list expected");
  int eps = lua_gettop(L);
  int64_t n_off = (int64_t)luaL_len(L, offsets);
  p.rows = (int64_t)luaL_len(L, eps);
  if (p.rows < 1) luaL_argerror(L, opts, "episodes: at least one expected");
  int64_t *range = mrl__obj_buffer(L, 2 * p.rows, sizeof(int64_t));
  p.cols = 1;
  for (int64_t i = 0; i < p.rows; i++) {
    lua_geti(L, eps, i + 1);
    int ok;
    lua_Integer e = lua_tointegerx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok || e < 1 || e >= n_off)
      luaL_argerror(L, opts, lua_pushfstring(L, "episodes[%d]: an episode number in 1..%d "
                                             "expected", (int)i + 1, (int)n_off - 1));
    lua_geti(L, offsets, e);
    lua_geti(L, offsets, e + 1);
    int64_t a = lua_tointeger(L, -2), b = lua_tointeger(L, -1);
    lua_pop(L, 2);
    if (a < 0 || b < a || b > p.total)
      luaL_argerror(L, opts, lua_pushfstring(L, "offsets of episode %d do not fit mask", (int)e));
    int64_t count = 0;
    for (int64_t j = a; j < b; j++) {
      if (mask[j] != 0.0f && mask[j] != 1.0f) luaL_argerror(L, opts, "mask: 0 or 1 expected");
      count += mask[j] != 0.0f;
    }
    if (span) {
      while (a < b && mask[a] == 0.0f) a++;
      count = b - a;
    }
    if (count > p.cols) p.cols = count;
    range[2 * i] = a;
    range[2 * i + 1] = b;
  }
  int64_t cells = p.rows * p.cols;
  p.pos = mrl__obj_buffer(L, cells, sizeof(int64_t));
  p.mask = mrl__obj_buffer(L, cells, sizeof(float));
  for (int64_t c = 0; c < cells; c++) p.pos[c] = -1;
  for (int64_t i = 0; i < p.rows; i++) {
    int64_t c = i * p.cols;
    for (int64_t j = range[2 * i]; j < range[2 * i + 1]; j++)
      if (span || mask[j] != 0.0f) {
        p.pos[c] = j;
        p.mask[c++] = mask[j];
      }
  }
  lua_replace(L, offsets); /* keep the arrays; drop the lists */
  lua_replace(L, eps);
  return p;
}

static packed pack(lua_State *L, int opts) { return pack_layout(L, opts, false); }

static float *gather(lua_State *L, const packed *p, const float *flat) {
  float *out = mrl__obj_buffer(L, p->rows * p->cols, sizeof(float));
  for (int64_t c = 0; c < p->rows * p->cols; c++) out[c] = p->pos[c] >= 0 ? flat[p->pos[c]] : 0.0f;
  return out;
}

/* A new flat tensor of total zeros with the packed values scattered back. */
static void push_scatter(lua_State *L, const packed *p, const float *packed_values) {
  mrl_engine *e = mrl__lua_engine(L);
  mrl_tensor *t = NULL;
  int64_t total = p->total;
  mrl_status st = mrl_tensor_new(e, 1, &total, &t);
  if (st) raise(L, st);
  mrl__lua_push_tensor(L, t);
  float *d = mrl_tensor_data(t);
  for (int64_t c = 0; c < p->rows * p->cols; c++)
    if (p->pos[c] >= 0) d[p->pos[c]] = packed_values[c];
}

/* rl.objective.loss's kinds, in mrl_pg_kind order */
static const char *const pg_names[] = {"ppo",     "gspo",    "cispo",    "sapo",
                                       "gpg",     "gmpo",    "dppo_tv",  "dppo_kl",
                                       "clip_cov", "kl_cov", "dro",      "reinforce",
                                       NULL};
/* and every kind rl.objective.loss takes: those, then A2TGPO's (mrl_a2tgpo_loss) */
static const char *const loss_names[] = {"ppo",      "gspo",   "cispo", "sapo",      "gpg",
                                         "gmpo",     "dppo_tv", "dppo_kl", "clip_cov", "kl_cov",
                                         "dro",      "reinforce", "a2tgpo", NULL};

static int find_name(lua_State *L, int opts, const char *key, const char *const *names,
                     const char *dflt) {
  return mrl__obj_option(L, opts, key, mrl__lua_opt_string(L, opts, key, dflt), names);
}

static void set_num(lua_State *L, const char *key, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, key);
}

/* rl.objective.loss{logp =, old_logp =, adv =, mask = (flat tensors), offsets =, episodes =
 * [, kind = "ppo", agg = "token-mean", agg_norm =, clip_low =, clip_high =, clip_c =, tau_pos =,
 * tau_neg =, clip_cov_ratio =, clip_cov_lb =, clip_cov_ub =, kl_cov_ratio =, ppo_kl_coef =,
 * dro_beta =, seed =, is_weights =, ref_logp =, kl = "k3", kl_coef = 0, entropy =,
 * entropy_coef = 0, details = false]}
 * kind: ppo, gspo, cispo, sapo, gpg, gmpo, dppo_tv, dppo_kl, clip_cov, kl_cov, dro, reinforce
 * (mrl_pg_kind), or a2tgpo (mrl_a2tgpo_loss: PPO without the dual clip, the clip range scaled
 * per token by clip_scale, a flat tensor, and with turn_level = true, the default, one ratio per
 * turn of turns, a flat tensor of turn numbers like the batch's; no is_weights);
 * clip_cov_* and kl_cov_ratio / ppo_kl_coef are the covariance losses' options,
 * seed clip_cov's random choice of tokens, dro_beta DRO's penalty (required with dro).
 * -> stats, dlogp [, dentropy]: the policy loss (plus coef * KL to the reference and minus
 * coef * entropy) over the listed episodes' sampled tokens, each episode one row; is_weights
 * (flat) multiply each token's policy loss; stats has loss, pg_loss, clipfrac, clipfrac_lower,
 * ppo_kl, kl, entropy, tokens; dlogp and dentropy are flat tensors of d loss / d logp (entropy)
 * for m:backward_batch. With details, stats also has pg_losses (a flat tensor of each sampled
 * token's policy loss before aggregation; not for gmpo) and, one value per listed episode,
 * seq_ratio (gspo, gmpo) and seq_adv (gmpo). */
static int l_loss(lua_State *L) {
  static const char *const keys[] = {
      "logp",        "old_logp",     "adv",          "mask",        "offsets",
      "episodes",    "kind",         "agg",          "agg_norm",    "clip_low",
      "clip_high",   "clip_c",       "tau_pos",      "tau_neg",     "clip_cov_ratio",
      "clip_cov_lb", "clip_cov_ub",  "kl_cov_ratio", "ppo_kl_coef", "dro_beta",
      "seed",        "is_weights",   "ref_logp",     "kl",          "kl_coef",
      "entropy",     "entropy_coef", "details",      "clip_scale",  "turns",
      "turn_level",  NULL};
  start(L, keys);
  mrl_engine *e = mrl__lua_engine(L);
  packed p = pack(L, 1);
  const float *f_logp = flat_tensor(L, 1, "logp", p.total, true);
  const float *f_old = flat_tensor(L, 1, "old_logp", p.total, true);
  const float *f_adv = flat_tensor(L, 1, "adv", p.total, true);
  const float *f_isw = flat_tensor(L, 1, "is_weights", p.total, false);
  const float *f_ref = flat_tensor(L, 1, "ref_logp", p.total, false);
  const float *f_ent = flat_tensor(L, 1, "entropy", p.total, false);
  const char *kind_name = mrl__lua_opt_string(L, 1, "kind", "ppo");
  /* A2TGPO's loss (mrl_a2tgpo_loss): PPO's clip scaled per token, a turn-level ratio */
  bool a2 = strcmp(kind_name, "a2tgpo") == 0;
  const float *f_scale = flat_tensor(L, 1, "clip_scale", p.total, a2);
  const float *f_turns = flat_tensor(L, 1, "turns", p.total, a2);
  bool turn_level = opt_boolean(L, 1, "turn_level", true);
  if (!a2 && (f_scale || f_turns))
    return luaL_argerror(L, 1, lua_pushfstring(L, "%s: only for kind = \"a2tgpo\"",
                                               f_scale ? "clip_scale" : "turns"));
  if (a2 && f_isw) return luaL_argerror(L, 1, "is_weights: not supported by kind \"a2tgpo\"");
  int k = 0;
  if (a2) kind_name = "ppo";
  while (pg_names[k] && strcmp(pg_names[k], kind_name) != 0) k++;
  if (!pg_names[k]) {
    const char *choices = push_names(L, loss_names);
    return luaL_argerror(L, 1, lua_pushfstring(L, "kind: unknown policy loss '%s' (expected one "
                                               "of: %s)", kind_name, choices));
  }
  mrl_pg_kind kind = (mrl_pg_kind)k;
  mrl_pg_opts o;
  mrl_pg_defaults(kind, &o);
  o.cov_ratio = kind == MRL_PG_KL_COV ? mrl__lua_opt_number(L, 1, "kl_cov_ratio", o.cov_ratio)
                                      : mrl__lua_opt_number(L, 1, "clip_cov_ratio", o.cov_ratio);
  o.cov_lb = mrl__lua_opt_number(L, 1, "clip_cov_lb", o.cov_lb);
  o.cov_ub = mrl__lua_opt_number(L, 1, "clip_cov_ub", o.cov_ub);
  o.kl_coef = mrl__lua_opt_number(L, 1, "ppo_kl_coef", o.kl_coef);
  o.dro_beta = mrl__lua_opt_number(L, 1, "dro_beta", o.dro_beta);
  double seed = mrl__lua_opt_number(L, 1, "seed", 0.0);
  if (seed < 0 || seed != floor(seed) || seed >= 18446744073709551616.0)
    return luaL_argerror(L, 1, "seed: a non-negative integer expected");
  o.seed = (uint64_t)seed;
  o.agg = (mrl_loss_agg)find_name(L, 1, "agg", mrl__obj_agg_names, mrl__obj_agg_names[o.agg]);
  o.agg_norm = mrl__lua_opt_number(L, 1, "agg_norm", o.agg_norm);
  o.clip_low = mrl__lua_opt_number(L, 1, "clip_low", o.clip_low);
  o.clip_high = mrl__lua_opt_number(L, 1, "clip_high", o.clip_high);
  o.clip_c = mrl__lua_opt_number(L, 1, "clip_c", o.clip_c);
  o.tau_pos = mrl__lua_opt_number(L, 1, "tau_pos", o.tau_pos);
  o.tau_neg = mrl__lua_opt_number(L, 1, "tau_neg", o.tau_neg);
  mrl_kl_kind kl_kind = mrl__obj_kl_kind(L, 1, "kl", mrl__lua_opt_string(L, 1, "kl", "k3"));
  double kl_coef = mrl__lua_opt_number(L, 1, "kl_coef", 0.0);
  double ent_coef = mrl__lua_opt_number(L, 1, "entropy_coef", 0.0);
  bool details = opt_boolean(L, 1, "details", false);
  if (kl_coef != 0.0 && !f_ref) return luaL_argerror(L, 1, "ref_logp: needed when kl_coef is set");
  if (ent_coef != 0.0 && !f_ent) return luaL_argerror(L, 1, "entropy: needed when entropy_coef is set");

  int64_t cells = p.rows * p.cols;
  float *logp = gather(L, &p, f_logp), *old = gather(L, &p, f_old), *adv = gather(L, &p, f_adv);
  float *isw = f_isw ? gather(L, &p, f_isw) : NULL;
  float *dlogp = mrl__obj_buffer(L, cells, sizeof(float));
  float *tl = details && kind != MRL_PG_GMPO ? mrl__obj_buffer(L, cells, sizeof(float)) : NULL;
  bool seq = details && (kind == MRL_PG_GSPO || kind == MRL_PG_GMPO);
  double *ratio = seq ? mrl__obj_buffer(L, p.rows, sizeof(double)) : NULL;
  double *sadv = seq && kind == MRL_PG_GMPO ? mrl__obj_buffer(L, p.rows, sizeof(double)) : NULL;
  mrl_pg_stats s;
  mrl_status st;
  if (a2) {
    float *scale = gather(L, &p, f_scale);
    int32_t *turn = mrl__obj_buffer(L, cells, sizeof(int32_t));
    for (int64_t c = 0; c < cells; c++) {
      float t = p.pos[c] >= 0 ? f_turns[p.pos[c]] : -1.0f;
      if (!(t >= -1.0f && t < 2147483647.0f && t == floorf(t)))
        return luaL_argerror(L, 1, "turns: turn numbers (integers >= -1) expected");
      turn[c] = (int32_t)t;
    }
    st = mrl_a2tgpo_loss(e, &o, turn_level, logp, old, adv, p.mask, turn, scale, p.rows, p.cols,
                         &s, tl, NULL, dlogp);
  } else {
    st = mrl_policy_loss(e, kind, &o, logp, old, adv, p.mask, isw, p.rows, p.cols, &s, tl, ratio,
                         sadv, dlogp);
  }
  if (st) return raise(L, st);
  double total = s.loss, kl_value = 0.0, kl_loss = 0.0, entropy = 0.0, ent_loss = 0.0;
  if (f_ref) {
    float *ref = gather(L, &p, f_ref);
    /* the KL's value under the loss's aggregation, whether or not it is trained on */
    if ((st = mrl_kl_loss(e, kl_kind, o.agg, o.agg_norm, 1.0, logp, ref, p.mask, p.rows, p.cols,
                          &kl_value, NULL)))
      return raise(L, st);
    if (kl_coef != 0.0 && (st = mrl_kl_loss(e, kl_kind, o.agg, o.agg_norm, kl_coef, logp, ref,
                                            p.mask, p.rows, p.cols, &kl_loss, dlogp)))
      return raise(L, st);
  }
  float *dent = NULL;
  if (f_ent) {
    float *ent = gather(L, &p, f_ent);
    if ((st = mrl_agg_loss(e, o.agg, o.agg_norm, ent, p.mask, p.rows, p.cols, &entropy)))
      return raise(L, st);
    if (ent_coef != 0.0) {
      dent = mrl__obj_buffer(L, cells, sizeof(float));
      if ((st = mrl_entropy_bonus(e, o.agg, o.agg_norm, ent_coef, ent, p.mask, p.rows, p.cols,
                                  &ent_loss, dent)))
        return raise(L, st);
    }
  }
  total += kl_loss + ent_loss;
  int64_t tokens = 0;
  for (int64_t c = 0; c < cells; c++) tokens += p.mask[c] != 0.0f;
  lua_createtable(L, 0, 13);
  set_num(L, "loss", total);
  set_num(L, "pg_loss", s.loss);
  set_num(L, "clipfrac", s.clipfrac);
  set_num(L, "clipfrac_lower", s.clipfrac_lower);
  set_num(L, "ppo_kl", s.ppo_kl);
  set_num(L, "kl", kl_value);
  set_num(L, "kl_loss", kl_loss);
  set_num(L, "entropy", entropy);
  set_num(L, "entropy_loss", ent_loss);
  lua_pushinteger(L, tokens);
  lua_setfield(L, -2, "tokens");
  if (tl) {
    push_scatter(L, &p, tl);
    lua_setfield(L, -2, "pg_losses");
  }
  if (ratio) {
    mrl__obj_push_doubles(L, ratio, p.rows);
    lua_setfield(L, -2, "seq_ratio");
  }
  if (sadv) {
    mrl__obj_push_doubles(L, sadv, p.rows);
    lua_setfield(L, -2, "seq_adv");
  }
  push_scatter(L, &p, dlogp);
  if (!dent) return 2;
  push_scatter(L, &p, dent);
  return 3;
}

/* rl.objective.kl{logp =, ref_logp =, mask = (flat tensors) [, kind = "k3"]} -> a flat tensor of
 * the per-token KL estimate of logp against ref_logp where mask is 1 (0 elsewhere). */
static int l_kl(lua_State *L) {
  static const char *const keys[] = {"logp", "ref_logp", "mask", "kind", NULL};
  start(L, keys);
  mrl_tensor *mt = flat_mask(L, 1);
  int64_t n = mrl_tensor_numel(mt);
  const float *mask = mrl_tensor_data(mt);
  const float *logp = flat_tensor(L, 1, "logp", n, true), *ref = flat_tensor(L, 1, "ref_logp", n, true);
  mrl_kl_kind kind = mrl__obj_kl_kind(L, 1, "kind", mrl__lua_opt_string(L, 1, "kind", "k3"));
  float *kl = mrl__obj_buffer(L, n, sizeof(float));
  mrl_status st = mrl_kl(mrl__lua_engine(L), kind, logp, ref, n, kl, NULL);
  if (st) return raise(L, st);
  packed p = {.rows = 1, .cols = n, .total = n, .pos = mrl__obj_buffer(L, n, sizeof(int64_t))};
  for (int64_t i = 0; i < n; i++) {
    p.pos[i] = i;
    if (mask[i] == 0.0f) kl[i] = 0.0f;
  }
  push_scatter(L, &p, kl);
  return 1;
}

/* rl.objective.gae{rewards =, values =, mask = (flat tensors), offsets =, episodes =
 * [, gamma = 1, lambda = 1]} -> adv, returns (flat tensors): GAE (spec 1.1) over the listed
 * episodes' sampled tokens, each episode one row. Observation tokens are transparent: the last
 * action token of a turn bootstraps from the first action token of the next, so rewards must
 * sit on sampled tokens (a turn's reward on its last one). adv is whitened over every sampled
 * token listed; returns = unwhitened advantages + values, the critic's targets. */
static int l_gae(lua_State *L) {
  static const char *const keys[] = {"rewards", "values", "mask", "offsets", "episodes", "gamma",
                                     "lambda", NULL};
  start(L, keys);
  packed p = pack(L, 1);
  const float *f_r = flat_tensor(L, 1, "rewards", p.total, true);
  const float *f_v = flat_tensor(L, 1, "values", p.total, true);
  double gamma = mrl__lua_opt_number(L, 1, "gamma", 1.0);
  double lambda = mrl__lua_opt_number(L, 1, "lambda", 1.0);
  int64_t cells = p.rows * p.cols;
  float *r = gather(L, &p, f_r), *v = gather(L, &p, f_v);
  float *adv = mrl__obj_buffer(L, cells, sizeof(float));
  float *ret = mrl__obj_buffer(L, cells, sizeof(float));
  mrl_status st = mrl_gae(mrl__lua_engine(L), r, v, p.mask, p.rows, p.cols, gamma, lambda, adv,
                          ret);
  if (st) return raise(L, st);
  push_scatter(L, &p, adv);
  push_scatter(L, &p, ret);
  return 2;
}

/* rl.objective.value_loss{values =, old_values =, returns =, mask = (flat tensors), offsets =,
 * episodes = [, clip = 0.5, agg = "token-mean", agg_norm =, coef = 1]} -> stats, dvalues: the
 * clipped critic loss (spec 4.7) times coef over the listed episodes' sampled tokens; stats has
 * loss and clipfrac; dvalues is d loss / d values (flat) for m:backward_batch. */
static int l_value_loss(lua_State *L) {
  static const char *const keys[] = {"values", "old_values", "returns", "mask", "offsets",
                                     "episodes", "clip", "agg", "agg_norm", "coef", NULL};
  start(L, keys);
  packed p = pack(L, 1);
  const float *f_v = flat_tensor(L, 1, "values", p.total, true);
  const float *f_old = flat_tensor(L, 1, "old_values", p.total, true);
  const float *f_ret = flat_tensor(L, 1, "returns", p.total, true);
  mrl_loss_agg agg = (mrl_loss_agg)find_name(L, 1, "agg", mrl__obj_agg_names, "token-mean");
  double norm = mrl__lua_opt_number(L, 1, "agg_norm", 0.0);
  double clip = mrl__lua_opt_number(L, 1, "clip", 0.5);
  double coef = mrl__lua_opt_number(L, 1, "coef", 1.0);
  int64_t cells = p.rows * p.cols;
  float *v = gather(L, &p, f_v), *old = gather(L, &p, f_old), *ret = gather(L, &p, f_ret);
  float *dv = mrl__obj_buffer(L, cells, sizeof(float));
  double loss = 0.0, clipfrac = 0.0;
  mrl_status st = mrl_value_loss(mrl__lua_engine(L), agg, norm, clip, v, old, ret, p.mask, p.rows,
                                 p.cols, &loss, &clipfrac, dv);
  if (st) return raise(L, st);
  for (int64_t c = 0; c < cells; c++) dv[c] = (float)(coef * dv[c]);
  lua_createtable(L, 0, 2);
  set_num(L, "loss", coef * loss);
  set_num(L, "clipfrac", clipfrac);
  push_scatter(L, &p, dv);
  return 2;
}

/* rl.objective.otb{rewards =, mask =, old_logp =, sum_pi_sq = (flat tensors), offsets =,
 * episodes =, groups = {...} [, is_weights =, multi_turn = false, handle_zero_tail = true,
 * epsilon = 1e-8]} -> adv, returns (flat tensors, 0 off the sampled tokens): verl's optimal token
 * baseline over the listed episodes (groups: one prompt-group id per listed episode). Each episode
 * is a row from its first sampled token to its end, observations included, so step t of every
 * episode of a group is the t-th token after the prompt; with multi_turn (verl's
 * tir_optimal_token_baseline) step t is the t-th sampled token. */
static int l_otb(lua_State *L) {
  static const char *const keys[] = {"rewards", "mask", "old_logp", "sum_pi_sq", "offsets",
                                     "episodes", "groups", "is_weights", "multi_turn",
                                     "handle_zero_tail", "epsilon", NULL};
  start(L, keys);
  packed p = pack_layout(L, 1, true);
  const float *f_r = flat_tensor(L, 1, "rewards", p.total, true);
  const float *f_old = flat_tensor(L, 1, "old_logp", p.total, true);
  const float *f_spq = flat_tensor(L, 1, "sum_pi_sq", p.total, true);
  const float *f_isw = flat_tensor(L, 1, "is_weights", p.total, false);
  int64_t *groups = id_list(L, 1, "groups", p.rows, true);
  mrl_otb_opts o;
  mrl_otb_defaults(&o);
  o.multi_turn = opt_boolean(L, 1, "multi_turn", false);
  o.handle_zero_tail = opt_boolean(L, 1, "handle_zero_tail", true);
  o.epsilon = mrl__lua_opt_number(L, 1, "epsilon", o.epsilon);
  int64_t cells = p.rows * p.cols;
  float *r = gather(L, &p, f_r), *old = gather(L, &p, f_old), *spq = gather(L, &p, f_spq);
  float *isw = f_isw ? gather(L, &p, f_isw) : NULL;
  float *adv = mrl__obj_buffer(L, cells, sizeof(float));
  float *ret = mrl__obj_buffer(L, cells, sizeof(float));
  mrl_status st = mrl_optimal_token_baseline(mrl__lua_engine(L), &o, r, p.mask, groups, old, spq,
                                             isw, p.rows, p.cols, adv, ret);
  if (st) return raise(L, st);
  for (int64_t c = 0; c < cells; c++)
    if (p.mask[c] == 0.0f) adv[c] = ret[c] = 0.0f;
  push_scatter(L, &p, adv);
  push_scatter(L, &p, ret);
  return 2;
}

/* ---- rollout correction: verl's threshold specifications ---- */

/* "U" or "L_U" (a number, or two joined by '_'): *upper and *lower (0 when absent). */
static bool parse_band(const char *spec, double *lower, double *upper) {
  char *end;
  double a = strtod(spec, &end);
  if (end == spec) return false;
  if (*end == '_') {
    const char *rest = end + 1;
    double b = strtod(rest, &end);
    if (end == rest || *end) return false;
    *lower = a;
    *upper = b;
    return true;
  }
  if (*end) return false;
  *lower = 0.0;
  *upper = a;
  return true;
}

/* Option key: a number U, or a string "U" or "L_U" of one band; raises naming key otherwise. */
static void opt_band(lua_State *L, int opts, const char *key, double dflt_upper, double *lower,
                     double *upper) {
  int t = lua_getfield(L, opts, key);
  *lower = 0.0;
  *upper = dflt_upper;
  if (t == LUA_TNUMBER) {
    *upper = lua_tonumber(L, -1);
  } else if (t == LUA_TSTRING) {
    if (!parse_band(lua_tostring(L, -1), lower, upper))
      luaL_argerror(L, opts, lua_pushfstring(L, "%s: '%s' is not a threshold (\"U\" or "
                                             "\"L_U\")", key, lua_tostring(L, -1)));
  } else if (t != LUA_TNIL) {
    luaL_argerror(L, opts, lua_pushfstring(L, "%s: a number or a string \"U\" / \"L_U\" "
                                           "expected, got %s", key, luaL_typename(L, -1)));
  }
  lua_pop(L, 1);
}

static const char *const rs_names[] = {"token_k1",    "token_k2",    "token_k3",    "seq_sum_k1",
                                       "seq_sum_k2",  "seq_sum_k3",  "seq_mean_k1", "seq_mean_k2",
                                       "seq_mean_k3", "seq_max_k2",  "seq_max_k3",  "binary_kl",
                                       NULL};

/* Splits the string at the top of the stack at commas into a table of trimmed parts (pushed). */
static void push_parts(lua_State *L, const char *list) {
  lua_newtable(L);
  int n = 0;
  const char *p = list;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    while (len && (*p == ' ' || *p == '\t')) p++, len--;
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    if (len) {
      lua_pushlstring(L, p, len);
      lua_rawseti(L, -2, ++n);
    }
    if (!comma) break;
    p = comma + 1;
  }
}

/* rs (a comma-separated string or a list of names) and rs_threshold (one number or "U" / "L_U"
 * string for all, or a comma-separated string or list of one per criterion) as criteria; *n gets
 * their count (0 without rs). A repeated criterion counts once, as in verl. */
static mrl_rollout_rs *read_rs(lua_State *L, int opts, int64_t *n) {
  *n = 0;
  int t = lua_getfield(L, opts, "rs");
  if (t == LUA_TNIL) {
    lua_pop(L, 1);
    if (lua_getfield(L, opts, "rs_threshold") != LUA_TNIL)
      luaL_argerror(L, opts, "rs_threshold: only with rs");
    lua_pop(L, 1);
    return NULL;
  }
  if (t == LUA_TSTRING) push_parts(L, lua_tostring(L, -1));
  else if (t == LUA_TTABLE) lua_pushvalue(L, -1);
  else luaL_argerror(L, opts, "rs: a string of criteria (\"token_k1,seq_mean_k3\") or a list "
                              "expected");
  int names = lua_gettop(L);
  int64_t count = (int64_t)luaL_len(L, names);
  if (count < 1) luaL_argerror(L, opts, "rs: at least one criterion expected");
  t = lua_getfield(L, opts, "rs_threshold");
  if (t == LUA_TNIL) luaL_argerror(L, opts, "rs_threshold: needed with rs (verl has no default)");
  if (t == LUA_TSTRING) push_parts(L, lua_tostring(L, -1));
  else if (t == LUA_TNUMBER) {
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, 1);
  } else if (t == LUA_TTABLE) lua_pushvalue(L, -1);
  else luaL_argerror(L, opts, "rs_threshold: a number, a string or a list expected");
  int thresholds = lua_gettop(L);
  int64_t n_thr = (int64_t)luaL_len(L, thresholds);
  if (n_thr != 1 && n_thr != count)
    luaL_argerror(L, opts, lua_pushfstring(L, "rs_threshold: one threshold for all criteria or "
                                           "one per criterion (%d) expected, got %d", (int)count,
                                           (int)n_thr));
  mrl_rollout_rs *rs = mrl__obj_buffer(L, count, sizeof *rs);
  for (int64_t j = 0; j < count; j++) {
    lua_geti(L, names, j + 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_argerror(L, opts, lua_pushfstring(L, "rs[%d]: a criterion name expected", (int)j + 1));
    int kind = mrl__obj_option(L, opts, "rs", lua_tostring(L, -1), rs_names);
    lua_pop(L, 1);
    bool seen = false;
    for (int64_t q = 0; q < *n; q++) seen = seen || rs[q].kind == (mrl_rollout_rs_kind)kind;
    lua_geti(L, thresholds, n_thr == 1 ? 1 : j + 1);
    double lower = 0.0, upper = 0.0;
    bool ok = lua_type(L, -1) == LUA_TNUMBER ? (upper = lua_tonumber(L, -1), true)
              : lua_type(L, -1) == LUA_TSTRING ? parse_band(lua_tostring(L, -1), &lower, &upper)
                                               : false;
    bool k1 = kind == MRL_RS_TOKEN_K1 || kind == MRL_RS_SEQ_SUM_K1 || kind == MRL_RS_SEQ_MEAN_K1;
    if (!ok || (!k1 && lower != 0.0))
      luaL_argerror(L, opts, lua_pushfstring(L, "rs_threshold: entry %d is not a threshold of "
                                             "%s (%s)", (int)j + 1, rs_names[kind],
                                             k1 ? "\"U\" or \"L_U\"" : "one upper bound"));
    lua_pop(L, 1);
    if (seen) continue;
    rs[*n].kind = (mrl_rollout_rs_kind)kind;
    rs[*n].upper = upper;
    rs[*n].lower = lower;
    (*n)++;
  }
  lua_replace(L, names - 1); /* the criteria block takes the place of the rs field */
  lua_settop(L, names - 1);
  return rs;
}

/* rl.objective.rollout_correction{logp =, rollout_logp =, mask = (flat tensors), offsets =,
 * episodes = [, is = "token" | "sequence", is_threshold = 2, is_batch_normalize = false, rs =,
 * rs_threshold =]} -> weights (a flat tensor, nil without is), mask (a flat tensor: the mask with
 * the rejected tokens 0), stats: verl's rollout correction of the listed episodes between the
 * policy trained (logp) and the one that sampled (rollout_logp). is_threshold: U truncates the
 * weights at U; "L_U" zeroes those outside [L, U]. rs: criteria as verl names them ("token_k1",
 * "seq_mean_k3", "binary_kl", ...; a comma-separated string or a list), rs_threshold one
 * threshold for all or one per criterion ("L_U" or "U" for the k1 ones, U for the others). */
static int l_rollout_correction(lua_State *L) {
  static const char *const keys[] = {"logp", "rollout_logp", "mask", "offsets", "episodes",
                                     "is", "is_threshold", "is_batch_normalize", "rs",
                                     "rs_threshold", NULL};
  static const char *const levels[] = {"none", "token", "sequence", NULL};
  start(L, keys);
  packed p = pack(L, 1);
  const float *f_logp = flat_tensor(L, 1, "logp", p.total, true);
  const float *f_roll = flat_tensor(L, 1, "rollout_logp", p.total, true);
  mrl_rollout_corr_opts o = {0};
  o.is = (mrl_rollout_is_level)find_name(L, 1, "is", levels, "none");
  opt_band(L, 1, "is_threshold", 2.0, &o.is_lower, &o.is_upper);
  o.is_batch_normalize = opt_boolean(L, 1, "is_batch_normalize", false);
  o.rs = read_rs(L, 1, &o.n_rs);
  int64_t cells = p.rows * p.cols;
  float *logp = gather(L, &p, f_logp), *roll = gather(L, &p, f_roll);
  float *w = mrl__obj_buffer(L, cells, sizeof(float));
  float *m = mrl__obj_buffer(L, cells, sizeof(float));
  mrl_rollout_corr_stats st;
  mrl_status status = mrl_rollout_correction(mrl__lua_engine(L), &o, logp, roll, p.mask, p.rows,
                                             p.cols, w, m, &st);
  if (status) return raise(L, status);
  if (o.is != MRL_ROLLOUT_IS_NONE) push_scatter(L, &p, w);
  else lua_pushnil(L);
  /* the mask: the input's, less the rejected tokens */
  mrl_tensor *mt = flat_mask(L, 1);
  const float *in = mrl_tensor_data(mt);
  for (int64_t c = 0; c < cells; c++) m[c] = p.mask[c] != 0.0f && m[c] == 0.0f ? -1.0f : 0.0f;
  push_scatter(L, &p, m);
  float *out = mrl_tensor_data(mrl__lua_check_tensor(L, -1, "mask"));
  for (int64_t i = 0; i < p.total; i++) out[i] = out[i] < 0.0f ? 0.0f : in[i];
  lua_createtable(L, 0, 8);
  set_num(L, "is_mean", st.is_mean);
  set_num(L, "is_fraction_high", st.is_fraction_high);
  set_num(L, "is_fraction_low", st.is_fraction_low);
  set_num(L, "is_norm_factor", st.is_norm_factor);
  set_num(L, "rs_masked_fraction", st.rs_masked_fraction);
  set_num(L, "rs_seq_masked_fraction", st.rs_seq_masked_fraction);
  set_num(L, "kl", st.kl);
  set_num(L, "k3_kl", st.k3_kl);
  return 3;
}

/* rl.objective.names() -> {loss = {...}, agg = {...}, kl = {...}, advantage = {...}, rs = {...}}:
 * the names rl.objective takes, for a caller that checks options before calling (the trainer). */
static int l_names(lua_State *L) {
  static const char *const keys[] = {NULL};
  if (!lua_isnoneornil(L, 1)) start(L, keys);
  static const struct {
    const char *key;
    const char *const *names;
  } lists[] = {{"loss", loss_names}, {"agg", mrl__obj_agg_names}, {"kl", mrl__obj_kl_names},
               {"rs", rs_names}};
  lua_createtable(L, 0, 5);
  for (size_t j = 0; j < sizeof lists / sizeof lists[0]; j++) {
    lua_newtable(L);
    for (int i = 0; lists[j].names[i]; i++) {
      lua_pushstring(L, lists[j].names[i]);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, lists[j].key);
  }
  lua_newtable(L);
  for (size_t i = 0; i < sizeof outcome_methods / sizeof outcome_methods[0]; i++) {
    lua_pushstring(L, outcome_methods[i].name);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, -2, "advantage");
  return 1;
}

/* rl.objective.overlong{lengths = {...}, max_len =, buffer = [, factor = 1, floor = true]} ->
 * DAPO's soft overlong penalty of each response length (0 up to max_len - buffer, then linear
 * down to -factor at max_len; floored at -factor unless floor is false). */
static int l_overlong(lua_State *L) {
  static const char *const keys[] = {"lengths", "max_len", "buffer", "factor", "floor", NULL};
  start(L, keys);
  int64_t n = -1;
  double *len = num_list(L, 1, "lengths", &n, true);
  int64_t *ilen = mrl__obj_buffer(L, n, sizeof(int64_t));
  for (int64_t i = 0; i < n; i++) ilen[i] = (int64_t)len[i];
  double max_len = mrl__lua_opt_number(L, 1, "max_len", -1);
  double buffer = mrl__lua_opt_number(L, 1, "buffer", -1);
  double factor = mrl__lua_opt_number(L, 1, "factor", 1.0);
  lua_getfield(L, 1, "floor");
  int floor_it = lua_isnil(L, -1) ? 1 : lua_toboolean(L, -1);
  lua_pop(L, 1);
  double *out = mrl__obj_buffer(L, n, sizeof(double));
  mrl_status st = mrl_overlong_penalty(mrl__lua_engine(L), ilen, n, (int64_t)max_len,
                                       (int64_t)buffer, factor, floor_it, out);
  if (st) return raise(L, st);
  mrl__obj_push_doubles(L, out, n);
  return 1;
}

/* ---- TT-OPD (spec 6.12): the teacher's turn-level KL and its EMA ---- */

/* rl.objective.turn_kl{logp =, teacher_logp =, mask =, turns = (flat tensors), offsets =,
 * episodes = [, kind = "k1", coef = 1, turn_weights = {{...}, ...}]} -> stats, dlogp: the
 * turn-level KL of mrl_turn_kl_loss over the listed episodes' sampled tokens (mask 1), each
 * episode one row: per turn (turns: each token's 0-based turn, -1 for none) the mean estimator
 * of logp - teacher_logp, per row the weighted mean of its turns, and the mean over rows.
 * turn_weights: one list per listed episode, entry k the weight of turn k - 1 (turns past the
 * list weigh 1). stats has loss (coef times the KL), kl (the KL), tokens, and per_turn (one table
 * per listed episode, {[k] = the KL of turn k - 1} for its turns with tokens); dlogp is coef
 * times d KL / d logp (flat, for m:backward_batch). */
static int l_turn_kl(lua_State *L) {
  static const char *const keys[] = {"logp", "teacher_logp", "mask", "turns", "offsets",
                                     "episodes", "kind", "coef", "turn_weights", NULL};
  start(L, keys);
  packed p = pack(L, 1);
  const float *f_logp = flat_tensor(L, 1, "logp", p.total, true);
  const float *f_teacher = flat_tensor(L, 1, "teacher_logp", p.total, true);
  const float *f_turns = flat_tensor(L, 1, "turns", p.total, true);
  mrl_kl_kind kind = mrl__obj_kl_kind(L, 1, "kind", mrl__lua_opt_string(L, 1, "kind", "k1"));
  double coef = mrl__lua_opt_number(L, 1, "coef", 1.0);
  if (!isfinite(coef)) return luaL_argerror(L, 1, "coef: a finite number expected");
  int64_t cells = p.rows * p.cols, turns = 1;
  float *logp = gather(L, &p, f_logp), *teacher = gather(L, &p, f_teacher);
  float *tf = gather(L, &p, f_turns);
  int32_t *turn = mrl__obj_buffer(L, cells, sizeof(int32_t));
  for (int64_t c = 0; c < cells; c++) {
    float v = tf[c];
    if (p.pos[c] >= 0 && (v != floorf(v) || v < -1.0f || v >= (float)INT32_MAX))
      return luaL_argerror(L, 1, lua_pushfstring(L, "turns[%I]: %f is not a turn (an integer >= -1)",
                                                 (lua_Integer)p.pos[c] + 1, (double)v));
    turn[c] = p.pos[c] >= 0 ? (int32_t)v : -1;
    if (p.mask[c] != 0.0f && turn[c] + 1 > turns) turns = turn[c] + 1;
  }
  double *weights = NULL;
  if (lua_getfield(L, 1, "turn_weights") != LUA_TNIL) {
    if (!lua_istable(L, -1) || (int64_t)luaL_len(L, -1) != p.rows)
      return luaL_argerror(L, 1, lua_pushfstring(L, "turn_weights: %I lists expected (one per "
                                                 "listed episode)", (lua_Integer)p.rows));
    int list = lua_gettop(L);
    weights = mrl__obj_buffer(L, p.rows * turns, sizeof(double));
    for (int64_t b = 0; b < p.rows; b++) {
      if (lua_geti(L, list, b + 1) != LUA_TTABLE)
        return luaL_argerror(L, 1, lua_pushfstring(L, "turn_weights[%I]: a list of numbers "
                                                   "expected", (lua_Integer)b + 1));
      int64_t len = (int64_t)luaL_len(L, -1);
      for (int64_t k = 0; k < turns; k++) {
        double w = 1.0;
        if (k < len) {
          lua_geti(L, -1, k + 1);
          int ok;
          w = lua_tonumberx(L, -1, &ok);
          lua_pop(L, 1);
          if (!ok || !isfinite(w) || w < 0.0)
            return luaL_argerror(L, 1, lua_pushfstring(L, "turn_weights[%I][%I]: a finite number "
                                                       ">= 0 expected", (lua_Integer)b + 1,
                                                       (lua_Integer)k + 1));
        }
        weights[b * turns + k] = w;
      }
      lua_pop(L, 1);
    }
    lua_replace(L, list); /* keep the weights, drop the list */
  } else {
    lua_pop(L, 1);
  }
  double kl = 0.0, *per_turn = mrl__obj_buffer(L, p.rows * turns, sizeof(double));
  float *dlogp = mrl__obj_buffer(L, cells, sizeof(float));
  mrl_status st = mrl_turn_kl_loss(mrl__lua_engine(L), kind, logp, teacher, p.mask, turn, p.rows,
                                   p.cols, turns, weights, &kl, per_turn, dlogp);
  if (st) return raise(L, st);
  int64_t tokens = 0;
  char *has = mrl__obj_buffer(L, p.rows * turns, 1);
  for (int64_t c = 0; c < cells; c++) {
    dlogp[c] = (float)(coef * dlogp[c]);
    if (p.mask[c] != 0.0f && turn[c] >= 0) {
      tokens++;
      has[(c / p.cols) * turns + turn[c]] = 1;
    }
  }
  lua_createtable(L, 0, 4);
  set_num(L, "loss", coef * kl);
  set_num(L, "kl", kl);
  lua_pushinteger(L, tokens);
  lua_setfield(L, -2, "tokens");
  lua_createtable(L, (int)p.rows, 0);
  for (int64_t b = 0; b < p.rows; b++) {
    lua_newtable(L);
    for (int64_t k = 0; k < turns; k++)
      if (has[b * turns + k]) {
        lua_pushnumber(L, per_turn[b * turns + k]);
        lua_rawseti(L, -2, k + 1);
      }
    lua_rawseti(L, -2, b + 1);
  }
  lua_setfield(L, -2, "per_turn");
  push_scatter(L, &p, dlogp);
  return 2;
}

/* rl.objective.ema{teacher =, student = (tensors of one size, contiguous) [, decay = 0.99]}:
 * in place, teacher = decay teacher + (1 - decay) student (mrl_ema_update); returns teacher. */
static int l_ema(lua_State *L) {
  static const char *const keys[] = {"teacher", "student", "decay", NULL};
  start(L, keys);
  lua_getfield(L, 1, "teacher");
  mrl_tensor *t = mrl__lua_check_tensor(L, -1, "teacher");
  lua_getfield(L, 1, "student");
  mrl_tensor *s = mrl__lua_check_tensor(L, -1, "student");
  if (!mrl_tensor_is_contiguous(t) || !mrl_tensor_is_contiguous(s))
    return luaL_argerror(L, 1, "teacher, student: contiguous tensors expected");
  if (mrl_tensor_numel(t) != mrl_tensor_numel(s))
    return luaL_argerror(L, 1, lua_pushfstring(L, "student: %I elements, teacher has %I",
                                               (lua_Integer)mrl_tensor_numel(s),
                                               (lua_Integer)mrl_tensor_numel(t)));
  double decay = mrl__lua_opt_number(L, 1, "decay", 0.99);
  if (mrl_tensor_numel(t) > 0) {
    mrl_status st = mrl_ema_update(mrl__lua_engine(L), mrl_tensor_data(t), mrl_tensor_data(s),
                                   mrl_tensor_numel(t), decay);
    if (st) return raise(L, st);
  }
  lua_pop(L, 1); /* the teacher stays on top */
  return 1;
}

void mrl__lua_open_objective(lua_State *L) {
  static const luaL_Reg funcs[] = {{"advantage", l_advantage},
                                   {"gigpo", l_gigpo},
                                   {"step_returns", l_step_returns},
                                   {"loss", l_loss},
                                   {"broadcast", l_broadcast},
                                   {"kl", l_kl},
                                   {"overlong", l_overlong},
                                   {"gae", l_gae},
                                   {"value_loss", l_value_loss},
                                   {"otb", l_otb},
                                   {"rollout_correction", l_rollout_correction},
                                   {"names", l_names},
                                   {"turn_kl", l_turn_kl},
                                   {"ema", l_ema},
                                   {NULL, NULL}};
  luaL_newlib(L, funcs);
}
