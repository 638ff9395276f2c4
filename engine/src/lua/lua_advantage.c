/* lua_advantage.c - rl.advantage: one function per method family of the spec's test vectors
 * (shared/spec/advantage_vectors.json) and of verl 1dda039's additions
 * (tests/advantage/verl_vectors.json), rl.advantage.<method>(inputs, params), taking the tables
 * a case's `inputs` and `params` hold and returning a table of its output keys.
 *
 * The families the trainer uses (outcome estimators and GDPO, GAE, step returns, GiGPO and
 * BEACON, the policy and value losses, KL, rollout correction and bypass mode, overlong shaping)
 * are adapters over rl.objective: they lay the case
 * out as the trainer does (each matrix row one episode of flat token tensors, per-row lists), call
 * the rl.objective function the trainer calls and read its results back, so the vectors check the
 * trainer's path. rl.objective computes per-token values on sampled tokens only and gives 0 at
 * mask-0 positions (spec 0.3: consumers multiply by the mask). The other families call the engine
 * (advantage*.c, loss*.c) directly: nothing else marshals them, or, for the optimal token
 * baseline, rl.objective.otb lays episodes out differently (from their first sampled token).
 *
 * Conventions, those of the vectors file: 2-D arrays are tables of equal-length rows; ids (group,
 * trajectory, agent, anchor, action) are numbers or strings, equal iff equal in Lua; row, step and
 * segment indices are 0-based, as the spec writes them; a failed evaluation in a list of numbers
 * may be false. Unknown input or parameter names, wrong types and the engine's refusals raise
 * argument errors naming the problem. */
#include "lua_objective.h"

#include <math.h>
#include <string.h>

enum { INPUTS = 1, PARAMS = 2 };
enum { OBJECTIVE = 1 }; /* upvalue: a table of rl.objective's functions */

/* ---- starting a call ---- */

/* Checks (inputs, params): inputs a table, params a table or nil (made {}), no unknown keys. */
static void start(lua_State *L, const char *const *inputs, const char *const *params) {
  luaL_checktype(L, INPUTS, LUA_TTABLE);
  luaL_checkstack(L, 24, "rl.advantage");
  if (lua_isnoneornil(L, PARAMS)) {
    lua_settop(L, 1);
    lua_newtable(L);
  }
  luaL_checktype(L, PARAMS, LUA_TTABLE);
  lua_settop(L, 2);
  mrl__obj_check_keys(L, INPUTS, "input", inputs);
  mrl__obj_check_keys(L, PARAMS, "param", params);
}

/* Raises the engine's message for a failed status as an error on the inputs. */
static void check_status(lua_State *L, mrl_status st) {
  if (st) mrl__lua_raise(L, mrl__lua_engine(L), st, INPUTS);
}

static void *buffer(lua_State *L, int64_t count, size_t elem) {
  return mrl__obj_buffer(L, count, elem);
}

/* ---- reading inputs ---- */

static bool has_input(lua_State *L, const char *key) {
  bool has = lua_getfield(L, INPUTS, key) != LUA_TNIL;
  lua_pop(L, 1);
  return has;
}

/* Pushes inputs[key], which must have type `type`. */
static void push_input(lua_State *L, const char *key, int type, const char *expected) {
  if (lua_getfield(L, INPUTS, key) != type)
    luaL_argerror(
        L, INPUTS,
        lua_pushfstring(L, "inputs.%s: %s expected, got %s", key, expected, luaL_typename(L, -1)));
}

static int64_t list_length(lua_State *L, const char *key) {
  push_input(L, key, LUA_TTABLE, "a list");
  int64_t n = (int64_t)luaL_len(L, -1);
  lua_pop(L, 1);
  return n;
}

/* The number at the top (element `i` of inputs.key); with `failed_ok`, false is read as NaN (a
 * failed evaluation). Pops it. */
static double take_number(lua_State *L, const char *key, int64_t i, bool failed_ok) {
  double v = NAN;
  if (lua_type(L, -1) == LUA_TNUMBER)
    v = lua_tonumber(L, -1);
  else if (!failed_ok || lua_type(L, -1) != LUA_TBOOLEAN || lua_toboolean(L, -1))
    luaL_argerror(L, INPUTS,
                  lua_pushfstring(L, "inputs.%s[%I]: number expected, got %s", key, (lua_Integer)i,
                                  luaL_typename(L, -1)));
  lua_pop(L, 1);
  return v;
}

static double input_number(lua_State *L, const char *key) {
  push_input(L, key, LUA_TNUMBER, "a number");
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static int64_t input_integer(lua_State *L, const char *key) {
  push_input(L, key, LUA_TNUMBER, "an integer");
  int ok;
  lua_Integer v = lua_tointegerx(L, -1, &ok);
  if (!ok) luaL_argerror(L, INPUTS, lua_pushfstring(L, "inputs.%s: an integer expected", key));
  lua_pop(L, 1);
  return (int64_t)v;
}

static bool input_boolean(lua_State *L, const char *key) {
  push_input(L, key, LUA_TBOOLEAN, "a boolean");
  bool v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* inputs.key as a list of numbers (doubles); *n gets its length. */
static double *input_vector(lua_State *L, const char *key, int64_t *n, bool failed_ok) {
  *n = list_length(L, key);
  double *out = buffer(L, *n, sizeof *out);
  push_input(L, key, LUA_TTABLE, "a list");
  for (int64_t i = 0; i < *n; i++) {
    lua_geti(L, -1, (lua_Integer)i + 1);
    out[i] = take_number(L, key, i + 1, failed_ok);
  }
  lua_pop(L, 1);
  return out;
}

/* inputs.key as a list of integers. */
static int64_t *input_integers(lua_State *L, const char *key, int64_t *n) {
  *n = list_length(L, key);
  int64_t *out = buffer(L, *n, sizeof *out);
  push_input(L, key, LUA_TTABLE, "a list");
  for (int64_t i = 0; i < *n; i++) {
    lua_geti(L, -1, (lua_Integer)i + 1);
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok || lua_type(L, -1) != LUA_TNUMBER)
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L, "inputs.%s[%I]: integer expected, got %s", key,
                                    (lua_Integer)i + 1, luaL_typename(L, -1)));
    out[i] = (int64_t)v;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return out;
}

/* inputs.key as flags: booleans (or 0 and 1). */
static uint8_t *input_flags(lua_State *L, const char *key, int64_t *n) {
  *n = list_length(L, key);
  uint8_t *out = buffer(L, *n, sizeof *out);
  push_input(L, key, LUA_TTABLE, "a list");
  for (int64_t i = 0; i < *n; i++) {
    lua_geti(L, -1, (lua_Integer)i + 1);
    if (lua_type(L, -1) == LUA_TBOOLEAN)
      out[i] = (uint8_t)lua_toboolean(L, -1);
    else if (lua_type(L, -1) == LUA_TNUMBER &&
             (lua_tonumber(L, -1) == 0 || lua_tonumber(L, -1) == 1))
      out[i] = lua_tonumber(L, -1) != 0;
    else
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L, "inputs.%s[%I]: boolean expected, got %s", key,
                                    (lua_Integer)i + 1, luaL_typename(L, -1)));
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return out;
}

/* inputs.key as ids; m NULL: a map of its own. */
static int64_t *input_ids(lua_State *L, const char *key, int64_t *n, mrl__idmap *m) {
  mrl__idmap own;
  if (!m) {
    own = mrl__obj_idmap(L, false);
    m = &own;
  }
  *n = list_length(L, key);
  int64_t *out = buffer(L, *n, sizeof *out);
  push_input(L, key, LUA_TTABLE, "a list");
  lua_pushfstring(L, "inputs.%s", key);
  const char *what = lua_tostring(L, -1);
  for (int64_t i = 0; i < *n; i++) {
    lua_geti(L, -2, (lua_Integer)i + 1);
    out[i] = mrl__obj_take_id(L, m, INPUTS, what, i + 1);
  }
  lua_pop(L, 2);
  return out;
}

/* inputs.key as strings (pointers into the inputs table, alive for the call) and their lengths */
static const char **input_strings(lua_State *L, const char *key, int64_t *n, size_t **lens) {
  *n = list_length(L, key);
  const char **out = buffer(L, *n, sizeof *out);
  *lens = buffer(L, *n, sizeof **lens);
  push_input(L, key, LUA_TTABLE, "a list");
  for (int64_t i = 0; i < *n; i++) {
    if (lua_geti(L, -1, (lua_Integer)i + 1) != LUA_TSTRING)
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L, "inputs.%s[%I]: string expected, got %s", key,
                                    (lua_Integer)i + 1, luaL_typename(L, -1)));
    out[i] = lua_tolstring(L, -1, &(*lens)[i]);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return out;
}

/* Size of inputs.key as a matrix (a list of equal-length rows); raises on ragged rows. */
static void matrix_shape(lua_State *L, const char *key, int64_t *rows, int64_t *cols) {
  push_input(L, key, LUA_TTABLE, "a table of rows");
  *rows = (int64_t)luaL_len(L, -1);
  *cols = 0;
  for (int64_t i = 0; i < *rows; i++) {
    if (lua_geti(L, -1, (lua_Integer)i + 1) != LUA_TTABLE)
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L, "inputs.%s[%I]: row (a table) expected, got %s", key,
                                    (lua_Integer)i + 1, luaL_typename(L, -1)));
    int64_t c = (int64_t)luaL_len(L, -1);
    if (i == 0) *cols = c;
    if (c != *cols)
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L, "inputs.%s: row %I has %I entries, row 1 has %I", key,
                                    (lua_Integer)i + 1, (lua_Integer)c, (lua_Integer)*cols));
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* inputs.key as a (rows, cols) row-major float matrix. When `like` names an earlier input,
 * inputs.key must have its shape, *rows x *cols. */
static float *input_matrix(lua_State *L, const char *key, int64_t *rows, int64_t *cols,
                           const char *like) {
  int64_t r, c;
  matrix_shape(L, key, &r, &c);
  if (like && (r != *rows || c != *cols))
    luaL_argerror(L, INPUTS,
                  lua_pushfstring(L, "inputs.%s is %Ix%I, but inputs.%s is %Ix%I", key,
                                  (lua_Integer)r, (lua_Integer)c, like, (lua_Integer)*rows,
                                  (lua_Integer)*cols));
  if (c > 0 && r > INT64_MAX / c)
    luaL_argerror(L, INPUTS, lua_pushfstring(L, "inputs.%s: too many entries", key));
  *rows = r;
  *cols = c;
  float *out = buffer(L, r * c, sizeof *out);
  push_input(L, key, LUA_TTABLE, "a table of rows");
  for (int64_t i = 0; i < r; i++) {
    lua_geti(L, -1, (lua_Integer)i + 1);
    for (int64_t j = 0; j < c; j++) {
      lua_geti(L, -1, (lua_Integer)j + 1);
      if (lua_type(L, -1) != LUA_TNUMBER)
        luaL_argerror(L, INPUTS,
                      lua_pushfstring(L, "inputs.%s[%I][%I]: number expected, got %s", key,
                                      (lua_Integer)i + 1, (lua_Integer)j + 1,
                                      luaL_typename(L, -1)));
      out[i * c + j] = (float)lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return out;
}

/* A matrix input that must have the shape of an earlier one */
static float *input_like(lua_State *L, const char *key, int64_t rows, int64_t cols,
                         const char *like) {
  return input_matrix(L, key, &rows, &cols, like);
}

/* A mask input (0 and 1 only) of the shape rows x cols of `like`. */
static float *input_mask(lua_State *L, const char *key, int64_t rows, int64_t cols,
                         const char *like) {
  float *m = input_like(L, key, rows, cols, like);
  for (int64_t i = 0; i < rows * cols; i++)
    if (m[i] != 0.0f && m[i] != 1.0f)
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L, "inputs.%s[%I][%I] is %f; a mask holds only 0 and 1", key,
                                    (lua_Integer)(i / cols) + 1, (lua_Integer)(i % cols) + 1,
                                    (double)m[i]));
  return m;
}

/* inputs.key as a flat float array of a list (rank 1) or a matrix (rank 2); shape[0..rank) */
static float *input_array(lua_State *L, const char *key, int *rank, int64_t *shape) {
  push_input(L, key, LUA_TTABLE, "a list or a table of rows");
  lua_geti(L, -1, 1);
  bool nested = lua_type(L, -1) == LUA_TTABLE;
  lua_pop(L, 2);
  if (nested) {
    *rank = 2;
    return input_matrix(L, key, &shape[0], &shape[1], NULL);
  }
  *rank = 1;
  int64_t n;
  double *v = input_vector(L, key, &n, false);
  float *out = buffer(L, n, sizeof *out);
  for (int64_t i = 0; i < n; i++) out[i] = (float)v[i];
  shape[0] = n;
  shape[1] = 1;
  return out;
}

