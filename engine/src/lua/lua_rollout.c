/* lua_rollout.c - rollouts from Lua (`rl.rollout`): Lua environments wrapped as mrl_env vtables
 * for the C episode driver, tree rollouts and hooked runs (mrl_rollout_run, mrl_rollout_run_tree,
 * mrl_rollout_run_hooks, with Lua functions as the hooks and the selective gate), and the
 * episodes' records handed back as tensors (one copy out of the rollout, then views).
 * Environment errors end only their episode; the message is kept. Every call into Lua that the
 * engine makes (reset, step, clone) runs under lua_pcall, so no Lua error, out-of-memory errors
 * included, unwinds through the engine's frames. The step function comes from the Lua facade
 * (moonrl.env registers it with rl.rollout.set_step): this module requires no Lua module. */
#include "lua_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ROLLOUT_MT "moonrl.rollout"
#define ENVS_MT "moonrl.rollout.envs"
#define STEP_KEY "moonrl.rollout.step" /* registry: the step function set_step registered */

typedef struct {
  mrl_rollout *r;
  mrl_model *model; /* borrowed: the model userdata is kept in the rollout's user value */
  int episodes, capacity;
} lrollout;

typedef struct run_envs run_envs;

/* A Lua environment instance as an mrl_env. */
typedef struct {
  mrl_env vt;
  lua_State *L;
  run_envs *run;                                    /* the run's wrappers (clone takes one) */
  int module, instance, task, rng, record, step_fn; /* registry references */
  int obs;                                          /* reference to the last observation */
  char err[512];
} lua_env;

/* The wrappers of one run, in a userdata closed (references released) when the run returns or
 * raises: n roots, then the wrappers the roots' clones fill in, `used` of them so far. */
struct run_envs {
  int n, forks, used;
  lua_env env[];
};

static lrollout *check_rollout(lua_State *L, int idx) {
  lrollout *b = luaL_checkudata(L, idx, ROLLOUT_MT);
  if (!b->r) luaL_argerror(L, idx, "rollout is closed");
  return b;
}

/* ---- Lua environments behind the mrl_env vtable ----
 * Each callback runs a p_* function under lua_pcall: everything that may raise (calls, table
 * lookups through metamethods, strings, references) happens inside it, and only what cannot
 * allocate happens outside. */

/* Runs f(args) under lua_pcall with a traceback handler. On failure keeps the message in
 * env->err (read without converting, so without allocating) and returns MRL_ERR_LUA, or
 * MRL_ERR_NOMEM for a memory error. Leaves the stack as it was. */
static mrl_status protected_call(lua_env *env, lua_CFunction f, void *args) {
  lua_State *L = env->L;
  int top = lua_gettop(L);
  lua_pushcfunction(L, mrl__lua_traceback);
  lua_pushcfunction(L, f);
  lua_pushlightuserdata(L, args);
  int rc = lua_pcall(L, 1, 0, top + 1);
  if (rc != LUA_OK) {
    if (lua_type(L, -1) == LUA_TSTRING)
      snprintf(env->err, sizeof env->err, "%s", lua_tostring(L, -1));
    else if (rc == LUA_ERRMEM)
      snprintf(env->err, sizeof env->err, "not enough memory");
    else
      snprintf(env->err, sizeof env->err, "(error object is a %s value)", luaL_typename(L, -1));
  }
  lua_settop(L, top);
  return rc == LUA_OK ? MRL_OK : rc == LUA_ERRMEM ? MRL_ERR_NOMEM : MRL_ERR_LUA;
}

/* Keeps the string at the top of the stack alive as the environment's last observation (pops
 * it). */
static void hold_observation(lua_env *env, const char **obs, size_t *len) {
  lua_State *L = env->L;
  luaL_unref(L, LUA_REGISTRYINDEX, env->obs);
  env->obs = LUA_NOREF; /* should luaL_ref raise, nothing refers to the old slot twice */
  *obs = lua_tolstring(L, -1, len);
  env->obs = luaL_ref(L, LUA_REGISTRYINDEX);
}

/* What a p_* function hands back besides raising: a refusal (st, message in env->err) or its
 * results. */
typedef struct {
  lua_env *env;
  mrl_status st;
  const char *action, *obs;
  size_t action_len, obs_len;
  double reward;
  int done;
  lua_env *copy; /* clone: the wrapper to fill */
} env_call;

static int refuse(env_call *c, const char *msg) {
  snprintf(c->env->err, sizeof c->env->err, "%s", msg);
  c->st = MRL_ERR_INVALID;
  return 0;
}

/* instance:reset(task, rng) -> the first observation */
static int p_reset(lua_State *L) {
  env_call *c = lua_touserdata(L, 1);
  lua_env *env = c->env;
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->instance);
  if (lua_getfield(L, -1, "reset") != LUA_TFUNCTION)
    return refuse(c, "the environment instance has no reset method");
  lua_insert(L, -2); /* reset, instance */
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->task);
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->rng);
  lua_call(L, 3, 1);
  if (lua_type(L, -1) != LUA_TSTRING) {
    snprintf(env->err, sizeof env->err, "reset returned %s, not an observation string",
             luaL_typename(L, -1));
    c->st = MRL_ERR_INVALID;
    return 0;
  }
  hold_observation(env, &c->obs, &c->obs_len);
  return 0;
}

/* step(module, instance, action, record) -> observation, reward, done */
static int p_step(lua_State *L) {
  env_call *c = lua_touserdata(L, 1);
  lua_env *env = c->env;
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->step_fn);
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->module);
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->instance);
  lua_pushlstring(L, c->action, c->action_len);
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->record);
  lua_call(L, 4, 3);
  c->reward = lua_tonumber(L, -2);
  c->done = lua_toboolean(L, -1);
  lua_pop(L, 2);
  if (lua_isnil(L, -1))
    c->obs = NULL;
  else
    hold_observation(env, &c->obs, &c->obs_len);
  return 0;
}

/* Pushes a new list holding the entries of the list referenced by ref, up to `limit`. */
static void push_list_copy(lua_State *L, int ref, lua_Integer limit) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  int old = lua_gettop(L);
  lua_Integer len = luaL_len(L, old);
  if (len > limit) len = limit;
  lua_createtable(L, (int)len, 0);
  for (lua_Integer t = 1; t <= len; t++) {
    lua_rawgeti(L, old, t);
    lua_rawseti(L, -2, t);
  }
  lua_remove(L, old);
}

/* instance:clone() into the wrapper c->copy: the new instance, the same module, task, rng and
 * step function, and a new list of the records so far. */
static int p_clone(lua_State *L) {
  env_call *c = lua_touserdata(L, 1);
  lua_env *src = c->env, *dst = c->copy;
  lua_rawgeti(L, LUA_REGISTRYINDEX, src->instance);
  if (lua_getfield(L, -1, "clone") != LUA_TFUNCTION)
    return refuse(c, "the environment instance has no clone() method");
  lua_insert(L, -2); /* clone, instance */
  lua_call(L, 1, 1);
  if (!lua_istable(L, -1)) return refuse(c, "it did not return a table");
  dst->instance = luaL_ref(L, LUA_REGISTRYINDEX);
  int from[] = {src->module, src->task, src->rng, src->step_fn};
  int *to[] = {&dst->module, &dst->task, &dst->rng, &dst->step_fn};
  for (int i = 0; i < 4; i++) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, from[i]);
    *to[i] = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  push_list_copy(L, src->record, LUA_MAXINTEGER);
  dst->record = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

