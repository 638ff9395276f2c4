/* check.c - the C test harness: runs test functions and prints TAP ("ok N - name"). */
#include "check.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int failures_in_test;
static char skip_reason[256];

bool check_record(bool ok, const char *expr, const char *file, int line) {
  if (!ok) {
    failures_in_test++;
    printf("# FAILED %s:%d: %s\n", file, line, expr);
  }
  return ok;
}

bool check_recordf(bool ok, const char *file, int line, const char *fmt, ...) {
  if (!ok) {
    failures_in_test++;
    printf("# FAILED %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
  }
  return ok;
}

void check_note(const char *fmt, ...) {
  printf("# ");
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

void check_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(skip_reason, sizeof skip_reason, fmt, ap);
  va_end(ap);
}

int check_main(int argc, char **argv, const test_case *tests) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  int n = 0, failed = 0;
  for (const test_case *t = tests; t->name; t++)
    if (!filter || strstr(t->name, filter)) n++;
  printf("1..%d\n", n);
  int i = 0;
  for (const test_case *t = tests; t->name; t++) {
    if (filter && !strstr(t->name, filter)) continue;
    failures_in_test = 0;
    skip_reason[0] = '\0';
    fflush(stdout);
    t->fn();
    i++;
    printf("%s %d - %s%s%s\n", failures_in_test ? "not ok" : "ok", i, t->name,
           skip_reason[0] ? " # SKIP " : "", skip_reason);
    fflush(stdout);
    if (failures_in_test) failed++;
  }
  return failed ? 1 : 0;
}
