/* lua_tensor.c - the Lua tensor class (`moonrl.tensor`): constructors, methods, metamethods.
 *
 * Lua indices and dimensions are 1-based (negative ones count from the end); the C API beneath is
 * 0-based. Tensor memory is allocated by the engine and reported to the Lua collector as it is
 * allocated (lua_gc LUA_GCSTEP), so that garbage tensors are collected at the pace at which tensor
 * memory grows; `__close` and `t:free()` release it at once. */
#include "lua_internal.h"

#include <math.h>
#include <string.h>

/* ---- boxes, checks, errors ---- */

mrl_tensor *mrl__lua_test_tensor(lua_State *L, int idx) {
  mrl_ltensor *b = luaL_testudata(L, idx, MRL_TENSOR_MT);
  return b ? b->t : NULL;
}

mrl_tensor *mrl__lua_check_tensor(lua_State *L, int idx, const char *name) {
  mrl_ltensor *b = luaL_testudata(L, idx, MRL_TENSOR_MT);
  if (!b) {
    const char *got = luaL_typename(L, idx);
    luaL_argerror(L, idx, lua_pushfstring(L, "%s: tensor expected, got %s", name, got));
  }
  if (!b->t) luaL_argerror(L, idx, lua_pushfstring(L, "%s: tensor is closed", name));
  return b->t;
}

static mrl_tensor **new_box(lua_State *L) {
  mrl_ltensor *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->t = NULL;
  luaL_setmetatable(L, MRL_TENSOR_MT);
  return &b->t;
}

void mrl__lua_push_tensor(lua_State *L, mrl_tensor *t) { *new_box(L) = t; }

int mrl__lua_raise(lua_State *L, mrl_engine *e, mrl_status st, int arg) {
  const char *msg = mrl_engine_last_error(e);
  if (!*msg) msg = mrl_strerror(st);
  const char *colon = strstr(msg, ": ");
  if (strncmp(msg, "mrl_", 4) == 0 && colon) msg = colon + 2;
  lua_pushstring(L, msg);
  mrl_engine_clear_error(e);
  msg = lua_tostring(L, -1);
  if (arg > 0) return luaL_argerror(L, arg, msg);
  return luaL_error(L, "%s", msg);
}

/* Tell the collector about new tensor memory, so garbage tensors do not pile up. */
static void charge_gc(lua_State *L, const mrl_tensor *t) {
  int64_t kb = t->numel * (int64_t)sizeof(float) / 1024;
  if (kb > 0) lua_gc(L, LUA_GCSTEP, kb > INT32_MAX ? INT32_MAX : (int)kb);
}

/* Raises on failure; on success charges the collector for the tensor in *fresh, the slot of a
 * newly allocated result (NULL when the result went into the caller's `out`). It takes the slot,
 * not the tensor: callers make the call that fills the slot in the same argument list, and C
 * leaves the order in which arguments are evaluated unspecified. */
static void check_result(lua_State *L, mrl_engine *e, mrl_status st, int arg,
                         mrl_tensor **fresh) {
  if (st) mrl__lua_raise(L, e, st, arg);
  if (fresh && *fresh) charge_gc(L, *fresh);
}

static int check_dim(lua_State *L, int idx, int rank, const char *name) {
  lua_Integer d = luaL_checkinteger(L, idx);
  if (d >= 1 && d <= rank) return (int)d - 1;
  if (d <= -1 && d >= -rank) return (int)(rank + d);
  return luaL_argerror(L, idx,
                       lua_pushfstring(L, "%s: %I is out of range for a rank-%d tensor (1..%d or "
                                       "-%d..-1)", name, d, rank, rank, rank));
}

/* Reads a shape given as a table {2, 3} or as integers from idx on. Returns the rank. */
static int check_shape(lua_State *L, int idx, int64_t *shape, const char *name) {
  int rank;
  if (lua_istable(L, idx)) {
    lua_Integer n = luaL_len(L, idx);
    if (n > MRL_MAX_RANK)
      return luaL_argerror(L, idx, lua_pushfstring(L, "%s: rank %I is above %d", name, n,
                                                   MRL_MAX_RANK));
    rank = (int)n;
    for (int i = 0; i < rank; i++) {
      lua_geti(L, idx, i + 1);
      int isnum;
      lua_Integer v = lua_tointegerx(L, -1, &isnum);
      isnum = isnum && lua_type(L, -1) == LUA_TNUMBER; /* no numeric strings */
      lua_pop(L, 1);
      if (!isnum || v < 0)
        return luaL_argerror(L, idx, lua_pushfstring(L, "%s: entry %d must be a non-negative "
                                                     "integer", name, i + 1));
      shape[i] = v;
    }
    return rank;
  }
  if (lua_isnoneornil(L, idx))
    return luaL_argerror(L, idx, lua_pushfstring(L, "%s: shape table expected, got no value",
                                                 name));
  rank = lua_gettop(L) - idx + 1;
  if (rank > MRL_MAX_RANK)
    return luaL_argerror(L, idx, lua_pushfstring(L, "%s: rank %d is above %d", name, rank,
                                                 MRL_MAX_RANK));
  for (int i = 0; i < rank; i++) {
    int isnum;
    lua_Integer v = lua_tointegerx(L, idx + i, &isnum);
    if (!isnum || v < 0 || lua_type(L, idx + i) != LUA_TNUMBER)
      return luaL_argerror(L, idx + i,
                           lua_pushfstring(L, "%s: non-negative integer expected, got %s", name,
                                           luaL_typename(L, idx + i)));
    shape[i] = v;
  }
  return rank;
}

