/* lua_comm.c - core.comm (rl.comm): the data-parallel communicator for Lua. One handle per Lua
 * state, made on first use and freed with the state (the last free in the process finalises
 * MPI). Every rank must call the collectives in the same order.
 *
 *   comm.rank(), comm.size()       0-based rank, number of ranks (1 without MPI)
 *   comm.backend(), comm.backends() "self" | "mpi"; the compiled ones ("self" or "self mpi")
 *   comm.allreduce(x)              tensor: summed over the ranks in place, returned; list of
 *                                  numbers: a new list of their sums (float64)
 *   comm.bcast(x [, root = 0])     tensor: root's values in place, returned; string (or nil on
 *                                  the other ranks): root's string
 *   comm.allgather(x)              string, or a 1-D tensor: the list of every rank's, in rank
 *                                  order (lengths may differ between ranks)
 *   comm.barrier()
 */
#include "lua_internal.h"

#include <string.h>

#define COMM_KEY "moonrl.comm" /* registry: the state's handle box */

typedef struct {
  mrl_comm *c;
} comm_box;

static int box_gc(lua_State *L) {
  comm_box *b = lua_touserdata(L, 1);
  mrl_comm_free(b->c);
  b->c = NULL;
  return 0;
}

mrl_comm *mrl__lua_comm(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, COMM_KEY) == LUA_TUSERDATA) {
    mrl_comm *c = ((comm_box *)lua_touserdata(L, -1))->c;
    lua_pop(L, 1);
    return c;
  }
  lua_pop(L, 1);
  mrl_engine *e = mrl__lua_engine(L);
  comm_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->c = NULL;
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, box_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  mrl_status st = mrl_comm_new(e, &b->c);
  if (st) {
    lua_pop(L, 1);
    mrl__lua_raise(L, e, st, 0);
  }
  lua_setfield(L, LUA_REGISTRYINDEX, COMM_KEY);
  return b->c;
}

static int raise_comm(lua_State *L, mrl_status st) { return mrl__lua_raise(L, mrl__lua_engine(L), st, 0); }

static int l_rank(lua_State *L) {
  lua_pushinteger(L, mrl_comm_rank(mrl__lua_comm(L)));
  return 1;
}

static int l_size(lua_State *L) {
  lua_pushinteger(L, mrl_comm_size(mrl__lua_comm(L)));
  return 1;
}

static int l_backend(lua_State *L) {
  lua_pushstring(L, mrl_comm_backend(mrl__lua_comm(L)));
  return 1;
}

static int l_backends(lua_State *L) {
  lua_pushstring(L, mrl_comm_backends());
  return 1;
}

/* A contiguous tensor at idx, or an argument error. */
static mrl_tensor *check_contiguous(lua_State *L, int idx, const char *fn) {
  mrl_tensor *t = mrl__lua_test_tensor(L, idx);
  if (!t) return NULL;
  if (!mrl_tensor_is_contiguous(t))
    luaL_argerror(L, idx, lua_pushfstring(L, "%s: a contiguous tensor expected", fn));
  return t;
}

