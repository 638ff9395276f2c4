/* tensor.c - tensor storage, creation, queries, views, element access and display. */
#include "tensor_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { STORAGE_ALIGN = 64 };

/* ---- helpers shared with the other tensor files ---- */

int mrl__dim(int dim, int rank) {
  int d = dim < 0 ? dim + rank : dim;
  return (d < 0 || d >= rank) ? -1 : d;
}

bool mrl__numel(int rank, const int64_t *shape, int64_t *numel) {
  int64_t n = 1, span = 1; /* span: product of the non-zero sizes; it bounds every stride */
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0) return false;
    if (shape[i] > 1 && span > INT64_MAX / shape[i]) return false;
    span *= shape[i] ? shape[i] : 1;
    n *= shape[i];
  }
  *numel = n;
  return true;
}

void mrl__shape_str(char *buf, size_t cap, int rank, const int64_t *shape) {
  size_t n = 0;
  n += (size_t)snprintf(buf, cap, "(");
  for (int i = 0; i < rank && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? "x%lld" : "%lld", (long long)shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, ")");
}

mrl_engine *mrl__engine_of(const mrl_tensor *t) { return t ? t->storage->engine : NULL; }

mrl_engine *mrl__out_engine(mrl_tensor **out) { return out ? mrl__engine_of(*out) : NULL; }

bool mrl__is_contiguous(const mrl_tensor *t) {
  int64_t expect = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

void mrl__iter_init(mrl_index_iter *it, int rank, const int64_t *shape) {
  it->rank = rank;
  for (int i = 0; i < rank; i++) {
    it->shape[i] = shape[i];
    it->idx[i] = 0;
  }
}

int mrl__iter_next(mrl_index_iter *it) {
  for (int d = it->rank - 1; d >= 0; d--) {
    if (++it->idx[d] < it->shape[d]) return d;
    it->idx[d] = 0;
  }
  return -1;
}

int64_t mrl__offset(const int64_t *stride, const int64_t *idx, int rank) {
  int64_t off = 0;
  for (int i = 0; i < rank; i++) off += stride[i] * idx[i];
  return off;
}

static void set_contiguous_strides(mrl_tensor *t) {
  int64_t s = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    t->stride[i] = s;
    s *= t->shape[i] ? t->shape[i] : 1;
  }
}

static mrl_status check_shape_arg(mrl_engine *e, const char *fn, int rank, const int64_t *shape,
                                  int64_t *numel) {
  if (rank < 0 || rank > MRL_MAX_RANK)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "rank %d is outside 0..%d", rank, MRL_MAX_RANK);
  if (rank > 0 && !shape) return mrl__fail(e, MRL_ERR_NULL, fn, "shape is NULL");
  for (int i = 0; i < rank; i++)
    if (shape[i] < 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "shape[%d] is negative (%lld)", i,
                       (long long)shape[i]);
  if (!mrl__numel(rank, shape, numel) ||
      (uint64_t)*numel > (SIZE_MAX - STORAGE_ALIGN - sizeof(mrl_storage)) / sizeof(float))
    return mrl__fail(e, MRL_ERR_OVERFLOW, fn, "the element count of this shape overflows");
  return MRL_OK;
}

/* ---- storage and headers ---- */

static mrl_tensor *header_new(mrl_engine *e, mrl_storage *s) {
  mrl_tensor *t = mrl__alloc(e, sizeof *t);
  if (!t) return NULL;
  memset(t, 0, sizeof *t);
  t->storage = s;
  s->refs++;
  return t;
}

static void storage_release(mrl_storage *s) {
  if (--s->refs > 0) return;
  mrl_engine *e = s->engine;
  if (s->release) s->release(s->release_ud, s->data);
  if (s->block)
    mrl__free(e, s->block, s->block_size);
  else
    mrl__free(e, s, sizeof *s);
  mrl__engine_release(e);
}