static void push_shape(lua_State *L, int rank, const int64_t *v) {
  lua_createtable(L, rank, 0);
  for (int i = 0; i < rank; i++) {
    lua_pushinteger(L, v[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

/* ---- constructors (upvalue 1: nothing; the engine comes from the registry) ---- */

static mrl_tensor *new_filled(lua_State *L, int shape_idx, float value) {
  int64_t shape[MRL_MAX_RANK];
  int rank = check_shape(L, shape_idx, shape, "shape");
  mrl_engine *e = mrl__lua_engine(L);
  mrl_tensor **slot = new_box(L);
  mrl_status st = mrl_tensor_new(e, rank, shape, slot);
  check_result(L, e, st, shape_idx, slot);
  if (value != 0.0f) mrl_tensor_fill(*slot, value);
  return *slot;
}

static int l_zeros(lua_State *L) {
  new_filled(L, 1, 0.0f);
  return 1;
}

static int l_ones(lua_State *L) {
  new_filled(L, 1, 1.0f);
  return 1;
}

static int l_full(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  float v = (float)luaL_checknumber(L, 2);
  lua_settop(L, 1);
  mrl_tensor *t = new_filled(L, 1, 0.0f);
  mrl_tensor_fill(t, v);
  return 1;
}

/* rl.tensor.randn(shape [, seed]) / rand(shape [, seed]): without a seed, the engine's RNG. */
static int random_tensor(lua_State *L, bool normal) {
  luaL_checktype(L, 1, LUA_TTABLE);
  bool seeded = !lua_isnoneornil(L, 2);
  lua_Integer seed = seeded ? luaL_checkinteger(L, 2) : 0;
  lua_settop(L, 1);
  mrl_tensor *t = new_filled(L, 1, 0.0f);
  struct mrl_rng r;
  struct mrl_rng *rng = NULL;
  if (seeded) {
    mrl__rng_seed(&r, (uint64_t)seed);
    rng = &r;
  }
  if (normal)
    mrl_tensor_rand_normal(t, rng, 0.0f, 1.0f);
  else
    mrl_tensor_rand_uniform(t, rng, 0.0f, 1.0f);
  return 1;
}

static int l_randn(lua_State *L) { return random_tensor(L, true); }
static int l_rand(lua_State *L) { return random_tensor(L, false); }

/* rl.tensor.arange(stop) or arange(start, stop [, step]): start, start+step, ... below stop. */
static int l_arange(lua_State *L) {
  double start = 0, stop, step = 1;
  if (lua_isnoneornil(L, 2)) {
    stop = luaL_checknumber(L, 1);
  } else {
    start = luaL_checknumber(L, 1);
    stop = luaL_checknumber(L, 2);
    step = luaL_optnumber(L, 3, 1.0);
  }
  bool one_arg = lua_isnoneornil(L, 2);
  if (step == 0 || !isfinite(step)) return luaL_argerror(L, 3, "step: must be finite and non-zero");
  if (!isfinite(start)) return luaL_argerror(L, 1, "start: must be finite");
  if (!isfinite(stop)) return luaL_argerror(L, one_arg ? 1 : 2, "stop: must be finite");
  double count = ceil((stop - start) / step);
  if (count < 0) count = 0;
  if (count > 1e15) return luaL_argerror(L, one_arg ? 1 : 2, "stop: too many elements");
  int64_t n = (int64_t)count;
  mrl_engine *e = mrl__lua_engine(L);
  mrl_tensor **slot = new_box(L);
  check_result(L, e, mrl_tensor_new(e, 1, &n, slot), 1, slot);
  mrl_tensor_arange(*slot, start, step);
  return 1;
}

/* ---- nested tables ---- */

/* Reading a nested table of numbers given as argument `arg` (named `name` in messages) into a
 * row-major buffer of floats, or of doubles when `dbl` is set. */
typedef struct {
  lua_State *L;
  int arg;
  const char *name;
  int rank;
  int64_t shape[MRL_MAX_RANK];
  void *dst;
  bool dbl;
  char path[200]; /* "[2][3]": where the element being read sits, for messages */
} nested_reader;

/* Walks the first elements of the nested table at r->arg to find its shape. */
static void nested_shape(nested_reader *r) {
  lua_State *L = r->L;
  r->rank = 0;
  lua_pushvalue(L, r->arg);
  while (lua_istable(L, -1)) {
    if (r->rank == MRL_MAX_RANK)
      luaL_argerror(L, r->arg, lua_pushfstring(L, "%s: nested deeper than %d levels", r->name,
                                               MRL_MAX_RANK));
    r->shape[r->rank++] = (int64_t)luaL_len(L, -1);
    lua_geti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
}

static void nested_store(nested_reader *r, lua_Number v) {
  if (r->dbl) {
    double *p = r->dst;
    *p = v;
    r->dst = p + 1;
  } else {
    float *p = r->dst;
    *p = (float)v;
    r->dst = p + 1;
  }
}

/* Copies the table on top of the stack, level d of the nested table, path length plen. */
static void nested_read_level(nested_reader *r, int d, size_t plen) {
  lua_State *L = r->L;
  int top = lua_gettop(L);
  if (!lua_istable(L, top) || luaL_len(L, top) != r->shape[d]) {
    const char *what = lua_istable(L, top) ? "has a different length" : "is not a table";
    luaL_argerror(L, r->arg, lua_pushfstring(L, "%s: ragged nested table: element %s %s "
                                             "(expected %I entries)", r->name,
                                             plen ? r->path : "(top)", what,
                                             (lua_Integer)r->shape[d]));
  }
  for (int64_t i = 0; i < r->shape[d]; i++) {
    lua_geti(L, top, i + 1);
    int n = snprintf(r->path + plen, sizeof r->path - plen, "[%lld]", (long long)i + 1);
    size_t sub = plen + (n > 0 && (size_t)n < sizeof r->path - plen ? (size_t)n : 0);
    if (d + 1 < r->rank) {
      nested_read_level(r, d + 1, sub);
    } else {
      if (lua_type(L, -1) != LUA_TNUMBER)
        luaL_argerror(L, r->arg, lua_pushfstring(L, "%s: element %s is %s, expected a number",
                                                 r->name, r->path, luaL_typename(L, -1)));
      nested_store(r, lua_tonumber(L, -1));
    }
    lua_pop(L, 1);
  }
}

/* Copies the nested table at r->arg (whose shape nested_shape found) into dst. */
static void nested_read(nested_reader *r, void *dst) {
  r->dst = dst;
  r->path[0] = '\0';
  lua_pushvalue(r->L, r->arg);
  nested_read_level(r, 0, 0);
  lua_pop(r->L, 1);
}

/* rl.tensor.from(nested_table or number) */
static int l_from(lua_State *L) {
  mrl_engine *e = mrl__lua_engine(L);
  if (lua_type(L, 1) == LUA_TNUMBER) {
    float v = (float)lua_tonumber(L, 1);
    mrl_tensor **slot = new_box(L);
    check_result(L, e, mrl_tensor_scalar(e, v, slot), 1, slot);
    return 1;
  }
  if (!lua_istable(L, 1))
    return luaL_argerror(L, 1, lua_pushfstring(L, "data: nested table of numbers expected, got "
                                               "%s", luaL_typename(L, 1)));
  nested_reader r = {.L = L, .arg = 1, .name = "data", .dbl = false};
  nested_shape(&r);
  mrl_tensor **slot = new_box(L);
  check_result(L, e, mrl_tensor_new(e, r.rank, r.shape, slot), 1, slot);
  nested_read(&r, mrl_tensor_data(*slot));
  return 1;
}

static void push_nested(lua_State *L, const mrl_tensor *t, int d, const float *p) {
  if (d == t->rank) {
    lua_pushnumber(L, *p);
    return;
  }
  luaL_checkstack(L, 3, "tensor nesting");
  lua_createtable(L, (int)t->shape[d], 0);
  for (int64_t i = 0; i < t->shape[d]; i++) {
    push_nested(L, t, d + 1, p + i * t->stride[d]);
    lua_rawseti(L, -2, i + 1);
  }
}

static int m_totable(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  push_nested(L, t, 0, t->data);
  return 1;
}

/* ---- queries ---- */

static int m_shape(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  push_shape(L, t->rank, t->shape);
  return 1;
}

static int m_stride(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  push_shape(L, t->rank, t->stride);
  return 1;
}

static int m_size(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  if (lua_isnoneornil(L, 2)) {
    push_shape(L, t->rank, t->shape);
    return 1;
  }
  lua_pushinteger(L, t->shape[check_dim(L, 2, t->rank, "dim")]);
  return 1;
}

static int m_dim(lua_State *L) {
  lua_pushinteger(L, mrl__lua_check_tensor(L, 1, "self")->rank);
  return 1;
}

static int m_numel(lua_State *L) {
  lua_pushinteger(L, mrl__lua_check_tensor(L, 1, "self")->numel);
  return 1;
}

static int m_is_contiguous(lua_State *L) {
  lua_pushboolean(L, mrl_tensor_is_contiguous(mrl__lua_check_tensor(L, 1, "self")));
  return 1;
}

/* Reads rank 1-based indices from idx on into 0-based index. */
static void check_index(lua_State *L, int idx, const mrl_tensor *t, int64_t *index) {
  for (int i = 0; i < t->rank; i++) {
    lua_Integer v = luaL_checkinteger(L, idx + i);
    if (v < 1 || v > t->shape[i])
      luaL_argerror(L, idx + i, lua_pushfstring(L, "index %I is outside 1..%I of dimension %d",
                                                v, (lua_Integer)t->shape[i], i + 1));
    index[i] = v - 1;
  }
}

static int m_get(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  if (lua_gettop(L) - 1 != t->rank)
    return luaL_error(L, "get: expected %d indices for a rank-%d tensor, got %d", t->rank,
                      t->rank, lua_gettop(L) - 1);
  int64_t index[MRL_MAX_RANK];
  check_index(L, 2, t, index);
  float v;
  mrl_tensor_get(t, index, &v);
  lua_pushnumber(L, v);
  return 1;
}

static int m_set(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  int n = lua_gettop(L);
  if (n - 2 != t->rank)
    return luaL_error(L, "set: expected %d indices and a value for a rank-%d tensor, got %d "
                      "arguments", t->rank, t->rank, n - 1);
  int64_t index[MRL_MAX_RANK];
  check_index(L, 2, t, index);
  mrl_tensor_set(t, index, (float)luaL_checknumber(L, n));
  lua_settop(L, 1);
  return 1;
}

/* ---- views ---- */

/* Returns the new view on the stack, or raises the failure as an error on argument arg. */
static int view_result(lua_State *L, const mrl_tensor *t, mrl_status st, int arg) {
  if (st) return mrl__lua_raise(L, mrl__engine_of(t), st, arg);
  return 1;
}

static int m_narrow(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  int d = check_dim(L, 2, t->rank, "dim");
  lua_Integer start = luaL_checkinteger(L, 3), len = luaL_checkinteger(L, 4);
  lua_Integer n = t->shape[d];
  if (start < 1 || start > n + 1 || len < 0 || len > n - (start - 1))
    return luaL_argerror(L, 3, lua_pushfstring(L, "start %I, length %I do not fit dimension %d "
                                               "of size %I", start, len, d + 1, n));
  mrl_tensor **slot = new_box(L);
  return view_result(L, t, mrl_tensor_narrow(t, d, start - 1, len, slot), 3);
}

/* t:slice(dim, i [, j [, step]]): entries i..j inclusive like string.sub (negatives count from
 * the end, j defaults to -1). */
static int m_slice(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  int d = check_dim(L, 2, t->rank, "dim");
  int64_t n = t->shape[d];
  lua_Integer i = luaL_checkinteger(L, 3), j = luaL_optinteger(L, 4, -1);
  lua_Integer step = luaL_optinteger(L, 5, 1);
  if (step <= 0) return luaL_argerror(L, 5, "step: must be positive");
  if (i < 0) i += n + 1;
  if (j < 0) j += n + 1;
  if (i < 1) i = 1;
  if (j > n) j = n;
  int64_t start = i - 1, stop = j >= i ? j : start;
  if (start > n) start = stop = n;
  mrl_tensor **slot = new_box(L);
  return view_result(L, t, mrl_tensor_slice(t, d, start, stop, step, slot), 3);
}

static int m_select(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  int d = check_dim(L, 2, t->rank, "dim");
  lua_Integer i = luaL_checkinteger(L, 3);
  int64_t n = t->shape[d];
  if (i < 1 ? (i < -n || i == 0) : i > n)
    return luaL_argerror(L, 3, lua_pushfstring(L, "index %I is outside 1..%I", i,
                                               (lua_Integer)n));
  mrl_tensor **slot = new_box(L);
  return view_result(L, t, mrl_tensor_select(t, d, i > 0 ? i - 1 : i, slot), 3);
}

static int m_transpose(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  if (t->rank < 2 && lua_isnoneornil(L, 2))
    return luaL_argerror(L, 1, "self: transpose needs a tensor of rank >= 2");
  int d0 = lua_isnoneornil(L, 2) ? t->rank - 2 : check_dim(L, 2, t->rank, "dim1");
  int d1 = lua_isnoneornil(L, 3) ? t->rank - 1 : check_dim(L, 3, t->rank, "dim2");
  mrl_tensor **slot = new_box(L);
  return view_result(L, t, mrl_tensor_transpose(t, d0, d1, slot), 2);
}

static int m_permute(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  int perm[MRL_MAX_RANK];
  bool table = lua_istable(L, 2);
  int n = table ? (int)luaL_len(L, 2) : lua_gettop(L) - 1;
  if (n != t->rank)
    return luaL_argerror(L, 2, lua_pushfstring(L, "perm: expected %d dimensions, got %d",
                                               t->rank, n));
  bool seen[MRL_MAX_RANK] = {false};
  for (int i = 0; i < n; i++) {
    if (table) {
      lua_geti(L, 2, i + 1);
      int isint;
      lua_Integer v = lua_tointegerx(L, -1, &isint);
      lua_pop(L, 1);
      if (!isint || v == 0 || v < -t->rank || v > t->rank)
        return luaL_argerror(L, 2, lua_pushfstring(L, "perm: entry %d must be a dim in 1..%d or "
                                                   "-%d..-1", i + 1, t->rank, t->rank));
      perm[i] = v > 0 ? (int)v - 1 : t->rank + (int)v;
    } else {
      perm[i] = check_dim(L, i + 2, t->rank, "perm entry");
    }
    if (seen[perm[i]])
      return luaL_argerror(L, table ? 2 : i + 2,
                           lua_pushfstring(L, "perm: dimension %d is named twice", perm[i] + 1));
    seen[perm[i]] = true;
  }
  mrl_tensor **slot = new_box(L);
  return view_result(L, t, mrl_tensor_permute(t, perm, slot), 2);
}

static int m_reshape(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  int64_t shape[MRL_MAX_RANK];
  int rank;
  if (lua_istable(L, 2)) {
    rank = (int)luaL_len(L, 2);
    if (rank > MRL_MAX_RANK) return luaL_argerror(L, 2, "shape: rank above 8");
    for (int i = 0; i < rank; i++) {
      lua_geti(L, 2, i + 1);
      int ok;
      shape[i] = lua_tointegerx(L, -1, &ok);
      ok = ok && lua_type(L, -1) == LUA_TNUMBER;
      lua_pop(L, 1);
      if (!ok) return luaL_argerror(L, 2, "shape: entries must be integers (-1 to infer one)");
    }
  } else {
    rank = lua_gettop(L) - 1;
    if (rank > MRL_MAX_RANK) return luaL_argerror(L, 2, "shape: rank above 8");
    for (int i = 0; i < rank; i++) shape[i] = luaL_checkinteger(L, i + 2);
  }
  mrl_tensor **slot = new_box(L);
  mrl_status st = mrl_tensor_reshape(t, rank, shape, slot);
  if (st) return mrl__lua_raise(L, mrl__engine_of(t), st, 2);
  if (!mrl_tensor_shares_storage(t, *slot)) charge_gc(L, *slot);
  return 1;
}

static int m_contiguous(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  mrl_tensor **slot = new_box(L);
  mrl_status st = mrl_tensor_contiguous(t, slot);
  if (st) return mrl__lua_raise(L, mrl__engine_of(t), st, 0);
  if (!mrl_tensor_shares_storage(t, *slot)) charge_gc(L, *slot);
  return 1;
}

static int m_clone(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  mrl_tensor **slot = new_box(L);
  check_result(L, mrl__engine_of(t), mrl_tensor_clone(t, slot), 0, slot);
  return 1;
}

/* ---- in-place fills ---- */

static int m_copy(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  mrl_tensor *src = mrl__lua_check_tensor(L, 2, "src");
  mrl_status st = mrl_tensor_copy(t, src);
  if (st) return mrl__lua_raise(L, mrl__engine_of(t), st, 2);
  lua_settop(L, 1);
  return 1;
}

static int m_fill(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  mrl_tensor_fill(t, (float)luaL_checknumber(L, 2));
  lua_settop(L, 1);
  return 1;
}

/* ---- elementwise ---- */

/* The result slot: the `out` argument at out_idx when given (pushed as the return value, and
 * stored in *given), or a new box (*given stays NULL: the result will be newly allocated). */
static mrl_tensor **result_slot(lua_State *L, int out_idx, mrl_tensor **given) {
  if (lua_isnoneornil(L, out_idx)) return new_box(L);
  *given = mrl__lua_check_tensor(L, out_idx, "out");
  lua_pushvalue(L, out_idx);
  return given;
}

typedef mrl_status (*binary_fn)(mrl_tensor **, const mrl_tensor *, const mrl_tensor *);
typedef mrl_status (*unary_fn)(mrl_tensor **, const mrl_tensor *);

/* The tensor at idx; a number there becomes a rank-0 tensor (which broadcasts) and replaces the
 * number on the stack, so that the collector owns it even if a later step raises. */
static mrl_tensor *operand(lua_State *L, int idx, mrl_engine *e, const char *name) {
  if (lua_type(L, idx) == LUA_TNUMBER) {
    float v = (float)lua_tonumber(L, idx);
    mrl_tensor **slot = new_box(L);
    mrl_status st = mrl_tensor_scalar(e, v, slot);
    if (st) mrl__lua_raise(L, e, st, idx);
    lua_replace(L, idx);
    return *slot;
  }
  mrl_ltensor *b = luaL_testudata(L, idx, MRL_TENSOR_MT);
  if (!b || !b->t)
    luaL_argerror(L, idx, lua_pushfstring(L, "%s: tensor or number expected, got %s", name,
                                          b ? "a closed tensor" : luaL_typename(L, idx)));
  return b->t;
}

static int binary_op(lua_State *L, binary_fn f) {
  mrl_tensor *self = mrl__lua_test_tensor(L, 1);
  mrl_tensor *other = mrl__lua_test_tensor(L, 2);
  mrl_engine *e = mrl__engine_of(self ? self : other);
  if (!e) e = mrl__lua_engine(L);
  mrl_tensor *a = operand(L, 1, e, "self");
  mrl_tensor *b = operand(L, 2, e, "other");
  mrl_tensor *given = NULL;
  mrl_tensor **slot = result_slot(L, 3, &given);
  mrl_status st = f(slot, a, b);
  if (st) {
    /* when the operands fit each other, what is left to blame is `out` */
    int rank;
    int64_t shape[MRL_MAX_RANK];
    bool fit = mrl__broadcast_shape(NULL, "", a, b, &rank, shape) == MRL_OK;
    mrl__lua_raise(L, e, st, given && fit ? 3 : 2);
  }
  check_result(L, e, st, 2, given ? NULL : slot);
  return 1;
}

static int unary_op(lua_State *L, unary_fn f) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self"), *given = NULL;
  mrl_tensor **slot = result_slot(L, 2, &given);
  check_result(L, mrl__engine_of(t), f(slot, t), 2, given ? NULL : slot);
  return 1;
}

static int m_add(lua_State *L) { return binary_op(L, mrl_tensor_add); }
static int m_sub(lua_State *L) { return binary_op(L, mrl_tensor_sub); }
static int m_mul(lua_State *L) { return binary_op(L, mrl_tensor_mul); }
static int m_div(lua_State *L) { return binary_op(L, mrl_tensor_div); }
static int m_neg(lua_State *L) { return unary_op(L, mrl_tensor_neg); }
static int m_exp(lua_State *L) { return unary_op(L, mrl_tensor_exp); }
static int m_log(lua_State *L) { return unary_op(L, mrl_tensor_log); }
static int m_tanh(lua_State *L) { return unary_op(L, mrl_tensor_tanh); }
static int m_silu(lua_State *L) { return unary_op(L, mrl_tensor_silu); }
static int m_softmax(lua_State *L) { return unary_op(L, mrl_tensor_softmax); }
static int m_log_softmax(lua_State *L) { return unary_op(L, mrl_tensor_log_softmax); }

static int m_scale(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self"), *given = NULL;
  float alpha = (float)luaL_checknumber(L, 2);
  mrl_tensor **slot = result_slot(L, 3, &given);
  check_result(L, mrl__engine_of(t), mrl_tensor_scale(slot, t, alpha), 3, given ? NULL : slot);
  return 1;
}

/* `-t` arrives as __unm(t, t): ignore the second operand. */
static int mm_unm(lua_State *L) {
  lua_settop(L, 1);
  return unary_op(L, mrl_tensor_neg);
}

/* ---- reductions ---- */

typedef mrl_status (*reduce_fn)(mrl_tensor **, const mrl_tensor *, int, int);

/* t:sum() -> number; t:sum(dim [, keepdim]) -> tensor. Same for mean. */
static int reduce(lua_State *L, reduce_fn f, bool mean) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  if (lua_isnoneornil(L, 2)) {
    double v;
    if (mean)
      mrl_tensor_mean_all(t, &v);
    else
      mrl_tensor_sum_all(t, &v);
    lua_pushnumber(L, v);
    return 1;
  }
  int d = check_dim(L, 2, t->rank, "dim");
  int keep = lua_toboolean(L, 3);
  mrl_tensor **slot = new_box(L);
  check_result(L, mrl__engine_of(t), f(slot, t, d, keep), 2, slot);
  return 1;
}

static int m_sum(lua_State *L) { return reduce(L, mrl_tensor_sum, false); }
static int m_mean(lua_State *L) { return reduce(L, mrl_tensor_mean, true); }

static void to_one_based(mrl_tensor *idx) {
  float *p = mrl_tensor_data(idx);
  for (int64_t i = 0; i < idx->numel; i++) p[i] += 1.0f;
}

/* t:max() -> value, flat index; t:max(dim [, keepdim]) -> values, indices; t:argmax(...) returns
 * only the indices. Indices are 1-based. */
static int max_or_argmax(lua_State *L, bool values) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  mrl_engine *e = mrl__engine_of(t);
  if (lua_isnoneornil(L, 2)) {
    float v;
    int64_t i;
    mrl_status st = mrl_tensor_max_all(t, &v, &i);
    if (st) return mrl__lua_raise(L, e, st, 1);
    if (values) lua_pushnumber(L, v);
    lua_pushinteger(L, i + 1);
    return values ? 2 : 1;
  }
  int d = check_dim(L, 2, t->rank, "dim");
  int keep = lua_toboolean(L, 3);
  if (values) {
    mrl_tensor **vals = new_box(L);
    check_result(L, e, mrl_tensor_max(vals, t, d, keep), 1, vals);
  }
  mrl_tensor **idx = new_box(L);
  check_result(L, e, mrl_tensor_argmax(idx, t, d, keep), 1, idx);
  to_one_based(*idx);
  return values ? 2 : 1;
}

static int m_max(lua_State *L) { return max_or_argmax(L, true); }
static int m_argmax(lua_State *L) { return max_or_argmax(L, false); }

/* ---- matmul ---- */

/* a:matmul(b [, {trans_a=, trans_b=, out=}]) and rl.tensor.matmul(a, b [, opts]) */
static int m_matmul(lua_State *L) {
  mrl_tensor *a = mrl__lua_check_tensor(L, 1, "self");
  mrl_tensor *b = mrl__lua_check_tensor(L, 2, "other");
  int flags = 0;
  mrl_tensor *given = NULL;
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    if (lua_getfield(L, 3, "trans_a") != LUA_TNIL && lua_toboolean(L, -1)) flags |= MRL_TRANS_A;
    if (lua_getfield(L, 3, "trans_b") != LUA_TNIL && lua_toboolean(L, -1)) flags |= MRL_TRANS_B;
    if (lua_getfield(L, 3, "out") != LUA_TNIL) {
      mrl_ltensor *o = luaL_testudata(L, -1, MRL_TENSOR_MT);
      if (!o || !o->t) return luaL_argerror(L, 3, "opts.out: open tensor expected");
      given = o->t;
    }
    lua_pop(L, 3);
  }
  mrl_tensor **slot;
  if (given) {
    lua_getfield(L, 3, "out");
    slot = &given;
  } else {
    slot = new_box(L);
  }
  mrl_status st = mrl_tensor_matmul(slot, a, b, flags);
  if (st) {
    /* when the operands fit each other, what is left to blame is opts.out */
    int rank;
    int64_t shape[MRL_MAX_RANK];
    bool fit = mrl__matmul_shape(NULL, "", a, b, flags, &rank, shape) == MRL_OK;
    mrl__lua_raise(L, mrl__engine_of(a), st, given && fit ? 3 : 2);
  }
  check_result(L, mrl__engine_of(a), st, 2, given ? NULL : slot);
  return 1;
}

/* ---- gather / index_select ---- */

/* Reads 1-based integer indices from a (nested) table or a tensor into a 0-based array owned by
 * a userdata left on the stack. Fills shape and rank. */
static int64_t *read_indices(lua_State *L, int idx, int64_t *shape, int *rank, int64_t *count) {
  mrl_ltensor *box = luaL_testudata(L, idx, MRL_TENSOR_MT);
  if (box && !box->t) luaL_argerror(L, idx, "index: tensor is closed");
  mrl_tensor *t = box ? box->t : NULL;
  nested_reader r = {.L = L, .arg = idx, .name = "index", .dbl = true};
  if (t) {
    r.rank = t->rank;
    memcpy(r.shape, t->shape, sizeof(int64_t) * (size_t)t->rank);
  } else if (lua_istable(L, idx)) {
    nested_shape(&r);
  } else {
    luaL_argerror(L, idx, lua_pushfstring(L, "index: table or tensor of integers expected, got "
                                          "%s", luaL_typename(L, idx)));
  }
  int64_t n;
  if (!mrl__numel(r.rank, r.shape, &n) || (uint64_t)n > SIZE_MAX / sizeof(double))
    luaL_argerror(L, idx, "index: too many entries");
  int64_t *out = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof(int64_t), 0);
  double *vals = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof(double), 0);
  if (t) {
    mrl_index_iter it;
    mrl__iter_init(&it, t->rank, t->shape);
    for (int64_t k = 0; k < n; k++, mrl__iter_next(&it))
      vals[k] = t->data[mrl__offset(t->stride, it.idx, t->rank)];
  } else {
    nested_read(&r, vals);
  }
  for (int64_t i = 0; i < n; i++) {
    if (!(vals[i] >= -9.2e18 && vals[i] <= 9.2e18) || vals[i] != floor(vals[i]))
      luaL_argerror(L, idx, "index: entries must be integers");
    out[i] = (int64_t)vals[i] - 1;
  }
  lua_pop(L, 1);
  *rank = r.rank;
  memcpy(shape, r.shape, sizeof(int64_t) * (size_t)r.rank);
  *count = n;
  return out;
}

