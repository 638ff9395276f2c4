/* lua_sandbox_lua.c - restricted Lua tools (`rl.sandbox.lua{code=, budget=, mem_mb=, wall_ms=}`):
 * a fresh Lua state per call with the allow-listed libraries (base without dofile, loadfile,
 * collectgarbage and warn; string without dump; table, math, utf8, coroutine), text-only load,
 * reads of undefined globals as errors, a memory cap held by the state's own allocator, an
 * instruction budget that neither pcall nor xpcall's handler nor a __gc method can escape, and
 * a print whose output is capped.
 *
 * Without wall_ms the state runs in this process. The budget's count hook never fires inside a C
 * function, so a catastrophic string pattern can run for minutes: with wall_ms the same runner
 * works in a forked copy of this process inside the tool sandbox (seccomp, namespaces, cgroups),
 * which is killed when the wall-clock limit passes. The copy uses no lock another thread may have
 * held when it was made: the state's memory is an arena of its own (mmap), and it reports through
 * fds 1 (print) and 2 (a framed result). Nothing raises outside a protected call: not in the
 * restricted state (whose error object is converted under lua_pcall), and not in the caller's
 * state while the arena or the sandbox's result is held (the result table is built under
 * lua_pcall, then they are freed). */
#define _GNU_SOURCE
#include "lua_internal.h"
#include "sandbox.h"

#include <errno.h>
#include <lualib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum {
  SMALL_STEP = 16,  /* small blocks come in multiples of 16 bytes ... */
  SMALL_MAX = 1024, /* ... up to 1 KiB, then in powers of two */
  NCLASSES = SMALL_MAX / SMALL_STEP + 48,
  HOOK_PERIOD = 1000 /* instructions between two calls of the count hook */
};

static const char RESULT_MAGIC[] = "\n\x01moonrl-lua-result\x01";

typedef enum { RS_OK, RS_ERROR, RS_BUDGET, RS_OOM, RS_TIMEOUT, RS_SETUP } rstatus;
static const char *const status_names[] = {"ok",  "error",   "budget",
                                           "oom", "timeout", "setup_error"};

/* A restricted state's memory and budget. The arena is reserved virtual memory, four times the
 * cap (size classes waste up to half of a block), so that the cap counts what Lua asked for. */
typedef struct rstate {
  char *base;
  size_t size, top;
  void *free_list[NCLASSES];
  size_t used, cap;
  int64_t budget, steps;
  int exceeded;
  int out_fd; /* print: -1 into out[], else straight to this fd (the worker) */
  char *out;
  size_t out_len, out_cap;
  uint64_t out_total;
} rstate;

/* ---- the arena ---- */
static int size_class(size_t n) {
  if (n > (size_t)1 << 56) return NCLASSES; /* beyond any arena */
  if (n <= SMALL_MAX) return n == 0 ? 0 : (int)((n - 1) / SMALL_STEP);
  int c = SMALL_MAX / SMALL_STEP;
  for (size_t s = 2 * SMALL_MAX; s < n; s *= 2) c++;
  return c;
}

static size_t class_size(int c) {
  if (c < SMALL_MAX / SMALL_STEP) return (size_t)(c + 1) * SMALL_STEP;
  return (size_t)2 * SMALL_MAX << (c - SMALL_MAX / SMALL_STEP);
}

static void *arena_get(rstate *rs, size_t n) {
  int c = size_class(n);
  if (c >= NCLASSES) return NULL;
  void *p = rs->free_list[c];
  if (p) {
    memcpy(&rs->free_list[c], p, sizeof(void *));
    return p;
  }
  size_t s = class_size(c);
  if (s > rs->size - rs->top) return NULL;
  p = rs->base + rs->top;
  rs->top += s;
  return p;
}

static void arena_put(rstate *rs, void *p, size_t n) {
  int c = size_class(n);
  memcpy(p, &rs->free_list[c], sizeof(void *));
  rs->free_list[c] = p;
}