mrl_status mrl__tensor_alloc(mrl_engine *e, const char *fn, int rank, const int64_t *shape,
                             mrl_tensor **out) {
  int64_t numel;
  mrl_status st = check_shape_arg(e, fn, rank, shape, &numel);
  if (st) return st;
  size_t bytes = (size_t)numel * sizeof(float);
  size_t block_size = sizeof(mrl_storage) + STORAGE_ALIGN + bytes;
  void *block = mrl__alloc(e, block_size);
  if (!block)
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate %zu bytes for a tensor", block_size);
  mrl_storage *s = block;
  memset(s, 0, sizeof *s);
  uintptr_t p = (uintptr_t)(s + 1);
  p = (p + STORAGE_ALIGN - 1) & ~(uintptr_t)(STORAGE_ALIGN - 1);
  s->data = (float *)p;
  s->block = block;
  s->block_size = block_size;
  s->engine = e;
  mrl_tensor *t = header_new(e, s);
  if (!t) {
    mrl__free(e, block, block_size);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a tensor header");
  }
  mrl__engine_retain(e);
  memset(s->data, 0, bytes);
  t->data = s->data;
  t->rank = rank;
  t->numel = numel;
  for (int i = 0; i < rank; i++) t->shape[i] = shape[i];
  set_contiguous_strides(t);
  *out = t;
  return MRL_OK;
}

mrl_status mrl__prepare_out(mrl_engine *e, const char *fn, mrl_tensor **out, int rank,
                            const int64_t *shape, mrl_tensor **result, bool *fresh) {
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  if (!*out) {
    mrl_status st = mrl__tensor_alloc(e, fn, rank, shape, result);
    *fresh = st == MRL_OK;
    return st;
  }
  mrl_tensor *o = *out;
  bool same = o->rank == rank;
  for (int i = 0; same && i < rank; i++) same = o->shape[i] == shape[i];
  if (!same) {
    char have[160], want[160];
    mrl__shape_str(have, sizeof have, o->rank, o->shape);
    mrl__shape_str(want, sizeof want, rank, shape);
    return mrl__fail(e, MRL_ERR_SHAPE, fn, "out has shape %s, the result has shape %s", have,
                     want);
  }
  *result = o;
  *fresh = false;
  return MRL_OK;
}

/* ---- creation ---- */

mrl_status mrl_tensor_new(mrl_engine *e, int rank, const int64_t *shape, mrl_tensor **out) {
  if (!e) return MRL_ERR_NULL;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, "mrl_tensor_new", "out is NULL");
  return mrl__tensor_alloc(e, "mrl_tensor_new", rank, shape, out);
}

mrl_status mrl_tensor_from_data(mrl_engine *e, int rank, const int64_t *shape, const float *data,
                                size_t count, mrl_tensor **out) {
  const char *fn = "mrl_tensor_from_data";
  if (!e) return MRL_ERR_NULL;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  int64_t numel;
  mrl_status st = check_shape_arg(e, fn, rank, shape, &numel);
  if (st) return st;
  if (count != (size_t)numel)
    return mrl__fail(e, MRL_ERR_SHAPE, fn, "count is %zu but the shape holds %lld elements", count,
                     (long long)numel);
  if (count && !data) return mrl__fail(e, MRL_ERR_NULL, fn, "data is NULL");
  mrl_tensor *t;
  if ((st = mrl__tensor_alloc(e, fn, rank, shape, &t))) return st;
  if (count) memcpy(t->data, data, count * sizeof(float));
  *out = t;
  return MRL_OK;
}

mrl_status mrl_tensor_scalar(mrl_engine *e, float value, mrl_tensor **out) {
  return mrl_tensor_from_data(e, 0, NULL, &value, 1, out);
}

mrl_status mrl_tensor_wrap(mrl_engine *e, int rank, const int64_t *shape, float *data,
                           void (*release)(void *ud, float *data), void *ud, mrl_tensor **out) {
  const char *fn = "mrl_tensor_wrap";
  if (!e) return MRL_ERR_NULL;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  int64_t numel;
  mrl_status st = check_shape_arg(e, fn, rank, shape, &numel);
  if (st) return st;
  if (!data) return mrl__fail(e, MRL_ERR_NULL, fn, "data is NULL");
  mrl_storage *s = mrl__alloc(e, sizeof *s);
  if (!s) return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate storage");
  memset(s, 0, sizeof *s);
  s->engine = e;
  s->data = data;
  mrl_tensor *t = header_new(e, s);
  if (!t) {
    mrl__free(e, s, sizeof *s);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a tensor header");
  }
  s->release = release;
  s->release_ud = ud;
  mrl__engine_retain(e);
  t->data = data;
  t->rank = rank;
  t->numel = numel;
  for (int i = 0; i < rank; i++) t->shape[i] = shape[i];
  set_contiguous_strides(t);
  *out = t;
  return MRL_OK;
}