/* Raises unless every 0-based index is below n, naming the entry and its value 1-based. */
static void check_index_range(lua_State *L, int arg, const int64_t *index, int64_t count,
                              int64_t n) {
  for (int64_t i = 0; i < count; i++)
    if (index[i] < 0 || index[i] >= n)
      luaL_argerror(L, arg, lua_pushfstring(L, "index: entry %I is %I, outside 1..%I",
                                            (lua_Integer)i + 1, (lua_Integer)index[i] + 1,
                                            (lua_Integer)n));
}

static int m_index_select(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  int d = check_dim(L, 2, t->rank, "dim");
  int64_t shape[MRL_MAX_RANK], n;
  int rank;
  int64_t *index = read_indices(L, 3, shape, &rank, &n);
  if (rank != 1) return luaL_argerror(L, 3, "index: a flat list of indices expected");
  check_index_range(L, 3, index, n, t->shape[d]);
  mrl_tensor **slot = new_box(L);
  check_result(L, mrl__engine_of(t), mrl_tensor_index_select(slot, t, d, index, n), 3, slot);
  return 1;
}

static int m_gather(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  int d = check_dim(L, 2, t->rank, "dim");
  int64_t shape[MRL_MAX_RANK], n;
  int rank;
  int64_t *index = read_indices(L, 3, shape, &rank, &n);
  if (rank != t->rank)
    return luaL_argerror(L, 3, lua_pushfstring(L, "index: rank %d expected (same as self), got "
                                               "%d", t->rank, rank));
  for (int i = 0; i < rank; i++)
    if (i != d && shape[i] > t->shape[i])
      return luaL_argerror(L, 3, lua_pushfstring(L, "index: size %I of dimension %d is larger "
                                                 "than self's %I", (lua_Integer)shape[i], i + 1,
                                                 (lua_Integer)t->shape[i]));
  check_index_range(L, 3, index, n, t->shape[d]);
  mrl_tensor **slot = new_box(L);
  check_result(L, mrl__engine_of(t), mrl_tensor_gather(slot, t, d, index, shape), 3, slot);
  return 1;
}

