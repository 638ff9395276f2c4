/* tensor_matmul.c - (batched) matrix products through cblas_sgemm, with the portable reference
 * kernel as the fallback when OpenBLAS is unavailable. */
#include "tensor_internal.h"

#include <limits.h>
#include <string.h>

enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

/* How one operand's matrices are handed to sgemm: row-major with leading dimension `ld`, or
 * (transposed) as the row-major storage of their transpose. */
typedef struct {
  bool trans;
  int64_t ld;
} blas_layout;

/* Matrices R x C with strides (rs, cs): usable without a copy when one of the strides is 1. */
static bool layout_of(int64_t rows, int64_t cols, int64_t rs, int64_t cs, blas_layout *l) {
  if (cs == 1 && (rows <= 1 || rs >= cols)) {
    l->trans = false;
    l->ld = rows <= 1 ? (cols > 1 ? cols : 1) : rs;
    return l->ld <= INT_MAX;
  }
  if (rs == 1 && (cols <= 1 || cs >= rows)) {
    l->trans = true;
    l->ld = cols <= 1 ? (rows > 1 ? rows : 1) : cs;
    return l->ld <= INT_MAX;
  }
  return false;
}

typedef struct {
  const mrl_tensor *t;
  int64_t rows, cols, rs, cs; /* the logical matrix after the user's transpose flag */
} operand;

static void operand_init(operand *o, const mrl_tensor *t, bool transpose) {
  int r = t->rank;
  o->t = t;
  o->rows = t->shape[r - (transpose ? 1 : 2)];
  o->cols = t->shape[r - (transpose ? 2 : 1)];
  o->rs = t->stride[r - (transpose ? 1 : 2)];
  o->cs = t->stride[r - (transpose ? 2 : 1)];
}

/* Size of batch dimension i (of br, aligned at the end) of t; 1 where t has no such dim. */
static int64_t batch_size(const mrl_tensor *t, int br, int i) {
  int j = i - (br - (t->rank - 2));
  return j < 0 ? 1 : t->shape[j];
}

/* Strides of t's batch dims aligned to br output batch dims; 0 where t broadcasts. */
static void batch_strides(const mrl_tensor *t, int br, int64_t *s) {
  for (int i = 0; i < br; i++) {
    int j = i - (br - (t->rank - 2));
    s[i] = (j < 0 || t->shape[j] == 1) ? 0 : t->stride[j];
  }
}

mrl_status mrl__matmul_shape(mrl_engine *e, const char *fn, const mrl_tensor *a,
                             const mrl_tensor *b, int flags, int *rank, int64_t *shape) {
  if (flags & ~(MRL_TRANS_A | MRL_TRANS_B))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "unknown flags 0x%x", (unsigned)flags);
  if (a->rank < 2 || b->rank < 2)
    return mrl__fail(e, MRL_ERR_SHAPE, fn, "needs rank >= 2 operands, got ranks %d and %d",
                     a->rank, b->rank);
  operand A, B;
  operand_init(&A, a, flags & MRL_TRANS_A);
  operand_init(&B, b, flags & MRL_TRANS_B);
  if (A.cols != B.rows) {
    char ha[160], hb[160];
    mrl__shape_str(ha, sizeof ha, a->rank, a->shape);
    mrl__shape_str(hb, sizeof hb, b->rank, b->shape);
    return mrl__fail(e, MRL_ERR_SHAPE, fn,
                     "inner dimensions differ: a %s%s gives K = %lld, b %s%s gives K = %lld", ha,
                     flags & MRL_TRANS_A ? " transposed" : "", (long long)A.cols, hb,
                     flags & MRL_TRANS_B ? " transposed" : "", (long long)B.rows);
  }
  if (A.rows > INT_MAX || B.cols > INT_MAX || A.cols > INT_MAX)
    return mrl__fail(e, MRL_ERR_UNSUPPORTED, fn, "matrix dimensions above %d", INT_MAX);
  /* batch dims broadcast like elementwise shapes */
  int br = (a->rank > b->rank ? a->rank : b->rank) - 2;
  for (int i = 0; i < br; i++) {
    int64_t na = batch_size(a, br, i), nb = batch_size(b, br, i);
    if (na != nb && na != 1 && nb != 1) {
      char ha[160], hb[160];
      mrl__shape_str(ha, sizeof ha, a->rank, a->shape);
      mrl__shape_str(hb, sizeof hb, b->rank, b->shape);
      return mrl__fail(e, MRL_ERR_SHAPE, fn, "batch dimensions of %s and %s do not broadcast "
                       "(%lld vs %lld)", ha, hb, (long long)na, (long long)nb);
    }
    shape[i] = na == 1 ? nb : na;
  }
  shape[br] = A.rows;
  shape[br + 1] = B.cols;
  *rank = br + 2;
  return MRL_OK;
}