/* lua_Alloc: the cap counts the sizes Lua asked for. Shrinking never fails (Lua relies on it). */
static void *arena_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  rstate *rs = ud;
  if (!ptr) osize = 0;
  if (nsize == 0) {
    if (ptr) {
      arena_put(rs, ptr, osize);
      rs->used -= osize;
    }
    return NULL;
  }
  if (nsize > osize && nsize - osize > rs->cap - rs->used) return NULL;
  if (ptr && nsize <= osize) {
    rs->used -= osize - nsize;
    /* the block stays: freed later as an nsize block, it is at least that big */
    return ptr;
  }
  if (ptr && size_class(nsize) == size_class(osize)) {
    rs->used += nsize - osize;
    return ptr;
  }
  void *q = arena_get(rs, nsize);
  if (!q) return NULL;
  if (ptr) {
    memcpy(q, ptr, osize);
    arena_put(rs, ptr, osize);
  }
  rs->used += nsize - osize;
  return q;
}

static bool rstate_init(rstate *rs, size_t cap, int64_t budget, size_t out_cap, int out_fd) {
  memset(rs, 0, sizeof *rs);
  rs->cap = cap;
  rs->size = 4 * cap + ((size_t)1 << 20);
  rs->base = mmap(NULL, rs->size, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (rs->base == MAP_FAILED) return false;
  rs->budget = budget;
  rs->out_fd = out_fd;
  rs->out_cap = out_cap;
  if (out_fd < 0) {
    rs->out = mmap(NULL, out_cap + 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (rs->out == MAP_FAILED) {
      munmap(rs->base, rs->size);
      return false;
    }
  }
  return true;
}

static void rstate_free(rstate *rs) {
  munmap(rs->base, rs->size);
  if (rs->out_fd < 0) munmap(rs->out, rs->out_cap + 1);
}

static rstate *rstate_of(lua_State *L) {
  void *ud;
  lua_getallocf(L, &ud);
  return ud;
}

/* ---- the budget ---- */

/* Counts instructions; past the budget it raises on every instruction of every coroutine, so a
 * pcall that catches the error only gets to run the next instruction, which raises again. */
static void budget_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  rstate *rs = rstate_of(L);
  if (!rs->exceeded) {
    rs->steps += rs->budget < HOOK_PERIOD ? rs->budget : HOOK_PERIOD;
    if (rs->steps < rs->budget) return;
    rs->exceeded = 1;
  }
  lua_sethook(L, budget_hook, LUA_MASKCOUNT, 1);
  luaL_error(L, "instruction budget of %I exceeded", (lua_Integer)rs->budget);
}

/* ---- the restricted library ---- */
static void output(rstate *rs, const char *s, size_t n) {
  rs->out_total += n;
  size_t room = rs->out_cap > rs->out_len ? rs->out_cap - rs->out_len : 0;
  size_t k = n < room ? n : room;
  if (k == 0) return;
  if (rs->out_fd >= 0) {
    for (size_t done = 0; done < k;) {
      ssize_t w = write(rs->out_fd, s + done, k - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      done += (size_t)w;
    }
  } else {
    memcpy(rs->out + rs->out_len, s, k);
  }
  rs->out_len += k;
}

/* print(...): as the standard one, into the capped output. */
static int r_print(lua_State *L) {
  rstate *rs = rstate_of(L);
  int n = lua_gettop(L);
  for (int i = 1; i <= n; i++) {
    size_t len;
    const char *s = luaL_tolstring(L, i, &len);
    if (i > 1) output(rs, "\t", 1);
    output(rs, s, len);
    lua_pop(L, 1);
  }
  output(rs, "\n", 1);
  return 0;
}

/* load(chunk [, chunkname [, mode [, env]]]): the standard one, always in text mode. */
static int r_load(lua_State *L) {
  int n = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_pushvalue(L, 1);
  if (n >= 2)
    lua_pushvalue(L, 2);
  else
    lua_pushnil(L);
  lua_pushliteral(L, "t");
  if (n >= 4) lua_pushvalue(L, 4);
  lua_call(L, n >= 4 ? 4 : 3, LUA_MULTRET);
  return lua_gettop(L) - n;
}

/* The message handler xpcall really installs: Lua runs a message handler at the point of the
 * error, and when the error came from the count hook, hooks are off until the unwinding: a user
 * handler would run unbudgeted. After the budget is spent the error passes through unchanged. */
static int r_msgh(lua_State *L) {
  if (rstate_of(L)->exceeded) return 1;
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

static int finish_xpcall(lua_State *L, int status, lua_KContext extra) {
  if (status != LUA_OK && status != LUA_YIELD) {
    lua_pushboolean(L, 0);
    lua_pushvalue(L, -2);
    return 2;
  }
  return lua_gettop(L) - (int)extra;
}

/* xpcall(f, msgh, ...): the standard one (lbaselib.c), with msgh wrapped by r_msgh. */
static int r_xpcall(lua_State *L) {
  int n = lua_gettop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  lua_pushcclosure(L, r_msgh, 1);
  lua_replace(L, 2);
  lua_pushboolean(L, 1);
  lua_pushvalue(L, 1);
  lua_rotate(L, 3, 2);
  int status = lua_pcallk(L, n - 2, LUA_MULTRET, 2, 2, finish_xpcall);
  return finish_xpcall(L, status, 2);
}

/* setmetatable(t, mt): refuses __gc. Lua runs finalizers with hooks off, so a __gc method would
 * run unbudgeted (and a table only becomes finalizable through setmetatable). */
static int r_setmetatable(lua_State *L) {
  if (lua_type(L, 2) == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, 2) != LUA_TNIL)
      return luaL_error(L, "__gc metamethods are not available in the sandbox");
    lua_pop(L, 1);
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

/* __index of the globals: reading a name that is not defined is an error. */
static int r_undefined(lua_State *L) {
  static const char *const removed[] = {"io",     "os",       "require",        "package", "debug",
                                        "dofile", "loadfile", "collectgarbage", "warn",    NULL};
  const char *name = lua_tostring(L, 2);
  for (int i = 0; name && removed[i]; i++)
    if (strcmp(name, removed[i]) == 0)
      return luaL_error(L, "'%s' is not available in the sandbox", name);
  return luaL_error(L, "global '%s' is not defined", name ? name : luaL_typename(L, 2));
}

static int open_restricted(lua_State *L) {
  static const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},
                                  {LUA_STRLIBNAME, luaopen_string},
                                  {LUA_TABLIBNAME, luaopen_table},
                                  {LUA_MATHLIBNAME, luaopen_math},
                                  {LUA_UTF8LIBNAME, luaopen_utf8},
                                  {LUA_COLIBNAME, luaopen_coroutine},
                                  {NULL, NULL}};
  for (const luaL_Reg *l = libs; l->name; l++) {
    luaL_requiref(L, l->name, l->func, 1);
    lua_pop(L, 1);
  }
  lua_pushglobaltable(L);
  static const char *const drop[] = {"dofile", "loadfile", "collectgarbage", "warn", NULL};
  for (int i = 0; drop[i]; i++) {
    lua_pushnil(L);
    lua_setfield(L, -2, drop[i]);
  }
  lua_pushcfunction(L, r_print);
  lua_setfield(L, -2, "print");
  lua_getfield(L, -1, "load");
  lua_pushcclosure(L, r_load, 1);
  lua_setfield(L, -2, "load");
  lua_pushcfunction(L, r_xpcall);
  lua_setfield(L, -2, "xpcall");
  lua_getfield(L, -1, "setmetatable");
  lua_pushcclosure(L, r_setmetatable, 1);
  lua_setfield(L, -2, "setmetatable");
  lua_getfield(L, -1, LUA_STRLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_pop(L, 1);
  lua_pushnil(L); /* package.loaded would still reach the libraries: it goes */
  lua_setfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, r_undefined);
  lua_setfield(L, -2, "__index");
  lua_setmetatable(L, -2);
  return 0;
}

/* ---- one run ---- */
typedef struct rresult {
  rstatus status;
  int vtype; /* LUA_TNIL, LUA_TBOOLEAN, LUA_TNUMBER (integer or float) or LUA_TSTRING */
  int vint;  /* the number is an integer */
  lua_Integer i;
  lua_Number f;
  int b;
  const char *s; /* string value: in the state's arena (valid until rstate_free) */
  size_t slen;
  const char *err; /* the error message (arena or static) */
  size_t errlen;
  char budget_msg[64];
} rresult;

/* take_value(res, value): the result's value (tostring for other types, under the budget);
 * returns it, so that a string stays referenced from the stack. */
static int take_value(lua_State *L) {
  rresult *res = lua_touserdata(L, 1);
  int ty = lua_type(L, 2);
  res->vtype = ty == LUA_TNONE ? LUA_TNIL : ty;
  switch (res->vtype) {
  case LUA_TNIL: break;
  case LUA_TBOOLEAN: res->b = lua_toboolean(L, 2); break;
  case LUA_TNUMBER:
    res->vint = lua_isinteger(L, 2);
    if (res->vint)
      res->i = lua_tointeger(L, 2);
    else
      res->f = lua_tonumber(L, 2);
    break;
  default:
    luaL_tolstring(L, 2, NULL);
    lua_replace(L, 2);
    res->vtype = LUA_TSTRING;
    /* fall through */
  case LUA_TSTRING: res->s = lua_tolstring(L, 2, &res->slen); break;
  }
  lua_settop(L, 2);
  return 1;
}

/* number_text(n): the number as a string (lua_tolstring converts in place, which allocates:
 * run under lua_pcall, so that a state at its memory cap cannot raise unprotected). */
static int number_text(lua_State *L) {
  lua_tolstring(L, 1, NULL);
  return 1;
}

static void set_error(lua_State *L, rresult *res, int rc) {
  rstate *rs = rstate_of(L);
  res->status = rs->exceeded ? RS_BUDGET : rc == LUA_ERRMEM ? RS_OOM : RS_ERROR;
  if (lua_type(L, -1) == LUA_TNUMBER) {
    lua_pushcfunction(L, number_text);
    lua_insert(L, -2);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) rc = LUA_ERRMEM;
  }
  const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &res->errlen) : NULL;
  if (!msg) {
    msg = "(error object is not a string)";
    res->errlen = strlen(msg);
  }
  if (rc == LUA_ERRMEM) {
    msg = "not enough memory";
    res->errlen = strlen(msg);
  }
  if (res->status == RS_BUDGET) { /* whatever error the escalation ended in */
    snprintf(res->budget_msg, sizeof res->budget_msg, "instruction budget of %lld exceeded",
             (long long)rs->budget);
    msg = res->budget_msg;
    res->errlen = strlen(msg);
  }
  res->err = msg;
}

