/* moonrl.h - public C API of the moonrl engine: engine handle, errors, RNG, tensors, BLAS, scripts.
 *
 * Conventions (they hold for every function below):
 * - Every handle is opaque and created by a `_new` function that has a `_free` partner.
 *   `_free(NULL)` is a no-op.
 * - Functions that can fail return `mrl_status` (MRL_OK == 0, errors are negative). The detail
 *   goes into the engine's last-error message: `mrl_engine_last_error(e)`, where the engine is
 *   the one the handles involved belong to. (When every handle argument is NULL there is no
 *   engine to hold a message, and MRL_ERR_NULL says it all.) An error never changes an output
 *   argument and never leaks: on failure `*out` is left untouched.
 * - Dimensions are 0-based; a negative dimension counts from the end (-1 is the last).
 * - Ownership is stated on every function that returns a pointer. "Caller owns" means: free it
 *   with the named `_free` function. "Borrowed" means: do not free; valid for as long as stated.
 * - An engine and everything made from it are used by one thread at a time.
 * - Lua-facing APIs (the `moonrl` Lua module) are 1-based; this C API is 0-based.
 */
#ifndef MOONRL_H
#define MOONRL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MRL_BUILDING_LIBRARY)
#define MRL_API __attribute__((visibility("default")))
#else
#define MRL_API
#endif

#define MRL_VERSION_MAJOR 0
#define MRL_VERSION_MINOR 1
#define MRL_VERSION_PATCH 0
#define MRL_VERSION_STRING "0.1.0"

/* ---- status codes (stable numbers; new codes are only ever appended) ---- */
typedef enum mrl_status {
  MRL_OK = 0,
  MRL_ERR_INVALID = -1,     /* an argument has a bad value */
  MRL_ERR_NULL = -2,        /* a required pointer argument is NULL */
  MRL_ERR_SHAPE = -3,       /* shapes do not match or cannot broadcast */
  MRL_ERR_RANGE = -4,       /* an index or dimension is out of range */
  MRL_ERR_OVERFLOW = -5,    /* a size computation would overflow */
  MRL_ERR_NOMEM = -6,       /* allocation failed or the engine's memory limit was reached */
  MRL_ERR_IO = -7,          /* a file could not be read or written */
  MRL_ERR_LUA = -8,         /* a Lua chunk raised an error or did not compile */
  MRL_ERR_UNSUPPORTED = -9  /* the operation is not supported for these arguments */
} mrl_status;

enum { MRL_MAX_RANK = 8 };

/* Static, human-readable text for a status code ("unknown status" for unknown codes). */
MRL_API const char *mrl_strerror(mrl_status status);

/* Version of the linked library, e.g. "0.1.0" (static string). Compare with MRL_VERSION_STRING
 * to detect a header/library mismatch. */
MRL_API const char *mrl_version(void);

/* Seconds from an arbitrary start on a monotonic clock (for timing; not wall-clock time). */
MRL_API double mrl_clock(void);

/* ---- opaque handles ---- */
typedef struct mrl_engine mrl_engine; /* allocator, memory accounting, default RNG, last error */
typedef struct mrl_tensor mrl_tensor; /* a float32 n-d view onto reference-counted storage */
typedef struct mrl_rng mrl_rng;       /* a seeded random number generator */
typedef struct mrl_script mrl_script; /* a Lua 5.4 state with the moonrl module loaded */

/* ---- engine ----------------------------------------------------------------------------- */

/* Allocation hook with lua_Alloc's contract: (ptr == NULL) allocates new_size bytes;
 * new_size == 0 frees ptr (old_size is its size) and returns NULL. Returns NULL on failure. */
typedef void *(*mrl_alloc_fn)(void *ud, void *ptr, size_t old_size, size_t new_size);

/* Creates an engine using malloc/free. *out: caller owns, free with mrl_engine_free. */
MRL_API mrl_status mrl_engine_new(mrl_engine **out);

/* Creates an engine whose tensor storage and handles are allocated through `alloc`. */
MRL_API mrl_status mrl_engine_new_with_alloc(mrl_alloc_fn alloc, void *ud, mrl_engine **out);

