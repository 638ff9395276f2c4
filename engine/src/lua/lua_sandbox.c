/* lua_sandbox.c - the Lua face of the tool sandbox (`rl.sandbox`): pool{...} with the methods
 * run, start, capabilities and close; jobs with wait, kill, done, fd and close; results as
 * tables (built under lua_pcall, so a memory error does not lose the engine's result); the
 * state's shared default pool; and rl.sandbox.lua (lua_sandbox_lua.c). */
#include "lua_internal.h"

#include <string.h>

#define POOL_MT "moonrl.sandbox.pool"
#define JOB_MT "moonrl.sandbox.job"
#define DEFAULT_POOL_KEY "moonrl.sandbox.default_pool" /* registry */

typedef struct {
  mrl_sandbox *p; /* NULL once closed */
} pool_box;

typedef struct {
  mrl_sandbox_job *j; /* NULL once closed; uservalue 1: the result table once waited for */
} job_box;

/* ---- options ---- */

/* Raises unless every key of the table at idx is one of `allowed` (NULL-terminated). */
static void check_keys(lua_State *L, int idx, const char *const *allowed, const char *what) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    bool known = false;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (int i = 0; allowed[i] && !known; i++)
        known = strcmp(lua_tostring(L, -1), allowed[i]) == 0;
    if (!known) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      for (int i = 0; allowed[i]; i++) {
        if (i) luaL_addstring(&b, ", ");
        luaL_addstring(&b, allowed[i]);
      }
      luaL_pushresult(&b);
      const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : luaL_typename(L, -2);
      luaL_argerror(L, idx,
                    lua_pushfstring(L, "%s: unknown field '%s' (expected %s)", what, key,
                                    lua_tostring(L, -1)));
    }
  }
}

/* Field key of the table at idx as a non-negative integer times scale (0 when absent). */
static int64_t count_field(lua_State *L, int idx, const char *key, int64_t scale) {
  int ty = lua_getfield(L, idx, key);
  int64_t v = 0;
  if (ty != LUA_TNIL) {
    int isint;
    lua_Integer n = lua_tointegerx(L, -1, &isint);
    if (!isint || ty != LUA_TNUMBER || n < 0 || n > INT64_MAX / scale)
      luaL_argerror(
          L, idx,
          lua_pushfstring(L, "%s: non-negative integer expected, got %s", key,
                          ty == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1)));
    v = (int64_t)n * scale;
  }
  lua_pop(L, 1);
  return v;
}

/* The limit fields shared by pool{} and run{}. */
static const char *const limit_keys[] = {"wall_ms",  "cpu_ms", "mem_mb", "pids",    "out_cap",
                                         "out_kill", "fsize",  "nofile", "disk_mb", "files_cap"};
enum { NLIMIT_KEYS = sizeof limit_keys / sizeof limit_keys[0] };

static void read_limits(lua_State *L, int idx, mrl_sandbox_limits *l) {
  l->wall_ms = count_field(L, idx, "wall_ms", 1);
  l->cpu_ms = count_field(L, idx, "cpu_ms", 1);
  l->mem_bytes = count_field(L, idx, "mem_mb", 1 << 20);
  l->pids = count_field(L, idx, "pids", 1);
  l->out_cap = count_field(L, idx, "out_cap", 1);
  l->out_kill = count_field(L, idx, "out_kill", 1);
  l->fsize = count_field(L, idx, "fsize", 1);
  l->nofile = count_field(L, idx, "nofile", 1);
  l->disk_bytes = count_field(L, idx, "disk_mb", 1 << 20);
  l->files_cap = count_field(L, idx, "files_cap", 1);
}

/* A NULL-terminated array of the strings in the list at field key (kept alive by the options
 * table); NULL when the field is absent. Leaves one value on the stack: the userdata holding the
 * array, or nil. */