/* ---- comparisons ---- */

static int m_allclose(lua_State *L) {
  mrl_tensor *a = mrl__lua_check_tensor(L, 1, "self");
  mrl_tensor *b = mrl__lua_check_tensor(L, 2, "other");
  double rtol = luaL_optnumber(L, 3, 1e-5), atol = luaL_optnumber(L, 4, 1e-8);
  int r;
  mrl_status st = mrl_tensor_allclose(a, b, rtol, atol, &r);
  if (st) return mrl__lua_raise(L, mrl__engine_of(a), st, 3);
  lua_pushboolean(L, r);
  return 1;
}

static int m_max_abs_diff(lua_State *L) {
  mrl_tensor *a = mrl__lua_check_tensor(L, 1, "self");
  mrl_tensor *b = mrl__lua_check_tensor(L, 2, "other");
  double d;
  mrl_status st = mrl_tensor_max_abs_diff(a, b, &d);
  if (st) return mrl__lua_raise(L, mrl__engine_of(a), st, 2);
  lua_pushnumber(L, d);
  return 1;
}

/* ---- lifetime and metamethods ---- */

static int m_free(lua_State *L) {
  mrl_ltensor *b = luaL_checkudata(L, 1, MRL_TENSOR_MT);
  mrl_tensor_free(b->t);
  b->t = NULL;
  return 0;
}

