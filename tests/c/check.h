/* check.h - a minimal test harness for the C unit tests: TAP output, one line per test. */
#ifndef MRL_CHECK_H
#define MRL_CHECK_H

#include <stdbool.h>

/* Records a failure (with file and line) in the current test without stopping it. */
#define CHECK(cond) check_record((cond), #cond, __FILE__, __LINE__)
#define CHECKF(cond, ...) check_recordf((cond), __FILE__, __LINE__, __VA_ARGS__)

typedef void (*test_fn)(void);
typedef struct {
  const char *name;
  test_fn fn;
} test_case;

bool check_record(bool ok, const char *expr, const char *file, int line);
bool check_recordf(bool ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prints a diagnostic line ("# ...") under the current test. */
void check_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Marks the current test as skipped (its TAP line gets "# SKIP reason"); for a feature the
 * machine lacks. The test should return right after. */
void check_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Runs the tests (all, or those whose names contain argv[1]); returns the exit status. */
int check_main(int argc, char **argv, const test_case *tests);

#endif /* MRL_CHECK_H */