/* Releases the caller's reference. The engine's memory lives on until the last tensor, RNG or
 * script made from it is freed, so freeing in any order is safe. */
MRL_API void mrl_engine_free(mrl_engine *e);

/* The message of the last failing call on this engine ("" if none). Borrowed: valid until the
 * next failing call on the engine or mrl_engine_clear_error. Never NULL (NULL engine: ""). */
MRL_API const char *mrl_engine_last_error(const mrl_engine *e);
MRL_API void mrl_engine_clear_error(mrl_engine *e);

/* Caps the bytes this engine may hold in tensor storage and handles (0 = no cap). A request that
 * would pass the cap fails with MRL_ERR_NOMEM. */
MRL_API mrl_status mrl_engine_set_memory_limit(mrl_engine *e, size_t bytes);
MRL_API size_t mrl_engine_memory_used(const mrl_engine *e);
MRL_API size_t mrl_engine_memory_peak(const mrl_engine *e);

/* The engine's default RNG (seeded with 0 at creation). Borrowed: lives as long as the engine. */
MRL_API mrl_rng *mrl_engine_rng(mrl_engine *e);

/* ---- random numbers ----------------------------------------------------------------------
 * xoshiro256** seeded through splitmix64: the same seed gives the same sequence on every
 * machine. Normal variates use Box-Muller computed in double precision. */

/* *out: caller owns, free with mrl_rng_free. */
MRL_API mrl_status mrl_rng_new(mrl_engine *e, uint64_t seed, mrl_rng **out);
MRL_API void mrl_rng_free(mrl_rng *rng);
MRL_API mrl_status mrl_rng_seed(mrl_rng *rng, uint64_t seed);
MRL_API mrl_status mrl_rng_u64(mrl_rng *rng, uint64_t *out);
MRL_API mrl_status mrl_rng_uniform(mrl_rng *rng, double *out); /* in [0, 1) */
MRL_API mrl_status mrl_rng_normal(mrl_rng *rng, double *out);  /* mean 0, std 1 */

/* ---- BLAS --------------------------------------------------------------------------------
 * libmoonrl loads OpenBLAS itself on first use. Before loading it, when the environment has no
 * OPENBLAS_CORETYPE, it sets one the CPU supports ("SkylakeX" with AVX-512, "Haswell" with
 * AVX2+FMA): OpenBLAS 0.3.21 otherwise may detect recent CPUs as "Prescott" and run sgemm about
 * 5x slower. If OpenBLAS is already loaded in the process, it is used as it is. If it cannot be
 * loaded at all, matmul falls back to a portable C kernel and `core` reports "none". */

/* Fills whichever outputs are non-NULL. Strings are static (borrowed, valid for the process):
 * core: OpenBLAS's core name ("SkylakeX", ...); config: OpenBLAS's build configuration;
 * source: who chose the core type: "moonrl", "user" (environment), "preloaded", "openblas"
 * (OpenBLAS's own detection) or "none" (OpenBLAS not loadable). */
MRL_API mrl_status mrl_blas_info(const char **core, int *threads, const char **config,
                                 const char **source);

/* The core type moonrl would choose for this CPU, or NULL when it would leave the choice to
 * OpenBLAS. For programs that link OpenBLAS themselves: set OPENBLAS_CORETYPE to this value
 * before OpenBLAS is loaded (that is, before main, so re-exec or set it in the launcher). */
MRL_API const char *mrl_blas_recommended_coretype(void);

/* Sets the number of OpenBLAS threads (process-wide). */
MRL_API mrl_status mrl_blas_set_threads(int threads);

/* ---- tensors -----------------------------------------------------------------------------
 * float32, rank 0..MRL_MAX_RANK, row-major, strided. Storage is reference-counted and shared by
 * views; a view keeps its storage alive after the tensor it came from is freed.
 *
 * Operations write a result through `mrl_tensor **out`:
 *   - *out == NULL: a new tensor of the result shape is allocated from the first input's engine
 *     and stored in *out (caller owns, free with mrl_tensor_free);
 *   - *out != NULL: the result is written into *out, which must have the result shape. It may be
 *     one of the inputs (in-place), but must not otherwise overlap an input's memory.
 * Binary elementwise operations broadcast: shapes are aligned at the last dimension and a
 * dimension of size 1 (or a missing leading one) stretches to the other operand's size. */