void mrl_tensor_free(mrl_tensor *t) {
  if (!t) return;
  mrl_storage *s = t->storage;
  mrl__free(s->engine, t, sizeof *t);
  storage_release(s);
}

/* ---- queries ---- */

mrl_engine *mrl_tensor_engine(const mrl_tensor *t) { return mrl__engine_of(t); }
int mrl_tensor_rank(const mrl_tensor *t) { return t ? t->rank : -1; }
int64_t mrl_tensor_numel(const mrl_tensor *t) { return t ? t->numel : -1; }
const int64_t *mrl_tensor_shape(const mrl_tensor *t) { return t ? t->shape : NULL; }
const int64_t *mrl_tensor_strides(const mrl_tensor *t) { return t ? t->stride : NULL; }
int mrl_tensor_is_contiguous(const mrl_tensor *t) { return t && mrl__is_contiguous(t); }
float *mrl_tensor_data(mrl_tensor *t) { return t ? t->data : NULL; }
int mrl_tensor_shares_storage(const mrl_tensor *a, const mrl_tensor *b) {
  return a && b && a->storage == b->storage;
}

/* ---- element access ---- */

static mrl_status check_index(const mrl_tensor *t, const char *fn, const int64_t *index,
                              int64_t *offset) {
  mrl_engine *e = mrl__engine_of(t);
  if (t->rank > 0 && !index) return mrl__fail(e, MRL_ERR_NULL, fn, "index is NULL");
  int64_t off = 0;
  for (int i = 0; i < t->rank; i++) {
    if (index[i] < 0 || index[i] >= t->shape[i])
      return mrl__fail(e, MRL_ERR_RANGE, fn, "index %lld is outside 0..%lld of dimension %d",
                       (long long)index[i], (long long)t->shape[i] - 1, i);
    off += index[i] * t->stride[i];
  }
  *offset = off;
  return MRL_OK;
}

mrl_status mrl_tensor_get(const mrl_tensor *t, const int64_t *index, float *out) {
  if (!t) return MRL_ERR_NULL;
  if (!out) return mrl__fail(mrl__engine_of(t), MRL_ERR_NULL, "mrl_tensor_get", "out is NULL");
  int64_t off;
  mrl_status st = check_index(t, "mrl_tensor_get", index, &off);
  if (st) return st;
  *out = t->data[off];
  return MRL_OK;
}

mrl_status mrl_tensor_set(mrl_tensor *t, const int64_t *index, float value) {
  if (!t) return MRL_ERR_NULL;
  int64_t off;
  mrl_status st = check_index(t, "mrl_tensor_set", index, &off);
  if (st) return st;
  t->data[off] = value;
  return MRL_OK;
}

static mrl_status check_count(const mrl_tensor *t, const char *fn, const void *buf, size_t count) {
  mrl_engine *e = mrl__engine_of(t);
  if (count != (size_t)t->numel)
    return mrl__fail(e, MRL_ERR_SHAPE, fn, "count is %zu but the tensor has %lld elements", count,
                     (long long)t->numel);
  if (count && !buf) return mrl__fail(e, MRL_ERR_NULL, fn, "buffer is NULL");
  return MRL_OK;
}

mrl_status mrl_tensor_read(const mrl_tensor *t, float *dst, size_t count) {
  if (!t) return MRL_ERR_NULL;
  mrl_status st = check_count(t, "mrl_tensor_read", dst, count);
  if (st || count == 0) return st;
  if (mrl__is_contiguous(t)) {
    memcpy(dst, t->data, count * sizeof(float));
    return MRL_OK;
  }
  mrl_index_iter it;
  mrl__iter_init(&it, t->rank, t->shape);
  size_t k = 0;
  do dst[k++] = t->data[mrl__offset(t->stride, it.idx, t->rank)];
  while (mrl__iter_next(&it) >= 0);
  return MRL_OK;
}

mrl_status mrl_tensor_write(mrl_tensor *t, const float *src, size_t count) {
  if (!t) return MRL_ERR_NULL;
  mrl_status st = check_count(t, "mrl_tensor_write", src, count);
  if (st || count == 0) return st;
  if (mrl__is_contiguous(t)) {
    memcpy(t->data, src, count * sizeof(float));
    return MRL_OK;
  }
  mrl_index_iter it;
  mrl__iter_init(&it, t->rank, t->shape);
  size_t k = 0;
  do t->data[mrl__offset(t->stride, it.idx, t->rank)] = src[k++];
  while (mrl__iter_next(&it) >= 0);
  return MRL_OK;
}

