/* tensor_internal.h - the tensor layer's internals shared with the layers above it (model, Lua
 * binding): the storage and tensor structs, shape and index helpers, and the BLAS entry points.
 * Not installed. */
#ifndef MRL_TENSOR_INTERNAL_H
#define MRL_TENSOR_INTERNAL_H

#include "internal.h"

typedef struct mrl_storage {
  long refs;
  mrl_engine *engine;
  float *data;        /* aligned start of the elements */
  void *block;        /* what the allocator returned (NULL for wrapped memory) */
  size_t block_size;
  void (*release)(void *ud, float *data);
  void *release_ud;
} mrl_storage;

struct mrl_tensor {
  mrl_storage *storage;
  float *data; /* element (0,...,0) */
  int rank;
  int64_t numel;
  int64_t shape[MRL_MAX_RANK];
  int64_t stride[MRL_MAX_RANK];
};

/* ---- tensor.c ---- */
/* Normalises a possibly negative dim against rank; returns -1 if out of range. */
int mrl__dim(int dim, int rank);
/* Fails with MRL_ERR_RANGE: "<name> <dim> is out of range for a rank-<rank> tensor". */
mrl_status mrl__bad_dim(mrl_engine *e, const char *fn, const char *name, int dim, int rank);
/* Product of shape; false when an entry is negative or when the product of the non-zero entries
 * (which bounds the contiguous strides, even of an empty tensor) overflows int64. */
bool mrl__numel(int rank, const int64_t *shape, int64_t *numel);
/* Allocates a contiguous zero-filled tensor. fn names the public caller for the message. */
mrl_status mrl__tensor_alloc(mrl_engine *e, const char *fn, int rank, const int64_t *shape,
                             mrl_tensor **out);
/* Resolves the `out` in/out convention: allocate when *out is NULL, else check the shape.
 * *fresh is set when a new tensor was made (so the caller frees it if a later step fails). */
mrl_status mrl__prepare_out(mrl_engine *e, const char *fn, mrl_tensor **out, int rank,
                            const int64_t *shape, mrl_tensor **result, bool *fresh);
mrl_engine *mrl__engine_of(const mrl_tensor *t);
/* The engine of *out when out and *out are set (for messages about NULL inputs), else NULL. */
mrl_engine *mrl__out_engine(mrl_tensor **out);
/* A new view with t's geometry over t's storage. */
mrl_status mrl__tensor_view(mrl_tensor *t, const char *fn, mrl_tensor **out);
bool mrl__is_contiguous(const mrl_tensor *t);
/* Writes "(2x3x4)" (or "()" for a scalar) into buf. */
void mrl__shape_str(char *buf, size_t cap, int rank, const int64_t *shape);

/* Iterates the multi-index of a shape in row-major order. */
typedef struct mrl_index_iter {
  int rank;
  int64_t shape[MRL_MAX_RANK];
  int64_t idx[MRL_MAX_RANK];
} mrl_index_iter;
void mrl__iter_init(mrl_index_iter *it, int rank, const int64_t *shape);
/* Advances to the next index; returns the deepest dimension that changed (-1 at the end). */
int mrl__iter_next(mrl_index_iter *it);
int64_t mrl__offset(const int64_t *stride, const int64_t *idx, int rank);

/* ---- tensor_ops.c / tensor_matmul.c: result shapes (they fail like the operations do) ---- */
mrl_status mrl__broadcast_shape(mrl_engine *e, const char *fn, const mrl_tensor *a,
                                const mrl_tensor *b, int *rank, int64_t *shape);
mrl_status mrl__matmul_shape(mrl_engine *e, const char *fn, const mrl_tensor *a,
                             const mrl_tensor *b, int flags, int *rank, int64_t *shape);

/* ---- blas.c ---- */
typedef void (*mrl_sgemm_fn)(int order, int transa, int transb, int m, int n, int k, float alpha,
                             const float *a, int lda, const float *b, int ldb, float beta, float *c,
                             int ldc);
/* Loads OpenBLAS once (thread-safe); returns its sgemm or NULL when unavailable. */
mrl_sgemm_fn mrl__blas_sgemm(void);
/* Row-major C = alpha * op(A) op(B) + beta * C with the portable reference kernel. */
void mrl__sgemm_naive(bool transa, bool transb, int m, int n, int k, float alpha, const float *a,
                      int lda, const float *b, int ldb, float beta, float *c, int ldc);

#endif /* MRL_TENSOR_INTERNAL_H */
