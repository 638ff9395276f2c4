/* lua_replay.c - moonrl.core.replay: the Lua binding of the replay buffer's arithmetic (replay.c):
 * sampling weights, draws without replacement, and importance ratios over a batch's flat tensors.
 * lua/moonrl/replay.lua (rl.replay) is the buffer built on them. */
#include "lua_objective.h"

#include <math.h>

static int raise(lua_State *L, mrl_status st) { return mrl__lua_raise(L, mrl__lua_engine(L), st, 1); }

/* Field key of the options table at 1: a list of numbers (exactly n when n >= 0; its length goes
 * to *len), in a scratch block left on the stack. */
static double *numbers(lua_State *L, const char *key, int64_t n, int64_t *len) {
  if (lua_getfield(L, 1, key) != LUA_TTABLE)
    luaL_argerror(L, 1, lua_pushfstring(L, "%s: a list of numbers expected", key));
  int list = lua_gettop(L);
  int64_t m = (int64_t)luaL_len(L, list);
  if (n >= 0 && m != n)
    luaL_argerror(L, 1, lua_pushfstring(L, "%s: %I values expected, got %I", key, (lua_Integer)n,
                                        (lua_Integer)m));
  double *out = mrl__obj_buffer(L, m, sizeof *out);
  for (int64_t i = 0; i < m; i++) {
    lua_geti(L, list, i + 1);
    int ok;
    out[i] = lua_tonumberx(L, -1, &ok);
    if (!ok) luaL_argerror(L, 1, lua_pushfstring(L, "%s[%I]: a number expected", key, (lua_Integer)i + 1));
    lua_pop(L, 1);
  }
  lua_replace(L, list);
  if (len) *len = m;
  return out;
}

static int64_t *integers(lua_State *L, const char *key, int64_t n) {
  if (lua_getfield(L, 1, key) != LUA_TTABLE)
    luaL_argerror(L, 1, lua_pushfstring(L, "%s: a list of integers expected", key));
  int list = lua_gettop(L);
  if ((int64_t)luaL_len(L, list) != n)
    luaL_argerror(L, 1, lua_pushfstring(L, "%s: %I integers expected", key, (lua_Integer)n));
  int64_t *out = mrl__obj_buffer(L, n, sizeof *out);
  for (int64_t i = 0; i < n; i++) {
    lua_geti(L, list, i + 1);
    int ok;
    out[i] = (int64_t)lua_tointegerx(L, -1, &ok);
    if (!ok) luaL_argerror(L, 1, lua_pushfstring(L, "%s[%I]: an integer expected", key, (lua_Integer)i + 1));
    lua_pop(L, 1);
  }
  lua_replace(L, list);
  return out;
}

static void start(lua_State *L, const char *const *keys) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstack(L, 24, "replay");
  mrl__obj_check_keys(L, 1, "option", keys);
}

/* core.replay.weights{priority =, age = (lists), alpha = 0.6, decay = math.huge, floor = 1e-6}
 * -> {w1, w2, ...}: max(priority, floor)^alpha * exp(-age / decay). */
static int l_weights(lua_State *L) {
  static const char *const keys[] = {"priority", "age", "alpha", "decay", "floor", NULL};
  start(L, keys);
  int64_t n;
  double *p = numbers(L, "priority", -1, &n), *age = numbers(L, "age", n, NULL);
  double *w = mrl__obj_buffer(L, n, sizeof *w);
  mrl_status st = mrl_replay_weights(mrl__lua_engine(L), p, age, n,
                                     mrl__lua_opt_number(L, 1, "alpha", 0.6),
                                     mrl__lua_opt_number(L, 1, "decay", INFINITY),
                                     mrl__lua_opt_number(L, 1, "floor", 1e-6), w);
  if (st) return raise(L, st);
  mrl__obj_push_doubles(L, w, n);
  return 1;
}

/* core.replay.draw{w =, last =, uniforms = (2k numbers), k =, staleness = 0, beta = 0} ->
 * picks (1-based entry numbers), probs, is_weights, stale (booleans): k distinct entries. */