/* Runs code in a new restricted state on rs; the state is left open (its strings are in the
 * result) and is dropped with the arena. */
static void run_restricted(rstate *rs, const char *code, size_t len, rresult *res) {
  memset(res, 0, sizeof *res);
  res->vtype = LUA_TNIL;
  lua_State *L = lua_newstate(arena_alloc, rs);
  if (!L) {
    res->status = RS_OOM;
    res->err = "not enough memory";
    res->errlen = strlen(res->err);
    return;
  }
  lua_pushcfunction(L, open_restricted);
  int rc = lua_pcall(L, 0, 0, 0);
  if (rc == LUA_OK) {
    lua_sethook(L, budget_hook, LUA_MASKCOUNT,
                rs->budget < HOOK_PERIOD ? (int)rs->budget : HOOK_PERIOD);
    rc = luaL_loadbufferx(L, code, len, "=tool", "t");
  }
  if (rc == LUA_OK) rc = lua_pcall(L, 0, 1, 0);
  if (rc == LUA_OK) {
    lua_pushcfunction(L, take_value);
    lua_pushlightuserdata(L, res);
    lua_rotate(L, -3, 2); /* take_value(res, value) */
    rc = lua_pcall(L, 2, 1, 0);
  }
  if (rc != LUA_OK) {
    res->vtype = LUA_TNIL;
    set_error(L, res, rc);
  }
  /* lua_close would run the code's __gc metamethods: the arena goes as a whole instead */
}

