/* support.c - helpers shared by the engine's C unit tests (see support.h). */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void must_ok(mrl_status st, const char *expr, int line) {
  if (st == MRL_OK) return;
  printf("Bail out! line %d: %s returned %d (%s)\n", line, expr, st, mrl_strerror(st));
  exit(1);
}

mrl_engine *new_engine(void) {
  mrl_engine *e = NULL;
  MUST(mrl_engine_new(&e));
  return e;
}

void check_failure(mrl_engine *e, mrl_status got, mrl_status want, const char *needle,
                   size_t used_before, const char *expr, int line) {
  CHECKF(got == want, "line %d: %s returned %d (%s), want %d (%s)", line, expr, got,
         mrl_strerror(got), want, mrl_strerror(want));
  const char *msg = mrl_engine_last_error(e);
  if (needle)
    CHECKF(strstr(msg, needle) != NULL, "line %d: %s: message \"%s\" lacks \"%s\"", line, expr,
           msg, needle);
  CHECKF(mrl_engine_memory_used(e) == used_before, "line %d: %s: memory went from %zu to %zu",
         line, expr, used_before, mrl_engine_memory_used(e));
}