static const char **string_list(lua_State *L, int idx, const char *key) {
  int ty = lua_getfield(L, idx, key);
  if (ty == LUA_TNIL) return NULL;
  if (ty != LUA_TTABLE)
    luaL_argerror(
        L, idx,
        lua_pushfstring(L, "%s: list of strings expected, got %s", key, luaL_typename(L, -1)));
  int t = lua_gettop(L);
  lua_Integer n = luaL_len(L, t);
  const char **a = lua_newuserdatauv(L, ((size_t)n + 1) * sizeof *a, 0);
  for (lua_Integer i = 1; i <= n; i++) {
    if (lua_geti(L, t, i) != LUA_TSTRING)
      luaL_argerror(
          L, idx,
          lua_pushfstring(L, "%s[%I]: string expected, got %s", key, i, luaL_typename(L, -1)));
    a[i - 1] = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  a[n] = NULL;
  lua_remove(L, t);
  return a;
}

/* Protection bits named in the list at field key. */
static unsigned protection_list(lua_State *L, int idx, const char *key) {
  const char **names = string_list(L, idx, key);
  unsigned bits = 0;
  for (size_t i = 0; names && names[i]; i++) {
    unsigned bit = 0;
    for (unsigned b = 1; b <= MRL_SANDBOX_PROT_CPU && !bit; b <<= 1)
      if (strcmp(mrl_sandbox_protection_name(b), names[i]) == 0) bit = b;
    if (!bit)
      luaL_argerror(L, idx,
                    lua_pushfstring(L,
                                    "%s: unknown protection '%s' (expected user, "
                                    "mount, pid, net, ipc, uts, seccomp, pids, "
                                    "memory or cpu)",
                                    key, names[i]));
    bits |= bit;
  }
  lua_pop(L, 1);
  return bits;
}

/* Raises an argument error for MRL_ERR_INVALID / NULL, a plain error for NOMEM; other failures
 * give nil, message (returns 2 then, else 0 after raising). */
static int fail_result(lua_State *L, mrl_engine *e, mrl_status st, int arg) {
  if (st == MRL_ERR_INVALID || st == MRL_ERR_NULL || st == MRL_ERR_NOMEM)
    return mrl__lua_raise(L, e, st, st == MRL_ERR_NOMEM ? 0 : arg);
  const char *msg = mrl_engine_last_error(e);
  const char *colon = strstr(msg, ": ");
  lua_pushnil(L);
  lua_pushstring(L, strncmp(msg, "mrl_", 4) == 0 && colon ? colon + 2 : msg);
  mrl_engine_clear_error(e);
  return 2;
}

/* ---- pools ---- */
static mrl_sandbox *check_pool(lua_State *L, int idx) {
  pool_box *b = luaL_testudata(L, idx, POOL_MT);
  if (!b)
    luaL_argerror(L, idx,
                  lua_pushfstring(L, "sandbox pool expected, got %s", luaL_typename(L, idx)));
  if (!b->p) luaL_argerror(L, idx, "the sandbox pool is closed");
  return b->p;
}

mrl_sandbox *mrl__lua_test_pool(lua_State *L, int idx) {
  pool_box *b = luaL_testudata(L, idx, POOL_MT);
  return b ? b->p : NULL;
}

static pool_box *new_pool_box(lua_State *L) {
  pool_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->p = NULL;
  luaL_setmetatable(L, POOL_MT);
  return b;
}

/* rl.sandbox.pool{max_jobs=, <limits>, ro_paths={...}, require={...}, disable={...}, uid=,
 * gid=} -> pool, or nil and a message when a required protection is missing or the host cannot
 * run a sandbox. */
static int l_pool(lua_State *L) {
  static const char *const keys[] = {"max_jobs",  "wall_ms",  "cpu_ms",  "mem_mb",  "pids",
                                     "out_cap",   "out_kill", "fsize",   "nofile",  "disk_mb",
                                     "files_cap", "ro_paths", "require", "disable", "uid",
                                     "gid",       NULL};
  mrl_sandbox_config c;
  memset(&c, 0, sizeof c);
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    check_keys(L, 1, keys, "options");
    read_limits(L, 1, &c.limits);
    int64_t jobs = count_field(L, 1, "max_jobs", 1);
    if (jobs > 1024) luaL_argerror(L, 1, "max_jobs: at most 1024");
    c.max_jobs = (int)jobs;
    c.host_uid = count_field(L, 1, "uid", 1);
    c.host_gid = count_field(L, 1, "gid", 1);
    c.require = protection_list(L, 1, "require");
    c.disable = protection_list(L, 1, "disable");
    c.ro_paths = string_list(L, 1, "ro_paths"); /* its userdata stays on the stack */
  }
  mrl_engine *e = mrl__lua_engine(L);
  pool_box *b = new_pool_box(L);
  mrl_status st = mrl_sandbox_new(e, &c, &b->p);
  if (st) return fail_result(L, e, st, 1);
  return 1;
}