/* inputs.key as per-token turn ids of the shape rows x cols of `like`: integers >= -1 */
static int32_t *input_turns(lua_State *L, const char *key, int64_t rows, int64_t cols,
                            const char *like) {
  float *v = input_like(L, key, rows, cols, like);
  int32_t *turn = buffer(L, rows * cols, sizeof *turn);
  for (int64_t i = 0; i < rows * cols; i++) {
    if (v[i] != floorf(v[i]) || v[i] < -1.0f || v[i] > (float)INT32_MAX)
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L, "inputs.%s: entry %I is %f; turn ids are integers >= -1",
                                    key, (lua_Integer)i + 1, (double)v[i]));
    turn[i] = (int32_t)v[i];
  }
  return turn;
}

static void check_length(lua_State *L, const char *key, int64_t n, int64_t want, const char *what) {
  if (n != want)
    luaL_argerror(L, INPUTS,
                  lua_pushfstring(L, "inputs.%s has %I entries; %s has %I", key, (lua_Integer)n,
                                  what, (lua_Integer)want));
}

/* ---- reading params ---- */

static int push_param(lua_State *L, const char *key) { return lua_getfield(L, PARAMS, key); }

static bool has_param(lua_State *L, const char *key) {
  bool has = push_param(L, key) != LUA_TNIL;
  lua_pop(L, 1);
  return has;
}