static int l_allreduce(lua_State *L) {
  mrl_comm *c = mrl__lua_comm(L);
  mrl_tensor *t = check_contiguous(L, 1, "allreduce");
  if (t) {
    mrl_status st = mrl_comm_allreduce_f32(c, mrl_tensor_data(t), mrl_tensor_numel(t));
    if (st) return raise_comm(L, st);
    lua_settop(L, 1);
    return 1;
  }
  if (!lua_istable(L, 1)) return luaL_argerror(L, 1, "a tensor or a list of numbers expected");
  lua_Integer n = luaL_len(L, 1);
  double *v = lua_newuserdatauv(L, sizeof(double) * (size_t)(n > 0 ? n : 1), 0);
  for (lua_Integer i = 0; i < n; i++) {
    lua_geti(L, 1, i + 1);
    int ok;
    v[i] = lua_tonumberx(L, -1, &ok);
    if (!ok) return luaL_argerror(L, 1, lua_pushfstring(L, "[%d]: a number expected", (int)(i + 1)));
    lua_pop(L, 1);
  }
  mrl_status st = mrl_comm_allreduce_f64(c, v, n);
  if (st) return raise_comm(L, st);
  lua_createtable(L, (int)n, 0);
  for (lua_Integer i = 0; i < n; i++) {
    lua_pushnumber(L, v[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_bcast(lua_State *L) {
  mrl_comm *c = mrl__lua_comm(L);
  lua_Integer root = luaL_optinteger(L, 2, 0);
  if (root < 0 || root >= mrl_comm_size(c))
    return luaL_argerror(L, 2, lua_pushfstring(L, "root: a rank in 0..%d expected", mrl_comm_size(c) - 1));
  mrl_tensor *t = check_contiguous(L, 1, "bcast");
  mrl_status st;
  if (t) {
    /* every rank checks that its tensor has root's length, so a mismatch is an error, not a
     * partial copy */
    double len = (double)mrl_tensor_numel(t);
    if ((st = mrl_comm_bcast(c, &len, sizeof len, (int)root))) return raise_comm(L, st);
    if (len != (double)mrl_tensor_numel(t))
      return luaL_argerror(L, 1, lua_pushfstring(L, "bcast: %d floats here, %d at the root",
                                                 (int)mrl_tensor_numel(t), (int)len));
    if ((st = mrl_comm_bcast(c, mrl_tensor_data(t), mrl_tensor_numel(t) * (int64_t)sizeof(float),
                             (int)root)))
      return raise_comm(L, st);
    lua_settop(L, 1);
    return 1;
  }
  bool is_root = mrl_comm_rank(c) == root;
  if (is_root ? lua_type(L, 1) != LUA_TSTRING : !lua_isnoneornil(L, 1) && lua_type(L, 1) != LUA_TSTRING)
    return luaL_argerror(L, 1, "a tensor or a string expected");
  size_t len = 0;
  const char *s = is_root ? lua_tolstring(L, 1, &len) : NULL;
  int64_t n = (int64_t)len;
  if ((st = mrl_comm_bcast(c, &n, sizeof n, (int)root))) return raise_comm(L, st);
  char *buf = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1), 0);
  if (is_root && n > 0) memcpy(buf, s, (size_t)n);
  if ((st = mrl_comm_bcast(c, buf, n, (int)root))) return raise_comm(L, st);
  lua_pushlstring(L, buf, (size_t)n);
  return 1;
}

static int l_allgather(lua_State *L) {
  mrl_comm *c = mrl__lua_comm(L);
  int size = mrl_comm_size(c);
  mrl_tensor *t = mrl__lua_test_tensor(L, 1);
  if (t && (mrl_tensor_rank(t) != 1 || !mrl_tensor_is_contiguous(t)))
    return luaL_argerror(L, 1, "allgather: a contiguous 1-D tensor expected");
  if (!t && lua_type(L, 1) != LUA_TSTRING) return luaL_argerror(L, 1, "a string or a 1-D tensor expected");
  size_t len = 0;
  const void *send = t ? (const void *)mrl_tensor_data(t) : (const void *)lua_tolstring(L, 1, &len);
  if (t) len = (size_t)mrl_tensor_numel(t) * sizeof(float);
  int64_t mine = (int64_t)len;
  int64_t *counts = lua_newuserdatauv(L, sizeof(int64_t) * (size_t)size, 0);
  mrl_status st = mrl_comm_allgather(c, &mine, sizeof mine, counts);
  if (st) return raise_comm(L, st);
  int64_t total = 0;
  for (int r = 0; r < size; r++) total += counts[r];
  char *recv = lua_newuserdatauv(L, (size_t)(total > 0 ? total : 1), 0);
  if ((st = mrl_comm_allgatherv(c, send, counts, recv))) return raise_comm(L, st);
  lua_createtable(L, size, 0);
  int64_t at = 0;
  for (int r = 0; r < size; r++) {
    if (t) {
      int64_t n = counts[r] / (int64_t)sizeof(float);
      mrl_tensor *out = NULL;
      /* a tensor has at least one element: an empty one is a 0-long narrow of one */
      int64_t alloc = n > 0 ? n : 1;
      if ((st = mrl_tensor_new(mrl__lua_engine(L), 1, &alloc, &out))) return raise_comm(L, st);
      if (n > 0) memcpy(mrl_tensor_data(out), recv + at, (size_t)counts[r]);
      if (n == 0) {
        mrl_tensor *v = NULL;
        st = mrl_tensor_narrow(out, 0, 0, 0, &v);
        mrl_tensor_free(out);
        if (st) return raise_comm(L, st);
        out = v;
      }
      mrl__lua_push_tensor(L, out);
    } else {
      lua_pushlstring(L, recv + at, (size_t)counts[r]);
    }
    lua_rawseti(L, -2, r + 1);
    at += counts[r];
  }
  return 1;
}

static int l_barrier(lua_State *L) {
  mrl_status st = mrl_comm_barrier(mrl__lua_comm(L));
  if (st) return raise_comm(L, st);
  return 0;
}

static const luaL_Reg comm_funcs[] = {
    {"rank", l_rank},           {"size", l_size},       {"backend", l_backend},
    {"backends", l_backends},   {"allreduce", l_allreduce}, {"bcast", l_bcast},
    {"allgather", l_allgather}, {"barrier", l_barrier}, {NULL, NULL}};

void mrl__lua_open_comm(lua_State *L) { luaL_newlib(L, comm_funcs); }