/* ---- views ---- */

/* A new header over t's storage with t's geometry, for the view functions to adjust. */
static mrl_status view_of(mrl_tensor *t, const char *fn, mrl_tensor **view) {
  mrl_engine *e = mrl__engine_of(t);
  mrl_tensor *v = header_new(e, t->storage);
  if (!v) return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a view");
  v->data = t->data;
  v->rank = t->rank;
  v->numel = t->numel;
  memcpy(v->shape, t->shape, sizeof v->shape);
  memcpy(v->stride, t->stride, sizeof v->stride);
  *view = v;
  return MRL_OK;
}

mrl_status mrl__tensor_view(mrl_tensor *t, const char *fn, mrl_tensor **out) {
  return view_of(t, fn, out);
}

static void recount(mrl_tensor *v) { mrl__numel(v->rank, v->shape, &v->numel); }

#define VIEW_PROLOGUE(fn)                                                                          \
  if (!t) return MRL_ERR_NULL;                                                                     \
  mrl_engine *e = mrl__engine_of(t);                                                               \
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL")

mrl_status mrl__bad_dim(mrl_engine *e, const char *fn, const char *name, int dim, int rank) {
  return mrl__fail(e, MRL_ERR_RANGE, fn, "%s %d is out of range for a rank-%d tensor", name, dim,
                   rank);
}

mrl_status mrl_tensor_narrow(mrl_tensor *t, int dim, int64_t start, int64_t length,
                             mrl_tensor **out) {
  const char *fn = "mrl_tensor_narrow";
  VIEW_PROLOGUE(fn);
  int d = mrl__dim(dim, t->rank);
  if (d < 0) return mrl__bad_dim(e, fn, "dim", dim, t->rank);
  if (start < 0 || length < 0 || start > t->shape[d] || length > t->shape[d] - start)
    return mrl__fail(e, MRL_ERR_RANGE, fn,
                     "start %lld, length %lld do not fit dimension %d of size %lld",
                     (long long)start, (long long)length, d, (long long)t->shape[d]);
  mrl_tensor *v;
  mrl_status st = view_of(t, fn, &v);
  if (st) return st;
  if (length > 0) v->data += start * t->stride[d];
  v->shape[d] = length;
  recount(v);
  *out = v;
  return MRL_OK;
}

mrl_status mrl_tensor_slice(mrl_tensor *t, int dim, int64_t start, int64_t stop, int64_t step,
                            mrl_tensor **out) {
  const char *fn = "mrl_tensor_slice";
  VIEW_PROLOGUE(fn);
  int d = mrl__dim(dim, t->rank);
  if (d < 0) return mrl__bad_dim(e, fn, "dim", dim, t->rank);
  if (step <= 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "step must be positive, got %lld",
                                  (long long)step);
  int64_t n = t->shape[d];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  if (start < 0 || start > n || stop < 0 || stop > n)
    return mrl__fail(e, MRL_ERR_RANGE, fn, "start/stop outside dimension %d of size %lld", d,
                     (long long)n);
  int64_t len = stop > start ? 1 + (stop - start - 1) / step : 0; /* no overflow for huge steps */
  mrl_tensor *v;
  mrl_status st = view_of(t, fn, &v);
  if (st) return st;
  if (len > 0) v->data += start * t->stride[d];
  v->shape[d] = len;
  if (len > 1) v->stride[d] = t->stride[d] * step; /* step < size here, so this fits */
  recount(v);
  *out = v;
  return MRL_OK;
}

mrl_status mrl_tensor_select(mrl_tensor *t, int dim, int64_t index, mrl_tensor **out) {
  const char *fn = "mrl_tensor_select";
  VIEW_PROLOGUE(fn);
  int d = mrl__dim(dim, t->rank);
  if (d < 0) return mrl__bad_dim(e, fn, "dim", dim, t->rank);
  int64_t n = t->shape[d];
  int64_t i = index < 0 ? index + n : index;
  if (i < 0 || i >= n)
    return mrl__fail(e, MRL_ERR_RANGE, fn, "index %lld is outside dimension %d of size %lld",
                     (long long)index, d, (long long)n);
  mrl_tensor *v;
  mrl_status st = view_of(t, fn, &v);
  if (st) return st;
  v->data += i * t->stride[d];
  for (int k = d; k < t->rank - 1; k++) {
    v->shape[k] = t->shape[k + 1];
    v->stride[k] = t->stride[k + 1];
  }
  v->rank = t->rank - 1;
  recount(v);
  *out = v;
  return MRL_OK;
}