/* ---- the worker: the same run in a forked copy inside the sandbox ---- */
typedef struct worker_job {
  const char *code;
  size_t len, cap, out_cap;
  int64_t budget;
} worker_job;

static void put_bytes(const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(2, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    c += w;
    n -= (size_t)w;
  }
}

static void put_u64(uint64_t v) { put_bytes(&v, sizeof v); }

/* Frame on fd 2: magic, status, value type, value, error, total output bytes. */
static int worker_main(void *ud) {
  worker_job *w = ud;
  rstate rs;
  if (!rstate_init(&rs, w->cap, w->budget, w->out_cap, 1)) return 125;
  rresult res;
  run_restricted(&rs, w->code, w->len, &res);
  put_bytes(RESULT_MAGIC, sizeof RESULT_MAGIC);
  put_u64((uint64_t)res.status);
  put_u64((uint64_t)res.vtype);
  put_u64((uint64_t)res.vint);
  switch (res.vtype) {
  case LUA_TBOOLEAN: put_u64((uint64_t)res.b); break;
  case LUA_TNUMBER:
    if (res.vint)
      put_u64((uint64_t)res.i);
    else
      put_bytes(&res.f, sizeof res.f);
    break;
  case LUA_TSTRING:
    put_u64(res.slen);
    put_bytes(res.s, res.slen);
    break;
  }
  put_u64(res.errlen);
  put_bytes(res.err ? res.err : "", res.errlen);
  put_u64(rs.out_total);
  return 0;
}