static mrl_status env_reset(void *self, const char **obs, size_t *len) {
  env_call c = {.env = self};
  mrl_status st = protected_call(self, p_reset, &c);
  if (st || c.st) return st ? st : c.st;
  *obs = c.obs;
  *len = c.obs_len;
  return MRL_OK;
}

static mrl_status env_step(void *self, const char *action, size_t action_len, const char **obs,
                           size_t *obs_len, double *reward, int *done) {
  env_call c = {.env = self, .action = action, .action_len = action_len};
  mrl_status st = protected_call(self, p_step, &c);
  if (st) return st;
  *obs = c.obs;
  *obs_len = c.obs ? c.obs_len : 0;
  *reward = c.reward;
  *done = c.done;
  return MRL_OK;
}

static const char *env_error(void *self) { return ((lua_env *)self)->err; }

/* The clone of a root: a wrapper of the run, filled by instance:clone(). */
static mrl_status env_clone(void *self, mrl_env **out) {
  lua_env *src = self;
  run_envs *run = src->run;
  if (run->used >= run->forks) {
    snprintf(src->err, sizeof src->err, "more clones than the tree has branches");
    return MRL_ERR_INVALID;
  }
  env_call c = {.env = src, .copy = &run->env[run->n + run->used++]};
  mrl_status st = protected_call(src, p_clone, &c);
  if (st || c.st) return st ? st : c.st;
  *out = &c.copy->vt;
  return MRL_OK;
}

/* __close of a run's wrappers: releases their references (never raises: luaL_unref reuses the
 * registry's existing slots). */
static int envs_close(lua_State *L) {
  run_envs *run = luaL_checkudata(L, 1, ENVS_MT);
  for (int i = 0; i < run->n + run->used; i++) {
    lua_env *env = &run->env[i];
    int *refs[] = {&env->module, &env->instance, &env->task, &env->rng,
                   &env->record, &env->step_fn, &env->obs};
    for (size_t k = 0; k < sizeof refs / sizeof *refs; k++) {
      luaL_unref(L, LUA_REGISTRYINDEX, *refs[k]);
      *refs[k] = LUA_NOREF;
    }
  }
  run->used = 0;
  run->n = 0;
  return 0;
}

/* Pushes the wrappers for n roots and `forks` clones, to be closed with the calling function. */
static run_envs *push_run_envs(lua_State *L, int n, int forks) {
  int total = n + forks;
  run_envs *run = lua_newuserdatauv(L, sizeof *run + sizeof(lua_env) * (size_t)total, 0);
  run->n = n;
  run->forks = forks;
  run->used = 0;
  for (int i = 0; i < total; i++) {
    lua_env *env = &run->env[i];
    memset(env, 0, sizeof *env);
    env->L = L;
    env->run = run;
    env->module = env->instance = env->task = env->rng = env->record = env->step_fn = env->obs =
        LUA_NOREF;
    env->vt = (mrl_env){.self = env, .reset = env_reset, .step = env_step, .error = env_error};
  }
  luaL_setmetatable(L, ENVS_MT);
  lua_toclose(L, -1);
  return run;
}

/* ---- options ---- */

void mrl__lua_check_fields(lua_State *L, int idx, const char *const *known) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    bool ok = false;
    for (int i = 0; known[i] && !ok; i++)
      ok = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), known[i]) == 0;
    if (ok) continue;
    const char *key = luaL_tolstring(L, -1, NULL);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; known[i]; i++) {
      if (i) luaL_addstring(&b, ", ");
      luaL_addstring(&b, known[i]);
    }
    luaL_pushresult(&b);
    luaL_argerror(L, idx, lua_pushfstring(L, "unknown field '%s' (expected %s)", key,
                                          lua_tostring(L, -1)));
  }
}

/* ---- rl.rollout.new{model =, episodes =, capacity =} ---- */

static int l_new(lua_State *L) {
  static const char *const fields[] = {"model", "episodes", "capacity", NULL};
  luaL_checktype(L, 1, LUA_TTABLE);
  mrl__lua_check_fields(L, 1, fields);
  lua_getfield(L, 1, "model");
  mrl_model *m = mrl__lua_check_model(L, -1, "model");
  int model_idx = lua_gettop(L);
  lua_Integer episodes = mrl__lua_opt_integer(L, 1, "episodes", 16);
  lua_Integer capacity = mrl__lua_opt_integer(L, 1, "capacity", 256);
  if (episodes < 1 || episodes > 1 << 16) return luaL_argerror(L, 1, "episodes: expected 1..65536");
  if (capacity < 1 || capacity > 1 << 24) return luaL_argerror(L, 1, "capacity: out of range");
  lrollout *b = lua_newuserdatauv(L, sizeof *b, 1);
  memset(b, 0, sizeof *b);
  luaL_setmetatable(L, ROLLOUT_MT);
  lua_pushvalue(L, model_idx);
  lua_setiuservalue(L, -2, 1); /* the model lives as long as the rollout */
  mrl_status st = mrl_rollout_new(m, (int)episodes, (int)capacity, &b->r);
  if (st) return mrl__lua_raise(L, mrl_model_engine(m), st, 1);
  b->model = m;
  b->episodes = (int)episodes;
  b->capacity = (int)capacity;
  return 1;
}

/* rl.rollout.set_step(fn): the function ro:run steps Lua environments with,
 * fn(module, instance, action, record) -> observation, reward, done (moonrl.env registers its
 * step when it loads; one per Lua state). */
static int l_set_step(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, STEP_KEY);
  return 0;
}

/* ---- ro:run{...} ---- */

static mrl_chat_template chat_option(lua_State *L, int opts) {
  static const char *const names[] = {"auto", "roles", "chatml", "llama3", NULL};
  lua_getfield(L, opts, "chat");
  int i = luaL_checkoption(L, -1, "auto", names);
  lua_pop(L, 1);
  return (mrl_chat_template)i;
}

/* Sets summary.branch = {root =, index =} on the table at the top of the stack. */
static void set_branch(lua_State *L, int root, int index) {
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, root);
  lua_setfield(L, -2, "root");
  lua_pushinteger(L, index);
  lua_setfield(L, -2, "index");
  lua_setfield(L, -2, "branch");
}

/* The summary of branch j (>= 1) of root i into results[dst + 1]: its clone's instance and
 * records, or, for a branch that got no clone (its root had ended, or the clone failed), the
 * root's instance and the root's records up to the branch's turns (those of the fork). */
static void branch_summary(lua_State *L, lrollout *ro, run_envs *run, mrl_env *clone,
                           const uint64_t *seeds, int results, int i, int j, int dst) {
  lua_env *root = &run->env[i], *env = clone ? clone->self : root;
  lua_createtable(L, 0, 12);
  if (clone)
    lua_rawgeti(L, LUA_REGISTRYINDEX, env->record);
  else
    push_list_copy(L, root->record, mrl_rollout_turn_count(ro->r, dst));
  lua_setfield(L, -2, "record");
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->instance);
  lua_setfield(L, -2, "instance");
  lua_rawgeti(L, LUA_REGISTRYINDEX, root->task);
  lua_setfield(L, -2, "task");
  lua_pushinteger(L, (lua_Integer)mrl_rollout_branch_seed(seeds[i], j));
  lua_setfield(L, -2, "seed");
  set_branch(L, i + 1, j + 1);
  lua_rawseti(L, results, dst + 1);
}

