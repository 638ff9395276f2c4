/* embed.c - embedding moonrl in a C program: open an engine, share a tensor with a Lua chunk,
 * call the C tensor API directly, read the message of a failing call, free everything.
 *
 *   cc embed.c $(pkg-config --cflags --libs moonrl) -o embed && ./embed
 */
#include <moonrl.h>

#include <stdio.h>
#include <string.h>

/* Prints the engine's message for a failed call and returns 1 (the process exit status). */
static int fail(mrl_engine *e, const char *what, mrl_status st) {
  fprintf(stderr, "%s failed: %s (%s)\n", what, mrl_strerror(st), mrl_engine_last_error(e));
  return 1;
}

int main(void) {
  if (strcmp(mrl_version(), MRL_VERSION_STRING) != 0) {
    fprintf(stderr, "header %s does not match library %s\n", MRL_VERSION_STRING, mrl_version());
    return 1;
  }
  mrl_engine *e = NULL;
  mrl_script *lua = NULL;
  mrl_tensor *w = NULL, *x = NULL, *y = NULL, *y_lua = NULL, *bad = NULL;
  mrl_status st;
  int rc = 1;

  if ((st = mrl_engine_new(&e))) {
    fprintf(stderr, "mrl_engine_new failed: %s\n", mrl_strerror(st));
    return 1;
  }

  /* C tensors: w (3x4) seeded normal, x (2x3) from data. */
  const int64_t wshape[] = {3, 4}, xshape[] = {2, 3};
  const float xdata[] = {1, 2, 3, 4, 5, 6};
  mrl_rng *rng = NULL;
  if ((st = mrl_rng_new(e, 42, &rng))) { rc = fail(e, "mrl_rng_new", st); goto done; }
  if ((st = mrl_tensor_new(e, 2, wshape, &w))) { rc = fail(e, "mrl_tensor_new", st); goto done; }
  st = mrl_tensor_rand_normal(w, rng, 0.0f, 1.0f);
  mrl_rng_free(rng);
  if (st) { rc = fail(e, "mrl_tensor_rand_normal", st); goto done; }
  if ((st = mrl_tensor_from_data(e, 2, xshape, xdata, 6, &x))) {
    rc = fail(e, "mrl_tensor_from_data", st);
    goto done;
  }

  /* The C API directly: y = x @ w (a new tensor, caller owns). */
  if ((st = mrl_tensor_matmul(&y, x, w, 0))) { rc = fail(e, "mrl_tensor_matmul", st); goto done; }

  /* A Lua chunk that uses the same tensors (shared memory, no copies). */
  if ((st = mrl_script_new(e, &lua))) { rc = fail(e, "mrl_script_new", st); goto done; }
  if ((st = mrl_script_set_tensor(lua, "w", w)) || (st = mrl_script_set_tensor(lua, "x", x))) {
    rc = fail(e, "mrl_script_set_tensor", st);
    goto done;
  }
  st = mrl_script_run(lua,
                      "local rl = require 'moonrl'\n"
                      "y = x:matmul(w)                -- the same product, from Lua\n"
                      "total = y:sum()\n",
                      "=embed");
  if (st) { rc = fail(e, "mrl_script_run", st); goto done; }
  double total;
  if ((st = mrl_script_get_tensor(lua, "y", &y_lua)) ||
      (st = mrl_script_get_number(lua, "total", &total))) {
    rc = fail(e, "reading Lua results", st);
    goto done;
  }
  double diff, c_total;
  mrl_tensor_max_abs_diff(y, y_lua, &diff);
  mrl_tensor_sum_all(y, &c_total);
  char text[512];
  mrl_tensor_format(y, text, sizeof text, NULL);
  printf("y = x @ w computed in C:\n%s\n", text);
  printf("sum from Lua %.6f, from C %.6f, max |C - Lua| = %g\n", total, c_total, diff);
  if (diff != 0.0) {
    fprintf(stderr, "C and Lua results differ\n");
    goto done;
  }

  /* A failing call: the shapes do not fit. The status says what kind of error; the engine's
   * last-error message says exactly what was wrong. Nothing was allocated. */
  st = mrl_tensor_matmul(&bad, w, x, 0);
  printf("w @ x -> %s: %s\n", mrl_strerror(st), mrl_engine_last_error(e));
  if (st != MRL_ERR_SHAPE || bad != NULL) goto done;

  /* A Lua error comes back as MRL_ERR_LUA with the message and a traceback. */
  st = mrl_script_run(lua, "error('boom')", "=embed");
  printf("Lua error -> %s: %.40s...\n", mrl_strerror(st), mrl_engine_last_error(e));
  if (st != MRL_ERR_LUA) goto done;
  rc = 0;

done:
  mrl_tensor_free(y_lua);
  mrl_script_free(lua);
  mrl_tensor_free(y);
  mrl_tensor_free(x);
  mrl_tensor_free(w);
  mrl_engine_free(e);
  return rc;
}
