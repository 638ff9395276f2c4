/* test_comm.c - mrl_comm in the build under test as a group of one (the default build's "self"
 * backend, or an MPI build started alone): rank and size, every collective's result, and every
 * bad argument refused with a message and without keeping memory. The collectives across ranks
 * are tests/lua/mpi_spec.lua's. */
#include "support.h"

#include <stdint.h>
#include <string.h>

/* One handle lives through the tests: in an MPI build the last free finalises MPI, which cannot
 * start again in the process (test_finalised checks that). */
static mrl_engine *keep_engine;
static mrl_comm *keep;

static void test_group_of_one(void) {
  keep_engine = new_engine();
  MUST(mrl_comm_new(keep_engine, &keep));
  mrl_engine *e = new_engine();
  mrl_comm *c = NULL;
  MUST(mrl_comm_new(e, &c));
  CHECK(mrl_comm_rank(c) == 0 && mrl_comm_size(c) == 1);
  const char *backend = mrl_comm_backend(c);
  CHECKF(strcmp(backend, "self") == 0 || strcmp(backend, "mpi") == 0, "backend %s", backend);
  CHECK(strstr(mrl_comm_backends(), backend) != NULL);
  float f[3] = {1.5f, -2.0f, 3.25f};
  double d[2] = {0.1, 1e300};
  CHECK(mrl_comm_allreduce_f32(c, f, 3) == MRL_OK && f[0] == 1.5f && f[1] == -2.0f && f[2] == 3.25f);
  CHECK(mrl_comm_allreduce_f64(c, d, 2) == MRL_OK && d[0] == 0.1 && d[1] == 1e300);
  CHECK(mrl_comm_allreduce_f32(c, NULL, 0) == MRL_OK); /* nothing to sum */
  int64_t n = 42;
  CHECK(mrl_comm_bcast(c, &n, sizeof n, 0) == MRL_OK && n == 42);
  char send[5] = "abcd", recv[5] = {0};
  CHECK(mrl_comm_allgather(c, send, 4, recv) == MRL_OK && memcmp(recv, "abcd", 4) == 0);
  int64_t counts[1] = {3};
  memset(recv, 0, sizeof recv);
  CHECK(mrl_comm_allgatherv(c, send, counts, recv) == MRL_OK && memcmp(recv, "abc", 3) == 0 &&
        recv[3] == 0);
  CHECK(mrl_comm_barrier(c) == MRL_OK);
  /* a second handle on the same group */
  mrl_comm *c2 = NULL;
  MUST(mrl_comm_new(e, &c2));
  CHECK(mrl_comm_size(c2) == 1);
  mrl_comm_free(c2);
  mrl_comm_free(c);
  mrl_comm_free(NULL);
  mrl_engine_free(e);
}

static void test_bad_arguments(void) {
  mrl_engine *e = new_engine();
  mrl_comm *c = NULL;
  CHECK(mrl_comm_new(NULL, &c) == MRL_ERR_NULL && c == NULL);
  CHECK(mrl_comm_new(e, NULL) == MRL_ERR_NULL);
  MUST(mrl_comm_new(e, &c));
  CHECK(mrl_comm_rank(NULL) == -1 && mrl_comm_size(NULL) == -1);
  CHECK(strcmp(mrl_comm_backend(NULL), "self") == 0);
  float f[2] = {1, 2};
  double d[1] = {1};
  CHECK(mrl_comm_allreduce_f32(NULL, f, 2) == MRL_ERR_NULL);
  CHECK_FAILS(e, MRL_ERR_INVALID, "negative length -1", mrl_comm_allreduce_f32(c, f, -1));
  CHECK_FAILS(e, MRL_ERR_NULL, "data is NULL", mrl_comm_allreduce_f32(c, NULL, 2));
  CHECK_FAILS(e, MRL_ERR_INVALID, "mrl_comm_allreduce_f64", mrl_comm_allreduce_f64(c, d, -3));
  CHECK_FAILS(e, MRL_ERR_RANGE, "root 1 outside 0..0", mrl_comm_bcast(c, f, sizeof f, 1));
  CHECK_FAILS(e, MRL_ERR_RANGE, "root -1", mrl_comm_bcast(c, f, sizeof f, -1));
  CHECK_FAILS(e, MRL_ERR_NULL, "data is NULL", mrl_comm_bcast(c, NULL, 4, 0));
  CHECK_FAILS(e, MRL_ERR_NULL, "recv is NULL", mrl_comm_allgather(c, f, 4, NULL));
  CHECK_FAILS(e, MRL_ERR_OVERFLOW, "at most", mrl_comm_allgather(c, f, (int64_t)1 << 40, f));
  int64_t bad[1] = {-1};
  char buf[4];
  CHECK_FAILS(e, MRL_ERR_RANGE, "counts[0] = -1", mrl_comm_allgatherv(c, buf, bad, buf));
  CHECK_FAILS(e, MRL_ERR_NULL, "counts is NULL", mrl_comm_allgatherv(c, buf, NULL, buf));
  int64_t two[1] = {2};
  CHECK_FAILS(e, MRL_ERR_NULL, "recv is NULL", mrl_comm_allgatherv(c, buf, two, NULL));
  CHECK(mrl_comm_barrier(NULL) == MRL_ERR_NULL);
  /* nothing changed after the refusals */
  CHECK(f[0] == 1 && f[1] == 2 && d[0] == 1);
  mrl_comm_free(c);
  mrl_engine_free(e);
}

/* The last handle's free ends the group: in an MPI build a new handle is then refused. */
static void test_finalised(void) {
  int mpi = strcmp(mrl_comm_backend(keep), "mpi") == 0;
  mrl_comm_free(keep);
  mrl_comm *c = NULL;
  if (mpi) {
    CHECK_FAILS(keep_engine, MRL_ERR_UNSUPPORTED, "cannot start again", mrl_comm_new(keep_engine, &c));
    CHECK(c == NULL);
  } else {
    CHECK(mrl_comm_new(keep_engine, &c) == MRL_OK && mrl_comm_size(c) == 1);
    mrl_comm_free(c);
  }
  mrl_engine_free(keep_engine);
}

static const test_case tests[] = {
    {"group_of_one", test_group_of_one},
    {"bad_arguments", test_bad_arguments},
    {"finalised", test_finalised},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