static const char *const END_NAMES[] = {"running", "done",  "max_turns", "budget",
                                        "env_error", "paused", "cut"};

static const char *end_name(int end) { return end >= 0 && end <= 6 ? END_NAMES[end] : "running"; }

/* ---- hooks (mrl_rollout_run_hooks): Lua functions behind the C hooks ----
 * Each hook runs its Lua function under lua_pcall (a p_* function does everything that may
 * raise); a failure keeps the message, named after the option and the episode, in h->err, and
 * ro:run raises it once the run has returned. */

typedef struct {
  lua_State *L;
  lrollout *ro;
  run_envs *run;
  mrl_env **clones;
  int n, total;
  int on_turn, on_branches, on_action, gate_fn; /* stack indices of the functions; 0: none */
  int forced, forced_lists; /* forced's function and the {[episode] = {entries}} table; 0: none */
  mrl_tokenizer *tok;
  int groups;                                   /* stack index of the groups list; 0: none */
  int decisions;                                /* stack index of the gate's decisions list */
  bool builtin_gate;
  mrl_rollout_gate gate;
  char err[1024];
} lua_hooks;

/* The wrapper whose instance and records episode e uses: its own (a root's, or its clone's), or
 * that of the episode it was copied from when it has none (its parent had ended, or the clone
 * failed). */
static lua_env *env_of(const lua_hooks *h, int e) {
  while (e >= h->n && !h->clones[e]) mrl_rollout_origin(h->ro->r, e, &e, NULL, NULL);
  return e < h->n ? &h->run->env[e] : h->clones[e]->self;
}

static void set_integer(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

/* Pushes what a hook sees of episode e: {episode =, turns =, end =, rewards =, return_ =,
 * length =, record =, instance =, task =, seed =, room =, branch = (forks), tokens = (with
 * tokens)}. */
static void push_view(lua_State *L, const lua_hooks *h, int e, bool tokens) {
  mrl_rollout *r = h->ro->r;
  const lua_env *env = env_of(h, e);
  int turns = mrl_rollout_turn_count(r, e), parent, index, turn;
  lua_createtable(L, 0, 14);
  set_integer(L, "episode", e + 1);
  set_integer(L, "turns", turns);
  lua_pushstring(L, end_name(mrl_rollout_end(r, e)));
  lua_setfield(L, -2, "end");
  const double *rw = mrl_rollout_rewards(r, e);
  double sum = 0.0;
  lua_createtable(L, turns, 0);
  for (int t = 0; t < turns; t++) {
    lua_pushnumber(L, rw[t]);
    lua_rawseti(L, -2, t + 1);
    sum += rw[t];
  }
  lua_setfield(L, -2, "rewards");
  lua_pushnumber(L, sum);
  lua_setfield(L, -2, "return_");
  set_integer(L, "length", mrl_rollout_length(r, e));
  if (e < h->n || h->clones[e])
    lua_rawgeti(L, LUA_REGISTRYINDEX, env->record);
  else
    push_list_copy(L, env->record, turns);
  lua_setfield(L, -2, "record");
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->instance);
  lua_setfield(L, -2, "instance");
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->task);
  lua_setfield(L, -2, "task");
  set_integer(L, "seed", (lua_Integer)mrl_rollout_seed(r, e));
  set_integer(L, "room", h->ro->episodes - h->total);
  mrl_rollout_origin(r, e, &parent, &index, &turn);
  if (parent >= 0) {
    lua_createtable(L, 0, 3);
    set_integer(L, "root", parent + 1);
    set_integer(L, "index", index);
    set_integer(L, "turn", turn);
    lua_setfield(L, -2, "branch");
  }
  if (tokens) {
    int len = mrl_rollout_length(r, e);
    const int32_t *ids = mrl_rollout_tokens(r, e);
    lua_createtable(L, len, 0);
    for (int i = 0; i < len; i++) {
      lua_pushinteger(L, ids[i]);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "tokens");
  }
}

/* What a p_* function gets and gives back. */
typedef struct {
  lua_hooks *h;
  int e, k, flags, attempt, turn, first, count, cut, again;
  const int *members;
  const char *action;
  size_t len;
  int third; /* stack index (ro:run's frame) of the third argument; 0: the gate's decisions */
} hook_call;

/* Runs f(call, fn, decisions or c->third) under lua_pcall, fn the Lua function at stack index
 * `fn` of ro:run's frame (the hooks run while it is the current one) or nil; on failure keeps
 * "<what>: <message>" in h->err. */
static mrl_status hook_pcall(lua_hooks *h, lua_CFunction f, hook_call *c, int fn,
                             const char *what) {
  lua_State *L = h->L;
  int top = lua_gettop(L);
  lua_pushcfunction(L, f);
  lua_pushlightuserdata(L, c);
  if (fn) lua_pushvalue(L, fn);
  else lua_pushnil(L);
  if (c->third || h->decisions) lua_pushvalue(L, c->third ? c->third : h->decisions);
  else lua_pushnil(L);
  int rc = lua_pcall(L, 3, 0, 0);
  if (rc != LUA_OK) {
    const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                      : rc == LUA_ERRMEM             ? "not enough memory"
                                                     : NULL;
    if (msg)
      snprintf(h->err, sizeof h->err, "%s: %s", what, msg);
    else
      snprintf(h->err, sizeof h->err, "%s: (error object is a %s value)", what,
               luaL_typename(L, -1));
  }
  lua_settop(L, top);
  return rc == LUA_OK ? MRL_OK : rc == LUA_ERRMEM ? MRL_ERR_NOMEM : MRL_ERR_LUA;
}

/* A C call a hook made that failed: its engine message under the hook's name. */
static mrl_status hook_refused(lua_hooks *h, mrl_status st, const char *what) {
  mrl_engine *eng = mrl_model_engine(h->ro->model);
  const char *msg = mrl_engine_last_error(eng), *colon = strstr(msg, ": ");
  if (strncmp(msg, "mrl_", 4) == 0 && colon) msg = colon + 2;
  snprintf(h->err, sizeof h->err, "%s: %s", what, *msg ? msg : mrl_strerror(st));
  return st;
}

/* on_turn(view) -> nil | k | {k =, drop =} */
static int p_turn(lua_State *L) {
  hook_call *c = lua_touserdata(L, 1);
  lua_pushvalue(L, 2);
  push_view(L, c->h, c->e, false);
  lua_call(L, 1, 1);
  int ok = 1, ret = lua_gettop(L);
  if (lua_isnoneornil(L, ret) || (lua_isboolean(L, ret) && !lua_toboolean(L, ret))) return 0;
  if (lua_istable(L, ret)) {
    lua_getfield(L, ret, "k");
    lua_Integer k = lua_tointegerx(L, -1, &ok);
    c->k = ok && k >= 2 && k <= 1 << 20 ? (int)k : 0;
    lua_getfield(L, ret, "drop");
    c->flags = lua_toboolean(L, -1) ? MRL_BRANCH_DROP : 0;
    for (lua_pushnil(L); lua_next(L, ret); lua_pop(L, 1))
      if (lua_type(L, -2) != LUA_TSTRING ||
          (strcmp(lua_tostring(L, -2), "k") && strcmp(lua_tostring(L, -2), "drop")))
        return luaL_error(L, "returned a table with a field other than k and drop");
  } else {
    lua_Integer k = lua_tointegerx(L, ret, &ok);
    c->k = ok && k >= 2 && k <= 1 << 20 ? (int)k : 0;
  }
  if (!c->k)
    return luaL_error(L, "returned %s; expected nil, a number of episodes k >= 2 or {k =, drop =}",
                      luaL_typename(L, ret));
  return 0;
}