static int l_draw(lua_State *L) {
  static const char *const keys[] = {"w", "last", "uniforms", "k", "staleness", "beta", NULL};
  start(L, keys);
  int64_t n;
  double *w = numbers(L, "w", -1, &n);
  int64_t *last = integers(L, "last", n);
  lua_Integer k = mrl__lua_opt_integer(L, 1, "k", 0);
  if (k < 0) return luaL_argerror(L, 1, "k: a non-negative integer expected");
  double *u = numbers(L, "uniforms", 2 * (int64_t)k, NULL);
  int64_t *out = mrl__obj_buffer(L, k, sizeof *out);
  double *prob = mrl__obj_buffer(L, k, sizeof *prob), *isw = mrl__obj_buffer(L, k, sizeof *isw);
  uint8_t *stale = mrl__obj_buffer(L, k, sizeof *stale);
  mrl_status st = mrl_replay_draw(mrl__lua_engine(L), w, last, n,
                                  mrl__lua_opt_number(L, 1, "staleness", 0.0),
                                  mrl__lua_opt_number(L, 1, "beta", 0.0), u, (int64_t)k, out, prob,
                                  isw, stale);
  if (st) return raise(L, st);
  lua_createtable(L, (int)k, 0);
  for (lua_Integer j = 0; j < k; j++) {
    lua_pushinteger(L, (lua_Integer)out[j] + 1);
    lua_rawseti(L, -2, j + 1);
  }
  mrl__obj_push_doubles(L, prob, k);
  mrl__obj_push_doubles(L, isw, k);
  lua_createtable(L, (int)k, 0);
  for (lua_Integer j = 0; j < k; j++) {
    lua_pushboolean(L, stale[j]);
    lua_rawseti(L, -2, j + 1);
  }
  return 4;
}

/* A flat 1-D contiguous tensor field of n floats. */
static float *flat(lua_State *L, const char *key, int64_t n) {
  lua_getfield(L, 1, key);
  mrl_tensor *t = mrl__lua_check_tensor(L, -1, key);
  lua_pop(L, 1); /* the options table keeps it alive */
  if (mrl_tensor_rank(t) != 1 || !mrl_tensor_is_contiguous(t) || (n >= 0 && mrl_tensor_numel(t) != n))
    luaL_argerror(L, 1, lua_pushfstring(L, "%s: a contiguous 1-D tensor as long as mask expected", key));
  return mrl_tensor_data(t);
}

/* core.replay.ratios{logp =, behaviour =, mask = (flat tensors), offsets = (episodes + 1
 * integers), cap = math.huge} -> ratios (one per episode), token weights (a flat tensor). */
static int l_ratios(lua_State *L) {
  static const char *const keys[] = {"logp", "behaviour", "mask", "offsets", "cap", NULL};
  start(L, keys);
  lua_getfield(L, 1, "mask");
  mrl_tensor *mt = mrl__lua_check_tensor(L, -1, "mask");
  lua_pop(L, 1);
  if (mrl_tensor_rank(mt) != 1 || !mrl_tensor_is_contiguous(mt))
    return luaL_argerror(L, 1, "mask: a contiguous 1-D tensor expected");
  int64_t total = mrl_tensor_numel(mt);
  const float *mask = mrl_tensor_data(mt);
  const float *logp = flat(L, "logp", total), *beh = flat(L, "behaviour", total);
  if (lua_getfield(L, 1, "offsets") != LUA_TTABLE)
    return luaL_argerror(L, 1, "offsets: a list of integers expected");
  int64_t n_off = (int64_t)luaL_len(L, -1);
  lua_pop(L, 1);
  if (n_off < 1) return luaL_argerror(L, 1, "offsets: at least one entry (0) expected");
  int64_t *off = integers(L, "offsets", n_off);
  if (off[n_off - 1] != total)
    return luaL_argerror(L, 1, "offsets: the last entry must be the token count of mask");
  double *ratio = mrl__obj_buffer(L, n_off - 1, sizeof *ratio);
  mrl_tensor *tw = NULL;
  mrl_status st = mrl_tensor_new(mrl__lua_engine(L), 1, &total, &tw);
  if (st) return raise(L, st);
  mrl__lua_push_tensor(L, tw);
  st = mrl_replay_ratios(mrl__lua_engine(L), logp, beh, mask, off, n_off - 1,
                         mrl__lua_opt_number(L, 1, "cap", INFINITY), ratio, mrl_tensor_data(tw));
  if (st) return raise(L, st);
  mrl__obj_push_doubles(L, ratio, n_off - 1);
  lua_insert(L, -2);
  return 2;
}

void mrl__lua_open_replay(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"weights", l_weights}, {"draw", l_draw}, {"ratios", l_ratios}, {NULL, NULL}};
  luaL_newlib(L, funcs);
}