/* Reads the worker's frame; pushes value and error and returns the status (-1 when malformed). */
static int read_frame(lua_State *L, const char *err, size_t len, uint64_t *out_total) {
  const char *m = NULL;
  for (const char *s = err; s && (size_t)(s - err) + sizeof RESULT_MAGIC <= len;) {
    const char *hit = memmem(s, len - (size_t)(s - err), RESULT_MAGIC, sizeof RESULT_MAGIC);
    if (!hit) break;
    m = hit;
    s = hit + 1;
  }
  if (!m) return -1;
  const char *p = m + sizeof RESULT_MAGIC, *end = err + len;
#define TAKE(dst, n)                                                                               \
  do {                                                                                             \
    if ((size_t)(end - p) < (n)) return -1;                                                        \
    memcpy((dst), p, (n));                                                                         \
    p += (n);                                                                                      \
  } while (0)
  uint64_t status, vtype, vint, v, n;
  TAKE(&status, 8);
  TAKE(&vtype, 8);
  TAKE(&vint, 8);
  if (status > RS_SETUP) return -1;
  switch (vtype) {
  case LUA_TNIL: lua_pushnil(L); break;
  case LUA_TBOOLEAN:
    TAKE(&v, 8);
    lua_pushboolean(L, v != 0);
    break;
  case LUA_TNUMBER:
    TAKE(&v, 8);
    if (vint)
      lua_pushinteger(L, (lua_Integer)v);
    else {
      lua_Number f;
      memcpy(&f, &v, sizeof f);
      lua_pushnumber(L, f);
    }
    break;
  case LUA_TSTRING:
    TAKE(&n, 8);
    if ((uint64_t)(end - p) < n) return -1;
    lua_pushlstring(L, p, (size_t)n);
    p += n;
    break;
  default: return -1;
  }
  TAKE(&n, 8);
  if ((uint64_t)(end - p) < n) return -1;
  lua_pushlstring(L, p, (size_t)n);
  p += n;
  TAKE(out_total, 8);
#undef TAKE
  return (int)status;
}

/* ---- rl.sandbox.lua ---- */
static int64_t opt_count(lua_State *L, const char *key, int64_t dflt, int64_t max) {
  int ty = lua_getfield(L, 1, key);
  int64_t v = dflt;
  if (ty != LUA_TNIL) {
    int isint;
    lua_Integer n = lua_tointegerx(L, -1, &isint);
    if (ty != LUA_TNUMBER || !isint || n < 1 || n > max)
      luaL_argerror(L, 1,
                    lua_pushfstring(L, "%s: integer from 1 to %I expected", key, (lua_Integer)max));
    v = n;
  }
  lua_pop(L, 1);
  return v;
}

