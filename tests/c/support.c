/* support.c - helpers shared by the engine's C unit tests (see support.h). */
#define _DEFAULT_SOURCE /* mkdtemp, lstat */
#include "support.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

enum { BLOCK_HEADER = 16 }; /* keeps malloc's alignment for the caller's part */

void *counting_alloc_fn(void *ud, void *ptr, size_t old_size, size_t new_size) {
  counting_alloc *c = ud;
  if (new_size == 0) {
    if (ptr) {
      char *block = (char *)ptr - BLOCK_HEADER;
      size_t size;
      memcpy(&size, block, sizeof size);
      c->bad_frees += size != old_size;
      c->live--;
      free(block);
    }
    return NULL;
  }
  if (ptr) {
    c->resizes++;
    return NULL;
  }
  if (c->requests++ == c->fail_at) return NULL;
  char *block = malloc(new_size + BLOCK_HEADER);
  if (!block) return NULL;
  memcpy(block, &new_size, sizeof new_size);
  c->live++;
  return block + BLOCK_HEADER;
}

mrl_engine *new_counting_engine(counting_alloc *c) {
  memset(c, 0, sizeof *c);
  c->fail_at = -1;
  mrl_engine *e = NULL;
  MUST(mrl_engine_new_with_alloc(counting_alloc_fn, c, &e));
  return e;
}

void counting_alloc_arm(counting_alloc *c, long fail_at) {
  c->requests = 0;
  c->fail_at = fail_at;
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

const char *temp_dir(void) {
  static char root[64];
  snprintf(root, sizeof root, "/tmp/moonrl-test-XXXXXX");
  if (!mkdtemp(root)) {
    printf("Bail out! mkdtemp failed\n");
    exit(1);
  }
  return root;
}

void remove_tree(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0) return;
  if (S_ISDIR(sb.st_mode)) {
    DIR *d = opendir(path);
    if (d) {
      struct dirent *de;
      while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
        remove_tree(sub);
      }
      closedir(d);
    }
    rmdir(path);
  } else {
    unlink(path);
  }
}

int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d) return -1;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

void write_bytes(const char *path, const void *p, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp || fwrite(p, 1, n, fp) != n) {
    printf("Bail out! cannot write %s\n", path);
    exit(1);
  }
  fclose(fp);
}

unsigned char *read_bytes(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long len = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *p = malloc((size_t)len + 1);
  *n = p ? fread(p, 1, (size_t)len, fp) : 0;
  if (p) p[*n] = 0;
  fclose(fp);
  return p;
}

int for_each_file(const char *subdir,
                  void (*fn)(const char *name, const unsigned char *data, size_t n, void *ud),
                  void *ud) {
  const char *root = getenv("MOONRL_ROOT");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", root ? root : ".", subdir);
  DIR *d = opendir(dir);
  if (!CHECKF(d != NULL, "cannot open %s", dir)) return -1;
  int count = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    size_t n = 0;
    unsigned char *data = read_bytes(path, &n);
    if (!CHECKF(data != NULL, "cannot read %s", path)) {
      count = -1;
      break;
    }
    fn(de->d_name, data, n, ud);
    free(data);
    count++;
  }
  closedir(d);
  return count;
}

void free_clones(mrl_env **clones, int n) {
  for (int i = 0; i < n; i++) {
    free(clones[i]); /* the vtable is the first member of its box */
    clones[i] = NULL;
  }
}

void copy_episode(const mrl_rollout *r, int e, episode *out) {
  memset(out, 0, sizeof *out);
  out->len = mrl_rollout_length(r, e);
  out->end = mrl_rollout_end(r, e);
  out->turns = mrl_rollout_turn_count(r, e);
  if (out->len > EPISODE_COPY_CAP || out->turns > EPISODE_COPY_CAP) {
    CHECKF(false, "episode %d: %d tokens, %d turns: more than a copy holds", e, out->len, out->turns);
    out->len = out->turns = 0;
    return;
  }
  if (out->len > 0) {
    memcpy(out->tokens, mrl_rollout_tokens(r, e), sizeof(int32_t) * (size_t)out->len);
    memcpy(out->logprobs, mrl_rollout_logprobs(r, e), sizeof(float) * (size_t)out->len);
  }
  if (out->turns > 0)
    memcpy(out->rewards, mrl_rollout_rewards(r, e), sizeof(double) * (size_t)out->turns);
}

bool same_episode(const episode *a, const episode *b) { return memcmp(a, b, sizeof *a) == 0; }