static int m_is_closed(lua_State *L) {
  mrl_ltensor *b = luaL_checkudata(L, 1, MRL_TENSOR_MT);
  lua_pushboolean(L, b->t == NULL);
  return 1;
}

static int mm_tostring(lua_State *L) {
  mrl_ltensor *b = luaL_checkudata(L, 1, MRL_TENSOR_MT);
  if (!b->t) {
    lua_pushstring(L, "tensor(closed)");
    return 1;
  }
  size_t len;
  mrl_tensor_format(b->t, NULL, 0, &len);
  luaL_Buffer buf;
  char *p = luaL_buffinitsize(L, &buf, len + 1);
  mrl_tensor_format(b->t, p, len + 1, NULL);
  luaL_pushresultsize(&buf, len);
  return 1;
}

static int mm_len(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  if (t->rank == 0) return luaL_error(L, "a scalar tensor has no length (use t:numel())");
  lua_pushinteger(L, t->shape[0]);
  return 1;
}

/* t[i]: a number for rank 1, a view of row i otherwise; t.name: a method. */
static int mm_index(lua_State *L) {
  if (lua_type(L, 2) == LUA_TNUMBER) {
    mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
    if (t->rank == 0) return luaL_error(L, "cannot index a scalar tensor (use t:get())");
    int isint;
    lua_Integer i = lua_tointegerx(L, 2, &isint);
    if (!isint) return luaL_error(L, "index %s is not an integer", lua_tostring(L, 2));
    if (i < 1 || i > t->shape[0])
      return luaL_error(L, "index %I is outside 1..%I", i, (lua_Integer)t->shape[0]);
    if (t->rank == 1) {
      lua_pushnumber(L, t->data[(i - 1) * t->stride[0]]);
      return 1;
    }
    mrl_tensor **slot = new_box(L);
    mrl_status st = mrl_tensor_select(t, 0, i - 1, slot);
    if (st) return mrl__lua_raise(L, mrl__engine_of(t), st, 0);
    return 1;
  }
  lua_pushvalue(L, 2);
  lua_rawget(L, lua_upvalueindex(1));
  return 1;
}