/* A new zero-filled contiguous tensor. shape may be NULL when rank is 0 (a scalar). *out: caller
 * owns. */
MRL_API mrl_status mrl_tensor_new(mrl_engine *e, int rank, const int64_t *shape, mrl_tensor **out);

/* A new contiguous tensor holding a copy of `count` row-major floats (count must equal numel). */
MRL_API mrl_status mrl_tensor_from_data(mrl_engine *e, int rank, const int64_t *shape,
                                        const float *data, size_t count, mrl_tensor **out);

/* A rank-0 tensor holding `value`. *out: caller owns. */
MRL_API mrl_status mrl_tensor_scalar(mrl_engine *e, float value, mrl_tensor **out);

/* A contiguous tensor over caller memory, without copying. `release(ud, data)` (may be NULL) is
 * called when the last view of it is freed; until then `data` must stay valid. */
MRL_API mrl_status mrl_tensor_wrap(mrl_engine *e, int rank, const int64_t *shape, float *data,
                                   void (*release)(void *ud, float *data), void *ud,
                                   mrl_tensor **out);

/* Frees this view; the storage is freed with its last view. NULL is a no-op. */
MRL_API void mrl_tensor_free(mrl_tensor *t);

/* Queries. On a NULL tensor: rank/numel return -1, shape/strides/data/engine return NULL. */
MRL_API mrl_engine *mrl_tensor_engine(const mrl_tensor *t); /* borrowed */
MRL_API int mrl_tensor_rank(const mrl_tensor *t);
MRL_API int64_t mrl_tensor_numel(const mrl_tensor *t);
MRL_API const int64_t *mrl_tensor_shape(const mrl_tensor *t);   /* borrowed, `rank` entries */
MRL_API const int64_t *mrl_tensor_strides(const mrl_tensor *t); /* borrowed, in elements */
MRL_API int mrl_tensor_is_contiguous(const mrl_tensor *t);      /* 1 if row-major dense */
/* Address of element (0,...,0); strides apply. Borrowed: valid while the storage lives. */
MRL_API float *mrl_tensor_data(mrl_tensor *t);
/* 1 if the two tensors share storage. */
MRL_API int mrl_tensor_shares_storage(const mrl_tensor *a, const mrl_tensor *b);

MRL_API mrl_status mrl_tensor_get(const mrl_tensor *t, const int64_t *index, float *out);
MRL_API mrl_status mrl_tensor_set(mrl_tensor *t, const int64_t *index, float value);
/* Copy all elements out to / in from a row-major buffer of exactly numel floats. */
MRL_API mrl_status mrl_tensor_read(const mrl_tensor *t, float *dst, size_t count);
MRL_API mrl_status mrl_tensor_write(mrl_tensor *t, const float *src, size_t count);

/* Views (no copy; *out is a new view, caller owns). */
MRL_API mrl_status mrl_tensor_narrow(mrl_tensor *t, int dim, int64_t start, int64_t length,
                                     mrl_tensor **out);
/* Elements start, start+step, ... below stop; negative start/stop count from the end; step > 0. */
MRL_API mrl_status mrl_tensor_slice(mrl_tensor *t, int dim, int64_t start, int64_t stop,
                                    int64_t step, mrl_tensor **out);
/* Drops dimension `dim`, keeping index `index` (negative counts from the end). */
MRL_API mrl_status mrl_tensor_select(mrl_tensor *t, int dim, int64_t index, mrl_tensor **out);
MRL_API mrl_status mrl_tensor_transpose(mrl_tensor *t, int dim0, int dim1, mrl_tensor **out);
/* perm lists the source dimension for each output dimension (rank entries). */
MRL_API mrl_status mrl_tensor_permute(mrl_tensor *t, const int *perm, mrl_tensor **out);
/* A view when t is contiguous, otherwise a contiguous copy; one entry of shape may be -1. */
MRL_API mrl_status mrl_tensor_reshape(mrl_tensor *t, int rank, const int64_t *shape,
                                      mrl_tensor **out);
