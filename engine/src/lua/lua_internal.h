/* lua_internal.h - helpers shared by the Lua binding's files (the only engine files that include
 * lua.h); not installed. */
#ifndef MRL_LUA_INTERNAL_H
#define MRL_LUA_INTERNAL_H

#include "tensor_internal.h"

#include <lauxlib.h>
#include <lua.h>

#define MRL_TENSOR_MT "moonrl.tensor"
#define MRL_ENGINE_KEY "moonrl.engine" /* registry: the state's engine box */

/* A Lua tensor: a box holding one C view. t is NULL once closed. */
typedef struct {
  mrl_tensor *t;
} mrl_ltensor;

/* Opens the whole binding (the table `require "moonrl.core"` returns). Uses the engine stored in
 * the registry under MRL_ENGINE_KEY, creating one if there is none. */
int mrl__lua_open_core(lua_State *L);

/* Stores e in the registry as the state's engine (retaining it). */
void mrl__lua_set_engine(lua_State *L, mrl_engine *e);
/* The state's engine (creating it on first use); raises on allocation failure. */
mrl_engine *mrl__lua_engine(lua_State *L);

/* Tensor class (lua_tensor.c). */
void mrl__lua_open_tensor(lua_State *L); /* pushes the `tensor` table */
mrl_tensor *mrl__lua_check_tensor(lua_State *L, int idx, const char *name);
mrl_tensor *mrl__lua_test_tensor(lua_State *L, int idx); /* NULL if not an open tensor */
/* Pushes a Lua tensor that takes ownership of t (t may be NULL only on the error path). */
void mrl__lua_push_tensor(lua_State *L, mrl_tensor *t);

/* Fields of an options table at idx: the value, or dflt when the field is nil; another type
 * raises "bad argument #idx (key: integer expected, got ...)". A string stays valid as long as
 * the table holds it. */
lua_Integer mrl__lua_opt_integer(lua_State *L, int idx, const char *key, lua_Integer dflt);
double mrl__lua_opt_number(lua_State *L, int idx, const char *key, double dflt);
const char *mrl__lua_opt_string(lua_State *L, int idx, const char *key, const char *dflt);

/* Raises the engine's last error for a failed status: an argument error on `arg` when arg > 0,
 * otherwise a plain error. The "mrl_xxx: " prefix of the C message is dropped. */
int mrl__lua_raise(lua_State *L, mrl_engine *e, mrl_status st, int arg);

/* Model class (lua_model.c): pushes the `model` table. */
void mrl__lua_open_model(lua_State *L);
/* The open model at idx; raises "name: an rl.model expected, got ..." otherwise. */
mrl_model *mrl__lua_check_model(lua_State *L, int idx, const char *name);
/* Rollouts (lua_rollout.c): pushes the `rollout` table. */
void mrl__lua_open_rollout(lua_State *L);
/* Raises an argument error on argument idx unless every key of the options table there is one
 * of `known` (NULL-terminated): "unknown field 'x' (expected a, b, ...)" (lua_rollout.c). */
void mrl__lua_check_fields(lua_State *L, int idx, const char *const *known);
/* The trainer's advantages and losses over ragged batches (lua_objective.c): pushes the table. */
void mrl__lua_open_objective(lua_State *L);
/* Pushes a new rl.rng seeded with seed (lua_module.c). */
void mrl__lua_push_rng(lua_State *L, uint64_t seed);
void mrl__lua_open_tokenizer(lua_State *L); /* lua_tokenizer.c: sets field `tokenizer` */
void mrl__lua_open_advantage(lua_State *L); /* lua_advantage.c: pushes the `advantage` table */
void mrl__lua_open_replay(lua_State *L);    /* lua_replay.c: pushes the `replay` table */
void mrl__lua_open_json(lua_State *L);      /* lua_json.c: sets field `json` (rl.json) */
/* Tool sandbox (lua_sandbox.c): pushes the `sandbox` table; the open pool at idx (NULL if it is
 * not one) and the state's default pool (made on first use; raises when it cannot be). */
void mrl__lua_open_sandbox(lua_State *L);
mrl_sandbox *mrl__lua_test_pool(lua_State *L, int idx);
mrl_sandbox *mrl__lua_default_pool(lua_State *L);
int mrl__lua_sandbox_lua(lua_State *L); /* lua_sandbox_lua.c: rl.sandbox.lua{...} */
void mrl__lua_open_comm(lua_State *L); /* lua_comm.c: pushes the `comm` table (core.comm) */
/* The state's communicator (made on first use; raises when it cannot be). */
mrl_comm *mrl__lua_comm(lua_State *L);
void mrl__lua_open_http(lua_State *L); /* lua_http.c: pushes the `http` table (core.http) */
/* The tokenizer at idx, or NULL when it is not a (live) rl.tokenizer. */
mrl_tokenizer *mrl__lua_test_tokenizer(lua_State *L, int idx);

/* Message handler adding a traceback (lua.c's msghandler), for lua_pcall (lua_module.c). */
int mrl__lua_traceback(lua_State *L);

/* Embedded Lua modules (generated from the files in lua/moonrl/): registers package.preload entries. */
void mrl__lua_preload_embedded(lua_State *L);

#endif /* MRL_LUA_INTERNAL_H */