/* t[i] = v: sets an entry of a rank-1 tensor, or fills / copies into row i. */
static int mm_newindex(lua_State *L) {
  mrl_tensor *t = mrl__lua_check_tensor(L, 1, "self");
  if (lua_type(L, 2) != LUA_TNUMBER)
    return luaL_error(L, "tensor fields cannot be assigned (key of type %s)", luaL_typename(L, 2));
  int isint;
  lua_Integer i = lua_tointegerx(L, 2, &isint);
  if (!isint) return luaL_error(L, "index %s is not an integer", lua_tostring(L, 2));
  if (t->rank == 0) return luaL_error(L, "cannot index a scalar tensor (use t:set())");
  if (i < 1 || i > t->shape[0])
    return luaL_error(L, "index %I is outside 1..%I", i, (lua_Integer)t->shape[0]);
  mrl_tensor *row;
  mrl_status st = mrl_tensor_select(t, 0, i - 1, &row);
  if (st) return mrl__lua_raise(L, mrl__engine_of(t), st, 0);
  mrl_tensor *src = mrl__lua_test_tensor(L, 3);
  if (src) {
    st = mrl_tensor_copy(row, src);
  } else if (lua_type(L, 3) == LUA_TNUMBER) {
    st = mrl_tensor_fill(row, (float)lua_tonumber(L, 3));
  } else {
    mrl_tensor_free(row);
    return luaL_error(L, "assigned value must be a number or a tensor, got %s",
                      luaL_typename(L, 3));
  }
  mrl_tensor_free(row);
  if (st) return mrl__lua_raise(L, mrl__engine_of(t), st, 3);
  return 0;
}

