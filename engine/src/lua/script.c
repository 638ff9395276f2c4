/* script.c - mrl_script: a Lua 5.4 state with the moonrl module, for programs embedding the engine
 * and for the moonrl command. Every call into Lua is protected; errors become MRL_ERR_LUA with the
 * message and traceback in the engine's last error. */
#include "script.h"

#include <lualib.h>
#include <string.h>

struct mrl_script {
  mrl_engine *engine;
  lua_State *L;
};

lua_State *mrl__script_lua(mrl_script *s) { return s->L; }
mrl_engine *mrl__script_engine(mrl_script *s) { return s->engine; }

mrl_status mrl__script_pcall(mrl_script *s, const char *fn, int nargs, int nresults) {
  lua_State *L = s->L;
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, mrl__lua_traceback);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  if (rc == LUA_OK) return MRL_OK;
  const char *msg = lua_tostring(L, -1);
  mrl_status st = rc == LUA_ERRMEM ? MRL_ERR_NOMEM : MRL_ERR_LUA;
  mrl__fail(s->engine, st, fn, "%s", msg ? msg : "(error without a message)");
  lua_pop(L, 1);
  return st;
}

static int setup(lua_State *L) {
  mrl_engine *e = lua_touserdata(L, 1);
  luaL_openlibs(L);
  mrl__lua_set_engine(L, e);
  luaL_requiref(L, "moonrl.core", mrl__lua_open_core, 0);
  lua_pop(L, 1);
  mrl__lua_preload_embedded(L);
  return 0;
}

mrl_status mrl_script_new(mrl_engine *e, mrl_script **out) {
  const char *fn = "mrl_script_new";
  if (!e) return MRL_ERR_NULL;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  mrl_script *s = mrl__alloc(e, sizeof *s);
  if (!s) return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a script");
  s->engine = e;
  s->L = luaL_newstate();
  if (!s->L) {
    mrl__free(e, s, sizeof *s);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot create a Lua state");
  }
  mrl__engine_retain(e);
  lua_pushcfunction(s->L, setup);
  lua_pushlightuserdata(s->L, e);
  mrl_status st = mrl__script_pcall(s, fn, 1, 0);
  if (st) {
    mrl_script_free(s);
    return st;
  }
  *out = s;
  return MRL_OK;
}

void mrl_script_free(mrl_script *s) {
  if (!s) return;
  mrl_engine *e = s->engine;
  lua_close(s->L);
  mrl__free(e, s, sizeof *s);
  mrl__engine_release(e);
}

mrl_status mrl_script_run(mrl_script *s, const char *code, const char *chunkname) {
  const char *fn = "mrl_script_run";
  if (!s) return MRL_ERR_NULL;
  if (!code) return mrl__fail(s->engine, MRL_ERR_NULL, fn, "code is NULL");
  lua_State *L = s->L;
  int rc = luaL_loadbufferx(L, code, strlen(code), chunkname ? chunkname : "=(embedded)", "t");
  if (rc != LUA_OK) {
    mrl__fail(s->engine, rc == LUA_ERRMEM ? MRL_ERR_NOMEM : MRL_ERR_LUA, fn, "%s",
              lua_tostring(L, -1));
    lua_pop(L, 1);
    return rc == LUA_ERRMEM ? MRL_ERR_NOMEM : MRL_ERR_LUA;
  }
  return mrl__script_pcall(s, fn, 0, 0);
}

/* Builds `arg` (arg[0] = path, arg[1..n] = argv) and leaves argv on the stack for the chunk. */
static int push_args(lua_State *L) {
  const char *path = lua_touserdata(L, 1);
  int argc = (int)lua_tointeger(L, 2);
  const char *const *argv = lua_touserdata(L, 3);
  lua_createtable(L, argc, 1);
  lua_pushstring(L, path);
  lua_rawseti(L, -2, 0);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setglobal(L, "arg");
  return 0;
}