static double param_number(lua_State *L, const char *key, double def) {
  int t = push_param(L, key);
  if (t != LUA_TNIL && t != LUA_TNUMBER)
    luaL_argerror(
        L, PARAMS,
        lua_pushfstring(L, "params.%s: number expected, got %s", key, luaL_typename(L, -1)));
  double v = t == LUA_TNIL ? def : lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static int64_t param_integer(lua_State *L, const char *key, int64_t def) {
  int t = push_param(L, key), ok = 1;
  lua_Integer v = t == LUA_TNIL ? (lua_Integer)def : lua_tointegerx(L, -1, &ok);
  if (t != LUA_TNIL && (t != LUA_TNUMBER || !ok))
    luaL_argerror(
        L, PARAMS,
        lua_pushfstring(L, "params.%s: integer expected, got %s", key, luaL_typename(L, -1)));
  lua_pop(L, 1);
  return (int64_t)v;
}

static bool param_boolean(lua_State *L, const char *key, bool def) {
  int t = push_param(L, key);
  if (t != LUA_TNIL && t != LUA_TBOOLEAN)
    luaL_argerror(
        L, PARAMS,
        lua_pushfstring(L, "params.%s: boolean expected, got %s", key, luaL_typename(L, -1)));
  bool v = t == LUA_TNIL ? def : lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* The index of params.key among names (def when absent). */
static int param_option(lua_State *L, const char *key, const char *def, const char *const *names) {
  int t = push_param(L, key);
  if (t != LUA_TNIL && t != LUA_TSTRING)
    luaL_argerror(
        L, PARAMS,
        lua_pushfstring(L, "params.%s: string expected, got %s", key, luaL_typename(L, -1)));
  const char *v = t == LUA_TNIL ? def : lua_tostring(L, -1);
  int i = mrl__obj_option(L, PARAMS, lua_pushfstring(L, "params.%s", key), v, names);
  lua_pop(L, 2);
  return i;
}

static mrl_loss_agg param_agg(lua_State *L, const char *def) {
  return (mrl_loss_agg)param_option(L, "loss_agg_mode", def, mrl__obj_agg_names);
}

/* The KL estimator params.key names (def when absent), and its name in *name (optional). */
static mrl_kl_kind param_kl(lua_State *L, const char *key, const char *def, const char **name) {
  int i = param_option(L, key, def, mrl__obj_kl_names);
  if (name) *name = mrl__obj_kl_names[i];
  return mrl__obj_kl_kind(L, PARAMS, key, mrl__obj_kl_names[i]);
}

static mrl_norm_mode param_norm_mode(lua_State *L) {
  static const char *const names[] = {"mean_norm", "mean_std_norm", NULL};
  return (mrl_norm_mode)param_option(L, "mode", "mean_norm", names);
}

/* ---- writing outputs into the result table at the top ---- */

static void set_number(lua_State *L, const char *key, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, key);
}

static void set_boolean(lua_State *L, const char *key, bool v) {
  lua_pushboolean(L, v);
  lua_setfield(L, -2, key);
}

static void set_string(lua_State *L, const char *key, const char *v) {
  lua_pushstring(L, v);
  lua_setfield(L, -2, key);
}

static void set_doubles(lua_State *L, const char *key, const double *x, int64_t n) {
  mrl__obj_push_doubles(L, x, n);
  lua_setfield(L, -2, key);
}

static void set_integers(lua_State *L, const char *key, const int64_t *x, int64_t n) {
  lua_createtable(L, n < INT32_MAX ? (int)n : 0, 0);
  for (int64_t i = 0; i < n; i++) {
    lua_pushinteger(L, (lua_Integer)x[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, -2, key);
}

/* a float array of rank 1 or 2 */
static void set_array(lua_State *L, const char *key, const float *x, int rank,
                      const int64_t *shape) {
  int64_t rows = rank == 2 ? shape[0] : 1, cols = rank == 2 ? shape[1] : shape[0];
  if (rank == 2) lua_createtable(L, rows < INT32_MAX ? (int)rows : 0, 0);
  for (int64_t b = 0; b < rows; b++) {
    lua_createtable(L, cols < INT32_MAX ? (int)cols : 0, 0);
    for (int64_t t = 0; t < cols; t++) {
      lua_pushnumber(L, x[b * cols + t]);
      lua_rawseti(L, -2, (lua_Integer)t + 1);
    }
    if (rank == 2) lua_rawseti(L, -2, (lua_Integer)b + 1);
  }
  lua_setfield(L, -2, key);
}

static void set_matrix(lua_State *L, const char *key, const float *x, int64_t rows, int64_t cols) {
  set_array(L, key, x, 2, (const int64_t[]){rows, cols});
}

/* ---- calling rl.objective ---- */

/* Sets field key of the table at the top to a new flat tensor of x[0..n). */
static void set_tensor(lua_State *L, const char *key, const float *x, int64_t n) {
  mrl_engine *e = mrl__lua_engine(L);
  mrl_tensor *t = NULL;
  mrl_status st = mrl_tensor_new(e, 1, &n, &t);
  if (st) mrl__lua_raise(L, e, st, 0);
  mrl__lua_push_tensor(L, t);
  if (n > 0) memcpy(mrl_tensor_data(t), x, (size_t)n * sizeof *x);
  lua_setfield(L, -2, key);
}

/* The trainer's layout of rows x cols matrices, in the table at the top: each row one episode
 * of the flat tensors (offsets 0, cols, 2 cols, ...) */
static void set_offsets(lua_State *L, int64_t rows, int64_t cols) {
  lua_createtable(L, (int)rows + 1, 0);
  for (int64_t b = 0; b <= rows; b++) {
    lua_pushinteger(L, (lua_Integer)(b * cols));
    lua_rawseti(L, -2, (lua_Integer)b + 1);
  }
  lua_setfield(L, -2, "offsets");
}

/* ... and every episode listed. */
static void set_layout(lua_State *L, int64_t rows, int64_t cols) {
  set_offsets(L, rows, cols);
  lua_createtable(L, (int)rows, 0);
  for (int64_t b = 0; b < rows; b++) {
    lua_pushinteger(L, (lua_Integer)b + 1);
    lua_rawseti(L, -2, (lua_Integer)b + 1);
  }
  lua_setfield(L, -2, "episodes");
}

/* Sets field key of the table at the top to inputs[input] as it is (read and checked before). */
static void pass_input(lua_State *L, const char *key, const char *input) {
  lua_getfield(L, INPUTS, input);
  lua_setfield(L, -2, key);
}

/* Sets field key of the table at the top to params[param], checked; absent, rl.objective's
 * default holds. */
static void pass_number(lua_State *L, const char *key, const char *param) {
  if (has_param(L, param)) set_number(L, key, param_number(L, param, 0.0));
}

static void pass_boolean(lua_State *L, const char *key, const char *param) {
  if (has_param(L, param)) set_boolean(L, key, param_boolean(L, param, false));
}

/* Calls rl.objective.<fn> on the table at the top, leaving nres results. The adapters check
 * their inputs first, so what fails here is a refusal of the engine: it becomes an argument error
 * on the inputs, the inner "bad argument #1 to '?'" dropped. */
static void call_objective(lua_State *L, const char *fn, int nres) {
  lua_getfield(L, lua_upvalueindex(OBJECTIVE), fn);
  lua_insert(L, -2);
  int status = lua_pcall(L, 1, nres, 0);
  if (status == LUA_OK) return;
  if (status != LUA_ERRRUN || lua_type(L, -1) != LUA_TSTRING) lua_error(L);
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len), *open = strstr(msg, " (");
  if (strncmp(msg, "bad argument #", 14) == 0 && open && msg[len - 1] == ')')
    msg = lua_pushlstring(L, open + 2, (size_t)(msg + len - 1 - (open + 2)));
  luaL_argerror(L, INPUTS, msg);
}

/* The data of the result tensor at idx. */
static const float *result_data(lua_State *L, int idx) {
  return mrl_tensor_data(mrl__lua_check_tensor(L, idx, "result"));
}

/* Copies field from of the table at idx to field to of the table at the top. */
static void copy_field(lua_State *L, int idx, const char *from, const char *to) {
  lua_getfield(L, idx, from);
  lua_setfield(L, -2, to);
}

/* S_b = sum_t r[b, t] over every position, masked or not (spec 0.2): the row's score. */
static double *row_scores(lua_State *L, const char *key, const float *r, int64_t rows,
                          int64_t cols) {
  double *s = buffer(L, rows, sizeof *s);
  for (int64_t b = 0; b < rows; b++) {
    for (int64_t t = 0; t < cols; t++) s[b] += r[b * cols + t];
    if (!isfinite(s[b]))
      luaL_argerror(L, INPUTS, lua_pushfstring(L, "inputs.%s[%I]: the rewards must be finite",
                                               key, (lua_Integer)b + 1));
  }
  return s;
}

/* ---- outcome advantages (1.2 - 1.5, 1.7, 1.9): rl.objective.advantage, then broadcast ---- */

static const char *const outcome_inputs[] = {"token_level_rewards", "response_mask", "index", NULL};

/* the token rewards, mask and prompt groups of an outcome estimator */
typedef struct {
  float *rewards, *mask;
  int64_t *group, rows, cols;
} outcome_batch;

static outcome_batch read_outcome(lua_State *L) {
  outcome_batch o;
  int64_t n;
  o.rewards = input_matrix(L, "token_level_rewards", &o.rows, &o.cols, NULL);
  o.mask = input_mask(L, "response_mask", o.rows, o.cols, "token_level_rewards");
  o.group = input_ids(L, "index", &n, NULL);
  check_length(L, "index", n, o.rows, "token_level_rewards");
  return o;
}

/* Pushes the flat tensor A[b, t] = a_b mask[b, t] of rl.objective's outcome estimator `method`:
 * the row scores with the prompt groups, the mask sums as sampled-token counts. */
static void push_outcome(lua_State *L, const char *method, const outcome_batch *b) {
  double *score = row_scores(L, "token_level_rewards", b->rewards, b->rows, b->cols);
  double *count = buffer(L, b->rows, sizeof *count);
  for (int64_t i = 0; i < b->rows * b->cols; i++) count[i / b->cols] += b->mask[i];
  lua_createtable(L, 0, 8);
  set_string(L, "method", method);
  set_doubles(L, "scores", score, b->rows);
  pass_input(L, "groups", "index");
  set_doubles(L, "counts", count, b->rows);
  pass_number(L, "epsilon", "epsilon");
  if (has_param(L, "norm_adv_by_std"))
    set_number(L, "norm_by_std", param_boolean(L, "norm_adv_by_std", true));
  pass_boolean(L, "singleton_zero", "singleton_zero");
  pass_number(L, "f_norm", "f_norm");
  call_objective(L, "advantage", 1);
  lua_createtable(L, 0, 3);
  lua_insert(L, -2);
  lua_setfield(L, -2, "values");
  set_tensor(L, "mask", b->mask, b->rows * b->cols);
  set_offsets(L, b->rows, b->cols);
  call_objective(L, "broadcast", 1);
}

static int outcome(lua_State *L, const char *method, const char *const *params) {
  start(L, outcome_inputs, params);
  outcome_batch b = read_outcome(L);
  push_outcome(L, method, &b);
  lua_newtable(L);
  set_matrix(L, "advantages", result_data(L, -2), b.rows, b.cols);
  return 1;
}

static const char *const grpo_params[] = {"epsilon", "norm_adv_by_std", NULL};
static int l_grpo(lua_State *L) { return outcome(L, "grpo", grpo_params); }
static int l_drgrpo(lua_State *L) { return outcome(L, "drgrpo", grpo_params); }
static int l_passk(lua_State *L) { return outcome(L, "grpo_passk", grpo_params); }
static int l_rloo(lua_State *L) {
  static const char *const params[] = {"singleton_zero", NULL};
  return outcome(L, "rloo", params);
}
static int l_opo(lua_State *L) {
  static const char *const params[] = {NULL};
  return outcome(L, "opo", params);
}
static int l_gpg(lua_State *L) {
  static const char *const params[] = {"f_norm", NULL};
  return outcome(L, "gpg", params);
}
static int l_rpp_baseline(lua_State *L) {
  static const char *const params[] = {NULL};
  return outcome(L, "reinforce_plus_plus_baseline", params);
}

/* fatal-aware GRPO / RLOO (6.8): the estimator, then fatal rows clamped at 0 from below */
static int l_fatal_aware(lua_State *L) {
  static const char *const inputs[] = {"token_level_rewards", "response_mask", "index", "is_fatal",
                                       NULL};
  static const char *const params[] = {"estimator", "epsilon", "norm_adv_by_std", "singleton_zero",
                                       NULL};
  static const char *const names[] = {"grpo", "drgrpo", "rloo", NULL};
  start(L, inputs, params);
  outcome_batch b = read_outcome(L);
  int64_t n;
  uint8_t *fatal = input_flags(L, "is_fatal", &n);
  check_length(L, "is_fatal", n, b.rows, "token_level_rewards");
  push_outcome(L, names[param_option(L, "estimator", "grpo", names)], &b);
  float *adv = mrl_tensor_data(mrl__lua_check_tensor(L, -1, "result"));
  check_status(L, mrl_fatal_clamp(mrl__lua_engine(L), fatal, b.rows, b.cols, adv));
  lua_newtable(L);
  set_matrix(L, "advantages", adv, b.rows, b.cols);
  return 1;
}

/* ---- token-level returns (1.1, 1.6, 1.8) ---- */

static int l_remax(lua_State *L) {
  static const char *const inputs[] = {"token_level_rewards", "reward_baselines", "response_mask",
                                       NULL};
  static const char *const params[] = {NULL};
  start(L, inputs, params);
  int64_t rows, cols, n;
  float *r = input_matrix(L, "token_level_rewards", &rows, &cols, NULL);
  float *mask = input_like(L, "response_mask", rows, cols, "token_level_rewards");
  double *base = input_vector(L, "reward_baselines", &n, false);
  check_length(L, "reward_baselines", n, rows, "token_level_rewards");
  float *adv = buffer(L, rows * cols, sizeof *adv), *ret = buffer(L, rows * cols, sizeof *ret);
  check_status(L, mrl_remax(mrl__lua_engine(L), r, mask, base, rows, cols, adv, ret));
  lua_newtable(L);
  set_matrix(L, "advantages", adv, rows, cols);
  set_matrix(L, "returns", ret, rows, cols);
  return 1;
}

/* REINFORCE++ (1.6): params.reset_at_mask = true is the rule before verl 8a1bf6d5b (the
 * running return restarts at every mask-0 token). */
static int l_reinforce_pp(lua_State *L) {
  static const char *const inputs[] = {"token_level_rewards", "response_mask", NULL};
  static const char *const params[] = {"gamma", "reset_at_mask", NULL};
  start(L, inputs, params);
  int64_t rows, cols;
  float *r = input_matrix(L, "token_level_rewards", &rows, &cols, NULL);
  float *mask = input_like(L, "response_mask", rows, cols, "token_level_rewards");
  float *adv = buffer(L, rows * cols, sizeof *adv), *ret = buffer(L, rows * cols, sizeof *ret);
  mrl_return_rule rule = param_boolean(L, "reset_at_mask", false) ? MRL_RETURN_RESET
                                                                   : MRL_RETURN_CARRY;
  check_status(L, mrl_reinforce_pp(mrl__lua_engine(L), r, mask, rows, cols,
                                   param_number(L, "gamma", 1.0), rule, adv, ret));
  lua_newtable(L);
  set_matrix(L, "advantages", adv, rows, cols);
  set_matrix(L, "returns", ret, rows, cols);
  return 1;
}

/* GAE (1.1) through rl.objective.gae: observation tokens are transparent there too, so the
 * sampled tokens of each row, packed, give the same recursion. */
static int l_gae(lua_State *L) {
  static const char *const inputs[] = {"token_level_rewards", "values", "response_mask", NULL};
  static const char *const params[] = {"gamma", "lam", NULL};
  start(L, inputs, params);
  int64_t rows, cols;
  float *r = input_matrix(L, "token_level_rewards", &rows, &cols, NULL);
  float *v = input_like(L, "values", rows, cols, "token_level_rewards");
  float *mask = input_mask(L, "response_mask", rows, cols, "token_level_rewards");
  lua_createtable(L, 0, 7);
  set_tensor(L, "rewards", r, rows * cols);
  set_tensor(L, "values", v, rows * cols);
  set_tensor(L, "mask", mask, rows * cols);
  set_layout(L, rows, cols);
  pass_number(L, "gamma", "gamma");
  pass_number(L, "lambda", "lam");
  call_objective(L, "gae", 2);
  lua_newtable(L);
  set_matrix(L, "advantages", result_data(L, -3), rows, cols);
  set_matrix(L, "returns", result_data(L, -2), rows, cols);
  return 1;
}

/* ---- losses (3, 4) ---- */

static int l_agg_loss(lua_State *L) {
  static const char *const inputs[] = {"loss_mat", "loss_mask", NULL};
  static const char *const params[] = {"mode", "loss_scale_factor", NULL};
  start(L, inputs, params);
  int64_t rows, cols;
  float *loss = input_matrix(L, "loss_mat", &rows, &cols, NULL);
  float *mask = input_like(L, "loss_mask", rows, cols, "loss_mat");
  double out;
  mrl_loss_agg mode = (mrl_loss_agg)param_option(L, "mode", "token-mean", mrl__obj_agg_names);
  check_status(L, mrl_agg_loss(mrl__lua_engine(L), mode, param_number(L, "loss_scale_factor", 0.0),
                               loss, mask, rows, cols, &out));
  lua_newtable(L);
  set_number(L, "loss", out);
  return 1;
}

/* the (rows, cols) arrays of a policy loss; old_log_prob may be absent for GPG */
typedef struct {
  float *logp, *old, *adv, *mask, *is_weights;
  int64_t rows, cols;
} pg_batch;

static pg_batch read_pg(lua_State *L, bool need_old) {
  pg_batch p = {0};
  p.logp = input_matrix(L, "log_prob", &p.rows, &p.cols, NULL);
  if (need_old || has_input(L, "old_log_prob"))
    p.old = input_like(L, "old_log_prob", p.rows, p.cols, "log_prob");
  p.adv = input_like(L, "advantages", p.rows, p.cols, "log_prob");
  p.mask = input_mask(L, "response_mask", p.rows, p.cols, "log_prob");
  if (has_input(L, "rollout_is_weights"))
    p.is_weights = input_like(L, "rollout_is_weights", p.rows, p.cols, "log_prob");
  return p;
}

/* clip bounds: clip_ratio_low / clip_ratio_high, each defaulting to clip_ratio, then to the
 * kind's own default */
static void read_clip(lua_State *L, mrl_pg_opts *o) {
  double both = param_number(L, "clip_ratio", NAN);
  o->clip_low = param_number(L, "clip_ratio_low", isnan(both) ? o->clip_low : both);
  o->clip_high = param_number(L, "clip_ratio_high", isnan(both) ? o->clip_high : both);
}

static const char *const pg_inputs[] = {"old_log_prob",  "log_prob",           "advantages",
                                        "response_mask", "rollout_is_weights", NULL};

/* The policy losses (4.1 - 4.6) through rl.objective.loss (kind: its name of the loss). */
/* The losses verl 1dda039 added: their vectors hold each token's gradient (grad_wrt_logp). */
static bool new_in_verl(const char *kind) {
  static const char *const kinds[] = {"dppo_tv", "dppo_kl", "clip_cov", "kl_cov",
                                      "dro",     "reinforce", NULL};
  for (int i = 0; kinds[i]; i++)
    if (strcmp(kinds[i], kind) == 0) return true;
  return false;
}

static int policy_loss(lua_State *L, const char *kind, const char *const *params) {
  start(L, pg_inputs, params);
  bool gpg = strcmp(kind, "gpg") == 0 || strcmp(kind, "reinforce") == 0;
  bool cispo = strcmp(kind, "cispo") == 0, fresh = new_in_verl(kind);
  pg_batch p = read_pg(L, !gpg);
  int64_t n = p.rows * p.cols;
  lua_createtable(L, 0, 20);
  int args = lua_gettop(L);
  set_tensor(L, "logp", p.logp, n);
  set_tensor(L, "old_logp", p.old ? p.old : p.logp, n); /* GPG's loss does not read it */
  set_tensor(L, "adv", p.adv, n);
  set_tensor(L, "mask", p.mask, n);
  if (p.is_weights) set_tensor(L, "is_weights", p.is_weights, n);
  set_layout(L, p.rows, p.cols);
  set_string(L, "kind", kind);
  set_boolean(L, "details", true);
  if (has_param(L, "loss_agg_mode"))
    set_string(L, "agg", mrl__obj_agg_names[param_agg(L, "token-mean")]);
  /* the sum-norm modes' C: loss_scale_factor or the row width L (rl.objective's rows are as wide
   * as the longest row's sampled tokens) */
  set_number(L, "agg_norm", param_number(L, "loss_scale_factor", (double)p.cols));
  double both = param_number(L, "clip_ratio", NAN);
  if (has_param(L, "clip_ratio_low") || !isnan(both))
    set_number(L, "clip_low", param_number(L, "clip_ratio_low", both));
  if (has_param(L, "clip_ratio_high") || !isnan(both))
    set_number(L, "clip_high", param_number(L, "clip_ratio_high", both));
  pass_number(L, "clip_c", "clip_ratio_c");
  pass_number(L, "tau_pos", "tau_pos");
  pass_number(L, "tau_neg", "tau_neg");
  for (const char *const *k = (const char *const[]){"clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
                                                    "kl_cov_ratio", "ppo_kl_coef", "dro_beta",
                                                    "seed", NULL};
       *k; k++)
    pass_number(L, *k, *k);
  lua_pushvalue(L, args);
  call_objective(L, "loss", 2);
  int stats = args + 1;
  if (cispo || fresh) {
    /* d l_t / d logp_t per token: the gradient of the plain sum (token-sum) */
    lua_pushvalue(L, args);
    set_string(L, "agg", "token-sum");
    set_boolean(L, "details", false);
    call_objective(L, "loss", 2);
  }
  lua_newtable(L);
  copy_field(L, stats, "loss", "loss");
  const float *tl = lua_getfield(L, stats, "pg_losses") != LUA_TNIL ? result_data(L, -1) : NULL;
  lua_pop(L, 1); /* stats keeps it */
  if (tl) set_matrix(L, "pg_losses", tl, p.rows, p.cols);
  if (strcmp(kind, "sapo") != 0 && !gpg && strcmp(kind, "dro") != 0)
    copy_field(L, stats, "clipfrac", "pg_clipfrac");
  if (strcmp(kind, "ppo") == 0 || strcmp(kind, "gmpo") == 0 || strncmp(kind, "dppo", 4) == 0)
    copy_field(L, stats, "clipfrac_lower", "pg_clipfrac_lower");
  if (p.old) copy_field(L, stats, "ppo_kl", "ppo_kl");
  copy_field(L, stats, "seq_ratio", "seq_ratio");
  copy_field(L, stats, "seq_adv", "seq_adv");
  if (cispo || fresh)
    set_matrix(L, cispo ? "grad_coeff_wrt_logp" : "grad_wrt_logp", result_data(L, -2), p.rows,
               p.cols);
  return 1;
}

static int l_pg_vanilla(lua_State *L) {
  static const char *const params[] = {"clip_ratio",
                                       "clip_ratio_low",
                                       "clip_ratio_high",
                                       "clip_ratio_c",
                                       "loss_agg_mode",
                                       "loss_scale_factor",
                                       NULL};
  return policy_loss(L, "ppo", params);
}
static int l_pg_gspo(lua_State *L) {
  static const char *const params[] = {"clip_ratio", "clip_ratio_low", "clip_ratio_high", NULL};
  return policy_loss(L, "gspo", params);
}
static int l_pg_cispo(lua_State *L) {
  static const char *const params[] = {"clip_ratio",    "clip_ratio_low",    "clip_ratio_high",
                                       "loss_agg_mode", "loss_scale_factor", NULL};
  return policy_loss(L, "cispo", params);
}
static int l_pg_sapo(lua_State *L) {
  static const char *const params[] = {"tau_pos", "tau_neg", NULL};
  return policy_loss(L, "sapo", params);
}
static int l_pg_gpg(lua_State *L) {
  static const char *const params[] = {"loss_agg_mode", "loss_scale_factor", NULL};
  return policy_loss(L, "gpg", params);
}
static int l_pg_dppo_tv(lua_State *L) {
  static const char *const params[] = {"clip_ratio",    "clip_ratio_low",    "clip_ratio_high",
                                       "clip_ratio_c",  "loss_agg_mode",     "loss_scale_factor",
                                       NULL};
  return policy_loss(L, "dppo_tv", params);
}
static int l_pg_dppo_kl(lua_State *L) {
  static const char *const params[] = {"clip_ratio",    "clip_ratio_low",    "clip_ratio_high",
                                       "clip_ratio_c",  "loss_agg_mode",     "loss_scale_factor",
                                       NULL};
  return policy_loss(L, "dppo_kl", params);
}
static int l_pg_clip_cov(lua_State *L) {
  static const char *const params[] = {"clip_ratio",     "clip_ratio_low", "clip_ratio_high",
                                       "clip_cov_ratio", "clip_cov_lb",    "clip_cov_ub",
                                       "seed",           "loss_agg_mode",  "loss_scale_factor",
                                       NULL};
  return policy_loss(L, "clip_cov", params);
}
static int l_pg_kl_cov(lua_State *L) {
  static const char *const params[] = {"kl_cov_ratio", "ppo_kl_coef", "loss_agg_mode",
                                       "loss_scale_factor", NULL};
  return policy_loss(L, "kl_cov", params);
}
static int l_pg_dro(lua_State *L) {
  static const char *const params[] = {"dro_beta", "loss_agg_mode", "loss_scale_factor", NULL};
  return policy_loss(L, "dro", params);
}
/* verl's compute_policy_loss_reinforce: old_log_prob is the rollout's (for ppo_kl only) */
static int l_pg_reinforce(lua_State *L) {
  static const char *const params[] = {"loss_agg_mode", "loss_scale_factor", NULL};
  return policy_loss(L, "reinforce", params);
}
static int l_pg_geo_mean(lua_State *L) {
  static const char *const params[] = {"clip_ratio", "clip_ratio_low", "clip_ratio_high", NULL};
  return policy_loss(L, "gmpo", params);
}

static int l_a2tgpo_loss(lua_State *L) {
  static const char *const inputs[] = {"old_log_prob", "log_prob",   "advantages", "response_mask",
                                       "turn_ids",     "clip_scale", NULL};
  static const char *const params[] = {"clip_ratio",
                                       "clip_ratio_low",
                                       "clip_ratio_high",
                                       "turn_level_ratio",
                                       "loss_agg_mode",
                                       "loss_scale_factor",
                                       NULL};
  start(L, inputs, params);
  pg_batch p = read_pg(L, true);
  int64_t n = p.rows * p.cols;
  int32_t *turn = input_turns(L, "turn_ids", p.rows, p.cols, "log_prob");
  float *scale = input_like(L, "clip_scale", p.rows, p.cols, "log_prob");
  mrl_pg_opts o;
  mrl_pg_defaults(MRL_PG_PPO, &o);
  o.clip_high = 0.28; /* A2TGPO runs with DAPO's clip-higher */
  read_clip(L, &o);
  o.agg = param_agg(L, "token-mean");
  o.agg_norm = param_number(L, "loss_scale_factor", 0.0);
  float *tl = buffer(L, n, sizeof *tl), *ratio = buffer(L, n, sizeof *ratio);
  mrl_pg_stats st;
  check_status(L, mrl_a2tgpo_loss(mrl__lua_engine(L), &o,
                                  param_boolean(L, "turn_level_ratio", true), p.logp, p.old, p.adv,
                                  p.mask, turn, scale, p.rows, p.cols, &st, tl, ratio, NULL));
  lua_newtable(L);
  set_number(L, "loss", st.loss);
  set_matrix(L, "pg_losses", tl, p.rows, p.cols);
  set_matrix(L, "ratio", ratio, p.rows, p.cols);
  set_number(L, "pg_clipfrac", st.clipfrac);
  set_number(L, "ppo_kl", st.ppo_kl);
  return 1;
}

/* The clipped value loss (4.7) through rl.objective.value_loss. */
static int l_value_loss(lua_State *L) {
  static const char *const inputs[] = {"vpreds", "returns", "values", "response_mask", NULL};
  static const char *const params[] = {"cliprange_value", "loss_agg_mode", "loss_scale_factor",
                                       NULL};
  start(L, inputs, params);
  int64_t rows, cols;
  float *vpred = input_matrix(L, "vpreds", &rows, &cols, NULL);
  float *ret = input_like(L, "returns", rows, cols, "vpreds");
  float *values = input_like(L, "values", rows, cols, "vpreds");
  float *mask = input_mask(L, "response_mask", rows, cols, "vpreds");
  lua_createtable(L, 0, 10);
  set_tensor(L, "values", vpred, rows * cols);
  set_tensor(L, "old_values", values, rows * cols);
  set_tensor(L, "returns", ret, rows * cols);
  set_tensor(L, "mask", mask, rows * cols);
  set_layout(L, rows, cols);
  pass_number(L, "clip", "cliprange_value");
  set_string(L, "agg", mrl__obj_agg_names[param_agg(L, "token-mean")]);
  set_number(L, "agg_norm", param_number(L, "loss_scale_factor", (double)cols));
  call_objective(L, "value_loss", 2);
  lua_newtable(L);
  copy_field(L, -3, "loss", "loss");
  copy_field(L, -3, "clipfrac", "vf_clipfrac");
  return 1;
}

/* ---- KL (2, 6.12) ---- */

/* The KL estimators (2): values from rl.objective.kl; the gradient is that of rl.objective.loss's
 * KL term with coefficient 1 summed over the tokens (one row, sum-norm with C = 1), beside a
 * policy term that is 0 (advantages 0). */
static int l_kl_penalty(lua_State *L) {
  static const char *const inputs[] = {"logprob", "ref_logprob", NULL};
  static const char *const params[] = {"kind", NULL};
  start(L, inputs, params);
  int rank, rank2;
  int64_t shape[2], shape2[2];
  float *lp = input_array(L, "logprob", &rank, shape);
  float *ref = input_array(L, "ref_logprob", &rank2, shape2);
  if (rank != rank2 || shape[0] != shape2[0] || shape[1] != shape2[1])
    luaL_argerror(L, INPUTS, "inputs.ref_logprob: not the shape of inputs.logprob");
  int64_t n = shape[0] * shape[1];
  const char *kind;
  param_kl(L, "kind", "kl", &kind);
  float *ones = buffer(L, n, sizeof *ones), *zeros = buffer(L, n, sizeof *zeros);
  for (int64_t i = 0; i < n; i++) ones[i] = 1.0f;
  lua_createtable(L, 0, 4);
  set_tensor(L, "logp", lp, n);
  set_tensor(L, "ref_logp", ref, n);
  set_tensor(L, "mask", ones, n);
  set_string(L, "kind", kind);
  call_objective(L, "kl", 1);
  lua_createtable(L, 0, 12);
  set_tensor(L, "logp", lp, n);
  set_tensor(L, "old_logp", lp, n);
  set_tensor(L, "adv", zeros, n);
  set_tensor(L, "mask", ones, n);
  set_layout(L, 1, n);
  set_string(L, "agg", "token-sum");
  set_tensor(L, "ref_logp", ref, n);
  set_string(L, "kl", kind);
  set_number(L, "kl_coef", 1.0);
  call_objective(L, "loss", 2);
  lua_newtable(L);
  set_array(L, "kl", result_data(L, -4), rank, shape);
  set_array(L, "grad_wrt_logprob", result_data(L, -2), rank, shape);
  return 1;
}

static int l_apply_kl_penalty(lua_State *L) {
  static const char *const inputs[] = {"token_level_scores", "old_log_prob", "ref_log_prob",
                                       "response_mask", NULL};
  static const char *const params[] = {"beta", "kind", NULL};
  start(L, inputs, params);
  int64_t rows, cols;
  float *scores = input_matrix(L, "token_level_scores", &rows, &cols, NULL);
  float *old = input_like(L, "old_log_prob", rows, cols, "token_level_scores");
  float *ref = input_like(L, "ref_log_prob", rows, cols, "token_level_scores");
  float *mask = input_like(L, "response_mask", rows, cols, "token_level_scores");
  float *rewards = buffer(L, rows * cols, sizeof *rewards);
  double current;
  check_status(L, mrl_kl_reward(mrl__lua_engine(L), param_kl(L, "kind", "kl", NULL),
                                param_number(L, "beta", 0.001), scores, old, ref, mask, rows, cols,
                                rewards, &current));
  lua_newtable(L);
  set_matrix(L, "token_level_rewards", rewards, rows, cols);
  set_number(L, "current_kl", current);
  return 1;
}

static int l_adaptive_kl(lua_State *L) {
  static const char *const inputs[] = {"value", "current_kl", "n_steps", NULL};
  static const char *const params[] = {"target_kl", "horizon", NULL};
  start(L, inputs, params);
  double out;
  check_status(L, mrl_kl_adaptive(mrl__lua_engine(L), input_number(L, "value"),
                                  input_number(L, "current_kl"), input_integer(L, "n_steps"),
                                  param_number(L, "target_kl", 0.1),
                                  param_number(L, "horizon", 10000.0), &out));
  lua_newtable(L);
  set_number(L, "new_value", out);
  return 1;
}

static int l_ttopd_turn_kl(lua_State *L) {
  static const char *const inputs[] = {"student_logp", "teacher_logp", "response_mask", "turn_ids",
                                       NULL};
  static const char *const params[] = {"estimator", "max_turns", "turn_weights", NULL};
  start(L, inputs, params);
  int64_t rows, cols;
  float *student = input_matrix(L, "student_logp", &rows, &cols, NULL);
  float *teacher = input_like(L, "teacher_logp", rows, cols, "student_logp");
  float *mask = input_like(L, "response_mask", rows, cols, "student_logp");
  int32_t *turn = input_turns(L, "turn_ids", rows, cols, "student_logp");
  int64_t max_turns = param_integer(L, "max_turns", INT32_MAX);
  if (max_turns < 1) luaL_argerror(L, PARAMS, "params.max_turns: must be >= 1");
  /* a row lists its turns up to the last one with a valid token (below max_turns) */
  int64_t *row_turns = buffer(L, rows, sizeof *row_turns), slots = 0;
  for (int64_t i = 0; i < rows * cols; i++) {
    int64_t b = i / cols;
    if (mask[i] != 0.0f && turn[i] >= 0 && turn[i] < max_turns && turn[i] >= row_turns[b])
      row_turns[b] = turn[i] + 1;
    if (row_turns[b] > slots) slots = row_turns[b];
  }
  double *weights = NULL;
  if (has_param(L, "turn_weights")) { /* a list of weights per row, one per turn */
    weights = buffer(L, rows * slots, sizeof *weights);
    if (push_param(L, "turn_weights") != LUA_TTABLE || (int64_t)luaL_len(L, -1) != rows)
      luaL_argerror(L, PARAMS,
                    lua_pushfstring(L,
                                    "params.turn_weights: %I lists expected (one "
                                    "per row)",
                                    (lua_Integer)rows));
    for (int64_t b = 0; b < rows; b++) {
      if (lua_geti(L, -1, (lua_Integer)b + 1) != LUA_TTABLE ||
          (int64_t)luaL_len(L, -1) < row_turns[b])
        luaL_argerror(L, PARAMS,
                      lua_pushfstring(L, "params.turn_weights[%I]: %I weights expected",
                                      (lua_Integer)b + 1, (lua_Integer)row_turns[b]));
      for (int64_t k = 0; k < slots; k++) {
        int t = lua_geti(L, -1, (lua_Integer)k + 1);
        if (t != LUA_TNUMBER && (t != LUA_TNIL || k < row_turns[b]))
          luaL_argerror(L, PARAMS,
                        lua_pushfstring(L,
                                        "params.turn_weights[%I][%I]: number "
                                        "expected",
                                        (lua_Integer)b + 1, (lua_Integer)k + 1));
        weights[b * slots + k] = t == LUA_TNUMBER ? lua_tonumber(L, -1) : 1.0;
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  double loss, *per_turn = buffer(L, rows * slots, sizeof *per_turn);
  check_status(L, mrl_turn_kl_loss(mrl__lua_engine(L), param_kl(L, "estimator", "k1", NULL), student,
                                   teacher, mask, turn, rows, cols, slots, weights, &loss, per_turn,
                                   NULL));
  lua_newtable(L);
  set_number(L, "loss", loss);
  lua_createtable(L, rows < INT32_MAX ? (int)rows : 0, 0);
  for (int64_t b = 0; b < rows; b++) {
    mrl__obj_push_doubles(L, per_turn + b * slots, row_turns[b]);
    lua_rawseti(L, -2, (lua_Integer)b + 1);
  }
  lua_setfield(L, -2, "per_turn");
  return 1;
}

static int l_ema_update(lua_State *L) {
  static const char *const inputs[] = {"teacher", "student", NULL};
  static const char *const params[] = {"decay", NULL};
  start(L, inputs, params);
  int rank, rank2;
  int64_t shape[2], shape2[2];
  float *teacher = input_array(L, "teacher", &rank, shape);
  float *student = input_array(L, "student", &rank2, shape2);
  if (rank != rank2 || shape[0] != shape2[0] || shape[1] != shape2[1])
    luaL_argerror(L, INPUTS, "inputs.student: not the shape of inputs.teacher");
  check_status(L, mrl_ema_update(mrl__lua_engine(L), teacher, student, shape[0] * shape[1],
                                 param_number(L, "decay", 0.99)));
  lua_newtable(L);
  set_array(L, "teacher", teacher, rank, shape);
  return 1;
}

/* ---- DAPO (5) ---- */

/* DAPO's overlong penalty (5) through rl.objective.overlong: verl's unfloored, the paper's
 * floored at -penalty_factor. */
static int l_overlong(lua_State *L) {
  static const char *const inputs[] = {"length", NULL};
  static const char *const params[] = {"max_resp_len", "buffer_len", "penalty_factor", NULL};
  start(L, inputs, params);
  int64_t n = 1, *lengths;
  bool scalar = lua_getfield(L, INPUTS, "length") != LUA_TTABLE;
  lua_pop(L, 1);
  if (scalar) {
    lengths = buffer(L, 1, sizeof *lengths);
    lengths[0] = input_integer(L, "length");
  } else {
    lengths = input_integers(L, "length", &n);
  }
  int64_t max_len = param_integer(L, "max_resp_len", 20480),
          buf = param_integer(L, "buffer_len", 4096);
  for (int floored = 0; floored < 2; floored++) {
    lua_createtable(L, 0, 5);
    set_integers(L, "lengths", lengths, n);
    set_number(L, "max_len", (double)max_len);
    set_number(L, "buffer", (double)buf);
    pass_number(L, "factor", "penalty_factor");
    set_boolean(L, "floor", floored);
    call_objective(L, "overlong", 1);
  }
  lua_newtable(L);
  for (int k = 0; k < 2; k++) {
    const char *key = k ? "paper" : "verl";
    if (scalar) lua_geti(L, k - 3, 1);
    else lua_pushvalue(L, k - 3);
    lua_setfield(L, -2, key);
  }
  return 1;
}

static int l_dynamic_sampling(lua_State *L) {
  static const char *const inputs[] = {"index", "metric", NULL};
  static const char *const params[] = {NULL};
  start(L, inputs, params);
  int64_t n;
  mrl__idmap groups = mrl__obj_idmap(L, true);
  int64_t *group = input_ids(L, "index", &n, &groups);
  check_length(L, "metric", list_length(L, "metric"), n, "index");
  double *metric = buffer(L, n, sizeof *metric);
  push_input(L, "metric", LUA_TTABLE, "a list");
  for (int64_t i = 0; i < n; i++) { /* a metric may be a boolean (acc) or a number */
    if (lua_geti(L, -1, (lua_Integer)i + 1) == LUA_TBOOLEAN) {
      metric[i] = lua_toboolean(L, -1);
      lua_pop(L, 1);
    } else {
      metric[i] = take_number(L, "metric", i + 1, false);
    }
  }
  lua_pop(L, 1);
  uint8_t *keep = buffer(L, n, sizeof *keep), *group_kept = buffer(L, groups.count, 1);
  check_status(L, mrl_dapo_filter(mrl__lua_engine(L), metric, group, n, keep, NULL));
  lua_newtable(L);
  lua_newtable(L); /* kept_rows */
  lua_newtable(L); /* kept_groups, in order of first appearance */
  int64_t rows_out = 0, groups_out = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!keep[i]) continue;
    lua_pushinteger(L, (lua_Integer)i);
    lua_rawseti(L, -3, (lua_Integer)++rows_out);
    if (!group_kept[group[i]]) {
      group_kept[group[i]] = 1;
      lua_rawgeti(L, groups.values, (lua_Integer)group[i] + 1);
      lua_rawseti(L, -2, (lua_Integer)++groups_out);
    }
  }
  lua_setfield(L, -3, "kept_groups");
  lua_setfield(L, -2, "kept_rows");
  return 1;
}

/* ---- steps of trajectories (6.1 - 6.5) ---- */

/* Step and turn returns (6.1) through rl.objective.step_returns (spec default gamma 0.95). */
static int l_step_returns(lua_State *L) {
  static const char *const inputs[] = {"rewards", "traj_uids", "env_step", NULL};
  static const char *const params[] = {"gamma", NULL};
  start(L, inputs, params);
  int64_t n, m;
  input_vector(L, "rewards", &n, false);
  input_ids(L, "traj_uids", &m, NULL);
  check_length(L, "traj_uids", m, n, "rewards");
  if (has_input(L, "env_step")) {
    input_ids(L, "env_step", &m, NULL);
    check_length(L, "env_step", m, n, "rewards");
  }
  lua_createtable(L, 0, 4);
  pass_input(L, "rewards", "rewards");
  pass_input(L, "traj", "traj_uids");
  pass_input(L, "env_step", "env_step");
  set_number(L, "gamma", param_number(L, "gamma", 0.95));
  call_objective(L, "step_returns", 1);
  lua_newtable(L);
  lua_insert(L, -2);
  lua_setfield(L, -2, "step_rewards");
  return 1;
}

static int l_turn_returns(lua_State *L) {
  static const char *const inputs[] = {"turn_rewards", NULL};
  static const char *const params[] = {"gamma", NULL};
  start(L, inputs, params);
  int64_t n;
  input_vector(L, "turn_rewards", &n, false);
  int64_t *traj = buffer(L, n, sizeof *traj); /* one trajectory */
  lua_createtable(L, 0, 3);
  pass_input(L, "rewards", "turn_rewards");
  set_integers(L, "traj", traj, n);
  set_number(L, "gamma", param_number(L, "gamma", 0.95));
  call_objective(L, "step_returns", 1);
  lua_newtable(L);
  lua_insert(L, -2);
  lua_setfield(L, -2, "returns");
  return 1;
}

/* Step-group anchors of GiGPO rows: inputs.anchor_obs as ids, or, with params.similarity_thresh,
 * its texts clustered by similarity within each prompt group. */
static int64_t *read_anchors(lua_State *L, const int64_t *group, int64_t rows) {
  int64_t n;
  if (!has_param(L, "similarity_thresh")) {
    int64_t *anchor = input_ids(L, "anchor_obs", &n, NULL);
    check_length(L, "anchor_obs", n, rows, "index");
    return anchor;
  }
  size_t *lens;
  const char **texts = input_strings(L, "anchor_obs", &n, &lens);
  check_length(L, "anchor_obs", n, rows, "index");
  int64_t *anchor = buffer(L, n, sizeof *anchor);
  check_status(L, mrl_similarity_groups(mrl__lua_engine(L), texts, lens, group, n,
                                        param_number(L, "similarity_thresh", 0.95), anchor));
  return anchor;
}

/* The step groups of GiGPO rows: their (group, anchor) pairs numbered in order of appearance. */
static int64_t *step_groups(lua_State *L, const int64_t *group, const int64_t *anchor, int64_t n) {
  int64_t *out = buffer(L, n, sizeof *out);
  mrl__idmap pairs = mrl__obj_idmap(L, false);
  for (int64_t i = 0; i < n; i++) {
    lua_pushinteger(L, (lua_Integer)(group[i] * n + anchor[i]));
    out[i] = mrl__obj_take_id(L, &pairs, INPUTS, "pair", i + 1);
  }
  lua_pop(L, 1);
  return out;
}

/* GiGPO (6.2) and BEACON (6.5) through rl.objective.gigpo: a table of its arguments at the top
 * with the rows' scores, step rewards and prompt groups (inputs read and checked before). */
static void push_gigpo_args(lua_State *L, const float *r, int64_t rows, int64_t cols) {
  double *score = row_scores(L, "token_level_rewards", r, rows, cols);
  lua_createtable(L, 0, 9);
  set_doubles(L, "scores", score, rows);
  pass_input(L, "step_rewards", "step_rewards");
  pass_input(L, "groups", "index");
  pass_number(L, "epsilon", "epsilon");
  pass_number(L, "step_weight", "step_advantage_w");
  if (has_param(L, "mode")) set_string(L, "mode", param_norm_mode(L) ? "mean_std" : "mean");
}

/* Calls rl.objective.gigpo on the table at the top and puts its three per-row results on the
 * rows' tokens, as matrices named by keys in a new result table. */
static void gigpo_results(lua_State *L, const char *const keys[3], const float *mask,
                          int64_t rows, int64_t cols) {
  call_objective(L, "gigpo", 3);
  float *m = buffer(L, rows * cols, sizeof *m);
  lua_newtable(L);
  for (int k = 0; k < 3; k++) {
    for (int64_t i = 0; i < rows * cols; i++) {
      lua_geti(L, k - 5, (lua_Integer)(i / cols) + 1);
      m[i] = (float)(lua_tonumber(L, -1) * mask[i]);
      lua_pop(L, 1);
    }
    set_matrix(L, keys[k], m, rows, cols);
  }
}

static int l_gigpo(lua_State *L) {
  static const char *const inputs[] = {"token_level_rewards",
                                       "step_rewards",
                                       "response_mask",
                                       "anchor_obs",
                                       "index",
                                       "traj_index",
                                       NULL};
  static const char *const params[] = {"epsilon",    "step_advantage_w",  "mode",
                                       "dedup_traj", "similarity_thresh", NULL};
  static const char *const keys[] = {"advantages", "episode_adv", "step_adv"};
  start(L, inputs, params);
  int64_t rows, cols, n;
  float *r = input_matrix(L, "token_level_rewards", &rows, &cols, NULL);
  float *mask = input_mask(L, "response_mask", rows, cols, "token_level_rewards");
  input_vector(L, "step_rewards", &n, false);
  check_length(L, "step_rewards", n, rows, "token_level_rewards");
  int64_t *group = input_ids(L, "index", &n, NULL);
  check_length(L, "index", n, rows, "token_level_rewards");
  input_ids(L, "traj_index", &n, NULL);
  check_length(L, "traj_index", n, rows, "token_level_rewards");
  int64_t *anchor = read_anchors(L, group, rows);
  int64_t *sg = step_groups(L, group, anchor, rows);
  push_gigpo_args(L, r, rows, cols);
  set_integers(L, "anchors", anchor, rows);
  pass_input(L, "traj", "traj_index");
  pass_boolean(L, "dedup_traj", "dedup_traj");
  gigpo_results(L, keys, mask, rows, cols);
  set_integers(L, "step_group_ids", sg, rows);
  return 1;
}

static int l_gigpo_step_groups(lua_State *L) {
  static const char *const inputs[] = {"anchor_obs", "index", NULL};
  static const char *const params[] = {"similarity_thresh", NULL};
  start(L, inputs, params);
  int64_t n;
  int64_t *group = input_ids(L, "index", &n, NULL);
  int64_t *anchor = read_anchors(L, group, n);
  /* similarity clusters are step groups already; exact anchors are numbered with their group */
  int64_t *out = has_param(L, "similarity_thresh") ? anchor : step_groups(L, group, anchor, n);
  lua_newtable(L);
  set_integers(L, "step_group_ids", out, n);
  return 1;
}

static int l_drmas(lua_State *L) {
  static const char *const inputs[] = {"token_level_rewards", "response_mask", "index",
                                       "traj_index",          "agent_id",      NULL};
  static const char *const params[] = {"agent_wise", "norm_adv_by_std", "epsilon", NULL};
  start(L, inputs, params);
  outcome_batch b = read_outcome(L);
  int64_t n;
  int64_t *traj = input_ids(L, "traj_index", &n, NULL);
  check_length(L, "traj_index", n, b.rows, "token_level_rewards");
  int64_t *agent = input_ids(L, "agent_id", &n, NULL);
  check_length(L, "agent_id", n, b.rows, "token_level_rewards");
  float *adv = buffer(L, b.rows * b.cols, sizeof *adv);
  check_status(L, mrl_drmas(mrl__lua_engine(L), b.rewards, b.mask, b.group, traj, agent, b.rows,
                            b.cols, param_boolean(L, "agent_wise", true),
                            param_boolean(L, "norm_adv_by_std", true),
                            param_number(L, "epsilon", 1e-6), adv));
  lua_newtable(L);
  set_matrix(L, "advantages", adv, b.rows, b.cols);
  return 1;
}

static int l_steppo(lua_State *L) {
  static const char *const inputs[] = {"token_level_rewards", "values",       "response_mask",
                                       "trajectory_uids",     "step_indices", NULL};
  static const char *const params[] = {"gamma", "lam", NULL};
  start(L, inputs, params);
  int64_t rows, cols, n;
  float *r = input_matrix(L, "token_level_rewards", &rows, &cols, NULL);
  float *v = input_like(L, "values", rows, cols, "token_level_rewards");
  float *mask = input_like(L, "response_mask", rows, cols, "token_level_rewards");
  int64_t *traj = input_ids(L, "trajectory_uids", &n, NULL);
  check_length(L, "trajectory_uids", n, rows, "token_level_rewards");
  int64_t *step = input_integers(L, "step_indices", &n);
  check_length(L, "step_indices", n, rows, "token_level_rewards");
  float *adv = buffer(L, rows * cols, sizeof *adv), *ret = buffer(L, rows * cols, sizeof *ret);
  check_status(L, mrl_steppo_gae(mrl__lua_engine(L), r, v, mask, traj, step, rows, cols,
                                 param_number(L, "gamma", 0.99), param_number(L, "lam", 1.0), adv,
                                 ret));
  lua_newtable(L);
  set_matrix(L, "advantages", adv, rows, cols);
  set_matrix(L, "returns", ret, rows, cols);
  return 1;
}

static int l_beacon_static(lua_State *L) {
  static const char *const inputs[] = {"traj_len", "match_indices", NULL};
  static const char *const params[] = {"gamma", NULL};
  start(L, inputs, params);
  int64_t steps = input_integer(L, "traj_len"), k;
  int64_t *match = input_integers(L, "match_indices", &k);
  if (steps < 0) luaL_argerror(L, INPUTS, "inputs.traj_len: must be >= 0");
  double *rewards = buffer(L, steps, sizeof *rewards);
  int64_t *segment = buffer(L, steps, sizeof *segment);
  check_status(L, mrl_milestone_segments(mrl__lua_engine(L), steps, match, k,
                                         param_number(L, "gamma", 0.99), rewards, segment));
  lua_newtable(L);
  set_doubles(L, "rewards", rewards, steps);
  set_integers(L, "segment_ids", segment, steps);
  return 1;
}

static int l_beacon_match(lua_State *L) {
  static const char *const inputs[] = {"actions", "milestones", NULL};
  static const char *const params[] = {"threshold", NULL};
  start(L, inputs, params);
  int64_t na, nm;
  size_t *la, *lm;
  const char **actions = input_strings(L, "actions", &na, &la);
  const char **milestones = input_strings(L, "milestones", &nm, &lm);
  int64_t *match = buffer(L, nm, sizeof *match);
  check_status(L, mrl_match_milestones(mrl__lua_engine(L), actions, la, na, milestones, lm, nm,
                                       param_number(L, "threshold", 0.85), match));
  lua_newtable(L);
  set_integers(L, "match_indices", match, nm);
  return 1;
}

static int l_beacon_dynamic(lua_State *L) {
  static const char *const inputs[] = {"milestone_flags", "traj_uids", NULL};
  static const char *const params[] = {"gamma", "scale", NULL};
  start(L, inputs, params);
  int64_t n, m;
  uint8_t *flags = input_flags(L, "milestone_flags", &n);
  int64_t *traj = input_ids(L, "traj_uids", &m, NULL);
  check_length(L, "traj_uids", m, n, "milestone_flags");
  double *rewards = buffer(L, n, sizeof *rewards);
  int64_t *segment = buffer(L, n, sizeof *segment);
  check_status(L, mrl_milestone_segments_dynamic(mrl__lua_engine(L), flags, traj, n,
                                                 param_number(L, "gamma", 0.99),
                                                 param_number(L, "scale", 10.0), rewards, segment));
  lua_newtable(L);
  set_doubles(L, "step_rewards", rewards, n);
  set_integers(L, "segment_ids", segment, n);
  return 1;
}

/* BEACON's dual-scale advantage: GiGPO with milestone segments as the step groups' anchors
 * (traj_uids is checked; GiGPO without deduplication does not look at trajectories) */
static int l_beacon(lua_State *L) {
  static const char *const inputs[] = {"token_level_rewards",
                                       "step_rewards",
                                       "response_mask",
                                       "index",
                                       "traj_uids",
                                       "segment_ids",
                                       NULL};
  static const char *const params[] = {"epsilon", "step_advantage_w", "mode", NULL};
  static const char *const keys[] = {"advantages", "episode_adv", "segment_adv"};
  start(L, inputs, params);
  int64_t rows, cols, n;
  float *r = input_matrix(L, "token_level_rewards", &rows, &cols, NULL);
  float *mask = input_mask(L, "response_mask", rows, cols, "token_level_rewards");
  input_vector(L, "step_rewards", &n, false);
  check_length(L, "step_rewards", n, rows, "token_level_rewards");
  const char *const lists[] = {"index", "traj_uids", "segment_ids"};
  for (int k = 0; k < 3; k++) {
    input_ids(L, lists[k], &n, NULL);
    check_length(L, lists[k], n, rows, "token_level_rewards");
  }
  push_gigpo_args(L, r, rows, cols);
  pass_input(L, "anchors", "segment_ids");
  gigpo_results(L, keys, mask, rows, cols);
  return 1;
}

/* ---- A2TGPO (6.6) ---- */

static int l_information_gain(lua_State *L) {
  static const char *const inputs[] = {"answer_logp_per_turn", NULL};
  static const char *const params[] = {NULL};
  start(L, inputs, params);
  int64_t n;
  double *f = input_vector(L, "answer_logp_per_turn", &n, false);
  int64_t m = n > 0 ? n - 1 : 0;
  double *lp = buffer(L, m, sizeof *lp), *p = buffer(L, m, sizeof *p);
  check_status(L, mrl_information_gain(mrl__lua_engine(L), f, n, lp, p));
  lua_newtable(L);
  set_doubles(L, "ig_logprob", lp, m);
  set_doubles(L, "ig_prob", p, m);
  return 1;
}

static int l_a2tgpo_accumulate(lua_State *L) {
  static const char *const inputs[] = {"normed_ig", NULL};
  static const char *const params[] = {"gamma", NULL};
  start(L, inputs, params);
  int64_t n;
  double *g = input_vector(L, "normed_ig", &n, false);
  double *out = buffer(L, n, sizeof *out);
  check_status(L,
               mrl_a2tgpo_accumulate(mrl__lua_engine(L), g, n, param_number(L, "gamma", 1.0), out));
  lua_newtable(L);
  set_doubles(L, "accumulated", out, n);
  return 1;
}

static int l_a2tgpo_advantages(lua_State *L) {
  static const char *const inputs[] = {"trajs", NULL};
  static const char *const params[] = {"epsilon", "gamma", "alpha", "clip_beta", "ig_ddof", NULL};
  start(L, inputs, params);
  int64_t trajs = list_length(L, "trajs");
  int64_t *offsets = buffer(L, trajs + 1, sizeof *offsets),
          *group = buffer(L, trajs, sizeof *group);
  double *outcome = buffer(L, trajs, sizeof *outcome);
  mrl__idmap groups = mrl__obj_idmap(L, false);
  push_input(L, "trajs", LUA_TTABLE, "a list");
  int list = lua_gettop(L);
  for (int64_t i = 0; i < trajs; i++) { /* sizes and scalars first */
    if (lua_geti(L, list, (lua_Integer)i + 1) != LUA_TTABLE)
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L,
                                    "inputs.trajs[%I]: table {group=, ig=, "
                                    "outcome=} expected",
                                    (lua_Integer)i + 1));
    lua_getfield(L, -1, "group");
    group[i] = mrl__obj_take_id(L, &groups, INPUTS, "inputs.trajs[].group", i + 1);
    if (lua_getfield(L, -1, "outcome") != LUA_TNUMBER || lua_getfield(L, -2, "ig") != LUA_TTABLE)
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L,
                                    "inputs.trajs[%I]: needs a number `outcome` and "
                                    "a list `ig`",
                                    (lua_Integer)i + 1));
    outcome[i] = lua_tonumber(L, -2);
    offsets[i + 1] = offsets[i] + (int64_t)luaL_len(L, -1);
    lua_pop(L, 3);
  }
  int64_t turns = offsets[trajs];
  double *ig = buffer(L, turns, sizeof *ig);
  for (int64_t i = 0; i < trajs; i++) {
    lua_geti(L, list, (lua_Integer)i + 1);
    lua_getfield(L, -1, "ig");
    for (int64_t j = offsets[i]; j < offsets[i + 1]; j++) {
      lua_geti(L, -1, (lua_Integer)(j - offsets[i]) + 1);
      ig[j] = take_number(L, "trajs[].ig", j - offsets[i] + 1, false);
    }
    lua_pop(L, 2);
  }
  mrl_a2tgpo_opts o;
  mrl_a2tgpo_defaults(&o);
  o.epsilon = param_number(L, "epsilon", o.epsilon);
  o.gamma = param_number(L, "gamma", o.gamma);
  o.alpha = param_number(L, "alpha", o.alpha);
  o.clip_beta = param_number(L, "clip_beta", o.clip_beta);
  o.ig_ddof = (int)param_integer(L, "ig_ddof", o.ig_ddof);
  double *normed = buffer(L, turns, sizeof *normed), *acc = buffer(L, turns, sizeof *acc);
  double *tadv = buffer(L, turns, sizeof *tadv), *clip = buffer(L, turns, sizeof *clip);
  double *oadv = buffer(L, trajs, sizeof *oadv);
  check_status(L, mrl_a2tgpo_advantages(mrl__lua_engine(L), &o, ig, offsets, group, outcome, trajs,
                                        normed, acc, tadv, clip, oadv));
  lua_newtable(L);
  lua_createtable(L, (int)trajs, 0);
  for (int64_t i = 0; i < trajs; i++) {
    int64_t first = offsets[i], k = offsets[i + 1] - first;
    lua_createtable(L, 0, 5);
    set_doubles(L, "normed_ig", normed + first, k);
    set_doubles(L, "accumulated", acc + first, k);
    set_number(L, "outcome_adv", oadv[i]);
    /* the IG turns, then the answer turn (outcome advantage, clip scale 1) */
    mrl__obj_push_doubles(L, tadv + first, k);
    lua_pushnumber(L, oadv[i]);
    lua_rawseti(L, -2, (lua_Integer)k + 1);
    lua_setfield(L, -2, "turn_adv");
    mrl__obj_push_doubles(L, clip + first, k);
    lua_pushnumber(L, 1.0);
    lua_rawseti(L, -2, (lua_Integer)k + 1);
    lua_setfield(L, -2, "clip_scale");
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, -2, "per_traj");
  return 1;
}