static const luaL_Reg tensor_methods[] = {
    {"shape", m_shape},         {"size", m_size},
    {"stride", m_stride},       {"dim", m_dim},
    {"numel", m_numel},         {"is_contiguous", m_is_contiguous},
    {"get", m_get},             {"set", m_set},
    {"totable", m_totable},     {"narrow", m_narrow},
    {"slice", m_slice},         {"select", m_select},
    {"transpose", m_transpose}, {"t", m_transpose},
    {"permute", m_permute},     {"reshape", m_reshape},
    {"contiguous", m_contiguous}, {"clone", m_clone},
    {"copy", m_copy},           {"fill", m_fill},
    {"add", m_add},             {"sub", m_sub},
    {"mul", m_mul},             {"div", m_div},
    {"scale", m_scale},         {"neg", m_neg},
    {"exp", m_exp},             {"log", m_log},
    {"tanh", m_tanh},           {"silu", m_silu},
    {"sum", m_sum},             {"mean", m_mean},
    {"max", m_max},             {"argmax", m_argmax},
    {"softmax", m_softmax},     {"log_softmax", m_log_softmax},
    {"matmul", m_matmul},       {"gather", m_gather},
    {"index_select", m_index_select}, {"allclose", m_allclose},
    {"max_abs_diff", m_max_abs_diff}, {"free", m_free},
    {"is_closed", m_is_closed}, {NULL, NULL}};

