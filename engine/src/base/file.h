/* file.h - file helpers of the base layer: bounded whole-file reads, atomic replacement, and
 * directory creation. Not installed. */
#ifndef MRL_FILE_H
#define MRL_FILE_H

#include "internal.h"

#include <stdio.h>

/* Reads a regular file of at most max_bytes; *text is NUL-terminated and freed with
 * mrl__free(e, *text, *len + 1). Failures: MRL_ERR_IO or MRL_ERR_NOMEM with "fn: path: ...". */
mrl_status mrl__read_file(mrl_engine *e, const char *fn, const char *path, size_t max_bytes,
                          char **text, size_t *len);

/* A file being replaced atomically: written to a temporary file in the same directory, then
 * flushed, synced and renamed over the target, and the directory synced. Until the commit the
 * target is untouched; on any failure the temporary file is removed. */
typedef struct mrl_atomic_file {
  mrl_engine *engine;
  const char *fn;
  FILE *fp;            /* write the contents here */
  char *path, *tmp;    /* owned copies (mrl__alloc) */
  size_t path_cap, tmp_cap;
} mrl_atomic_file;

mrl_status mrl__atomic_begin(mrl_engine *e, const char *fn, const char *path, mrl_atomic_file *af);
/* Finishes the file (also checks that every write succeeded) and releases af either way. */
mrl_status mrl__atomic_commit(mrl_atomic_file *af);
/* Removes the temporary file and releases af; the target stays as it was. */
void mrl__atomic_abort(mrl_atomic_file *af);
/* Writes len bytes to path atomically. */
mrl_status mrl__write_file_atomic(mrl_engine *e, const char *fn, const char *path,
                                  const char *data, size_t len);
/* Creates dir and its missing parents. */
mrl_status mrl__make_dirs(mrl_engine *e, const char *fn, const char *dir);

#endif /* MRL_FILE_H */
