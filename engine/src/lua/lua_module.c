/* lua_module.c - the `moonrl.core` Lua module table: the state's engine, version, BLAS info,
 * seeding and memory figures, plus the tensor class. */
#include "lua_internal.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENGINE_BOX_MT "moonrl.engine_box" /* metatable name; differs from the registry key */

typedef struct {
  mrl_engine *e;
} engine_box;

static int engine_box_gc(lua_State *L) {
  engine_box *b = luaL_checkudata(L, 1, ENGINE_BOX_MT);
  if (b->e) mrl__engine_release(b->e);
  b->e = NULL;
  return 0;
}

static engine_box *new_engine_box(lua_State *L) {
  engine_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->e = NULL;
  if (luaL_newmetatable(L, ENGINE_BOX_MT)) {
    lua_pushcfunction(L, engine_box_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  return b;
}

void mrl__lua_set_engine(lua_State *L, mrl_engine *e) {
  engine_box *b = new_engine_box(L);
  mrl__engine_retain(e);
  b->e = e;
  lua_setfield(L, LUA_REGISTRYINDEX, MRL_ENGINE_KEY);
}

mrl_engine *mrl__lua_engine(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, MRL_ENGINE_KEY);
  engine_box *b = luaL_testudata(L, -1, ENGINE_BOX_MT);
  lua_pop(L, 1);
  if (b && b->e) return b->e;
  b = new_engine_box(L);
  if (mrl_engine_new(&b->e) != MRL_OK) luaL_error(L, "moonrl: cannot allocate an engine");
  lua_setfield(L, LUA_REGISTRYINDEX, MRL_ENGINE_KEY);
  return b->e;
}

/* rl.blas_info() -> {core=, threads=, config=, source=, recommended=} */
static int l_blas_info(lua_State *L) {
  const char *core, *config, *source, *rec = mrl_blas_recommended_coretype();
  int threads;
  mrl_blas_info(&core, &threads, &config, &source);
  lua_createtable(L, 0, 5);
  lua_pushstring(L, core);
  lua_setfield(L, -2, "core");
  lua_pushinteger(L, threads);
  lua_setfield(L, -2, "threads");
  lua_pushstring(L, config);
  lua_setfield(L, -2, "config");
  lua_pushstring(L, source);
  lua_setfield(L, -2, "source");
  if (rec) {
    lua_pushstring(L, rec);
    lua_setfield(L, -2, "recommended");
  }
  return 1;
}

/* rl.blas_threads(n): sets OpenBLAS's thread count (process-wide). */
static int l_blas_threads(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  if (n < 1 || n > 1024) return luaL_argerror(L, 1, "threads: expected 1..1024");
  mrl_blas_set_threads((int)n);
  return 0;
}

/* rl.threads([n]) -> count: sets (with n; 0 means the cores the process may run on) and returns the number of
 * threads this state's engine computes on (attention, sampling). Results do not depend on it. */
static int l_threads(lua_State *L) {
  mrl_engine *e = mrl__lua_engine(L);
  if (!lua_isnoneornil(L, 1)) {
    lua_Integer n = luaL_checkinteger(L, 1);
    if (n < 0 || n > 1024)
      return luaL_argerror(L, 1, "threads: expected 0..1024 (0: the cores the process may run on)");
    mrl_engine_set_threads(e, (int)n);
  }
  lua_pushinteger(L, mrl_engine_threads(e));
  return 1;
}

/* rl.seed(n): reseeds the engine's default RNG (used by randn/rand without a seed). */
static int l_seed(lua_State *L) {
  lua_Integer seed = luaL_checkinteger(L, 1);
  mrl_rng_seed(mrl_engine_rng(mrl__lua_engine(L)), (uint64_t)seed);
  return 0;
}

int mrl__lua_traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* ---- rl.rng(seed): a seeded random stream (the engine's xoshiro256**), the same numbers on
 * every machine; environments get one per episode. ---- */

/* ---- options tables (lua_internal.h) ---- */

static int field_type_error(lua_State *L, int idx, const char *key, const char *want) {
  return luaL_argerror(L, idx, lua_pushfstring(L, "%s: %s expected, got %s", key, want,
                                                luaL_typename(L, -1)));
}

lua_Integer mrl__lua_opt_integer(lua_State *L, int idx, const char *key, lua_Integer dflt) {
  int type = lua_getfield(L, idx, key), ok = 1;
  lua_Integer v = type == LUA_TNIL ? dflt : lua_tointegerx(L, -1, &ok);
  if (type != LUA_TNIL && (type != LUA_TNUMBER || !ok)) field_type_error(L, idx, key, "integer");
  lua_pop(L, 1);
  return v;
}

double mrl__lua_opt_number(lua_State *L, int idx, const char *key, double dflt) {
  int type = lua_getfield(L, idx, key);
  if (type != LUA_TNIL && type != LUA_TNUMBER) field_type_error(L, idx, key, "number");
  double v = type == LUA_TNIL ? dflt : lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

const char *mrl__lua_opt_string(lua_State *L, int idx, const char *key, const char *dflt) {
  int type = lua_getfield(L, idx, key);
  if (type != LUA_TNIL && type != LUA_TSTRING) field_type_error(L, idx, key, "string");
  const char *v = type == LUA_TNIL ? dflt : lua_tostring(L, -1);
  lua_pop(L, 1);
  return v;
}

#define RNG_MT "moonrl.rng"

typedef struct {
  mrl_rng *rng;
} rng_box;

void mrl__lua_push_rng(lua_State *L, uint64_t seed) {
  mrl_engine *e = mrl__lua_engine(L);
  rng_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->rng = NULL;
  luaL_setmetatable(L, RNG_MT);
  mrl_status st = mrl_rng_new(e, seed, &b->rng);
  if (st) mrl__lua_raise(L, e, st, 0);
}

static mrl_rng *check_rng(lua_State *L) {
  rng_box *b = luaL_checkudata(L, 1, RNG_MT);
  if (!b->rng) luaL_argerror(L, 1, "rng is closed");
  return b->rng;
}

static int l_rng(lua_State *L) {
  mrl__lua_push_rng(L, (uint64_t)luaL_optinteger(L, 1, 0));
  return 1;
}

/* rng:random() in [0, 1); rng:random(n) in 1..n; rng:random(m, n) in m..n, uniform for any
 * m <= n (as math.random, with the engine's generator). */
static int rng_random(lua_State *L) {
  mrl_rng *r = check_rng(L);
  int args = lua_gettop(L) - 1;
  if (args == 0) {
    double u;
    mrl_rng_uniform(r, &u);
    lua_pushnumber(L, u);
    return 1;
  }
  if (args > 2) return luaL_argerror(L, 4, "at most two bounds expected");
  lua_Integer lo = 1, hi = luaL_checkinteger(L, 2);
  if (args == 2) {
    lo = hi;
    hi = luaL_checkinteger(L, 3);
  }
  if (lo > hi) return luaL_argerror(L, args + 1, "interval is empty");
  int64_t k;
  mrl_rng_int(r, lo, hi, &k);
  lua_pushinteger(L, k);
  return 1;
}

static int rng_normal(lua_State *L) {
  double v;
  mrl_rng_normal(check_rng(L), &v);
  lua_pushnumber(L, v);
  return 1;
}

static int rng_free(lua_State *L) {
  rng_box *b = luaL_checkudata(L, 1, RNG_MT);
  mrl_rng_free(b->rng);
  b->rng = NULL;
  return 0;
}

static void open_rng(lua_State *L) {
  static const luaL_Reg methods[] = {{"random", rng_random}, {"normal", rng_normal}, {NULL, NULL}};
  if (luaL_newmetatable(L, RNG_MT)) {
    lua_pushcfunction(L, rng_free);
    lua_setfield(L, -2, "__gc");
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
}

/* ---- rl.fs: what recipes need of the file system beyond io: directories, atomic writes, and
 * whether stdout is a terminal (progress bars). Failures return nil, message. ---- */

static int fs_result(lua_State *L, mrl_engine *e, mrl_status st) {
  if (st == MRL_OK) {
    lua_pushboolean(L, 1);
    return 1;
  }
  const char *msg = mrl_engine_last_error(e);
  const char *colon = strstr(msg, ": ");
  luaL_pushfail(L);
  lua_pushstring(L, colon ? colon + 2 : msg);
  return 2;
}

/* rl.fs.mkdir(path) -> true: creates path and its missing parents. */
static int fs_mkdir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  mrl_engine *e = mrl__lua_engine(L);
  return fs_result(L, e, mrl__make_dirs(e, "mkdir", path));
}

/* rl.fs.write(path, text) -> true: replaces path atomically (a temporary file, fsync, rename),
 * so a reader or a crash sees the old file or the new one, never a part. */
static int fs_write(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  size_t len;
  const char *text = luaL_checklstring(L, 2, &len);
  mrl_engine *e = mrl__lua_engine(L);
  return fs_result(L, e, mrl__write_file_atomic(e, "write", path, text, len));
}

/* rl.fs.isatty([fd = 1]) -> whether the descriptor is a terminal. */
static int fs_isatty(lua_State *L) {
  lua_pushboolean(L, isatty((int)luaL_optinteger(L, 1, 1)));
  return 1;
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

#define DIR_MT "moonrl.fs.dir"

/* The open directory of a listing, closed by __gc too when a memory error unwinds fs_list. */
static int dir_gc(lua_State *L) {
  DIR **box = luaL_checkudata(L, 1, DIR_MT);
  if (*box) closedir(*box);
  *box = NULL;
  return 0;
}

/* rl.fs.list(path) -> the names in the directory (without . and ..), sorted bytewise; or nil,
 * message when it cannot be read. */
static int fs_list(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  DIR **box = lua_newuserdatauv(L, sizeof *box, 0);
  *box = NULL;
  if (luaL_newmetatable(L, DIR_MT)) {
    lua_pushcfunction(L, dir_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  *box = opendir(path);
  if (!*box) {
    luaL_pushfail(L);
    lua_pushfstring(L, "%s: %s", path, strerror(errno));
    return 2;
  }
  lua_newtable(L); /* the names as read, which keep the strings alive */
  int names = lua_gettop(L);
  lua_Integer n = 0;
  struct dirent *ent;
  errno = 0;
  while ((ent = readdir(*box)) != NULL) {
    if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) continue;
    lua_pushstring(L, ent->d_name);
    lua_rawseti(L, names, ++n);
    errno = 0;
  }
  int read_errno = errno;
  closedir(*box);
  *box = NULL;
  if (read_errno) {
    luaL_pushfail(L);
    lua_pushfstring(L, "%s: %s", path, strerror(read_errno));
    return 2;
  }
  const char **sorted = lua_newuserdatauv(L, sizeof *sorted * (size_t)(n > 0 ? n : 1), 0);
  for (lua_Integer i = 0; i < n; i++) {
    lua_rawgeti(L, names, i + 1);
    sorted[i] = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  qsort(sorted, (size_t)n, sizeof *sorted, compare_names);
  lua_createtable(L, (int)n, 0);
  for (lua_Integer i = 0; i < n; i++) {
    lua_pushstring(L, sorted[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static void open_fs(lua_State *L) {
  static const luaL_Reg funcs[] = {{"mkdir", fs_mkdir},   {"write", fs_write}, {"list", fs_list},
                                   {"isatty", fs_isatty}, {NULL, NULL}};
  luaL_newlib(L, funcs);
  lua_setfield(L, -2, "fs");
}

/* rl.memory() -> {used=, peak=} bytes held by the engine (tensors and handles). */
static int l_memory(lua_State *L) {
  mrl_engine *e = mrl__lua_engine(L);
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, (lua_Integer)mrl_engine_memory_used(e));
  lua_setfield(L, -2, "used");
  lua_pushinteger(L, (lua_Integer)mrl_engine_memory_peak(e));
  lua_setfield(L, -2, "peak");
  return 1;
}

/* rl.clock() -> seconds on a monotonic clock, for timing. */
static int l_clock(lua_State *L) {
  lua_pushnumber(L, mrl_clock());
  return 1;
}

/* rl.lr_at(schedule, step, total, warmup, base [, min_lr]): the learning rate at a 0-based step
 * ("constant" or "cosine", linear warmup). */
static int l_lr_at(lua_State *L) {
  static const char *const kinds[] = {"constant", "cosine", NULL};
  int kind = luaL_checkoption(L, 1, NULL, kinds);
  lua_Integer step = luaL_checkinteger(L, 2), total = luaL_checkinteger(L, 3);
  lua_Integer warmup = luaL_checkinteger(L, 4);
  double base = luaL_checknumber(L, 5), min_lr = luaL_optnumber(L, 6, 0.0);
  lua_pushnumber(L, mrl_lr_at(kind ? MRL_LR_COSINE : MRL_LR_CONSTANT, step, total, warmup, base,
                              min_lr));
  return 1;
}

/* rl.equal_words(a, b) -> how many of the 8-byte words of strings a and b are equal, position by
 * position (MinHash signatures packed with string.pack compared in one call: rl.synth.novelty).
 * a and b must have the same length, a multiple of 8. */
static int l_equal_words(lua_State *L) {
  size_t na = 0, nb = 0;
  const char *a = luaL_checklstring(L, 1, &na);
  const char *b = luaL_checklstring(L, 2, &nb);
  luaL_argcheck(L, na % 8 == 0, 1, "a length that is a multiple of 8 expected");
  luaL_argcheck(L, nb == na, 2, "a string as long as the first expected");
  lua_Integer same = 0;
  for (size_t i = 0; i < na; i += 8) same += memcmp(a + i, b + i, 8) == 0;
  lua_pushinteger(L, same);
  return 1;
}

static const luaL_Reg core_funcs[] = {{"blas_info", l_blas_info},
                                      {"equal_words", l_equal_words},
                                      {"lr_at", l_lr_at},
                                      {"clock", l_clock},
                                      {"rng", l_rng},
                                      {"blas_threads", l_blas_threads},
                                      {"threads", l_threads},
                                      {"seed", l_seed},
                                      {"memory", l_memory},
                                      {NULL, NULL}};

int mrl__lua_open_core(lua_State *L) {
  mrl__lua_engine(L);
  luaL_newlib(L, core_funcs);
  lua_pushstring(L, mrl_version());
  lua_setfield(L, -2, "version");
  mrl__lua_open_tensor(L);
  lua_setfield(L, -2, "tensor");
  mrl__lua_open_model(L);
  lua_setfield(L, -2, "model");
  mrl__lua_open_rollout(L);
  lua_setfield(L, -2, "rollout");
  mrl__lua_open_objective(L);
  lua_setfield(L, -2, "objective");
  mrl__lua_open_advantage(L);
  lua_setfield(L, -2, "advantage");
  mrl__lua_open_replay(L);
  lua_setfield(L, -2, "replay");
  mrl__lua_open_sandbox(L);
  lua_setfield(L, -2, "sandbox");
  mrl__lua_open_http(L);
  lua_setfield(L, -2, "http");
  mrl__lua_open_comm(L);
  lua_setfield(L, -2, "comm");
  open_rng(L);
  open_fs(L);
  mrl__lua_open_tokenizer(L);
  mrl__lua_open_json(L);
  return 1;
}
