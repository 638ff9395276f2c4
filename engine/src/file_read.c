/* file_read.c - reads a whole, bounded regular file into engine memory, for the loaders of
 * config.json, shard indexes and tokenizer.json. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
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