static void push_common(lua_State *L, rstatus status, const char *output, size_t out_len,
                        bool truncated) {
  lua_pushstring(L, status_names[status]);
  lua_setfield(L, -2, "status");
  lua_pushlstring(L, output, out_len);
  lua_setfield(L, -2, "output");
  lua_pushboolean(L, truncated);
  lua_setfield(L, -2, "output_truncated");
}

/* The result table of an in-process run (raises on memory errors; run under lua_pcall). */
typedef struct {
  rstate *rs;
  rresult *res;
} in_process_run;

static int push_in_process(lua_State *L) {
  in_process_run *run = lua_touserdata(L, 1);
  const rresult *res = run->res;
  const rstate *rs = run->rs;
  lua_createtable(L, 0, 6);
  push_common(L, res->status, rs->out, rs->out_len, rs->out_total > rs->out_len);
  switch (res->vtype) {
  case LUA_TBOOLEAN: lua_pushboolean(L, res->b); break;
  case LUA_TNUMBER:
    if (res->vint)
      lua_pushinteger(L, res->i);
    else
      lua_pushnumber(L, res->f);
    break;
  case LUA_TSTRING: lua_pushlstring(L, res->s, res->slen); break;
  default: lua_pushnil(L);
  }
  lua_setfield(L, -2, "value");
  if (res->err) {
    lua_pushlstring(L, res->err, res->errlen);
    lua_setfield(L, -2, "error");
  }
  return 1;
}

/* The result table of a run in the sandbox from its result r (raises on memory errors; run
 * under lua_pcall). */
static int push_worker(lua_State *L) {
  const mrl_sandbox_result *r = lua_touserdata(L, 1);
  lua_settop(L, 0);
  lua_createtable(L, 0, 6);
  int top = lua_gettop(L);
  uint64_t out_total = r->out_total;
  int fs = r->status == MRL_SANDBOX_EXITED && r->exit_code == 0
               ? read_frame(L, r->err, r->err_len, &out_total)
               : -1;
  rstatus status;
  if (fs >= 0) {
    status = (rstatus)fs;
    lua_setfield(L, -3, "error"); /* the error message (empty when none) ... */
    lua_getfield(L, -2, "error");
    if (lua_rawlen(L, -1) == 0) {
      lua_pushnil(L);
      lua_setfield(L, -4, "error");
    }
    lua_pop(L, 1);
    lua_setfield(L, -2, "value"); /* ... and the value */
  } else {
    lua_settop(L, top);
    status = r->status == MRL_SANDBOX_TIMEOUT || r->status == MRL_SANDBOX_CPU_LIMIT ? RS_TIMEOUT
             : r->status == MRL_SANDBOX_OOM                                         ? RS_OOM
             : r->status == MRL_SANDBOX_SETUP_ERROR                                 ? RS_SETUP
                                                                                    : RS_ERROR;
    if (*r->message)
      lua_pushfstring(L, "the sandboxed worker: %s: %s", mrl_sandbox_status_name(r->status),
                      r->message);
    else
      lua_pushfstring(L, "the sandboxed worker ended: %s %d", mrl_sandbox_status_name(r->status),
                      r->status == MRL_SANDBOX_EXITED ? r->exit_code : r->signal);
    lua_setfield(L, -2, "error");
  }
  push_common(L, status, r->out, r->out_len, out_total > r->out_len);
  return 1;
}

/* rl.sandbox.lua{code=, budget=, mem_mb=, wall_ms=, output_cap=, pool=} -> {status=, value=,
 * output=, error=, output_truncated=}. status: "ok", "error", "budget", "oom", "timeout" or
 * "setup_error". With wall_ms the code runs in the sandbox (pool, else the default pool). */