/* pool:capabilities() -> {user=true, ..., notes={user="...", ...}, missing={"net", ...}} */
static int m_capabilities(lua_State *L) {
  mrl_sandbox *p = check_pool(L, 1);
  unsigned on = mrl_sandbox_protections(p);
  lua_createtable(L, 0, 12);
  lua_createtable(L, 0, 10);
  lua_createtable(L, 4, 0);
  int missing = 0;
  for (unsigned bit = 1; bit <= MRL_SANDBOX_PROT_CPU; bit <<= 1) {
    const char *name = mrl_sandbox_protection_name(bit);
    lua_pushboolean(L, (on & bit) != 0);
    lua_setfield(L, -4, name);
    lua_pushstring(L, mrl_sandbox_protection_note(p, bit));
    lua_setfield(L, -3, name);
    if (!(on & bit)) {
      lua_pushstring(L, name);
      lua_rawseti(L, -2, ++missing);
    }
  }
  lua_setfield(L, -3, "missing");
  lua_setfield(L, -2, "notes");
  return 1;
}

static void push_result(lua_State *L, const mrl_sandbox_result *r) {
  lua_createtable(L, 0, 16);
  lua_pushstring(L, mrl_sandbox_status_name(r->status));
  lua_setfield(L, -2, "status");
  if (r->status == MRL_SANDBOX_EXITED) {
    lua_pushinteger(L, r->exit_code);
    lua_setfield(L, -2, "exit_code");
  }
  if (r->signal) {
    lua_pushinteger(L, r->signal);
    lua_setfield(L, -2, "signal");
  }
  lua_pushlstring(L, r->out, r->out_len);
  lua_setfield(L, -2, "stdout");
  lua_pushlstring(L, r->err, r->err_len);
  lua_setfield(L, -2, "stderr");
  lua_pushboolean(L, r->out_truncated);
  lua_setfield(L, -2, "stdout_truncated");
  lua_pushboolean(L, r->err_truncated);
  lua_setfield(L, -2, "stderr_truncated");
  lua_pushinteger(L, (lua_Integer)r->out_total);
  lua_setfield(L, -2, "stdout_bytes");
  lua_pushinteger(L, (lua_Integer)r->err_total);
  lua_setfield(L, -2, "stderr_bytes");
  lua_pushnumber(L, r->wall_ms);
  lua_setfield(L, -2, "wall_ms");
  lua_pushnumber(L, r->cpu_ms);
  lua_setfield(L, -2, "cpu_ms");
  lua_pushinteger(L, r->max_rss_kb);
  lua_setfield(L, -2, "max_rss_kb");
  lua_createtable(L, 0, (int)r->nfiles);
  for (size_t i = 0; i < r->nfiles; i++) {
    lua_pushlstring(L, r->files[i].data, r->files[i].len);
    lua_setfield(L, -2, r->files[i].name);
  }
  lua_setfield(L, -2, "files");
  lua_pushboolean(L, r->files_truncated);
  lua_setfield(L, -2, "files_truncated");
  if (*r->message) {
    lua_pushstring(L, r->message);
    lua_setfield(L, -2, "message");
  }
}

/* push_result under lua_pcall, then frees r whatever happened: a memory error while the table
 * is built must not lose the result. Re-raises that error after freeing. */
static int push_result_protected(lua_State *L) {
  push_result(L, lua_touserdata(L, 1));
  return 1;
}

static void push_result_and_free(lua_State *L, mrl_sandbox_result *r) {
  if (!lua_checkstack(L, 2)) {
    mrl_sandbox_result_free(r);
    luaL_error(L, "sandbox: no room on the Lua stack for the result");
  }
  lua_pushcfunction(L, push_result_protected);
  lua_pushlightuserdata(L, r);
  int rc = lua_pcall(L, 1, 1, 0);
  mrl_sandbox_result_free(r);
  if (rc != LUA_OK) lua_error(L);
}

/* Builds a call from the options table at idx; the arrays live in userdata pushed on the stack
 * (and the strings in the options table). */