mrl_status mrl_script_run_file(mrl_script *s, const char *path, int argc,
                               const char *const *argv) {
  const char *fn = "mrl_script_run_file";
  if (!s) return MRL_ERR_NULL;
  if (!path) return mrl__fail(s->engine, MRL_ERR_NULL, fn, "path is NULL");
  if (argc < 0 || (argc > 0 && !argv))
    return mrl__fail(s->engine, MRL_ERR_INVALID, fn, "argc/argv do not describe an array");
  lua_State *L = s->L;
  lua_pushcfunction(L, push_args);
  lua_pushlightuserdata(L, (void *)path);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, (void *)argv);
  mrl_status st = mrl__script_pcall(s, fn, 3, 0);
  if (st) return st;
  int rc = luaL_loadfilex(L, path, "t");
  if (rc != LUA_OK) {
    mrl_status err = rc == LUA_ERRMEM ? MRL_ERR_NOMEM : rc == LUA_ERRFILE ? MRL_ERR_IO : MRL_ERR_LUA;
    mrl__fail(s->engine, err, fn, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    return err;
  }
  if (!lua_checkstack(L, argc + 1)) {
    lua_pop(L, 1);
    return mrl__fail(s->engine, MRL_ERR_NOMEM, fn, "too many arguments");
  }
  for (int i = 0; i < argc; i++) lua_pushstring(L, argv[i]);
  return mrl__script_pcall(s, fn, argc, 0);
}

static int set_tensor_global(lua_State *L) {
  const char *name = lua_touserdata(L, 1);
  mrl_tensor **view = lua_touserdata(L, 2);
  mrl__lua_push_tensor(L, *view); /* the Lua box owns the view from here on */
  *view = NULL;
  lua_setglobal(L, name);
  return 0;
}

mrl_status mrl_script_set_tensor(mrl_script *s, const char *name, mrl_tensor *t) {
  const char *fn = "mrl_script_set_tensor";
  if (!s) return MRL_ERR_NULL;
  if (!name || !t) return mrl__fail(s->engine, MRL_ERR_NULL, fn, "%s is NULL", name ? "t" : "name");
  mrl_tensor *view;
  mrl_status st = mrl__tensor_view(t, fn, &view);
  if (st) return st;
  lua_pushcfunction(s->L, set_tensor_global);
  lua_pushlightuserdata(s->L, (void *)name);
  lua_pushlightuserdata(s->L, &view);
  st = mrl__script_pcall(s, fn, 2, 0);
  mrl_tensor_free(view); /* NULL unless the state failed before taking it */
  return st;
}

/* Pushes global `name` without metamethods (so nothing can raise). */
static void raw_global(lua_State *L, const char *name) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
  lua_pushstring(L, name);
  lua_rawget(L, -2);
  lua_remove(L, -2);
}

mrl_status mrl_script_get_tensor(mrl_script *s, const char *name, mrl_tensor **out) {
  const char *fn = "mrl_script_get_tensor";
  if (!s) return MRL_ERR_NULL;
  if (!name || !out) return mrl__fail(s->engine, MRL_ERR_NULL, fn, "%s is NULL", name ? "out" : "name");
  raw_global(s->L, name);
  mrl_tensor *t = mrl__lua_test_tensor(s->L, -1);
  const char *type = luaL_typename(s->L, -1);
  lua_pop(s->L, 1);
  if (!t) return mrl__fail(s->engine, MRL_ERR_INVALID, fn, "global '%s' is %s, not an open tensor", name, type);
  return mrl__tensor_view(t, fn, out);
}

mrl_status mrl_script_get_number(mrl_script *s, const char *name, double *out) {
  const char *fn = "mrl_script_get_number";
  if (!s) return MRL_ERR_NULL;
  if (!name || !out) return mrl__fail(s->engine, MRL_ERR_NULL, fn, "%s is NULL", name ? "out" : "name");
  raw_global(s->L, name);
  int ok = lua_type(s->L, -1) == LUA_TNUMBER;
  double v = lua_tonumber(s->L, -1);
  const char *type = luaL_typename(s->L, -1);
  lua_pop(s->L, 1);
  if (!ok) return mrl__fail(s->engine, MRL_ERR_INVALID, fn, "global '%s' is %s, not a number", name, type);
  *out = v;
  return MRL_OK;
}