int mrl__lua_sandbox_lua(lua_State *L) {
  static const char *const keys[] = {"code",       "budget", "mem_mb", "wall_ms",
                                     "output_cap", "pool",   NULL};
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    lua_pop(L, 1);
    bool known = false;
    for (int i = 0; keys[i] && !known; i++)
      known = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), keys[i]) == 0;
    if (!known)
      luaL_argerror(L, 1,
                    lua_pushfstring(L,
                                    "unknown field '%s' (expected code, budget, mem_mb, "
                                    "wall_ms, output_cap, pool)",
                                    luaL_tolstring(L, -1, NULL)));
  }
  if (lua_getfield(L, 1, "code") != LUA_TSTRING)
    luaL_argerror(L, 1, lua_pushfstring(L, "code: string expected, got %s", luaL_typename(L, -1)));
  size_t len;
  const char *code = lua_tolstring(L, -1, &len); /* stays on the stack */
  int64_t budget = opt_count(L, "budget", 100000000, INT64_MAX / 2);
  int64_t mem_mb = opt_count(L, "mem_mb", 64, 1 << 16);
  int64_t out_cap = opt_count(L, "output_cap", 65536, (int64_t)1 << 30);
  int has_wall = lua_getfield(L, 1, "wall_ms") != LUA_TNIL;
  lua_pop(L, 1);
  int64_t wall_ms = opt_count(L, "wall_ms", 0, 86400000);
  int pool_ty = lua_getfield(L, 1, "pool");
  mrl_sandbox *pool = pool_ty == LUA_TNIL ? NULL : mrl__lua_test_pool(L, -1);
  if (pool_ty != LUA_TNIL && !pool) luaL_argerror(L, 1, "pool: an open sandbox pool expected");
  size_t cap = (size_t)mem_mb << 20;

  if (!has_wall) {
    rstate rs;
    if (!rstate_init(&rs, cap, budget, (size_t)out_cap, -1))
      return luaL_error(L, "rl.sandbox.lua: cannot reserve %d MiB of memory", (int)mem_mb);
    rresult res;
    run_restricted(&rs, code, len, &res);
    /* the result's strings live in the arena: copied out under lua_pcall, then it goes */
    in_process_run run = {&rs, &res};
    if (!lua_checkstack(L, 2)) {
      rstate_free(&rs);
      return luaL_error(L, "rl.sandbox.lua: no room on the Lua stack for the result");
    }
    lua_pushcfunction(L, push_in_process);
    lua_pushlightuserdata(L, &run);
    int rc = lua_pcall(L, 1, 1, 0);
    rstate_free(&rs);
    return rc == LUA_OK ? 1 : lua_error(L);
  }

  if (!pool) pool = mrl__lua_default_pool(L);
  worker_job w = {code, len, cap, (size_t)out_cap, budget};
  mrl_sandbox_call call;
  memset(&call, 0, sizeof call);
  call.limits.wall_ms = wall_ms;
  call.limits.cpu_ms = wall_ms;
  call.limits.pids = 4;
  /* the arena, the copy's own pages and the frame of a string value as big as the cap */
  call.limits.mem_bytes = (int64_t)(4 * cap) + ((int64_t)64 << 20);
  call.limits.out_cap = (int64_t)cap + out_cap + 4096;
  call.limits.out_kill = 2 * call.limits.out_cap + 4096;
  mrl_engine *e = mrl__lua_engine(L);
  mrl_sandbox_job *job = NULL;
  mrl_sandbox_result *r = NULL;
  mrl_status st = mrl__sandbox_start_fn(pool, &call, worker_main, &w, &job);
  if (!st) st = mrl_sandbox_job_wait(job, &r);
  mrl_sandbox_job_free(job);
  if (st) return mrl__lua_raise(L, e, st, 0);
  if (!lua_checkstack(L, 2)) {
    mrl_sandbox_result_free(r);
    return luaL_error(L, "rl.sandbox.lua: no room on the Lua stack for the result");
  }
  lua_pushcfunction(L, push_worker);
  lua_pushlightuserdata(L, r);
  int rc = lua_pcall(L, 1, 1, 0);
  mrl_sandbox_result_free(r);
  return rc == LUA_OK ? 1 : lua_error(L);
}