static void read_call(lua_State *L, int idx, mrl_sandbox_call *call) {
  static const char *const keys[] = {"argv",   "stdin",  "files",   "env",       "wall_ms",
                                     "cpu_ms", "mem_mb", "pids",    "out_cap",   "out_kill",
                                     "fsize",  "nofile", "disk_mb", "files_cap", NULL};
  luaL_checktype(L, idx, LUA_TTABLE);
  check_keys(L, idx, keys, "call");
  memset(call, 0, sizeof *call);
  read_limits(L, idx, &call->limits);
  call->argv = string_list(L, idx, "argv");
  if (!call->argv || !call->argv[0])
    luaL_argerror(L, idx, "argv: a non-empty list of strings expected");
  int ty = lua_getfield(L, idx, "stdin");
  if (ty == LUA_TSTRING)
    call->stdin_data = lua_tolstring(L, -1, &call->stdin_len);
  else if (ty != LUA_TNIL)
    luaL_argerror(L, idx,
                  lua_pushfstring(L, "stdin: string expected, got %s", luaL_typename(L, -1)));
  lua_pop(L, 1);
  for (int which = 0; which < 2; which++) { /* files, then env: both {name = string} */
    const char *key = which ? "env" : "files";
    ty = lua_getfield(L, idx, key);
    if (ty == LUA_TNIL) {
      lua_pop(L, 1);
      continue;
    }
    if (ty != LUA_TTABLE)
      luaL_argerror(L, idx,
                    lua_pushfstring(L, "%s: table expected, got %s", key, luaL_typename(L, -1)));
    int t = lua_gettop(L);
    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, t)) {
      if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
        luaL_argerror(L, idx,
                      lua_pushfstring(L, "%s: string keys and string values expected", key));
      lua_pop(L, 1);
      n++;
    }
    if (which == 0) {
      mrl_sandbox_file *f = lua_newuserdatauv(L, (n ? n : 1) * sizeof *f, 0);
      size_t i = 0;
      lua_pushnil(L);
      while (lua_next(L, t)) {
        f[i].name = lua_tostring(L, -2);
        f[i].data = lua_tolstring(L, -1, &f[i].len);
        i++;
        lua_pop(L, 1);
      }
      call->files = f;
      call->nfiles = n;
    } else { /* "NAME=value" strings, kept in a table on the stack */
      const char **env = lua_newuserdatauv(L, (n + 1) * sizeof *env, 1);
      lua_createtable(L, (int)n, 0);
      size_t i = 0;
      lua_pushnil(L);
      while (lua_next(L, t)) {
        const char *name = lua_tostring(L, -2);
        if (!*name || strchr(name, '='))
          luaL_argerror(L, idx, lua_pushfstring(L, "env: bad variable name '%s'", name));
        lua_pushfstring(L, "%s=%s", name, lua_tostring(L, -1));
        env[i] = lua_tostring(L, -1);
        lua_rawseti(L, -4, (lua_Integer)++i);
        lua_pop(L, 1);
      }
      env[i] = NULL;
      lua_setiuservalue(L, -2, 1);
      call->env = env;
    }
  }
}

/* pool:run{argv={...}, stdin=, files={name=content}, env={NAME=value}, <limits>} -> result
 * table (the outcome of the call, whatever it was), or nil and a message when the engine cannot
 * start processes at all. */
static int m_run(lua_State *L) {
  mrl_sandbox *p = check_pool(L, 1);
  mrl_sandbox_call call;
  read_call(L, 2, &call);
  mrl_sandbox_result *r = NULL;
  mrl_engine *e = mrl__lua_engine(L);
  mrl_status st = mrl_sandbox_run(p, &call, &r);
  if (st) return fail_result(L, e, st, 2);
  push_result_and_free(L, r);
  return 1;
}

/* pool:start{...} -> job (the same options as run). */
static int m_start(lua_State *L) {
  mrl_sandbox *p = check_pool(L, 1);
  mrl_sandbox_call call;
  read_call(L, 2, &call);
  job_box *b = lua_newuserdatauv(L, sizeof *b, 1);
  b->j = NULL;
  luaL_setmetatable(L, JOB_MT);
  mrl_engine *e = mrl__lua_engine(L);
  mrl_status st = mrl_sandbox_start(p, &call, &b->j);
  if (st) return fail_result(L, e, st, 2);
  return 1;
}

static int m_pool_close(lua_State *L) {
  pool_box *b = luaL_checkudata(L, 1, POOL_MT);
  mrl_sandbox_free(b->p);
  b->p = NULL;
  return 0;
}

static int m_pool_tostring(lua_State *L) {
  pool_box *b = luaL_checkudata(L, 1, POOL_MT);
  if (b->p)
    lua_pushfstring(L, "sandbox pool (%p)", (void *)b->p);
  else
    lua_pushliteral(L, "sandbox pool (closed)");
  return 1;
}

