/* comm.c - mrl_comm, the data-parallel communicator: a group of one (always built) or the MPI
 * world (built with MRL_WITH_MPI, `make MPI=1`). Collectives are deliberately few: sums of
 * float32 and float64 buffers in place, broadcast, gathers and a barrier.
 *
 * MPI is process-wide while handles are not: the first mrl_comm_new initialises MPI (FUNNELED:
 * only the thread that calls these functions talks to MPI) unless the host program already did,
 * every handle counts as a reference, and the last mrl_comm_free finalises what this file
 * initialised. MPI cannot start twice in one process, so a new handle after that is refused. */
#include "internal.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#ifdef MRL_WITH_MPI
#include <mpi.h>
#endif

/* Sums go through MPI in pieces of this many bytes, so that a large gradient buffer never needs
 * one giant message (and a later backend can overlap the pieces with backward). */
#define COMM_PIECE_BYTES ((int64_t)4 << 20)

struct mrl_comm {
  mrl_engine *engine;
  int rank, size;
  int mpi; /* 1: the MPI world; 0: a group of one */
};

#ifdef MRL_WITH_MPI
static int g_refs;      /* live handles on the MPI world */
static int g_ours;      /* this file called MPI_Init_thread (so it finalises) */
static int g_finalized; /* this file finalised MPI: no new world in this process */

static mrl_status mpi_fail(mrl_engine *e, const char *fn, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", code);
  return mrl__fail(e, MRL_ERR_IO, fn, "MPI: %s", text);
}
#endif

const char *mrl_comm_backends(void) {
#ifdef MRL_WITH_MPI
  return "self mpi";
#else
  return "self";
#endif
}

mrl_status mrl_comm_new(mrl_engine *e, mrl_comm **out) {
  if (!e || !out) return MRL_ERR_NULL;
  mrl_comm *c = mrl__alloc(e, sizeof *c);
  if (!c) return mrl__fail(e, MRL_ERR_NOMEM, "mrl_comm_new", "out of memory");
  memset(c, 0, sizeof *c);
  c->engine = e;
  c->size = 1;
#ifdef MRL_WITH_MPI
  if (g_finalized) {
    mrl__free(e, c, sizeof *c);
    return mrl__fail(e, MRL_ERR_UNSUPPORTED, "mrl_comm_new",
                     "MPI was finalised in this process and cannot start again");
  }
  int inited = 0, rc;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) {
      mrl__free(e, c, sizeof *c);
      return mpi_fail(e, "mrl_comm_new", rc);
    }
    g_ours = 1;
    /* errors come back as codes and become messages instead of killing the process here */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size);
  c->mpi = 1;
  g_refs++;
#endif
  mrl__engine_retain(e);
  *out = c;
  return MRL_OK;
}

void mrl_comm_free(mrl_comm *c) {
  if (!c) return;
  mrl_engine *e = c->engine;
#ifdef MRL_WITH_MPI
  if (c->mpi && --g_refs == 0 && g_ours) {
    MPI_Finalize();
    g_ours = 0;
    g_finalized = 1;
  }
#endif
  mrl__free(e, c, sizeof *c);
  mrl__engine_release(e);
}

void mrl_comm_abort(int code) {
#ifdef MRL_WITH_MPI
  int inited = 0, done = 0, size = 1;
  MPI_Initialized(&inited);
  MPI_Finalized(&done);
  if (!inited || done) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)code;
#endif
}

int mrl_comm_rank(const mrl_comm *c) { return c ? c->rank : -1; }
int mrl_comm_size(const mrl_comm *c) { return c ? c->size : -1; }
const char *mrl_comm_backend(const mrl_comm *c) { return c && c->mpi ? "mpi" : "self"; }

static mrl_status check_buffer(const mrl_comm *c, const void *data, int64_t n, const char *fn) {
  if (!c) return MRL_ERR_NULL;
  if (n < 0) return mrl__fail(c->engine, MRL_ERR_INVALID, fn, "negative length %lld", (long long)n);
  if (n > 0 && !data) return mrl__fail(c->engine, MRL_ERR_NULL, fn, "data is NULL");
  return MRL_OK;
}

#ifdef MRL_WITH_MPI
/* In-place sum of n elements of `elem` bytes in pieces of COMM_PIECE_BYTES. */
static mrl_status allreduce_pieces(mrl_comm *c, void *data, int64_t n, size_t elem,
                                   MPI_Datatype type, const char *fn) {
  int64_t per = COMM_PIECE_BYTES / (int64_t)elem;
  for (int64_t a = 0; a < n; a += per) {
    int64_t k = n - a < per ? n - a : per;
    int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)data + (size_t)a * elem, (int)k, type, MPI_SUM,
                           MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(c->engine, fn, rc);
  }
  return MRL_OK;
}
#endif

/* The in-place sum of n floats (f64: doubles). */
static mrl_status allreduce(mrl_comm *c, void *data, int64_t n, int f64, const char *fn) {
  mrl_status st = check_buffer(c, data, n, fn);
  if (st || c->size == 1) return st;
#ifdef MRL_WITH_MPI
  if (f64) return allreduce_pieces(c, data, n, sizeof(double), MPI_DOUBLE, fn);
  return allreduce_pieces(c, data, n, sizeof(float), MPI_FLOAT, fn);
#else
  (void)f64;
  return MRL_OK;
#endif
}