/* forced(view) -> nil | text: the text (special tokens spelled out are those tokens) is scored
 * after the episode's context (mrl_rollout_score) and {turn =, logp =, tokens =, logprobs =}
 * appended to the episode's list in the lists table (argument 3). */
static int p_forced(lua_State *L) {
  hook_call *c = lua_touserdata(L, 1);
  lua_hooks *h = c->h;
  lua_pushvalue(L, 2);
  push_view(L, h, c->e, false);
  lua_call(L, 1, 1);
  if (lua_isnil(L, -1)) return 0;
  if (lua_type(L, -1) != LUA_TSTRING)
    return luaL_error(L, "returned %s; expected the text to score (a string) or nil",
                      luaL_typename(L, -1));
  size_t len, count = 0;
  const char *text = lua_tolstring(L, -1, &len);
  if (len == 0) return luaL_error(L, "returned an empty string; expected text to score");
  size_t cap = 3 * len;
  int32_t *ids = lua_newuserdatauv(L, sizeof(int32_t) * cap, 0);
  mrl_engine *eng = mrl_model_engine(h->ro->model);
  mrl_status st = mrl_tokenizer_encode(h->tok, text, len, MRL_ENCODE_SPECIAL, ids, cap, &count);
  if (!st && (count < 1 || count > (size_t)INT32_MAX / 4)) st = MRL_ERR_INVALID;
  if (st) return luaL_error(L, "cannot encode the text: %s", mrl_engine_last_error(eng));
  float *lp = lua_newuserdatauv(L, sizeof(float) * count, 0);
  int n = (int)count;
  if ((st = mrl_rollout_score(h->ro->r, 1, &c->e, ids, &n, lp))) {
    const char *msg = mrl_engine_last_error(eng), *colon = strstr(msg, ": ");
    return luaL_error(L, "%s", strncmp(msg, "mrl_", 4) == 0 && colon ? colon + 2 : msg);
  }
  if (lua_rawgeti(L, 3, c->e + 1) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawseti(L, 3, c->e + 1);
  }
  lua_createtable(L, 0, 4);
  set_integer(L, "turn", mrl_rollout_turn_count(h->ro->r, c->e));
  set_integer(L, "tokens", n);
  double sum = 0.0;
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    sum += lp[i];
    lua_pushnumber(L, lp[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "logprobs");
  lua_pushnumber(L, sum);
  lua_setfield(L, -2, "logp");
  lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
  return 0;
}

static mrl_status run_forced(lua_hooks *h, int e) {
  char what[64];
  snprintf(what, sizeof what, "forced (episode %d)", e + 1);
  hook_call c = {.h = h, .e = e, .third = h->forced_lists};
  return hook_pcall(h, p_forced, &c, h->forced, what);
}

/* After the prompt: the start hook runs only for forced. */
static mrl_status hook_start(void *user, mrl_rollout *r, int e) {
  (void)r;
  return run_forced(user, e);
}

static mrl_status hook_turn(void *user, mrl_rollout *r, int e) {
  lua_hooks *h = user;
  if (h->forced && mrl_rollout_end(r, e) == MRL_END_NONE) {
    mrl_status st = run_forced(h, e);
    if (st) return st;
  }
  if (!h->on_turn) return MRL_OK;
  char what[64];
  snprintf(what, sizeof what, "on_turn (episode %d)", e + 1);
  hook_call c = {.h = h, .e = e};
  mrl_status st = hook_pcall(h, p_turn, &c, h->on_turn, what);
  if (st || !c.k) return st;
  if ((st = mrl_rollout_branch(r, e, c.k, c.flags, NULL))) return hook_refused(h, st, what);
  h->total += c.k - 1;
  return MRL_OK;
}

/* on_branches{episode =, turn =, branches = {view of the parent, of each branch...}} */
static int p_branches(lua_State *L) {
  hook_call *c = lua_touserdata(L, 1);
  lua_pushvalue(L, 2);
  lua_createtable(L, 0, 3);
  set_integer(L, "episode", c->e + 1);
  set_integer(L, "turn", c->turn);
  lua_createtable(L, c->count + 1, 0);
  push_view(L, c->h, c->e, true);
  lua_rawseti(L, -2, 1);
  for (int i = 0; i < c->count; i++) {
    push_view(L, c->h, c->first + i, true);
    lua_rawseti(L, -2, i + 2);
  }
  lua_setfield(L, -2, "branches");
  lua_call(L, 1, 0);
  return 0;
}

static mrl_status hook_branches(void *user, mrl_rollout *r, int parent, int turn, int first,
                                int count) {
  (void)r;
  lua_hooks *h = user;
  if (!h->on_branches) return MRL_OK;
  char what[64];
  snprintf(what, sizeof what, "on_branches (episode %d)", parent + 1);
  hook_call c = {.h = h, .e = parent, .turn = turn, .first = first, .count = count};
  return hook_pcall(h, p_branches, &c, h->on_branches, what);
}

/* on_action(view, action, attempt) -> truthy to sample the turn again */
static int p_action(lua_State *L) {
  hook_call *c = lua_touserdata(L, 1);
  lua_pushvalue(L, 2);
  push_view(L, c->h, c->e, false);
  lua_pushlstring(L, c->action, c->len);
  lua_pushinteger(L, c->attempt);
  lua_call(L, 3, 1);
  c->again = lua_toboolean(L, -1);
  return 0;
}

static mrl_status hook_action(void *user, mrl_rollout *r, int e, int attempt, const char *action,
                              size_t len, int *again) {
  (void)r;
  lua_hooks *h = user;
  char what[64];
  snprintf(what, sizeof what, "on_action (episode %d)", e + 1);
  hook_call c = {.h = h, .e = e, .attempt = attempt, .action = action, .len = len};
  mrl_status st = hook_pcall(h, p_action, &c, h->on_action, what);
  *again = c.again;
  return st;
}

/* gate.fn{id =, turn =, episodes = {views}} -> truthy to cut (fn: argument 2); then the decision
 * into the list (argument 3):
 * {group =, cut =, episodes = {numbers}, distance =, termination = (the built-in gate's)} */
static int p_group(lua_State *L) {
  hook_call *c = lua_touserdata(L, 1);
  lua_hooks *h = c->h;
  if (h->gate_fn) {
    lua_pushvalue(L, 2);
    lua_createtable(L, 0, 3);
    set_integer(L, "id", c->e);
    set_integer(L, "turn", c->turn);
    lua_createtable(L, c->count, 0);
    for (int i = 0; i < c->count; i++) {
      push_view(L, h, c->members[i], false);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "episodes");
    lua_call(L, 1, 1);
    c->cut = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lua_createtable(L, 0, 6);
  set_integer(L, "group", c->e);
  lua_pushboolean(L, c->cut);
  lua_setfield(L, -2, "cut");
  lua_createtable(L, c->count, 0);
  for (int i = 0; i < c->count; i++) {
    lua_pushinteger(L, c->members[i] + 1);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "episodes");
  if (h->builtin_gate) {
    lua_pushnumber(L, h->gate.distance);
    lua_setfield(L, -2, "distance");
    lua_pushnumber(L, h->gate.termination);
    lua_setfield(L, -2, "termination");
  }
  lua_rawseti(L, 3, (lua_Integer)luaL_len(L, 3) + 1);
  return 0;
}

static mrl_status hook_group(void *user, mrl_rollout *r, int group, int turn, const int *members,
                             int count, int *cut) {
  lua_hooks *h = user;
  char what[64];
  snprintf(what, sizeof what, "gate (group %d)", group);
  hook_call c = {.h = h, .e = group, .turn = turn, .members = members, .count = count};
  if (h->builtin_gate) {
    mrl_status st = mrl_rollout_gate_group(&h->gate, r, group, turn, members, count, &c.cut);
    if (st) return hook_refused(h, st, what);
  }
  mrl_status st = hook_pcall(h, p_group, &c, h->gate_fn, what);
  *cut = c.cut;
  return st;
}

/* ---- ro:run{...} options ---- */

/* The field `key` of the options at idx: a function (its stack index, the value left there) or
 * nil (0). */
static int opt_function(lua_State *L, int idx, const char *key) {
  int type = lua_getfield(L, idx, key);
  if (type == LUA_TNIL) {
    lua_pop(L, 1);
    return 0;
  }
  if (type != LUA_TFUNCTION)
    luaL_argerror(L, 2, lua_pushfstring(L, "%s: a function expected, got %s", key,
                                        luaL_typename(L, -1)));
  return lua_gettop(L);
}

/* gate = {turn =, d_low = 0.12, t_high =, finish = false, fn =}: checked into h and *turn,
 * *finish; the table stays on the stack. */
static void gate_option(lua_State *L, int gi, lua_hooks *h, int *turn, int *finish) {
  static const char *const known[] = {"turn", "d_low", "t_high", "finish", "fn", NULL};
  for (lua_pushnil(L); lua_next(L, gi); lua_pop(L, 1)) {
    bool ok = false;
    for (int i = 0; known[i] && !ok; i++)
      ok = lua_type(L, -2) == LUA_TSTRING && strcmp(lua_tostring(L, -2), known[i]) == 0;
    if (!ok)
      luaL_argerror(L, 2, lua_pushfstring(L, "gate: unknown field '%s' (expected turn, d_low, "
                                          "t_high, finish, fn)", luaL_tolstring(L, -2, NULL)));
  }
  int ok = 0;
  lua_getfield(L, gi, "turn");
  lua_Integer t = lua_tointegerx(L, -1, &ok);
  if (!ok || t < 1 || t > 1 << 20)
    luaL_argerror(L, 2, lua_pushfstring(L, "gate.turn: a turn number >= 1 expected, got %s",
                                        luaL_typename(L, -1)));
  *turn = (int)t;
  lua_pop(L, 1);
  if (lua_getfield(L, gi, "fn") == LUA_TNIL) {
    lua_pop(L, 1);
  } else if (lua_isfunction(L, -1)) {
    h->gate_fn = lua_gettop(L); /* left on the stack */
  } else {
    luaL_argerror(L, 2, lua_pushfstring(L, "gate.fn: a function expected, got %s",
                                        luaL_typename(L, -1)));
  }
  h->builtin_gate = !h->gate_fn;
  const char *nums[] = {"d_low", "t_high"};
  double vals[] = {0.12, 2.0};
  for (int i = 0; i < 2; i++) {
    int type = lua_getfield(L, gi, nums[i]);
    if (type != LUA_TNIL && h->gate_fn)
      luaL_argerror(L, 2, lua_pushfstring(L, "gate.%s: the built-in gate's, not fn's", nums[i]));
    if (type != LUA_TNIL && (type != LUA_TNUMBER || !isfinite(lua_tonumber(L, -1))))
      luaL_argerror(L, 2, lua_pushfstring(L, "gate.%s: a number expected, got %s", nums[i],
                                          luaL_typename(L, -1)));
    if (type != LUA_TNIL) vals[i] = lua_tonumber(L, -1);
    lua_pop(L, 1);
  }
  h->gate = (mrl_rollout_gate){.d_low = vals[0], .t_high = vals[1]};
  int type = lua_getfield(L, gi, "finish");
  if (type != LUA_TNIL && type != LUA_TBOOLEAN)
    luaL_argerror(L, 2, lua_pushfstring(L, "gate.finish: true or false expected, got %s",
                                        luaL_typename(L, -1)));
  *finish = lua_toboolean(L, -1);
  lua_pop(L, 1);
}

/* The summary of episode e (>= n), forked by a hook, into all[e + 1]: its clone's instance and
 * records, or, for one without a clone (its parent had ended, or the clone failed), those it was
 * copied from, the records up to its turns. */
static void fork_summary(lua_State *L, const lua_hooks *h, int all, int e) {
  mrl_rollout *r = h->ro->r;
  const lua_env *env = env_of(h, e);
  int parent, index, turn;
  mrl_rollout_origin(r, e, &parent, &index, &turn);
  lua_createtable(L, 0, 12);
  if (h->clones[e])
    lua_rawgeti(L, LUA_REGISTRYINDEX, env->record);
  else
    push_list_copy(L, env->record, mrl_rollout_turn_count(r, e));
  lua_setfield(L, -2, "record");
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->instance);
  lua_setfield(L, -2, "instance");
  lua_rawgeti(L, LUA_REGISTRYINDEX, env->task);
  lua_setfield(L, -2, "task");
  set_integer(L, "seed", (lua_Integer)mrl_rollout_seed(r, e));
  lua_createtable(L, 0, 3);
  set_integer(L, "root", parent + 1);
  set_integer(L, "index", index);
  set_integer(L, "turn", turn);
  lua_setfield(L, -2, "branch");
  lua_rawseti(L, all, e + 1);
}

/* results.gate: {turn =, groups =, cut =, episodes_cut =, finish =, decisions = {...}} and,
 * with finish (the cut groups ran to the end), each cut decision's returns = {...} and
 * zero_variance, and cut_zero_variance = how many of the cut groups had one return. */
static void push_gate(lua_State *L, const lua_hooks *h, int all, int turn, int finish) {
  lua_createtable(L, 0, 8);
  set_integer(L, "turn", turn);
  lua_Integer groups = luaL_len(L, h->decisions), cut = 0, episodes = 0, flat = 0;
  for (lua_Integer i = 1; i <= groups; i++) {
    lua_rawgeti(L, h->decisions, i);
    lua_getfield(L, -1, "cut");
    bool was_cut = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (was_cut) {
      cut++;
      lua_getfield(L, -1, "episodes");
      lua_Integer m = luaL_len(L, -1);
      episodes += m;
      if (finish) {
        lua_createtable(L, (int)m, 0);
        bool same = true;
        double first = 0.0;
        for (lua_Integer j = 1; j <= m; j++) {
          lua_rawgeti(L, -2, j);
          lua_rawgeti(L, all, lua_tointeger(L, -1));
          lua_getfield(L, -1, "return_");
          double ret = lua_tonumber(L, -1);
          if (j == 1) first = ret;
          same = same && ret == first;
          lua_rawseti(L, -4, j);
          lua_pop(L, 2);
        }
        lua_setfield(L, -3, "returns");
        lua_pushboolean(L, same);
        lua_setfield(L, -3, "zero_variance");
        flat += same;
      }
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  set_integer(L, "groups", groups);
  set_integer(L, "cut", cut);
  set_integer(L, "episodes_cut", episodes);
  lua_pushboolean(L, finish);
  lua_setfield(L, -2, "finish");
  if (finish) set_integer(L, "cut_zero_variance", flat);
  lua_pushvalue(L, h->decisions);
  lua_setfield(L, -2, "decisions");
}

/* ro:run{tokenizer =, env = <module>, tasks = {...}, seeds = {...}, max_turns = 8,
 *         max_turn_tokens = 64, temperature = 1, top_k = 0, top_p = 1, min_p = 0, system =,
 *         chat = "auto", observation_role = "user", branch =, groups =, batch_invariant =,
 *         on_turn =, on_branches =, on_action =, max_resamples = 1, gate =} -> list of
 * episode summaries:
 *   {end = "done"|"max_turns"|"budget"|"env_error"|"cut", error = msg, turns = n,
 *    rewards = {...}, record = {{action=, parsed=, observation=, reward=, done=, info=}, ...},
 *    instance = env, task = task, seed = seed, length = tokens}
 * One environment instance per task (module.new()), episode i with tasks[i] and seeds[i].
 * branch = {turn = t, k = K} makes a tree (mrl_rollout_run_tree): the n episodes (the roots)
 * run t turns, then each is forked into K - 1 more episodes (KV cache and record copied,
 * environment by instance:clone(), which every instance must have) and all n * K go on to the
 * end. Summaries n + 1 .. n * K are the forks, root i's at n + (i - 1) * (K - 1) + 1 ..; each
 * summary has branch = {root = i, index = 1 for the root itself, 2..K for its forks}. A root
 * that ended within t turns is copied as it is. A fork's stream is seeded from its root's seed
 * and its index (mrl_rollout_branch_seed).
 * groups = {...} (integers, one per task) names each episode's group: results.groups holds the
 * group of each summary (forks take their root's). batch_invariant = true decodes each episode
 * to the same floats whatever runs beside it (mrl_rollout_config.batch_invariant).
 * Hooks (mrl_rollout_run_hooks; README "Rollout hooks"), each given a view of an episode
 * (push_view): on_turn(view) after each turn may return k or {k =, drop =} to fork it into k;
 * on_branches{episode =, turn =, branches = {views with tokens}} when a fork's episodes have all
 * ended; on_action(view, action, attempt) before the environment sees an action may return true
 * to sample the turn again (up to max_resamples times); gate = {turn = K, d_low = 0.12,
 * t_high =, finish = false} (the selective gate, in C) or {turn = K, fn = function(group)
 * return cut end} drops groups at turn K. forced(view) -> text | nil, called after the prompt
 * (view.turns = 0) and after each turn the episode goes on from, scores the text
 * (mrl_rollout_score; special tokens spelled out are those tokens) without disturbing the
 * episode: each summary's forced = {{turn =, logp = (the sum), tokens =, logprobs = {...}}, ...}
 * (a fork's list starts at its fork). With hooks the list holds the episodes that were not
 * dropped, in episode order; results.slots their episode numbers (ro:tensors takes the list)
 * and results.gate the gate's counts (push_gate). */
static int m_run(lua_State *L) {
  static const char *const fields[] = {
      "tokenizer", "env",      "tasks",  "seeds",  "max_turns",        "max_turn_tokens",
      "temperature", "top_k",  "top_p",  "min_p",  "system",           "observation_role",
      "chat",      "branch",   "groups", "batch_invariant", "on_turn", "on_branches",
      "on_action", "max_resamples", "gate", "forced", NULL};
  lrollout *ro = check_rollout(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checkstack(L, 2 * LUA_MINSTACK, "rl.rollout: run"); /* ~30 values stay on the stack */
  mrl__lua_check_fields(L, 2, fields);
  lua_getfield(L, 2, "tokenizer");
  mrl_tokenizer *tok = mrl__lua_test_tokenizer(L, -1);
  if (!tok) return luaL_argerror(L, 2, "tokenizer: an rl.tokenizer expected");
  lua_pop(L, 1);
  if (lua_getfield(L, 2, "env") != LUA_TTABLE)
    return luaL_argerror(L, 2, "env: an environment module (table) expected");
  int module = lua_gettop(L);
  if (lua_getfield(L, module, "new") != LUA_TFUNCTION)
    return luaL_argerror(L, 2, "env: the module has no new() function");
  lua_pop(L, 1);
  if (lua_getfield(L, 2, "tasks") != LUA_TTABLE) return luaL_argerror(L, 2, "tasks: a list expected");
  int tasks = lua_gettop(L);
  int n = (int)luaL_len(L, tasks);
  if (n < 1 || n > ro->episodes)
    return luaL_argerror(L, 2, lua_pushfstring(L, "tasks: 1..%d tasks expected (the rollout's "
                                               "episodes), got %d", ro->episodes, n));
  if (lua_getfield(L, 2, "seeds") != LUA_TTABLE || luaL_len(L, -1) != n)
    return luaL_argerror(L, 2, "seeds: a list as long as tasks expected");
  int seeds_idx = lua_gettop(L);
  mrl_rollout_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.sampling.temperature = (float)mrl__lua_opt_number(L, 2, "temperature", 1.0);
  cfg.sampling.top_k = (int)mrl__lua_opt_integer(L, 2, "top_k", 0);
  cfg.sampling.top_p = (float)mrl__lua_opt_number(L, 2, "top_p", 1.0);
  cfg.sampling.min_p = (float)mrl__lua_opt_number(L, 2, "min_p", 0.0);
  cfg.max_turns = (int)mrl__lua_opt_integer(L, 2, "max_turns", 8);
  cfg.max_turn_tokens = (int)mrl__lua_opt_integer(L, 2, "max_turn_tokens", 64);
  cfg.chat = chat_option(L, 2);
  int type = lua_getfield(L, 2, "batch_invariant");
  if (type != LUA_TNIL && type != LUA_TBOOLEAN)
    return luaL_argerror(L, 2, lua_pushfstring(L, "batch_invariant: true or false expected, got "
                                               "%s", luaL_typename(L, -1)));
  cfg.batch_invariant = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, 2, "system");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_getfield(L, module, "system");
  }
  cfg.system = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1); /* kept on the stack */
  lua_getfield(L, 2, "observation_role");
  cfg.observation_role = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);

  int k = 1, branch_turn = 0;
  if (lua_getfield(L, 2, "branch") != LUA_TNIL) {
    if (!lua_istable(L, -1)) return luaL_argerror(L, 2, "branch: a table {turn =, k =} expected");
    int bi = lua_gettop(L), ok_t, ok_k;
    lua_getfield(L, bi, "turn");
    lua_getfield(L, bi, "k");
    lua_Integer bt = lua_tointegerx(L, -2, &ok_t), bk = lua_tointegerx(L, -1, &ok_k);
    lua_pop(L, 2);
    branch_turn = ok_t && bt > 0 && bt < 1 << 20 ? (int)bt : 0;
    k = ok_k && bk > 0 && bk < 1 << 20 ? (int)bk : 0;
    if (branch_turn < 1) return luaL_argerror(L, 2, "branch.turn: a turn number >= 1 expected");
    if (k < 2) return luaL_argerror(L, 2, "branch.k: 2 or more episodes per root expected");
    if ((int64_t)n * k > ro->episodes)
      return luaL_argerror(L, 2, lua_pushfstring(L, "branch: %d roots x %d need %d episodes, the "
                                                 "rollout has %d", n, k, n * k, ro->episodes));
  }
  lua_pop(L, 1);

  /* hooks and groups */
  lua_hooks *h = lua_newuserdatauv(L, sizeof *h, 0);
  memset(h, 0, sizeof *h);
  h->L = L;
  h->ro = ro;
  h->n = h->total = n;
  h->on_turn = opt_function(L, 2, "on_turn");
  h->on_branches = opt_function(L, 2, "on_branches");
  h->on_action = opt_function(L, 2, "on_action");
  h->forced = opt_function(L, 2, "forced");
  h->tok = tok;
  if (h->forced) {
    lua_newtable(L);
    h->forced_lists = lua_gettop(L);
  }
  lua_Integer max_resamples = mrl__lua_opt_integer(L, 2, "max_resamples", 1);
  if (max_resamples < 1 || max_resamples > 1 << 20)
    return luaL_argerror(L, 2, "max_resamples: a number of times >= 1 expected");
  int gate_turn = 0, finish = 0;
  if (lua_getfield(L, 2, "gate") != LUA_TNIL) {
    if (!lua_istable(L, -1))
      return luaL_argerror(L, 2, "gate: a table {turn =, d_low =, t_high =, finish =, fn =} "
                                 "expected");
    gate_option(L, lua_gettop(L), h, &gate_turn, &finish);
  }
  int *group_ids = NULL;
  if (lua_getfield(L, 2, "groups") != LUA_TNIL) {
    if (!lua_istable(L, -1) || luaL_len(L, -1) != n)
      return luaL_argerror(L, 2, "groups: a list as long as tasks expected");
    h->groups = lua_gettop(L);
    group_ids = lua_newuserdatauv(L, sizeof(int) * (size_t)n, 0);
    for (int i = 0; i < n; i++) {
      int ok;
      lua_geti(L, h->groups, i + 1);
      lua_Integer g = lua_tointegerx(L, -1, &ok);
      lua_pop(L, 1);
      if (!ok || g < INT32_MIN || g > INT32_MAX)
        return luaL_argerror(L, 2, lua_pushfstring(L, "groups[%d]: an integer expected", i + 1));
      group_ids[i] = (int)g;
    }
  }
  if (gate_turn && !group_ids)
    return luaL_argerror(L, 2, "gate: groups (the group of each task) is required");
  bool hooked = h->on_turn || h->on_branches || h->on_action || gate_turn || h->forced;
  if (hooked && k > 1)
    return luaL_argerror(L, 2, "branch: a tree does not run with hooks (on_turn, on_branches, "
                               "on_action, gate, forced): fork from on_turn instead");
  mrl_rollout_hooks hooks;
  memset(&hooks, 0, sizeof hooks);
  hooks.user = h;
  hooks.turn = h->on_turn || h->forced ? hook_turn : NULL;
  hooks.start = h->forced ? hook_start : NULL;
  hooks.branches = h->on_branches ? hook_branches : NULL;
  hooks.resample = h->on_action ? hook_action : NULL;
  hooks.max_resamples = (int)max_resamples;
  if (gate_turn) {
    hooks.group = hook_group;
    hooks.groups = group_ids;
    hooks.group_turn = gate_turn;
    hooks.finish_cut = finish;
    lua_newtable(L);
    h->decisions = lua_gettop(L);
  }

  int total = n * k, forks = hooked ? (h->on_turn ? ro->episodes - n : 0) : n * (k - 1);
  if (lua_getfield(L, LUA_REGISTRYINDEX, STEP_KEY) != LUA_TFUNCTION)
    return luaL_error(L, "rl.rollout: no step function; load moonrl.env (it registers its step) "
                         "or call rl.rollout.set_step(fn)");
  int step_fn = lua_gettop(L);
  /* environments: wrappers in a userdata whose references are released when this function
   * returns or raises; vectors for the C calls */
  run_envs *run = push_run_envs(L, n, forks);
  mrl_env **pv = lua_newuserdatauv(L, sizeof(mrl_env *) * (size_t)n, 0);
  uint64_t *seeds = lua_newuserdatauv(L, sizeof(uint64_t) * (size_t)n, 0);
  int nclones = hooked ? ro->episodes : forks > 0 ? forks : 1;
  mrl_env **clones = lua_newuserdatauv(L, sizeof(mrl_env *) * (size_t)nclones, 0);
  for (int i = 0; i < nclones; i++) clones[i] = NULL;
  h->run = run;
  h->clones = clones;
  lua_createtable(L, total, 0); /* the summaries, by episode number */
  int all = lua_gettop(L);
  for (int i = 0; i < n; i++) {
    lua_env *env = &run->env[i];
    pv[i] = &env->vt;
    lua_geti(L, seeds_idx, i + 1);
    int ok;
    lua_Integer seed = lua_tointegerx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok) return luaL_argerror(L, 2, lua_pushfstring(L, "seeds[%d]: integer expected", i + 1));
    seeds[i] = (uint64_t)seed;
    lua_getfield(L, module, "new");
    if (lua_pcall(L, 0, 1, 0) != LUA_OK || !lua_istable(L, -1))
      return luaL_error(L, "env.new() failed: %s", lua_isstring(L, -1) ? lua_tostring(L, -1)
                                                                       : "it did not return a table");
    bool can_clone = lua_getfield(L, -1, "clone") == LUA_TFUNCTION;
    lua_pop(L, 1);
    if (k > 1 && !can_clone)
      return luaL_error(L, "branch: the environment instance has no clone() method");
    if (can_clone && (k > 1 || h->on_turn)) env->vt.clone = env_clone;
    lua_pushvalue(L, -1);
    env->instance = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, module);
    env->module = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_geti(L, tasks, i + 1);
    env->task = luaL_ref(L, LUA_REGISTRYINDEX);
    mrl__lua_push_rng(L, (uint64_t)seed);
    env->rng = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    env->record = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, step_fn);
    env->step_fn = luaL_ref(L, LUA_REGISTRYINDEX);
    /* the summary table: {instance =, record =, task =, seed =}, filled in below */
    lua_createtable(L, 0, 12);
    lua_insert(L, -3); /* summary, instance, record */
    lua_setfield(L, -3, "record");
    lua_setfield(L, -2, "instance");
    lua_geti(L, tasks, i + 1);
    lua_setfield(L, -2, "task");
    lua_pushinteger(L, seed);
    lua_setfield(L, -2, "seed");
    if (k > 1) set_branch(L, i + 1, 1);
    lua_rawseti(L, all, i + 1);
  }
  luaL_checkstack(L, 8, "rl.rollout: run"); /* room for the callbacks' protected calls */
  mrl_status st = hooked ? mrl_rollout_run_hooks(ro->r, tok, n, pv, seeds, &cfg, &hooks, clones,
                                                 &total)
                  : k > 1 ? mrl_rollout_run_tree(ro->r, tok, n, pv, seeds, &cfg, branch_turn, k,
                                                 clones)
                          : mrl_rollout_run(ro->r, tok, n, pv, seeds, &cfg);
  if (st && h->err[0]) return luaL_error(L, "%s", h->err);
  if (st) return mrl__lua_raise(L, mrl_model_engine(ro->model), st, 0);
  for (int e = n; hooked && e < total; e++) fork_summary(L, h, all, e);
  for (int i = 0; !hooked && i < n; i++)
    for (int j = 1; j < k; j++) {
      int b = i * (k - 1) + (j - 1);
      branch_summary(L, ro, run, clones[b], seeds, all, i, j, n + b);
    }
  for (int i = 0; i < total; i++) {
    lua_rawgeti(L, all, i + 1);
    int end = mrl_rollout_end(ro->r, i), turns = mrl_rollout_turn_count(ro->r, i);
    lua_pushstring(L, end_name(end));
    lua_setfield(L, -2, "end");
    lua_pushinteger(L, turns);
    lua_setfield(L, -2, "turns");
    lua_pushinteger(L, mrl_rollout_length(ro->r, i));
    lua_setfield(L, -2, "length");
    const double *rw = mrl_rollout_rewards(ro->r, i);
    lua_createtable(L, turns, 0);
    double sum = 0.0;
    for (int t = 0; t < turns; t++) {
      lua_pushnumber(L, rw[t]);
      lua_rawseti(L, -2, t + 1);
      sum += rw[t];
    }
    lua_setfield(L, -2, "rewards");
    lua_pushnumber(L, sum);
    lua_setfield(L, -2, "return_");
    if (h->forced) {
      if (lua_rawgeti(L, h->forced_lists, i + 1) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_newtable(L);
      }
      lua_setfield(L, -2, "forced");
    }
    const char *err = mrl_rollout_error(ro->r, i);
    if (err) {
      lua_pushstring(L, err);
      lua_setfield(L, -2, "error");
    }
    lua_pop(L, 1);
  }
  /* the list: every episode, or with hooks those not dropped; their groups (a fork's root's) */
  int results = all;
  if (hooked) {
    lua_createtable(L, total, 3);
    results = lua_gettop(L);
    lua_createtable(L, total, 0);
    lua_Integer kept = 0;
    for (int e = 0; e < total; e++) {
      if (mrl_rollout_dropped(ro->r, e)) continue;
      lua_rawgeti(L, all, e + 1);
      lua_rawseti(L, results, ++kept);
      lua_pushinteger(L, e + 1);
      lua_rawseti(L, -2, kept);
    }
    lua_setfield(L, results, "slots");
  }
  if (h->groups) {
    lua_Integer len = luaL_len(L, results);
    lua_createtable(L, (int)len, 0);
    for (lua_Integer i = 1; i <= len; i++) {
      int e = (int)i - 1;
      if (hooked) {
        lua_getfield(L, results, "slots");
        lua_rawgeti(L, -1, i);
        e = (int)lua_tointeger(L, -1) - 1;
        lua_pop(L, 2);
        while (e >= n) mrl_rollout_origin(ro->r, e, &e, NULL, NULL);
      } else if (e >= n) {
        e = (e - n) / (k - 1);
      }
      lua_rawgeti(L, h->groups, e + 1);
      lua_rawseti(L, -2, i);
    }
    lua_setfield(L, results, "groups");
  }
  if (gate_turn) {
    push_gate(L, h, all, gate_turn, finish);
    lua_setfield(L, results, "gate");
  }
  lua_pushvalue(L, results);
  return 1;
}