/* A new view of the same storage when contiguous, otherwise a contiguous copy. */
MRL_API mrl_status mrl_tensor_contiguous(mrl_tensor *t, mrl_tensor **out);
/* Always a contiguous copy with its own storage. */
MRL_API mrl_status mrl_tensor_clone(const mrl_tensor *t, mrl_tensor **out);

/* Fills (in place). */
MRL_API mrl_status mrl_tensor_copy(mrl_tensor *dst, const mrl_tensor *src); /* src broadcasts */
MRL_API mrl_status mrl_tensor_fill(mrl_tensor *t, float value);
/* Element k in row-major order gets start + k * step (computed in double, then rounded). */
MRL_API mrl_status mrl_tensor_arange(mrl_tensor *t, double start, double step);
/* rng NULL means the engine's default RNG. Elements are drawn in row-major order. */
MRL_API mrl_status mrl_tensor_rand_uniform(mrl_tensor *t, mrl_rng *rng, float low, float high);
MRL_API mrl_status mrl_tensor_rand_normal(mrl_tensor *t, mrl_rng *rng, float mean, float std);

/* Elementwise (binary ones broadcast). */
MRL_API mrl_status mrl_tensor_add(mrl_tensor **out, const mrl_tensor *a, const mrl_tensor *b);
MRL_API mrl_status mrl_tensor_sub(mrl_tensor **out, const mrl_tensor *a, const mrl_tensor *b);
MRL_API mrl_status mrl_tensor_mul(mrl_tensor **out, const mrl_tensor *a, const mrl_tensor *b);
MRL_API mrl_status mrl_tensor_div(mrl_tensor **out, const mrl_tensor *a, const mrl_tensor *b);
MRL_API mrl_status mrl_tensor_scale(mrl_tensor **out, const mrl_tensor *a, float alpha);
MRL_API mrl_status mrl_tensor_neg(mrl_tensor **out, const mrl_tensor *a);
MRL_API mrl_status mrl_tensor_exp(mrl_tensor **out, const mrl_tensor *a);
MRL_API mrl_status mrl_tensor_log(mrl_tensor **out, const mrl_tensor *a);
MRL_API mrl_status mrl_tensor_tanh(mrl_tensor **out, const mrl_tensor *a);
MRL_API mrl_status mrl_tensor_silu(mrl_tensor **out, const mrl_tensor *a); /* x * sigmoid(x) */

/* Reductions over one dimension. The result drops `dim`, or keeps it with size 1 if keepdim.
 * Sums accumulate in double. max/argmax take the first maximum; NaN counts as the maximum.
 * argmax writes 0-based indices as floats (exact while the dimension has < 2^24 entries). */
MRL_API mrl_status mrl_tensor_sum(mrl_tensor **out, const mrl_tensor *a, int dim, int keepdim);
MRL_API mrl_status mrl_tensor_mean(mrl_tensor **out, const mrl_tensor *a, int dim, int keepdim);
MRL_API mrl_status mrl_tensor_max(mrl_tensor **out, const mrl_tensor *a, int dim, int keepdim);
MRL_API mrl_status mrl_tensor_argmax(mrl_tensor **out, const mrl_tensor *a, int dim, int keepdim);
/* Reductions over all elements. argmax is the row-major flat index. Empty tensors: sum 0, mean
 * NaN, max/argmax fail with MRL_ERR_SHAPE. */
MRL_API mrl_status mrl_tensor_sum_all(const mrl_tensor *a, double *out);
MRL_API mrl_status mrl_tensor_mean_all(const mrl_tensor *a, double *out);
MRL_API mrl_status mrl_tensor_max_all(const mrl_tensor *a, float *value, int64_t *index);