/* The state's default pool, made on first use. */
mrl_sandbox *mrl__lua_default_pool(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, DEFAULT_POOL_KEY);
  pool_box *b = luaL_testudata(L, -1, POOL_MT);
  lua_pop(L, 1);
  if (b && b->p) return b->p;
  mrl_engine *e = mrl__lua_engine(L);
  b = new_pool_box(L);
  mrl_status st = mrl_sandbox_new(e, NULL, &b->p);
  if (st) mrl__lua_raise(L, e, st, 0);
  lua_setfield(L, LUA_REGISTRYINDEX, DEFAULT_POOL_KEY);
  return b->p;
}

/* rl.sandbox.default_pool() -> the pool rl.sandbox.lua and the tool runners use when given
 * none (made on first use, with the default settings). */
static int l_default_pool(lua_State *L) {
  mrl__lua_default_pool(L);
  lua_getfield(L, LUA_REGISTRYINDEX, DEFAULT_POOL_KEY);
  return 1;
}

/* ---- jobs ---- */
static job_box *check_job(lua_State *L) {
  job_box *b = luaL_testudata(L, 1, JOB_MT);
  if (!b)
    luaL_argerror(L, 1, lua_pushfstring(L, "sandbox job expected, got %s", luaL_typename(L, 1)));
  if (!b->j) luaL_argerror(L, 1, "the sandbox job is closed");
  return b;
}

/* job:wait() -> the result table (the same table on every call). */
static int m_wait(lua_State *L) {
  job_box *b = check_job(L);
  if (lua_getiuservalue(L, 1, 1) == LUA_TTABLE) return 1;
  mrl_sandbox_result *r = NULL;
  mrl_engine *e = mrl__lua_engine(L);
  mrl_status st = mrl_sandbox_job_wait(b->j, &r);
  if (st) return mrl__lua_raise(L, e, st, 0);
  push_result_and_free(L, r);
  lua_pushvalue(L, -1);
  lua_setiuservalue(L, 1, 1);
  return 1;
}

/* job:done() -> whether the job has finished (makes progress on the whole pool, never waits). */
static int m_done(lua_State *L) {
  job_box *b = check_job(L);
  int done = 0;
  mrl_sandbox_job_poll(b->j, &done);
  lua_pushboolean(L, done);
  return 1;
}

/* job:kill(): kills the job's process tree (a queued job never starts). */
static int m_kill(lua_State *L) {
  mrl_sandbox_job_kill(check_job(L)->j);
  return 0;
}

/* job:fd() -> a file descriptor that is readable whenever job:done() has progress to make. */
static int m_fd(lua_State *L) {
  lua_pushinteger(L, mrl_sandbox_job_fd(check_job(L)->j));
  return 1;
}

static int m_job_close(lua_State *L) {
  job_box *b = luaL_checkudata(L, 1, JOB_MT);
  mrl_sandbox_job_free(b->j);
  b->j = NULL;
  return 0;
}

static int m_job_tostring(lua_State *L) {
  job_box *b = luaL_checkudata(L, 1, JOB_MT);
  if (b->j)
    lua_pushfstring(L, "sandbox job (%p)", (void *)b->j);
  else
    lua_pushliteral(L, "sandbox job (closed)");
  return 1;
}

static const luaL_Reg pool_methods[] = {{"run", m_run},
                                        {"start", m_start},
                                        {"capabilities", m_capabilities},
                                        {"close", m_pool_close},
                                        {NULL, NULL}};
static const luaL_Reg pool_meta[] = {{"__gc", m_pool_close},
                                     {"__close", m_pool_close},
                                     {"__tostring", m_pool_tostring},
                                     {NULL, NULL}};
static const luaL_Reg job_methods[] = {{"wait", m_wait}, {"done", m_done},       {"kill", m_kill},
                                       {"fd", m_fd},     {"close", m_job_close}, {NULL, NULL}};
static const luaL_Reg job_meta[] = {
    {"__gc", m_job_close}, {"__close", m_job_close}, {"__tostring", m_job_tostring}, {NULL, NULL}};
static const luaL_Reg sandbox_funcs[] = {{"pool", l_pool},
                                         {"default_pool", l_default_pool},
                                         {"lua", mrl__lua_sandbox_lua},
                                         {NULL, NULL}};

void mrl__lua_open_sandbox(lua_State *L) {
  luaL_newmetatable(L, POOL_MT);
  luaL_setfuncs(L, pool_meta, 0);
  luaL_newlib(L, pool_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newmetatable(L, JOB_MT);
  luaL_setfuncs(L, job_meta, 0);
  luaL_newlib(L, job_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, sandbox_funcs);
}