/* ---- selective rollout gate (6.9) ---- */

static int l_edit_distance(lua_State *L) {
  static const char *const inputs[] = {"a", "b", NULL};
  static const char *const params[] = {NULL};
  start(L, inputs, params);
  mrl__idmap symbols = mrl__obj_idmap(L, false);
  int64_t na, nb;
  int64_t *a = input_ids(L, "a", &na, &symbols), *b = input_ids(L, "b", &nb, &symbols);
  double d;
  check_status(L, mrl_edit_distance(mrl__lua_engine(L), a, na, b, nb, &d));
  lua_newtable(L);
  set_number(L, "distance", d);
  return 1;
}

static int l_selective_gate(lua_State *L) {
  static const char *const inputs[] = {"actions_per_traj", NULL};
  static const char *const params[] = {"K", "d_low", "t_high", NULL};
  start(L, inputs, params);
  int64_t trajs = list_length(L, "actions_per_traj");
  int64_t *offsets = buffer(L, trajs + 1, sizeof *offsets);
  push_input(L, "actions_per_traj", LUA_TTABLE, "a list");
  for (int64_t i = 0; i < trajs; i++) {
    if (lua_geti(L, -1, (lua_Integer)i + 1) != LUA_TTABLE)
      luaL_argerror(L, INPUTS,
                    lua_pushfstring(L,
                                    "inputs.actions_per_traj[%I]: list of actions "
                                    "expected",
                                    (lua_Integer)i + 1));
    offsets[i + 1] = offsets[i] + (int64_t)luaL_len(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  int64_t *actions = buffer(L, offsets[trajs], sizeof *actions);
  mrl__idmap symbols = mrl__obj_idmap(L, false);
  push_input(L, "actions_per_traj", LUA_TTABLE, "a list");
  for (int64_t i = 0; i < trajs; i++) {
    lua_geti(L, -1, (lua_Integer)i + 1);
    for (int64_t j = offsets[i]; j < offsets[i + 1]; j++) {
      lua_geti(L, -1, (lua_Integer)(j - offsets[i]) + 1);
      actions[j] =
          mrl__obj_take_id(L, &symbols, INPUTS, "inputs.actions_per_traj[][]", j - offsets[i] + 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  double d_low = param_number(L, "d_low", 0.12), t_high = param_number(L, "t_high", 0.9);
  mrl_selective_gate g;
  check_status(L, mrl_selective_gate_eval(mrl__lua_engine(L), actions, offsets, trajs,
                                          param_integer(L, "K", 10), d_low, t_high, &g));
  lua_newtable(L);
  set_boolean(L, "cut", g.cut);
  set_number(L, "prefix_edit_distance_mean", g.edit_distance);
  set_number(L, "termination_fraction", g.termination);
  set_number(L, "unique_action_ratio", g.unique_action);
  set_number(L, "unique_prefix_ratio", g.unique_prefix);
  set_number(L, "action_bigram_jaccard_mean", g.bigram_jaccard);
  set_number(L, "action_entropy", g.action_entropy);
  return 1;
}

/* ---- fatal steps (6.8) ---- */

static int l_fatal_step(lua_State *L) {
  static const char *const inputs[] = {"step_is_error", "terminated_with_answer", NULL};
  static const char *const params[] = {"threshold", NULL};
  static const char *const reasons[] = {"", "consecutive_errors", "no_final_answer", "no_steps"};
  start(L, inputs, params);
  int64_t n, index;
  uint8_t *errors = input_flags(L, "step_is_error", &n);
  bool answered = input_boolean(L, "terminated_with_answer");
  int64_t threshold = param_integer(L, "threshold", 3);
  if (threshold < 1 || threshold > INT32_MAX)
    luaL_argerror(L, PARAMS, "params.threshold: must be >= 1");
  mrl_fatal_reason reason;
  check_status(
      L, mrl_fatal_step(mrl__lua_engine(L), errors, n, answered, (int)threshold, &index, &reason));
  lua_newtable(L);
  lua_createtable(L, 2, 0); /* {index or nil, reason} */
  if (index >= 0) {
    lua_pushinteger(L, (lua_Integer)index);
    lua_rawseti(L, -2, 1);
  }
  lua_pushstring(L, reasons[reason]);
  lua_rawseti(L, -2, 2);
  lua_setfield(L, -2, "result");
  return 1;
}

static int l_fatal_mask(lua_State *L) {
  static const char *const inputs[] = {"mask_row", "fatal_step_index", NULL};
  static const char *const params[] = {NULL};
  start(L, inputs, params);
  int64_t n;
  double *row = input_vector(L, "mask_row", &n, false);
  int64_t index = has_input(L, "fatal_step_index") ? input_integer(L, "fatal_step_index") : -1;
  if (has_input(L, "fatal_step_index") && index < 0)
    luaL_argerror(L, INPUTS, "inputs.fatal_step_index: must be >= 0 (or absent: not fatal)");
  float *mask = buffer(L, n, sizeof *mask);
  for (int64_t i = 0; i < n; i++) mask[i] = (float)row[i];
  check_status(L, mrl_fatal_mask(mrl__lua_engine(L), &index, 1, n, mask));
  lua_newtable(L);
  set_array(L, "mask", mask, 1, (const int64_t[]){n, 1});
  return 1;
}

/* ---- AEM (6.7) ---- */

static int l_aem(lua_State *L) {
  static const char *const inputs[] = {"base_adv", "mean_entropy", "group", NULL};
  static const char *const params[] = {"lam", "min_range", NULL};
  start(L, inputs, params);
  int64_t n, m;
  double *base = input_vector(L, "base_adv", &n, false);
  double *h = input_vector(L, "mean_entropy", &m, false);
  check_length(L, "mean_entropy", m, n, "base_adv");
  int64_t *group = input_ids(L, "group", &m, NULL);
  check_length(L, "group", m, n, "base_adv");
  double *adv = buffer(L, n, sizeof *adv), *alpha = buffer(L, n, sizeof *alpha);
  check_status(L, mrl_aem(mrl__lua_engine(L), base, h, group, n, param_number(L, "lam", 1.0),
                          param_number(L, "min_range", 0.1), adv, alpha));
  lua_newtable(L);
  set_doubles(L, "advantages", adv, n);
  set_doubles(L, "alpha", alpha, n);
  return 1;
}

static int l_aem_entropy(lua_State *L) {
  static const char *const inputs[] = {"token_entropy", "mask", NULL};
  static const char *const params[] = {NULL};
  start(L, inputs, params);
  int64_t rows, cols;
  float *h = input_matrix(L, "token_entropy", &rows, &cols, NULL);
  float *mask = input_like(L, "mask", rows, cols, "token_entropy");
  double *out = buffer(L, rows, sizeof *out);
  check_status(L, mrl_row_mean(mrl__lua_engine(L), h, mask, rows, cols, out));
  lua_newtable(L);
  set_doubles(L, "mean_entropy", out, rows);
  return 1;
}

/* ---- freshness-aware replay (6.10) ---- */

static int l_per_reward(lua_State *L) {
  static const char *const inputs[] = {"reward", "age", NULL};
  static const char *const params[] = {"epsilon", "age_decay", NULL};
  start(L, inputs, params);
  int64_t n, m;
  double *reward = input_vector(L, "reward", &n, false), *age = input_vector(L, "age", &m, false);
  check_length(L, "age", m, n, "reward");
  double *out = buffer(L, n, sizeof *out);
  check_status(L, mrl_per_reward_priority(mrl__lua_engine(L), reward, age, n,
                                          param_number(L, "epsilon", 1e-6),
                                          param_number(L, "age_decay", 500.0), out));
  lua_newtable(L);
  set_doubles(L, "priority", out, n);
  return 1;
}

static int l_per_priority(lua_State *L) {
  static const char *const inputs[] = {"base_priority", "age", NULL};
  static const char *const params[] = {"age_decay", "floor", NULL};
  start(L, inputs, params);
  int64_t n, m;
  double *base = input_vector(L, "base_priority", &n, false);
  double *age = input_vector(L, "age", &m, false);
  check_length(L, "age", m, n, "base_priority");
  double *out = buffer(L, n, sizeof *out);
  check_status(L, mrl_per_priority(mrl__lua_engine(L), base, age, n,
                                   param_number(L, "age_decay", 500.0),
                                   param_number(L, "floor", 1e-8), out));
  lua_newtable(L);
  set_doubles(L, "effective_priority", out, n);
  return 1;
}

static int l_per_sampling(lua_State *L) {
  static const char *const inputs[] = {"effective_priority", "sampled", NULL};
  static const char *const params[] = {"alpha", "beta", NULL};
  start(L, inputs, params);
  int64_t n, m;
  double *p = input_vector(L, "effective_priority", &n, false);
  int64_t *sampled = input_integers(L, "sampled", &m);
  double *probs = buffer(L, n, sizeof *probs), *w = buffer(L, m, sizeof *w);
  check_status(L, mrl_per_sampling(mrl__lua_engine(L), p, n, param_number(L, "alpha", 0.6),
                                   param_number(L, "beta", 0.4), sampled, m, probs, w));
  lua_newtable(L);
  set_doubles(L, "probs", probs, n);
  set_doubles(L, "is_weights", w, m);
  return 1;
}

static double required_param(lua_State *L, const char *key) {
  if (!has_param(L, key)) luaL_argerror(L, PARAMS, lua_pushfstring(L, "params.%s: required", key));
  return param_number(L, key, 0.0);
}

static int l_per_beta(lua_State *L) {
  static const char *const inputs[] = {"steps", NULL};
  static const char *const params[] = {"total", "start", "end", NULL};
  start(L, inputs, params);
  int64_t n;
  int64_t *steps = input_integers(L, "steps", &n);
  required_param(L, "total");
  int64_t total = param_integer(L, "total", 0);
  double first = param_number(L, "start", 0.4), last = param_number(L, "end", 1.0);
  double *out = buffer(L, n, sizeof *out);
  mrl_engine *e = mrl__lua_engine(L);
  for (int64_t i = 0; i < n; i++)
    check_status(L, mrl_per_beta(e, steps[i], total, first, last, &out[i]));
  lua_newtable(L);
  set_doubles(L, "beta", out, n);
  return 1;
}

/* ---- PACEvolve++ (6.11) ---- */

static int l_pace_shape(lua_State *L) {
  static const char *const inputs[] = {"y", NULL};
  static const char *const params[] = {"y_init", "y_target", "direction", "alpha_r", "scale", NULL};
  static const char *const directions[] = {"max", "min", NULL};
  start(L, inputs, params);
  int64_t n;
  double *y = input_vector(L, "y", &n, true);
  double y_init = required_param(L, "y_init"), y_target = required_param(L, "y_target");
  double *out = buffer(L, n, sizeof *out);
  check_status(L,
               mrl_pace_shape(mrl__lua_engine(L), y, n, y_init, y_target,
                              param_option(L, "direction", "max", directions),
                              param_number(L, "alpha_r", 1.0), param_number(L, "scale", 5.0), out));
  lua_newtable(L);
  set_doubles(L, "reward", out, n);
  return 1;
}

static int frontier(lua_State *L, int pkpo) {
  static const char *const inputs[] = {"rewards", NULL};
  static const char *const params[] = {"k", NULL};
  start(L, inputs, params);
  int64_t n;
  double *r = input_vector(L, "rewards", &n, false);
  double *out = buffer(L, n, sizeof *out);
  check_status(L,
               mrl_frontier_weights(mrl__lua_engine(L), r, n, param_integer(L, "k", 4), pkpo, out));
  lua_newtable(L);
  set_doubles(L, "weights", out, n);
  return 1;
}
static int l_sloo(lua_State *L) { return frontier(L, 0); }
static int l_pkpo(lua_State *L) { return frontier(L, 1); }

static int l_pacevolve(lua_State *L) {
  static const char *const inputs[] = {"rewards", "step", NULL};
  static const char *const params[] = {"k", "total_steps", "alpha", NULL};
  start(L, inputs, params);
  int64_t n;
  double *r = input_vector(L, "rewards", &n, true);
  double alpha = 0.0;
  if (has_param(L, "alpha"))
    alpha = param_number(L, "alpha", 0.0);
  else if (has_input(L, "step"))
    alpha = mrl_pace_phase(input_integer(L, "step"), param_integer(L, "total_steps", 1000));
  else
    luaL_argerror(L, INPUTS, "inputs.step: required unless params.alpha sets the phase");
  double *adv = buffer(L, n, sizeof *adv), *ag = buffer(L, n, sizeof *ag);
  double *at = buffer(L, n, sizeof *at);
  int skip;
  check_status(L, mrl_pace_advantage(mrl__lua_engine(L), r, n, param_integer(L, "k", 4), alpha, adv,
                                     ag, at, &skip));
  lua_newtable(L);
  set_number(L, "alpha", alpha);
  set_boolean(L, "skip", skip != 0);
  if (skip & MRL_PACE_NONFINITE) {
    set_string(L, "reason", "non-finite rewards");
    return 1;
  }
  set_string(L, "reason",
             skip == (MRL_PACE_COLLAPSED_GROUP | MRL_PACE_COLLAPSED_TOPK) ? "collapsed:group,top-k"
             : skip == MRL_PACE_COLLAPSED_GROUP                           ? "collapsed:group"
             : skip == MRL_PACE_COLLAPSED_TOPK                            ? "collapsed:top-k"
                                                                          : "");
  if (!skip) set_doubles(L, "advantages", adv, n);
  set_doubles(L, "a_group", ag, n);
  set_doubles(L, "a_topk", at, n);
  return 1;
}

/* ---- verl 1dda039's additions ---- */

/* Sets field key of the table at the top to params[param] as it is, when present. */
static void pass_param(lua_State *L, const char *key, const char *param) {
  if (push_param(L, param) == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  lua_setfield(L, -2, key);
}

/* The arguments of rl.objective.rollout_correction from verl's rollout-correction params, into
 * the table at the top. */
static void pass_rollout_params(lua_State *L) {
  pass_param(L, "is", "rollout_is");
  pass_param(L, "is_threshold", "rollout_is_threshold");
  pass_param(L, "is_batch_normalize", "rollout_is_batch_normalize");
  pass_param(L, "rs", "rollout_rs");
  pass_param(L, "rs_threshold", "rollout_rs_threshold");
}

#define ROLLOUT_PARAMS                                                                             \
  "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",              \
      "rollout_rs_threshold"

/* verl's compute_rollout_correction_and_rejection_mask through rl.objective.rollout_correction:
 * IS weights of old_log_prob (the trained policy) against rollout_log_prob, and the mask less the
 * rejected tokens. */
static int l_rollout_correction(lua_State *L) {
  static const char *const inputs[] = {"old_log_prob", "rollout_log_prob", "response_mask", NULL};
  static const char *const params[] = {ROLLOUT_PARAMS, NULL};
  start(L, inputs, params);
  int64_t rows, cols;
  float *lp = input_matrix(L, "old_log_prob", &rows, &cols, NULL);
  float *rp = input_like(L, "rollout_log_prob", rows, cols, "old_log_prob");
  float *mask = input_mask(L, "response_mask", rows, cols, "old_log_prob");
  lua_createtable(L, 0, 10);
  set_tensor(L, "logp", lp, rows * cols);
  set_tensor(L, "rollout_logp", rp, rows * cols);
  set_tensor(L, "mask", mask, rows * cols);
  set_layout(L, rows, cols);
  pass_rollout_params(L);
  call_objective(L, "rollout_correction", 3);
  int w = lua_gettop(L) - 2;
  lua_newtable(L);
  if (!lua_isnil(L, w)) set_matrix(L, "rollout_is_weights", result_data(L, w), rows, cols);
  set_matrix(L, "modified_response_mask", result_data(L, w + 1), rows, cols);
  lua_pushnil(L);
  while (lua_next(L, w + 2)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_settable(L, -4);
  }
  return 1;
}

/* verl's compute_policy_loss_bypass_mode: old_log_prob is the rollout's; IS weights and the
 * rejection mask come from the current log_prob against it (as constants), then loss_type
 * "ppo_clip" (default) is PPO on the kept tokens without the weights, "reinforce" the REINFORCE
 * loss with them. */
static int l_pg_bypass(lua_State *L) {
  static const char *const params[] = {"loss_type",     "clip_ratio",        "clip_ratio_low",
                                       "clip_ratio_high", "clip_ratio_c",    "loss_agg_mode",
                                       "loss_scale_factor", ROLLOUT_PARAMS,  NULL};
  static const char *const types[] = {"ppo_clip", "reinforce", NULL};
  start(L, pg_inputs, params);
  bool reinforce = param_option(L, "loss_type", "ppo_clip", types) == 1;
  pg_batch p = read_pg(L, true);
  if (p.is_weights)
    luaL_argerror(L, INPUTS, "inputs.rollout_is_weights: bypass mode computes its own");
  int64_t n = p.rows * p.cols;
  lua_createtable(L, 0, 10);
  set_tensor(L, "logp", p.logp, n);
  set_tensor(L, "rollout_logp", p.old, n);
  set_tensor(L, "mask", p.mask, n);
  set_layout(L, p.rows, p.cols);
  pass_rollout_params(L);
  call_objective(L, "rollout_correction", 3);
  int w = lua_gettop(L) - 2;
  lua_createtable(L, 0, 16);
  set_tensor(L, "logp", p.logp, n);
  set_tensor(L, "old_logp", p.old, n);
  set_tensor(L, "adv", p.adv, n);
  lua_pushvalue(L, w + 1);
  lua_setfield(L, -2, "mask");
  if (reinforce && !lua_isnil(L, w)) {
    lua_pushvalue(L, w);
    lua_setfield(L, -2, "is_weights");
  }
  set_layout(L, p.rows, p.cols);
  set_string(L, "kind", reinforce ? "reinforce" : "ppo");
  /* verl hands its loss_agg_mode (token-mean by default) to both */
  set_string(L, "agg", mrl__obj_agg_names[param_agg(L, "token-mean")]);
  set_number(L, "agg_norm", param_number(L, "loss_scale_factor", (double)p.cols));
  double both = param_number(L, "clip_ratio", NAN);
  if (has_param(L, "clip_ratio_low") || !isnan(both))
    set_number(L, "clip_low", param_number(L, "clip_ratio_low", both));
  if (has_param(L, "clip_ratio_high") || !isnan(both))
    set_number(L, "clip_high", param_number(L, "clip_ratio_high", both));
  pass_number(L, "clip_c", "clip_ratio_c");
  call_objective(L, "loss", 2);
  int stats = lua_gettop(L) - 1;
  lua_newtable(L);
  copy_field(L, stats, "loss", "loss");
  copy_field(L, stats, "ppo_kl", "ppo_kl");
  if (!reinforce) {
    copy_field(L, stats, "clipfrac", "pg_clipfrac");
    copy_field(L, stats, "clipfrac_lower", "pg_clipfrac_lower");
  }
  set_matrix(L, "grad_wrt_logp", result_data(L, stats + 1), p.rows, p.cols);
  if (!lua_isnil(L, w)) set_matrix(L, "rollout_is_weights", result_data(L, w), p.rows, p.cols);
  set_matrix(L, "modified_response_mask", result_data(L, w + 1), p.rows, p.cols);
  return 1;
}

/* GDPO through rl.objective.advantage: inputs.reward_terms holds one list of row scores per
 * reward term (absent: the rows' summed token_level_rewards are the one term). */
static int l_gdpo(lua_State *L) {
  static const char *const inputs[] = {"token_level_rewards", "response_mask", "index",
                                       "reward_terms", NULL};
  static const char *const params[] = {"epsilon", "norm_adv_by_std", "weights", NULL};
  start(L, inputs, params);
  int64_t rows, cols, n;
  float *mask;
  double *score = NULL;
  if (has_input(L, "token_level_rewards")) {
    float *r = input_matrix(L, "token_level_rewards", &rows, &cols, NULL);
    mask = input_mask(L, "response_mask", rows, cols, "token_level_rewards");
    score = row_scores(L, "token_level_rewards", r, rows, cols);
  } else {
    matrix_shape(L, "response_mask", &rows, &cols);
    mask = input_mask(L, "response_mask", rows, cols, NULL);
  }
  input_ids(L, "index", &n, NULL);
  check_length(L, "index", n, rows, "response_mask");
  if (!score && !has_input(L, "reward_terms"))
    luaL_argerror(L, INPUTS, "inputs.reward_terms or inputs.token_level_rewards: one is needed");
  double *count = buffer(L, rows, sizeof *count);
  for (int64_t i = 0; i < rows * cols; i++) count[i / cols] += mask[i];
  lua_createtable(L, 0, 8);
  set_string(L, "method", "gdpo");
  if (score) set_doubles(L, "scores", score, rows);
  else set_doubles(L, "scores", count, rows); /* unread beside terms: it gives the row count */
  pass_input(L, "groups", "index");
  set_doubles(L, "counts", count, rows);
  pass_input(L, "terms", "reward_terms");
  pass_param(L, "term_weights", "weights");
  pass_number(L, "epsilon", "epsilon");
  if (has_param(L, "norm_adv_by_std"))
    set_number(L, "norm_by_std", param_boolean(L, "norm_adv_by_std", true));
  call_objective(L, "advantage", 1);
  lua_createtable(L, 0, 3);
  lua_insert(L, -2);
  lua_setfield(L, -2, "values");
  set_tensor(L, "mask", mask, rows * cols);
  set_offsets(L, rows, cols);
  call_objective(L, "broadcast", 1);
  lua_newtable(L);
  set_matrix(L, "advantages", result_data(L, -2), rows, cols);
  return 1;
}

/* The optimal token baseline on verl's (rows, cols) layout, calling the engine directly (the
 * trainer's rl.objective.otb lays episodes out from their first sampled token instead). */
static int otb(lua_State *L, int multi_turn) {
  static const char *const inputs[] = {"token_level_rewards", "response_mask",
                                       "index",               "old_log_probs",
                                       "sum_pi_squared",      "rollout_is_weights",
                                       NULL};
  static const char *const params[] = {"handle_zero_tail", "epsilon", NULL};
  start(L, inputs, params);
  int64_t rows, cols, n;
  float *r = input_matrix(L, "token_level_rewards", &rows, &cols, NULL);
  float *mask = input_mask(L, "response_mask", rows, cols, "token_level_rewards");
  int64_t *group = input_ids(L, "index", &n, NULL);
  check_length(L, "index", n, rows, "token_level_rewards");
  float *old = input_like(L, "old_log_probs", rows, cols, "token_level_rewards");
  float *spq = input_like(L, "sum_pi_squared", rows, cols, "token_level_rewards");
  float *isw = has_input(L, "rollout_is_weights")
                   ? input_like(L, "rollout_is_weights", rows, cols, "token_level_rewards")
                   : NULL;
  mrl_otb_opts o;
  mrl_otb_defaults(&o);
  o.multi_turn = multi_turn;
  o.handle_zero_tail = param_boolean(L, "handle_zero_tail", true);
  o.epsilon = param_number(L, "epsilon", o.epsilon);
  float *adv = buffer(L, rows * cols, sizeof *adv), *ret = buffer(L, rows * cols, sizeof *ret);
  check_status(L, mrl_optimal_token_baseline(mrl__lua_engine(L), &o, r, mask, group, old, spq, isw,
                                             rows, cols, adv, ret));
  lua_newtable(L);
  set_matrix(L, "advantages", adv, rows, cols);
  set_matrix(L, "returns", ret, rows, cols);
  return 1;
}
static int l_otb(lua_State *L) { return otb(L, 0); }
static int l_tir_otb(lua_State *L) { return otb(L, 1); }

/* ---- the table ---- */

static const luaL_Reg advantage_funcs[] = {{"grpo", l_grpo},
                                           {"drgrpo_advantage", l_drgrpo},
                                           {"grpo_passk", l_passk},
                                           {"rloo", l_rloo},
                                           {"opo", l_opo},
                                           {"gpg", l_gpg},
                                           {"remax", l_remax},
                                           {"reinforce_plus_plus", l_reinforce_pp},
                                           {"reinforce_plus_plus_baseline", l_rpp_baseline},
                                           {"gae", l_gae},
                                           {"agg_loss", l_agg_loss},
                                           {"policy_loss_vanilla", l_pg_vanilla},
                                           {"policy_loss_gspo", l_pg_gspo},
                                           {"policy_loss_sapo", l_pg_sapo},
                                           {"policy_loss_cispo", l_pg_cispo},
                                           {"policy_loss_gpg", l_pg_gpg},
                                           {"policy_loss_geo_mean", l_pg_geo_mean},
                                           {"policy_loss_dppo_tv", l_pg_dppo_tv},
                                           {"policy_loss_dppo_kl", l_pg_dppo_kl},
                                           {"policy_loss_clip_cov", l_pg_clip_cov},
                                           {"policy_loss_kl_cov", l_pg_kl_cov},
                                           {"policy_loss_dro", l_pg_dro},
                                           {"policy_loss_reinforce", l_pg_reinforce},
                                           {"policy_loss_bypass_mode", l_pg_bypass},
                                           {"rollout_correction", l_rollout_correction},
                                           {"gdpo", l_gdpo},
                                           {"optimal_token_baseline", l_otb},
                                           {"tir_optimal_token_baseline", l_tir_otb},
                                           {"value_loss", l_value_loss},
                                           {"kl_penalty", l_kl_penalty},
                                           {"apply_kl_penalty", l_apply_kl_penalty},
                                           {"adaptive_kl_controller", l_adaptive_kl},
                                           {"dapo_overlong_penalty", l_overlong},
                                           {"dapo_dynamic_sampling", l_dynamic_sampling},
                                           {"step_discounted_returns", l_step_returns},
                                           {"gigpo", l_gigpo},
                                           {"gigpo_step_groups", l_gigpo_step_groups},
                                           {"turn_discounted_returns", l_turn_returns},
                                           {"drmas", l_drmas},
                                           {"beacon_segment_rewards_static", l_beacon_static},
                                           {"beacon_match_milestones", l_beacon_match},
                                           {"beacon_step_rewards_dynamic", l_beacon_dynamic},
                                           {"beacon", l_beacon},
                                           {"information_gain", l_information_gain},
                                           {"a2tgpo_advantages", l_a2tgpo_advantages},
                                           {"a2tgpo_accumulate", l_a2tgpo_accumulate},
                                           {"a2tgpo_policy_loss", l_a2tgpo_loss},
                                           {"selective_rollout_gate", l_selective_gate},
                                           {"normalized_edit_distance", l_edit_distance},
                                           {"find_fatal_step_index", l_fatal_step},
                                           {"apply_fatal_step_mask", l_fatal_mask},
                                           {"fatal_aware_advantage", l_fatal_aware},
                                           {"aem", l_aem},
                                           {"aem_response_entropy", l_aem_entropy},
                                           {"freshper_reward_fresh", l_per_reward},
                                           {"freshper_priority", l_per_priority},
                                           {"freshper_sampling", l_per_sampling},
                                           {"freshper_beta_schedule", l_per_beta},
                                           {"pace_shape_reward", l_pace_shape},
                                           {"sloo_weights", l_sloo},
                                           {"pkpo_weights", l_pkpo},
                                           {"pacevolve_pp", l_pacevolve},
                                           {"steppo_step_gae", l_steppo},
                                           {"ttopd_turn_kl", l_ttopd_turn_kl},
                                           {"ema_update", l_ema_update},
                                           {NULL, NULL}};

/* the table; its functions share a private copy of rl.objective (upvalue OBJECTIVE) */
void mrl__lua_open_advantage(lua_State *L) {
  luaL_newlibtable(L, advantage_funcs);
  mrl__lua_open_objective(L);
  luaL_setfuncs(L, advantage_funcs, 1);
}