static const luaL_Reg tensor_meta[] = {
    {"__add", m_add},   {"__sub", m_sub},   {"__mul", m_mul},           {"__div", m_div},
    {"__unm", mm_unm},  {"__len", mm_len},  {"__tostring", mm_tostring}, {"__gc", m_free},
    {"__close", m_free}, {"__newindex", mm_newindex}, {NULL, NULL}};

static int l_is_tensor(lua_State *L) {
  lua_pushboolean(L, luaL_testudata(L, 1, MRL_TENSOR_MT) != NULL);
  return 1;
}

static const luaL_Reg tensor_funcs[] = {
    {"zeros", l_zeros},   {"ones", l_ones},   {"full", l_full},
    {"randn", l_randn},   {"rand", l_rand},   {"arange", l_arange},
    {"from", l_from},     {"matmul", m_matmul}, {"is_tensor", l_is_tensor},
    {NULL, NULL}};

void mrl__lua_open_tensor(lua_State *L) {
  luaL_newmetatable(L, MRL_TENSOR_MT);
  luaL_setfuncs(L, tensor_meta, 0);
  luaL_newlib(L, tensor_methods);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "methods"); /* metatable.methods: lets Lua code add methods */
  lua_pushcclosure(L, mm_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, tensor_funcs);
}