mrl_status mrl_tensor_transpose(mrl_tensor *t, int dim0, int dim1, mrl_tensor **out) {
  const char *fn = "mrl_tensor_transpose";
  VIEW_PROLOGUE(fn);
  int a = mrl__dim(dim0, t->rank), b = mrl__dim(dim1, t->rank);
  if (a < 0) return mrl__bad_dim(e, fn, "dim0", dim0, t->rank);
  if (b < 0) return mrl__bad_dim(e, fn, "dim1", dim1, t->rank);
  mrl_tensor *v;
  mrl_status st = view_of(t, fn, &v);
  if (st) return st;
  v->shape[a] = t->shape[b];
  v->shape[b] = t->shape[a];
  v->stride[a] = t->stride[b];
  v->stride[b] = t->stride[a];
  *out = v;
  return MRL_OK;
}

mrl_status mrl_tensor_permute(mrl_tensor *t, const int *perm, mrl_tensor **out) {
  const char *fn = "mrl_tensor_permute";
  VIEW_PROLOGUE(fn);
  if (t->rank > 0 && !perm) return mrl__fail(e, MRL_ERR_NULL, fn, "perm is NULL");
  bool seen[MRL_MAX_RANK] = {false};
  for (int i = 0; i < t->rank; i++) {
    int d = mrl__dim(perm[i], t->rank);
    if (d < 0) return mrl__bad_dim(e, fn, "perm entry", perm[i], t->rank);
    if (seen[d])
      return mrl__fail(e, MRL_ERR_INVALID, fn, "perm names dimension %d twice", d);
    seen[d] = true;
  }
  mrl_tensor *v;
  mrl_status st = view_of(t, fn, &v);
  if (st) return st;
  for (int i = 0; i < t->rank; i++) {
    int d = mrl__dim(perm[i], t->rank);
    v->shape[i] = t->shape[d];
    v->stride[i] = t->stride[d];
  }
  *out = v;
  return MRL_OK;
}

mrl_status mrl_tensor_clone(const mrl_tensor *t, mrl_tensor **out) {
  if (!t) return MRL_ERR_NULL;
  mrl_engine *e = mrl__engine_of(t);
  if (!out) return mrl__fail(e, MRL_ERR_NULL, "mrl_tensor_clone", "out is NULL");
  mrl_tensor *c;
  mrl_status st = mrl__tensor_alloc(e, "mrl_tensor_clone", t->rank, t->shape, &c);
  if (st) return st;
  mrl_tensor_read(t, c->data, (size_t)c->numel);
  *out = c;
  return MRL_OK;
}

mrl_status mrl_tensor_contiguous(mrl_tensor *t, mrl_tensor **out) {
  const char *fn = "mrl_tensor_contiguous";
  VIEW_PROLOGUE(fn);
  if (mrl__is_contiguous(t)) return view_of(t, fn, out);
  return mrl_tensor_clone(t, out);
}

