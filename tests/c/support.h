/* support.h - helpers shared by the engine's C unit tests: shape literals, setup that must succeed,
 * and checks of failing calls. */
#ifndef MRL_TEST_SUPPORT_H
#define MRL_TEST_SUPPORT_H

#include "check.h"
#include "moonrl.h"

#include <stdbool.h>
#include <stddef.h>

/* SHAPE(3, 4) expands to the two arguments `rank, shape` the engine and the helpers take. */
#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define SHAPE(...) (int)(sizeof DIMS(__VA_ARGS__) / sizeof(int64_t)), DIMS(__VA_ARGS__)

/* Setup that must succeed for a test to mean anything stops the run otherwise (TAP bail out). */
#define MUST(call) must_ok((call), #call, __LINE__)
void must_ok(mrl_status st, const char *expr, int line);

/* A new engine (bails out if it cannot be made). */
mrl_engine *new_engine(void);

/* Runs `call` (which must fail) with a cleared message; checks the status, that the message
 * names the problem (needle NULL: no engine can be reached) and that no memory was kept. */
#define CHECK_FAILS(e, want, needle, call)                                                         \
  do {                                                                                             \
    mrl_engine_clear_error(e);                                                                     \
    size_t used_before_ = mrl_engine_memory_used(e);                                               \
    mrl_status got_ = (call);                                                                      \
    check_failure(e, got_, want, needle, used_before_, #call, __LINE__);                           \
  } while (0)
void check_failure(mrl_engine *e, mrl_status got, mrl_status want, const char *needle,
                   size_t used_before, const char *expr, int line);

/* An allocator with lua_Alloc's contract that counts live blocks, checks that every free names
 * the size that was allocated, and fails the allocation request numbered fail_at (0-based). */
typedef struct {
  long live;        /* blocks allocated and not yet freed */
  long requests;    /* allocation requests so far */
  long fail_at;     /* this request fails; -1: none */
  long bad_frees;   /* frees whose old_size differed from the allocated size */
  long resizes;     /* requests to resize a block (the engine never needs one) */
} counting_alloc;

void *counting_alloc_fn(void *ud, void *ptr, size_t old_size, size_t new_size);
/* Failure sweeps: an engine on a counting allocator that fails nothing yet; arming restarts the
 * count so that request fail_at (0-based) of what follows fails. Sweeping fail_at over 0, 1, ...
 * until the call under test succeeds visits every allocation it makes: each failure must return
 * a status with a message, leave the objects' state as it was, and hold no memory. */
mrl_engine *new_counting_engine(counting_alloc *c);
void counting_alloc_arm(counting_alloc *c, long fail_at);

/* Files for tests that read and write them. */
/* A new empty directory under /tmp (a static buffer, valid until the next call). */
const char *temp_dir(void);
/* Removes a file or a directory tree. */
void remove_tree(const char *path);
/* Entries in a directory other than . and .., or -1 if it cannot be read. */
int count_entries(const char *dir);
/* Writes n bytes to path (bails out on failure). */
void write_bytes(const char *path, const void *p, size_t n);
/* The whole file (NUL-terminated for convenience), or NULL; caller frees. */
unsigned char *read_bytes(const char *path, size_t *n);
/* Calls fn(name, bytes, n, ud) for every file of $MOONRL_ROOT/<subdir> (else ./<subdir>) but
 * dot files (a fuzz corpus); returns how many, or -1 (and a failed check) when the folder or a
 * file cannot be read. */
int for_each_file(const char *subdir,
                  void (*fn)(const char *name, const unsigned char *data, size_t n, void *ud),
                  void *ud);

/* One episode's record after a rollout, copied out so that runs can be compared bit for bit
 * (memcmp of two copies, or same_episode): its length, end, turns, tokens, behaviour
 * log-probabilities and rewards, zero past them. */
enum { EPISODE_COPY_CAP = 512 };
typedef struct {
  int len, end, turns;
  int32_t tokens[EPISODE_COPY_CAP];
  float logprobs[EPISODE_COPY_CAP];
  double rewards[EPISODE_COPY_CAP];
} episode;
/* Copies episode e of r into *out (a failed check when it is longer than EPISODE_COPY_CAP). */
void copy_episode(const mrl_rollout *r, int e, episode *out);
/* Whether two copies are the same bytes. */
bool same_episode(const episode *a, const episode *b);

/* Frees the n environments a tree or hooked rollout's clone() made (each one malloc'd block
 * whose first member is its mrl_env, NULL where none was made) and sets the entries to NULL. */
void free_clones(mrl_env **clones, int n);

#endif /* MRL_TEST_SUPPORT_H */
