/* lua_objective.h - what rl.objective (lua_objective.c, the binding of the engine's advantages
 * and losses) shares with rl.advantage (lua_advantage.c, the spec's cases run through it):
 * scratch memory, option-key checks, ids, lists and the names of enumerations; not installed. */
#ifndef MRL_LUA_OBJECTIVE_H
#define MRL_LUA_OBJECTIVE_H

#include "lua_internal.h"

#include <stdbool.h>

/* A zeroed block of count elements owned by a userdata left on the stack (the GC frees it, also
 * when an error unwinds the call). */
void *mrl__obj_buffer(lua_State *L, int64_t count, size_t elem);

/* Raises an argument error on idx when the table there has a key that is not in allowed
 * (NULL-terminated): "unknown <what> 'key' (expected: a, b, ...)". */
void mrl__obj_check_keys(lua_State *L, int idx, const char *what, const char *const *allowed);

/* Dense integers for ids (numbers or strings, equal iff equal in Lua), numbered 0, 1, ... in
 * order of first appearance. map is a stack index holding id -> integer; values (0: not kept)
 * one holding the distinct ids in that order. */
typedef struct {
  int map, values;
  int64_t count;
} mrl__idmap;

mrl__idmap mrl__obj_idmap(lua_State *L, bool keep_values);
/* The integer of the id at the top, element i of `what` (for messages); pops it. A value that is
 * not an id raises an argument error on arg. */
int64_t mrl__obj_take_id(lua_State *L, mrl__idmap *m, int arg, const char *what, int64_t i);

/* Pushes a list of n numbers. */
void mrl__obj_push_doubles(lua_State *L, const double *x, int64_t n);

/* The index of value among names (NULL-terminated); otherwise an argument error on arg naming
 * key and the choices. */
int mrl__obj_option(lua_State *L, int arg, const char *key, const char *value,
                    const char *const *names);

/* Names of mrl_loss_agg in enum order; the names of the KL estimators, moonrl's and verl's
 * ("kl", "mse", "low_var_kl" and their "+" forms). */
extern const char *const mrl__obj_agg_names[];
extern const char *const mrl__obj_kl_names[];
/* The estimator a KL name (value, of option key) means; otherwise an argument error on arg. */
mrl_kl_kind mrl__obj_kl_kind(lua_State *L, int arg, const char *key, const char *value);

#endif /* MRL_LUA_OBJECTIVE_H */