/* ro:tensors(n | list) -> {tokens =, logprobs =, mask =, turns = (float tensors of the first n
 * episodes, or of the listed episode numbers in that order, concatenated), offsets = {0, len1,
 * len1 + len2, ...}}: one copy out of the rollout. */
static int m_tensors(lua_State *L) {
  lrollout *ro = check_rollout(L, 1);
  int n;
  bool listed = lua_istable(L, 2);
  if (listed) {
    lua_Integer len = luaL_len(L, 2);
    if (len < 0 || len > ro->episodes)
      return luaL_argerror(L, 2, lua_pushfstring(L, "a list of at most %d episodes expected",
                                                 ro->episodes));
    n = (int)len;
  } else {
    lua_Integer count = luaL_checkinteger(L, 2);
    if (count < 1 || count > ro->episodes)
      return luaL_argerror(L, 2, lua_pushfstring(L, "n: expected 1..%d", ro->episodes));
    n = (int)count;
  }
  int *eps = lua_newuserdatauv(L, sizeof(int) * (size_t)(n > 0 ? n : 1), 0);
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    int e = i, ok = 1;
    if (listed) {
      lua_geti(L, 2, i + 1);
      lua_Integer v = lua_tointegerx(L, -1, &ok);
      lua_pop(L, 1);
      if (!ok || v < 1 || v > ro->episodes)
        return luaL_argerror(L, 2, lua_pushfstring(L, "[%d]: an episode number in 1..%d "
                                                   "expected", i + 1, ro->episodes));
      e = (int)v - 1;
    }
    int len = mrl_rollout_length(ro->r, e);
    if (len < 0) return luaL_argerror(L, 2, lua_pushfstring(L, "episode %d never ran", e + 1));
    eps[i] = e;
    total += len;
  }
  mrl_engine *eng = mrl__lua_engine(L);
  static const char *const names[] = {"tokens", "logprobs", "mask", "turns"};
  lua_createtable(L, 0, 5);
  float *dst[4];
  for (int k = 0; k < 4; k++) {
    mrl_tensor *t = NULL;
    mrl_status st = mrl_tensor_new(eng, 1, &total, &t);
    if (st) return mrl__lua_raise(L, eng, st, 0);
    mrl__lua_push_tensor(L, t);
    lua_setfield(L, -2, names[k]);
    dst[k] = mrl_tensor_data(t);
  }
  lua_createtable(L, n + 1, 0);
  lua_pushinteger(L, 0);
  lua_rawseti(L, -2, 1);
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    int e = eps[i], len = mrl_rollout_length(ro->r, e);
    const int32_t *tokens = mrl_rollout_tokens(ro->r, e), *turns = mrl_rollout_turns(ro->r, e);
    const float *lp = mrl_rollout_logprobs(ro->r, e), *mask = mrl_rollout_mask(ro->r, e);
    for (int p = 0; p < len; p++) {
      dst[0][off + p] = (float)tokens[p];
      dst[3][off + p] = (float)turns[p];
    }
    memcpy(dst[1] + off, lp, sizeof(float) * (size_t)len);
    memcpy(dst[2] + off, mask, sizeof(float) * (size_t)len);
    off += len;
    lua_pushinteger(L, off);
    lua_rawseti(L, -2, i + 2);
  }
  lua_setfield(L, -2, "offsets");
  return 1;
}

static int m_free(lua_State *L) {
  lrollout *b = luaL_checkudata(L, 1, ROLLOUT_MT);
  mrl_rollout_free(b->r);
  b->r = NULL;
  return 0;
}

static const luaL_Reg rollout_methods[] = {
    {"run", m_run}, {"tensors", m_tensors}, {"free", m_free}, {NULL, NULL}};
static const luaL_Reg rollout_meta[] = {{"__gc", m_free}, {"__close", m_free}, {NULL, NULL}};
static const luaL_Reg rollout_funcs[] = {{"new", l_new}, {"set_step", l_set_step}, {NULL, NULL}};

void mrl__lua_open_rollout(lua_State *L) {
  luaL_newmetatable(L, ENVS_MT);
  lua_pushcfunction(L, envs_close);
  lua_setfield(L, -2, "__close");
  lua_pop(L, 1);
  luaL_newmetatable(L, ROLLOUT_MT);
  luaL_setfuncs(L, rollout_meta, 0);
  luaL_newlib(L, rollout_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, rollout_funcs);
}
