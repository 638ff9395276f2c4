/* file.c - the engine's file helpers: reading a whole, bounded regular file into engine memory
 * (config.json, shard indexes, tokenizer.json), replacing a file atomically (checkpoints,
 * safetensors, configs), and creating directories. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

mrl_status mrl__read_file(mrl_engine *e, const char *fn, const char *path, size_t max_bytes,
                          char **text, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is refused, not waited on */
  if (fd < 0) return mrl__fail(e, MRL_ERR_IO, fn, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max_bytes) {
    close(fd);
    return mrl__fail(e, MRL_ERR_IO, fn, "%s: not a regular file of at most %zu bytes", path,
                     max_bytes);
  }
  size_t size = (size_t)sb.st_size, got = 0;
  char *buf = mrl__alloc(e, size + 1);
  if (!buf) {
    close(fd);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "%s: out of memory", path);
  }
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got != size) {
    mrl__free(e, buf, size + 1);
    return mrl__fail(e, MRL_ERR_IO, fn, "%s: read failed", path);
  }
  buf[size] = '\0';
  *text = buf;
  *len = size;
  return MRL_OK;
}

/* ---- atomic replacement ---- */

static char *copy_string(mrl_engine *e, const char *s, size_t extra, size_t *cap) {
  size_t n = strlen(s);
  *cap = n + extra + 1;
  char *c = mrl__alloc(e, *cap);
  if (c) memcpy(c, s, n + 1);
  return c;
}

static void release_atomic(mrl_atomic_file *af) {
  mrl__free(af->engine, af->path, af->path_cap);
  mrl__free(af->engine, af->tmp, af->tmp_cap);
  af->path = af->tmp = NULL;
  af->fp = NULL;
}

mrl_status mrl__atomic_begin(mrl_engine *e, const char *fn, const char *path, mrl_atomic_file *af) {
  memset(af, 0, sizeof *af);
  af->engine = e;
  af->fn = fn;
  af->path = copy_string(e, path, 0, &af->path_cap);
  af->tmp = copy_string(e, path, 48, &af->tmp_cap);
  if (!af->path || !af->tmp) {
    release_atomic(af);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "%s: out of memory", path);
  }
  /* O_EXCL with a fresh name per attempt: writers racing for the same target never share a
   * temporary file, and the file gets the usual permissions (0666 less the umask) */
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; attempt++) {
    snprintf(af->tmp, af->tmp_cap, "%s.tmp.%ld.%d", path, (long)getpid(), attempt);
    fd = open(af->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    int err = errno;
    release_atomic(af);
    return mrl__fail(e, MRL_ERR_IO, fn, "%s: cannot create a temporary file beside it: %s", path,
                     strerror(err));
  }
  af->fp = fdopen(fd, "wb");
  if (!af->fp) {
    int err = errno;
    close(fd);
    unlink(af->tmp);
    release_atomic(af);
    return mrl__fail(e, MRL_ERR_IO, fn, "%s: %s", path, strerror(err));
  }
  return MRL_OK;
}

void mrl__atomic_abort(mrl_atomic_file *af) {
  if (!af->fp) return;
  fclose(af->fp);
  unlink(af->tmp);
  release_atomic(af);
}

/* Syncs the directory holding path, so the rename itself survives a crash. */
static int sync_parent_dir(const char *path, char *scratch) {
  strcpy(scratch, path);
  char *slash = strrchr(scratch, '/');
  const char *dir = ".";
  if (slash == scratch) {
    dir = "/";
  } else if (slash) {
    *slash = '\0';
    dir = scratch;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  /* some file systems cannot sync a directory (EINVAL); the rename is then as durable as it gets */
  int rc = fsync(fd) != 0 && errno != EINVAL ? -1 : 0;
  close(fd);
  return rc;
}

mrl_status mrl__atomic_commit(mrl_atomic_file *af) {
  mrl_engine *e = af->engine;
  const char *step = NULL;
  if (ferror(af->fp))
    step = "write";
  else if (fflush(af->fp) != 0)
    step = "flush";
  else if (fsync(fileno(af->fp)) != 0)
    step = "sync";
  int err = errno;
  if (fclose(af->fp) != 0 && !step) {
    step = "close";
    err = errno;
  }
  af->fp = NULL;
  if (!step && rename(af->tmp, af->path) != 0) {
    step = "rename";
    err = errno;
  }
  if (step) {
    unlink(af->tmp);
    mrl_status st = mrl__fail(e, MRL_ERR_IO, af->fn, "%s: %s failed: %s", af->path, step,
                              strerror(err));
    release_atomic(af);
    return st;
  }
  mrl_status st = MRL_OK;
  /* af->tmp is no longer needed and is longer than the path: scratch space for the dirname */
  if (sync_parent_dir(af->path, af->tmp) != 0)
    st = mrl__fail(e, MRL_ERR_IO, af->fn, "%s: written, but its directory could not be synced: %s",
                   af->path, strerror(errno));
  release_atomic(af);
  return st;
}

/* ---- directories and whole files ---- */

mrl_status mrl__make_dirs(mrl_engine *e, const char *fn, const char *dir) {
  char p[4096];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof p)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "bad directory \"%s\"", dir);
  memcpy(p, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
      return mrl__fail(e, MRL_ERR_IO, fn, "%s: cannot create directory: %s", p, strerror(errno));
    p[i] = c;
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return mrl__fail(e, MRL_ERR_IO, fn, "%s: not a directory", dir);
  return MRL_OK;
}

mrl_status mrl__write_file_atomic(mrl_engine *e, const char *fn, const char *path,
                                    const char *data, size_t len) {
  mrl_atomic_file af;
  mrl_status st = mrl__atomic_begin(e, fn, path, &af);
  if (st) return st;
  fwrite(data, 1, len, af.fp);
  return mrl__atomic_commit(&af); /* a short write shows up there */
}