mrl_status mrl_tensor_matmul(mrl_tensor **out, const mrl_tensor *a, const mrl_tensor *b,
                             int flags) {
  const char *fn = "mrl_tensor_matmul";
  mrl_engine *e = a || b ? mrl__engine_of(a ? a : b) : mrl__out_engine(out);
  if (!a || !b) return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", a ? "b" : "a");
  int rank;
  int64_t shape[MRL_MAX_RANK], sa[MRL_MAX_RANK], sb[MRL_MAX_RANK];
  mrl_status st = mrl__matmul_shape(e, fn, a, b, flags, &rank, shape);
  if (st) return st;
  int br = rank - 2;
  operand A, B;
  operand_init(&A, a, flags & MRL_TRANS_A);
  operand_init(&B, b, flags & MRL_TRANS_B);
  int64_t M = A.rows, N = B.cols, K = A.cols;

  mrl_tensor *o;
  bool fresh;
  if ((st = mrl__prepare_out(e, fn, out, rank, shape, &o, &fresh))) return st;

  /* Operands BLAS cannot read in place, and an output it cannot write or that overlaps an
   * input, go through contiguous temporaries. */
  mrl_tensor *ta = NULL, *tb = NULL, *tc = NULL;
  blas_layout la, lb, lc;
  if (!layout_of(A.rows, A.cols, A.rs, A.cs, &la)) {
    if ((st = mrl_tensor_clone(a, &ta))) goto fail;
    operand_init(&A, ta, flags & MRL_TRANS_A);
    layout_of(A.rows, A.cols, A.rs, A.cs, &la);
  }
  if (!layout_of(B.rows, B.cols, B.rs, B.cs, &lb)) {
    if ((st = mrl_tensor_clone(b, &tb))) goto fail;
    operand_init(&B, tb, flags & MRL_TRANS_B);
    layout_of(B.rows, B.cols, B.rs, B.cs, &lb);
  }
  batch_strides(A.t, br, sa);
  batch_strides(B.t, br, sb);
  mrl_tensor *c = o;
  if (!layout_of(M, N, o->stride[br], o->stride[br + 1], &lc) || lc.trans ||
      (!fresh && (mrl_tensor_shares_storage(o, a) || mrl_tensor_shares_storage(o, b)))) {
    if ((st = mrl__tensor_alloc(e, fn, br + 2, shape, &tc))) goto fail;
    c = tc;
    layout_of(M, N, c->stride[br], c->stride[br + 1], &lc);
  }

  if (M > 0 && N > 0 && o->numel > 0) { /* a batch dim of size 0 leaves nothing to compute */
    mrl_sgemm_fn sgemm = mrl__blas_sgemm();
    const float *pa = A.t->data, *pb = B.t->data;
    mrl_index_iter it;
    mrl__iter_init(&it, br, shape);
    do {
      const float *ma = pa + mrl__offset(sa, it.idx, br);
      const float *mb = pb + mrl__offset(sb, it.idx, br);
      float *mc = c->data + mrl__offset(c->stride, it.idx, br);
      if (K == 0) {
        for (int64_t i = 0; i < M; i++)
          memset(mc + i * lc.ld, 0, sizeof(float) * (size_t)N);
      } else if (sgemm) {
        sgemm(CBLAS_ROW_MAJOR, la.trans ? CBLAS_TRANS : CBLAS_NO_TRANS,
              lb.trans ? CBLAS_TRANS : CBLAS_NO_TRANS, (int)M, (int)N, (int)K, 1.0f, ma,
              (int)la.ld, mb, (int)lb.ld, 0.0f, mc, (int)lc.ld);
      } else {
        mrl__sgemm_naive(la.trans, lb.trans, (int)M, (int)N, (int)K, 1.0f, ma, (int)la.ld, mb,
                         (int)lb.ld, 0.0f, mc, (int)lc.ld);
      }
    } while (mrl__iter_next(&it) >= 0);
  }
  if (tc) {
    mrl_tensor_copy(o, tc);
    mrl_tensor_free(tc);
  }
  mrl_tensor_free(ta);
  mrl_tensor_free(tb);
  *out = o;
  return MRL_OK;

fail:
  mrl_tensor_free(ta);
  mrl_tensor_free(tb);
  mrl_tensor_free(tc);
  if (fresh) mrl_tensor_free(o);
  return st;
}