mrl_status mrl_comm_allreduce_f32(mrl_comm *c, float *data, int64_t n) {
  return allreduce(c, data, n, 0, "mrl_comm_allreduce_f32");
}

mrl_status mrl_comm_allreduce_f64(mrl_comm *c, double *data, int64_t n) {
  return allreduce(c, data, n, 1, "mrl_comm_allreduce_f64");
}

mrl_status mrl_comm_bcast(mrl_comm *c, void *data, int64_t bytes, int root) {
  mrl_status st = check_buffer(c, data, bytes, "mrl_comm_bcast");
  if (st) return st;
  if (root < 0 || root >= c->size)
    return mrl__fail(c->engine, MRL_ERR_RANGE, "mrl_comm_bcast", "root %d outside 0..%d", root,
                     c->size - 1);
  if (c->size == 1) return MRL_OK;
#ifdef MRL_WITH_MPI
  for (int64_t a = 0; a < bytes; a += COMM_PIECE_BYTES) {
    int64_t k = bytes - a < COMM_PIECE_BYTES ? bytes - a : COMM_PIECE_BYTES;
    int rc = MPI_Bcast((char *)data + a, (int)k, MPI_BYTE, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(c->engine, "mrl_comm_bcast", rc);
  }
#endif
  return MRL_OK;
}

mrl_status mrl_comm_allgather(mrl_comm *c, const void *send, int64_t bytes, void *recv) {
  mrl_status st = check_buffer(c, send, bytes, "mrl_comm_allgather");
  if (st) return st;
  if (bytes > 0 && !recv) return mrl__fail(c->engine, MRL_ERR_NULL, "mrl_comm_allgather", "recv is NULL");
  if (bytes > INT_MAX)
    return mrl__fail(c->engine, MRL_ERR_OVERFLOW, "mrl_comm_allgather",
                     "%lld bytes per rank: at most %d", (long long)bytes, INT_MAX);
  if (c->size == 1) {
    if (bytes > 0) memmove(recv, send, (size_t)bytes);
    return MRL_OK;
  }
#ifdef MRL_WITH_MPI
  int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) return mpi_fail(c->engine, "mrl_comm_allgather", rc);
#endif
  return MRL_OK;
}

mrl_status mrl_comm_allgatherv(mrl_comm *c, const void *send, const int64_t *counts, void *recv) {
  if (!c) return MRL_ERR_NULL;
  if (!counts) return mrl__fail(c->engine, MRL_ERR_NULL, "mrl_comm_allgatherv", "counts is NULL");
  int64_t total = 0;
  for (int r = 0; r < c->size; r++) {
    if (counts[r] < 0 || counts[r] > INT_MAX)
      return mrl__fail(c->engine, MRL_ERR_RANGE, "mrl_comm_allgatherv",
                       "counts[%d] = %lld: 0..%d bytes expected", r, (long long)counts[r], INT_MAX);
    total += counts[r];
  }
  if (total > INT_MAX)
    return mrl__fail(c->engine, MRL_ERR_OVERFLOW, "mrl_comm_allgatherv",
                     "%lld bytes in all: at most %d", (long long)total, INT_MAX);
  mrl_status st = check_buffer(c, send, counts[c->rank], "mrl_comm_allgatherv");
  if (st) return st;
  if (total > 0 && !recv) return mrl__fail(c->engine, MRL_ERR_NULL, "mrl_comm_allgatherv", "recv is NULL");
  if (c->size == 1) {
    if (total > 0) memmove(recv, send, (size_t)total);
    return MRL_OK;
  }
#ifdef MRL_WITH_MPI
  size_t ints = sizeof(int) * (size_t)c->size;
  int *cnt = mrl__alloc(c->engine, 2 * ints);
  if (!cnt) return mrl__fail(c->engine, MRL_ERR_NOMEM, "mrl_comm_allgatherv", "out of memory");
  int *disp = cnt + c->size;
  int at = 0;
  for (int r = 0; r < c->size; r++) {
    cnt[r] = (int)counts[r];
    disp[r] = at;
    at += cnt[r];
  }
  int rc = MPI_Allgatherv(send, cnt[c->rank], MPI_BYTE, recv, cnt, disp, MPI_BYTE, MPI_COMM_WORLD);
  mrl__free(c->engine, cnt, 2 * ints);
  if (rc != MPI_SUCCESS) return mpi_fail(c->engine, "mrl_comm_allgatherv", rc);
#endif
  return MRL_OK;
}

mrl_status mrl_comm_barrier(mrl_comm *c) {
  if (!c) return MRL_ERR_NULL;
  if (c->size == 1) return MRL_OK;
#ifdef MRL_WITH_MPI
  int rc = MPI_Barrier(MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) return mpi_fail(c->engine, "mrl_comm_barrier", rc);
#endif
  return MRL_OK;
}