/* Softmax and log-softmax along the last dimension (numerically stable). */
MRL_API mrl_status mrl_tensor_softmax(mrl_tensor **out, const mrl_tensor *a);
MRL_API mrl_status mrl_tensor_log_softmax(mrl_tensor **out, const mrl_tensor *a);

/* Matrix product through cblas_sgemm. a is (..., M, K) and b is (..., K, N), or their last two
 * dimensions swapped with MRL_TRANS_A / MRL_TRANS_B; rank >= 2; leading (batch) dimensions
 * broadcast. The result is (..., M, N). Views whose matrices are row- or column-major (such as
 * transposes) go to BLAS without a copy. */
enum { MRL_TRANS_A = 1, MRL_TRANS_B = 2 };
MRL_API mrl_status mrl_tensor_matmul(mrl_tensor **out, const mrl_tensor *a, const mrl_tensor *b,
                                     int flags);

/* index_select: out takes a's entries at `index[0..count)` along dim (out's dim has size count).
 * gather: out has index_shape (same rank as a, and no larger than a except along dim);
 *   out[i..., j, k...] = a[i..., index[i..., j, k...], k...] along dim (torch.gather).
 * Indices are 0-based; negative or too large ones fail with MRL_ERR_RANGE. */
MRL_API mrl_status mrl_tensor_index_select(mrl_tensor **out, const mrl_tensor *a, int dim,
                                           const int64_t *index, int64_t count);
MRL_API mrl_status mrl_tensor_gather(mrl_tensor **out, const mrl_tensor *a, int dim,
                                     const int64_t *index, const int64_t *index_shape);

/* *result = 1 if shapes are equal and |a - b| <= atol + rtol * |b| everywhere (NaN != NaN;
 * equal infinities are close, other infinite entries are not). */
MRL_API mrl_status mrl_tensor_allclose(const mrl_tensor *a, const mrl_tensor *b, double rtol,
                                       double atol, int *result);
/* Largest |a - b| over all elements (shapes must be equal; NaN if any difference is NaN). */
MRL_API mrl_status mrl_tensor_max_abs_diff(const mrl_tensor *a, const mrl_tensor *b, double *out);

/* A readable display, summarised with "..." past 6 entries per dimension. Writes at most cap
 * bytes including the terminating NUL into buf (buf may be NULL when cap is 0); *len (optional)
 * receives the full length without the NUL, as snprintf does. */
MRL_API mrl_status mrl_tensor_format(const mrl_tensor *t, char *buf, size_t cap, size_t *len);

/* ---- scripts (Lua 5.4) -------------------------------------------------------------------
 * A Lua 5.4 state with the standard libraries, `require "moonrl"` available, and the engine's
 * tensors shared with C without copying. Errors (syntax or runtime) return MRL_ERR_LUA with the
 * Lua message and a traceback in the engine's last error. Not for processes that host another
 * Lua implementation (LuaJIT): use the FFI module there. */

/* Retains e. *out: caller owns, free with mrl_script_free. */
MRL_API mrl_status mrl_script_new(mrl_engine *e, mrl_script **out);
MRL_API void mrl_script_free(mrl_script *s);
/* Runs a chunk of Lua source; chunkname names it in messages (NULL: "=(embedded)"). */
MRL_API mrl_status mrl_script_run(mrl_script *s, const char *code, const char *chunkname);
/* Runs a file with `arg` set as the standalone interpreter does (arg[0] = path). */
MRL_API mrl_status mrl_script_run_file(mrl_script *s, const char *path, int argc,
                                       const char *const *argv);
/* Sets global `name` to a new Lua view of t (t stays the caller's). */
MRL_API mrl_status mrl_script_set_tensor(mrl_script *s, const char *name, mrl_tensor *t);
/* Global `name` must be a tensor; *out is a new view of it. Caller owns, mrl_tensor_free. */
MRL_API mrl_status mrl_script_get_tensor(mrl_script *s, const char *name, mrl_tensor **out);
/* Global `name` must be a number. */
MRL_API mrl_status mrl_script_get_number(mrl_script *s, const char *name, double *out);

#ifdef __cplusplus
}
#endif

#endif /* MOONRL_H */