mrl_status mrl_tensor_reshape(mrl_tensor *t, int rank, const int64_t *shape, mrl_tensor **out) {
  const char *fn = "mrl_tensor_reshape";
  VIEW_PROLOGUE(fn);
  if (rank < 0 || rank > MRL_MAX_RANK)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "rank %d is outside 0..%d", rank, MRL_MAX_RANK);
  if (rank > 0 && !shape) return mrl__fail(e, MRL_ERR_NULL, fn, "shape is NULL");
  int64_t s[MRL_MAX_RANK];
  int infer = -1;
  int64_t known = 1, span = 1; /* span: product of the non-zero sizes, which bounds the strides */
  for (int i = 0; i < rank; i++) {
    s[i] = shape[i];
    if (s[i] == -1) {
      if (infer >= 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "more than one -1 in shape");
      infer = i;
      continue;
    }
    if (s[i] < 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "shape[%d] is negative (%lld)", i,
                       (long long)s[i]);
    if (s[i] > 1 && span > INT64_MAX / s[i])
      return mrl__fail(e, MRL_ERR_OVERFLOW, fn, "the element count of this shape overflows");
    span *= s[i] ? s[i] : 1;
    known *= s[i];
  }
  if (infer >= 0) {
    if (known == 0 || t->numel % known != 0) {
      char have[160];
      mrl__shape_str(have, sizeof have, t->rank, t->shape);
      return mrl__fail(e, MRL_ERR_SHAPE, fn, "cannot infer -1: %lld elements %s into blocks of %lld",
                       (long long)t->numel, have, (long long)known);
    }
    s[infer] = t->numel / known;
    known = t->numel;
  }
  if (known != t->numel) {
    char have[160], want[160];
    mrl__shape_str(have, sizeof have, t->rank, t->shape);
    mrl__shape_str(want, sizeof want, rank, s);
    return mrl__fail(e, MRL_ERR_SHAPE, fn, "cannot reshape %s (%lld elements) to %s", have,
                     (long long)t->numel, want);
  }
  mrl_tensor *v;
  mrl_status st = mrl__is_contiguous(t) ? view_of(t, fn, &v) : mrl_tensor_clone(t, &v);
  if (st) return st;
  v->rank = rank;
  for (int i = 0; i < rank; i++) v->shape[i] = s[i];
  set_contiguous_strides(v);
  *out = v;
  return MRL_OK;
}

/* ---- display ---- */

typedef struct {
  char *buf;
  size_t cap, len;
} text;

static void put(text *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = o->len < o->cap ? o->cap - o->len : 0;
  int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) o->len += (size_t)n;
}

enum { EDGE = 3, SUMMARY_OVER = 6 };

static bool shown(int64_t i, int64_t n) { return n <= SUMMARY_OVER || i < EDGE || i >= n - EDGE; }

static void fmt_num(char *b, size_t cap, float v) {
  if (isnan(v))
    snprintf(b, cap, "nan");
  else if (isinf(v))
    snprintf(b, cap, v > 0 ? "inf" : "-inf");
  else
    snprintf(b, cap, "%.6g", (double)v);
}

static void put_block(text *o, const mrl_tensor *t, int d, const float *p, int width) {
  char num[48];
  if (d == t->rank) {
    fmt_num(num, sizeof num, *p);
    put(o, "%*s", width, num);
    return;
  }
  int64_t n = t->shape[d];
  put(o, "[");
  for (int64_t i = 0; i < n; i++) {
    if (!shown(i, n)) {
      if (i == EDGE) {
        if (d == t->rank - 1)
          put(o, "..., ");
        else
          put(o, "...,\n%*s", d + 1, "");
      }
      continue;
    }
    put_block(o, t, d + 1, p + i * t->stride[d], width);
    if (i + 1 < n) {
      if (d == t->rank - 1)
        put(o, ", ");
      else
        put(o, ",%.*s%*s", t->rank - d - 1, "\n\n\n\n\n\n\n\n", d + 1, "");
    }
  }
  put(o, "]");
}

static int max_width(const mrl_tensor *t, int d, const float *p) {
  char num[48];
  if (d == t->rank) {
    fmt_num(num, sizeof num, *p);
    return (int)strlen(num);
  }
  int w = 0;
  for (int64_t i = 0; i < t->shape[d]; i++) {
    if (!shown(i, t->shape[d])) continue;
    int wi = max_width(t, d + 1, p + i * t->stride[d]);
    if (wi > w) w = wi;
  }
  return w;
}

mrl_status mrl_tensor_format(const mrl_tensor *t, char *buf, size_t cap, size_t *len) {
  if (!t) return MRL_ERR_NULL;
  if (cap && !buf)
    return mrl__fail(mrl__engine_of(t), MRL_ERR_NULL, "mrl_tensor_format", "buf is NULL");
  text o = {buf, cap, 0};
  char shape[160];
  mrl__shape_str(shape, sizeof shape, t->rank, t->shape);
  put(&o, "tensor%s", t->rank ? shape : "(scalar)");
  if (t->numel == 0) {
    put(&o, " []");
  } else {
    put(&o, t->rank ? "\n" : " ");
    put_block(&o, t, 0, t->data, max_width(t, 0, t->data));
  }
  if (cap) buf[o.len < cap ? o.len : cap - 1] = '\0';
  if (len) *len = o.len;
  return MRL_OK;
}
