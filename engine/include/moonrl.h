/* moonrl.h - public C API of the moonrl engine: engine handle, errors, RNG, tensors, BLAS, model,
 * tokenizers, rollouts, objectives, sandbox, HTTP client, scripts.
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
 * - An engine and everything made from it are used by one thread at a time. Engines are
 *   independent: several threads may each use their own engine at once. An engine runs parts
 *   of its work on threads of its own (mrl_engine_set_threads) while a call lasts.
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

/* Threads the engine's own work runs on: the calling thread plus threads - 1 workers, which
 * compute attention (per sequence and head, in the model's forward and backward passes and in
 * KV-cache appends), SwiGLU (per block of rows) and sampling (per slot). 0 means the cores the
 * process may run on (its CPU affinity on Linux, else the online cores), the default. The workers start when a call first needs them and are joined when the
 * engine's memory goes (or the count changes); starting them can fail that call with
 * MRL_ERR_NOMEM. Results do not depend on the count: each piece of work is done whole by one
 * thread. OpenBLAS's threads, which the matrix products on the calling thread use, are separate
 * (mrl_blas_set_threads). */
MRL_API mrl_status mrl_engine_set_threads(mrl_engine *e, int threads);
MRL_API int mrl_engine_threads(const mrl_engine *e); /* -1 for NULL */

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
/* An integer uniform in [lo, hi], without bias, for any lo <= hi (MRL_ERR_INVALID otherwise). */
MRL_API mrl_status mrl_rng_int(mrl_rng *rng, int64_t lo, int64_t hi, int64_t *out);

/* ---- BLAS --------------------------------------------------------------------------------
 * libmoonrl loads OpenBLAS itself on first use. Before loading it, when the environment has no
 * OPENBLAS_CORETYPE, it sets one the CPU supports ("SkylakeX" with AVX-512, "Haswell" with
 * AVX2+FMA): OpenBLAS 0.3.21 otherwise may detect recent CPUs as "Prescott" and run sgemm about
 * 5x slower. If OpenBLAS is already loaded in the process, it is used as it is. MOONRL_BLAS names
 * another library to load (a file name or a path). If none with cblas_sgemm loads, matmul falls
 * back to a naive C kernel: a line on stderr says so once per process, `core` and `source` report
 * "none" and `config` says why. */

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

/* Sets the number of OpenBLAS threads (process-wide; the engine itself never changes it). */
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

/* ---- safetensors files ---------------------------------------------------------------------
 * The Hugging Face format: an 8-byte little-endian header length, a JSON header naming each
 * tensor's dtype, shape and byte range, then the data. Reading converts F32, F16 and BF16 to
 * float32; writing produces F32 or BF16. Every malformed file is refused with a message. */
typedef struct mrl_safetensors mrl_safetensors;
typedef enum mrl_dtype { MRL_DTYPE_F32 = 0, MRL_DTYPE_F16 = 1, MRL_DTYPE_BF16 = 2 } mrl_dtype;

/* Opens and validates a file (the data is mapped, not read). *out: caller owns,
 * mrl_safetensors_close. */
MRL_API mrl_status mrl_safetensors_open(mrl_engine *e, const char *path, mrl_safetensors **out);
MRL_API void mrl_safetensors_close(mrl_safetensors *f);
MRL_API int64_t mrl_safetensors_count(const mrl_safetensors *f); /* -1 for NULL */
/* Name of tensor i (0-based, in file order). Borrowed: valid until close. NULL if out of range. */
MRL_API const char *mrl_safetensors_name(const mrl_safetensors *f, int64_t i);
/* Dtype and shape of a named tensor (any output may be NULL); shape needs room for
 * MRL_MAX_RANK entries. An unknown name fails with MRL_ERR_INVALID; a tensor of a dtype other
 * than F32/F16/BF16 (listed, but not readable) with MRL_ERR_UNSUPPORTED. */
MRL_API mrl_status mrl_safetensors_info(const mrl_safetensors *f, const char *name,
                                        mrl_dtype *dtype, int *rank, int64_t *shape);
/* Reads a named tensor converted to float32. *out: caller owns, mrl_tensor_free. */
MRL_API mrl_status mrl_safetensors_read(mrl_safetensors *f, const char *name, mrl_tensor **out);
/* Metadata value for key ("__metadata__" entries), or NULL. Borrowed: valid until close. */
MRL_API const char *mrl_safetensors_metadata(const mrl_safetensors *f, const char *key);
/* Writes count named tensors (and optional metadata key/value pairs) atomically: a temporary
 * file in the same directory, fsync, rename. A crash never leaves a partial file at path. Names
 * must be unique, valid UTF-8 and not "__metadata__"; dtype is F32 or BF16 (F16 fails with
 * MRL_ERR_UNSUPPORTED). */
MRL_API mrl_status mrl_safetensors_write(mrl_engine *e, const char *path, int64_t count,
                                         const char *const *names, mrl_tensor *const *tensors,
                                         mrl_dtype dtype, int64_t metadata_count,
                                         const char *const *metadata_keys,
                                         const char *const *metadata_values);

/* ---- the policy model --------------------------------------------------------------------
 * A Llama-family decoder: token embedding, `layers` blocks of [RMSNorm, attention with RoPE and
 * grouped-query heads (optional q/k/v biases as in Qwen2, optional per-head q/k RMSNorm as in
 * Qwen3), residual, RMSNorm, SwiGLU MLP, residual], a final RMSNorm and the LM head (tied to the
 * embedding or not). Parameters, gradients and AdamW moments live in one buffer each, with
 * views named as in Hugging Face files ("model.layers.0.self_attn.q_proj.weight", ...). */
typedef struct mrl_model mrl_model;

typedef struct mrl_model_config {
  int vocab;             /* vocabulary size */
  int dim;               /* hidden size */
  int layers;            /* decoder blocks */
  int heads;             /* query heads */
  int kv_heads;          /* key/value heads; divides heads */
  int head_dim;          /* size of one head; 0 means dim / heads */
  int ffn;               /* SwiGLU inner size */
  int ctx;               /* longest sequence (positions) */
  float rope_theta;      /* RoPE base */
  float norm_eps;        /* RMSNorm epsilon */
  int tie_embeddings;    /* 1: the LM head is the embedding matrix */
  int qkv_bias;          /* 1: q/k/v projections have biases (Qwen2) */
  int qk_norm;           /* 1: RMSNorm over each head of q and k (Qwen3) */
  float rope_llama3_factor; /* > 0: Llama-3.1 RoPE frequency scaling with the three fields below */
  float rope_llama3_low_freq_factor;
  float rope_llama3_high_freq_factor;
  int rope_llama3_original_ctx;
} mrl_model_config;

/* Fills cfg with a small byte-level model (vocab 256 + specials, dim 128, 4 layers, 4 heads). */
MRL_API void mrl_model_config_default(mrl_model_config *cfg);

/* A new model with freshly initialised weights (normal(0, 0.02) matrices, the residual output
 * projections scaled by 1/sqrt(2 layers), unit norms, zero biases) drawn from `seed`.
 * *out: caller owns, mrl_model_free. */
MRL_API mrl_status mrl_model_new(mrl_engine *e, const mrl_model_config *cfg, uint64_t seed,
                                 mrl_model **out);
MRL_API void mrl_model_free(mrl_model *m);
MRL_API mrl_status mrl_model_config_get(const mrl_model *m, mrl_model_config *out);
MRL_API mrl_engine *mrl_model_engine(const mrl_model *m); /* borrowed; NULL for NULL */
/* A new model with m's configuration and a copy of its weights (not its gradients or optimizer
 * state), e.g. a frozen reference policy. *out: caller owns. */
MRL_API mrl_status mrl_model_clone(const mrl_model *m, mrl_model **out);
/* Forgets the AdamW moments and step count (the next step starts a fresh optimizer, as a new
 * training stage should). */
MRL_API mrl_status mrl_model_reset_optimizer(mrl_model *m);
/* on != 0: decoding with the KV cache (sampling, rollouts, generation, serving, mrl_rollout_score)
 * reads a bfloat16 copy of the weights, made now, instead of the float32 ones: half the bytes to
 * stream per decoded token, at the cost of bfloat16 rounding of the projection and head matrices
 * (norms, biases and the embedding lookup stay float32): the log-probabilities of sampled tokens
 * then differ from float32 scoring (tests/c/test_decode_bf16.c, a small random model: mean
 * 3.3e-3, max 1.1e-2), which rollout importance-sampling correction is there for. The float32 weights stay the master copy: training, mrl_model_score
 * and mrl_model_logits use them. Each mrl_model_adamw_step rewrites the copy; after writing weights any
 * other way (parameter views, loading into the buffer), call this again to refresh it. on = 0
 * frees the copy. Off by default. mrl_model_decode_bf16: 1 when on (0 for NULL). */
MRL_API mrl_status mrl_model_set_decode_bf16(mrl_model *m, int on);
MRL_API int mrl_model_decode_bf16(const mrl_model *m);

/* Named parameters: count, and for each its Hugging Face name (borrowed, lives with the model)
 * and new views of the weights and of their gradients (caller owns both, and they keep the
 * memory alive even after mrl_model_free; either may be NULL). */
MRL_API int mrl_model_param_count(const mrl_model *m);
MRL_API mrl_status mrl_model_param(mrl_model *m, int i, const char **name, mrl_tensor **weights,
                                   mrl_tensor **grads);
/* Total number of parameters (floats). -1 for NULL. */
MRL_API int64_t mrl_model_numel(const mrl_model *m);

/* Hugging Face model directories: config.json (LlamaForCausalLM, Qwen2ForCausalLM,
 * Qwen3ForCausalLM) and model.safetensors or sharded model-*.safetensors with
 * model.safetensors.index.json. Configs the model cannot compute exactly are refused with a
 * message naming the field. *out: caller owns, mrl_model_free. */
MRL_API mrl_status mrl_model_load(mrl_engine *e, const char *dir, mrl_model **out);
/* Writes config.json and model.safetensors (F32 or BF16) into dir (created if missing); each
 * file is written atomically. */
MRL_API mrl_status mrl_model_save(mrl_model *m, const char *dir, mrl_dtype dtype);
/* moonrl's own training checkpoint, one file written atomically: weights, AdamW moments and
 * step, and the caller's `step` and RNG state (`rng` may be NULL). */
MRL_API mrl_status mrl_model_save_checkpoint(mrl_model *m, const char *path, int64_t step,
                                             const mrl_rng *rng);
/* Restores a checkpoint written for the same configuration into m (and rng when not NULL;
 * step may be NULL). Everything is checked before m changes: a failed load leaves it as it was. */
MRL_API mrl_status mrl_model_load_checkpoint(mrl_model *m, const char *path, int64_t *step,
                                             mrl_rng *rng);

/* -- training and scoring --
 * A batch is `batch` sequences of `steps` token ids each, row-major, right-padded: sequence b
 * holds lengths[b] real tokens (1..steps); positions past it never influence the others.
 * mrl_model_forward runs the decoder and keeps what the backward pass needs. After it, per
 * position (batch x steps arrays, row-major):
 *   - targets[i] is the token whose log-probability position i scores (usually the next token),
 *     or -1 for positions that score nothing (padding, prompts);
 *   - mrl_model_score writes logprobs[i] = log p(targets[i] | tokens up to i) and the entropy of
 *     the next-token distribution (either output may be NULL; unscored positions get 0);
 *   - mrl_model_backward adds to the gradients the effect of a loss whose derivative with
 *     respect to logprobs[i] is dlogprobs[i] and with respect to entropy[i] is dentropy[i]
 *     (either may be NULL, meaning zeros). Masked cross-entropy is dlogprobs = -mask / count.
 * The LM head is computed in blocks of rows, so the full (positions x vocab) logits are never
 * held unless mrl_model_logits asks for them. A forward that fails after its arguments were
 * checked (out of memory) keeps no forward pass, not the previous one either: score, logits and
 * backward refuse until a forward succeeds. A failed score or backward changes nothing. */
MRL_API mrl_status mrl_model_forward(mrl_model *m, const int32_t *tokens, const int32_t *lengths,
                                     int batch, int steps);
MRL_API mrl_status mrl_model_score(mrl_model *m, const int32_t *targets, float *logprobs,
                                   float *entropy);
/* Logits of the last forward, (batch, steps, vocab). *out: caller owns. */
MRL_API mrl_status mrl_model_logits(mrl_model *m, mrl_tensor **out);
MRL_API mrl_status mrl_model_backward(mrl_model *m, const int32_t *targets,
                                      const float *dlogprobs, const float *dentropy);
/* The final normalised hidden states of the last forward (batch x steps x dim, row-major; the
 * LM head's input), for heads of one's own such as a critic's value head. Borrowed: valid until
 * the next forward; NULL when there is none. */
MRL_API const float *mrl_model_hidden(const mrl_model *m);
/* mrl_model_backward plus dhidden (batch x steps x dim, may be NULL): the derivative of the loss
 * with respect to mrl_model_hidden's states, from heads of one's own. Entries at padding
 * positions (t >= lengths[b]) do not reach the weights: keep them zero. */
MRL_API mrl_status mrl_model_backward_hidden(mrl_model *m, const int32_t *targets,
                                             const float *dlogprobs, const float *dentropy,
                                             const float *dhidden);

MRL_API mrl_status mrl_model_zero_grad(mrl_model *m);
/* Global L2 norm of the gradients; with max_norm > 0, scales them down to at most max_norm
 * (norm: the norm before clipping; may be NULL). */
MRL_API mrl_status mrl_model_clip_grad(mrl_model *m, double max_norm, double *norm);

/* AdamW with decoupled weight decay (applied to matrices, not to norms and biases), bias
 * correction, one step over every parameter. */
typedef struct mrl_adamw {
  float lr, beta1, beta2, eps, weight_decay;
} mrl_adamw;
MRL_API mrl_status mrl_model_adamw_step(mrl_model *m, const mrl_adamw *opt);

/* Learning rate at `step` (0-based) of `total`: MRL_LR_CONSTANT is base after warmup;
 * MRL_LR_COSINE decays from base to min_lr along a half cosine after a linear warmup. Warmup is
 * linear from base / warmup at step 0 to base at step warmup - 1. */
typedef enum mrl_lr_schedule { MRL_LR_CONSTANT = 0, MRL_LR_COSINE = 1 } mrl_lr_schedule;
MRL_API double mrl_lr_at(mrl_lr_schedule kind, int64_t step, int64_t total, int64_t warmup,
                         double base, double min_lr);

/* -- incremental decoding with a KV cache --
 * A cache holds `slots` sequences of up to `capacity` tokens; its memory (keys and values of every
 * layer) is allocated once and reused. Tokens are appended to many slots in one batched pass;
 * each slot then holds the logits after its last token, from which mrl_kv_cache_sample draws with
 * the slot's own random stream, so a sequence's samples do not depend on which other sequences
 * share the batch. */
typedef struct mrl_kv_cache mrl_kv_cache;

typedef struct mrl_sampling {
  float temperature; /* 0: greedy */
  int top_k;         /* keep the k most likely tokens; 0: off */
  float top_p;       /* keep the smallest set with probability >= top_p; 1 (or 0): off */
  float min_p;       /* drop tokens below min_p times the top probability; 0: off */
} mrl_sampling;

/* *out: caller owns, mrl_kv_cache_free (before the model: a cache uses its model's weights).
 * mrl_kv_cache_reset empties a slot and seeds its random stream. */
MRL_API mrl_status mrl_kv_cache_new(mrl_model *m, int slots, int capacity, mrl_kv_cache **out);
MRL_API void mrl_kv_cache_free(mrl_kv_cache *c);
MRL_API mrl_status mrl_kv_cache_reset(mrl_kv_cache *c, int slot, uint64_t seed);
MRL_API int mrl_kv_cache_length(const mrl_kv_cache *c, int slot); /* -1 for bad arguments */
/* Appends counts[i] tokens to slot slots[i] for i < n (tokens concatenated in that order). A
 * slot is listed at most once. On failure no slot changes (lengths, logits). */
MRL_API mrl_status mrl_kv_cache_append(mrl_kv_cache *c, int n, const int *slots,
                                       const int32_t *tokens, const int *counts);
/* Draws the next token of each listed slot (it is not appended); a slot is listed at most once.
 * logprobs (may be NULL) gets the token's log-probability under the temperature-scaled
 * distribution before top-k/top-p/min-p (the behaviour log-probability; temperature 0 scores at
 * temperature 1). Logits that are not finite (NaN or infinite weights or activations) fail the
 * call with MRL_ERR_INVALID and a message naming the slot. On failure nothing is drawn: no
 * stream advances and tokens/logprobs are not written. */
MRL_API mrl_status mrl_kv_cache_sample(mrl_kv_cache *c, int n, const int *slots,
                                       const mrl_sampling *sampling, int32_t *tokens,
                                       float *logprobs);
/* mrl_kv_cache_sample for one slot, drawing only among the tokens whose allowed[id] is non-zero
 * (vocab bytes, read only): the others get probability 0 before top-k/top-p/min-p, and *logprob
 * (may be NULL) is the token's log-probability under the temperature-scaled distribution
 * renormalised over the allowed tokens (the behaviour log-probability of the constrained draw).
 * MRL_ERR_INVALID when no token is allowed. For constrained decoding (forced tool calls). */
MRL_API mrl_status mrl_kv_cache_sample_masked(mrl_kv_cache *c, int slot,
                                              const mrl_sampling *sampling,
                                              const uint8_t *allowed, int32_t *token,
                                              float *logprob);
/* The logits after a slot's last token (vocab floats). Borrowed: valid until the next append or
 * reset of any slot. */
MRL_API const float *mrl_kv_cache_logits(const mrl_kv_cache *c, int slot);
/* Makes slot dst a copy of slot src (keys, values, length, logits) whose random stream is seeded
 * by seed: a fork, for tree rollouts. src and dst must differ. */
MRL_API mrl_status mrl_kv_cache_copy(mrl_kv_cache *c, int src, int dst, uint64_t seed);
/* on != 0: every later append computes each token's row on its own (one matrix product per row
 * instead of one for all), so a slot's keys, values and logits are the same floats whichever
 * other slots share the append. OpenBLAS picks its kernels by the sizes of a product, so
 * otherwise they differ in the last bits (1e-6 in log-probabilities). The cost: 128 episodes of
 * the quickstart-sized model decode in 0.21 s instead of 0.14 s. Off when the cache is made. */
MRL_API mrl_status mrl_kv_cache_set_batch_invariant(mrl_kv_cache *c, int on);
/* Shortens a slot to its first `length` tokens (1 <= length <= its length) and makes `logits`
 * (vocab floats, copied; the slot's own may be passed) its logits, those a caller saved with
 * mrl_kv_cache_logits when the slot had that length: the next sample redraws from the same
 * distribution with the stream as it is now. */
MRL_API mrl_status mrl_kv_cache_truncate(mrl_kv_cache *c, int slot, int length,
                                         const float *logits);

/* ---- rollouts ----------------------------------------------------------------------------
 * Many multi-turn episodes decoded at once over one model (continuous batching): every call to
 * mrl_rollout_generate takes one batched decode step per token over all the episodes it is given,
 * and returns as soon as one of them finishes its turn; the caller then feeds that episode's
 * environment, appends the observation, and calls again with the others still mid-turn. Each
 * episode records its tokens with the behaviour log-probability and loss mask of each (1 exactly
 * on sampled tokens) and the turn each token belongs to. */
typedef struct mrl_rollout mrl_rollout;

/* How a turn ended. */
enum {
  MRL_TURN_STOP = 1,   /* sampled one of the stop tokens (kept as the turn's last token) */
  MRL_TURN_LENGTH = 2, /* reached the turn's token limit */
  MRL_TURN_FULL = 3    /* the episode reached its capacity */
};

/* Room for `episodes` episodes of up to `capacity` tokens (<= the model's context). The rollout
 * uses m's weights: free it before m. *out: caller owns, mrl_rollout_free. */
MRL_API mrl_status mrl_rollout_new(mrl_model *m, int episodes, int capacity, mrl_rollout **out);
MRL_API void mrl_rollout_free(mrl_rollout *r);
/* Starts episode e afresh with a prompt (mask 0, turn -1) and seeds its sampling stream. */
MRL_API mrl_status mrl_rollout_start(mrl_rollout *r, int e, const int32_t *prompt, int count,
                                     uint64_t seed);
/* Appends observation tokens (mask 0) to n episodes in one batched pass: episode eps[i] gets
 * counts[i] tokens (tokens concatenated in that order). They belong to the episode's last turn. */
MRL_API mrl_status mrl_rollout_observe(mrl_rollout *r, int n, const int *eps,
                                       const int32_t *tokens, const int *counts);
/* Continues the turns of the n listed episodes (an episode whose previous turn ended starts a new
 * one) until at least one ends: by a stop token, by max_tokens tokens in the turn, or by running
 * out of capacity. ended[0..*n_ended) receives the episodes whose turns ended in this call and
 * reasons[] how (MRL_TURN_*); both arrays need room for n entries. */
MRL_API mrl_status mrl_rollout_generate(mrl_rollout *r, int n, const int *eps,
                                        const mrl_sampling *sampling, const int32_t *stop,
                                        int n_stop, int max_tokens, int *ended, int *reasons,
                                        int *n_ended);
/* Copies episode src (tokens, record, cache) into episode dst and seeds dst's stream: a fork at
 * src's current state, for tree rollouts. */
MRL_API mrl_status mrl_rollout_fork(mrl_rollout *r, int src, int dst, uint64_t seed);
/* An episode's record: length, and borrowed arrays of that many entries (valid until the episode
 * is started, observed, generated or forked into again). NULL / -1 for bad arguments. */
MRL_API int mrl_rollout_length(const mrl_rollout *r, int e);
MRL_API const int32_t *mrl_rollout_tokens(const mrl_rollout *r, int e);
MRL_API const float *mrl_rollout_logprobs(const mrl_rollout *r, int e); /* 0 where mask is 0 */
MRL_API const float *mrl_rollout_mask(const mrl_rollout *r, int e);     /* 1 on sampled tokens */
MRL_API const int32_t *mrl_rollout_turns(const mrl_rollout *r, int e);  /* -1 for the prompt */

/* ---- tokenizers ----------------------------------------------------------------------------
 * Text <-> token ids. Two kinds:
 *   - the byte tokenizer: ids 0..255 are the bytes themselves, then the eight special tokens
 *     below (vocabulary MRL_BYTE_VOCAB = 264, the size mrl_model_config_default uses);
 *   - byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama-3, Qwen2/Qwen3 style):
 *     normalizer NFC or none; pre-tokenizer Split with the GPT-2, Llama-3 or Qwen2 regex then
 *     ByteLevel (or ByteLevel alone); model BPE with a vocabulary and ranked merges ("a b"
 *     strings or ["a", "b"] pairs, ignore_merges honoured); added tokens (special or not);
 *     decoder ByteLevel. Anything else (WordPiece, Unigram, byte_fallback, other normalizers,
 *     pre-tokenizers or split patterns, added tokens with lstrip/rstrip/single_word) is refused
 *     with MRL_ERR_UNSUPPORTED and a message naming it. The post-processor, truncation and
 *     padding settings are ignored: encoding never adds BOS/EOS, truncates or pads (the chat
 *     templates add what a model expects).
 * Encoding takes any bytes: text need not be valid UTF-8. A byte sequence that is not valid
 * UTF-8 is kept as it is (when splitting, each maximal invalid subpart counts as one character
 * that is neither letter, number nor space, like the U+FFFD that would replace it), so decode
 * gives back the input byte for byte. Added tokens are found in the text before normalization
 * (or after it, for those marked "normalized"), leftmost-longest first. Token ids are 0-based
 * in this API and in Lua, as in Hugging Face files.
 * A tokenizer keeps scratch buffers and a cache of encoded words: like everything made from an
 * engine it is used by one thread at a time. */
typedef struct mrl_tokenizer mrl_tokenizer;

enum {
  MRL_TOKEN_BOS = 256,       /* <|bos|> */
  MRL_TOKEN_EOS = 257,       /* <|eos|> */
  MRL_TOKEN_PAD = 258,       /* <|pad|> */
  MRL_TOKEN_SYSTEM = 259,    /* <|system|> */
  MRL_TOKEN_USER = 260,      /* <|user|> */
  MRL_TOKEN_ASSISTANT = 261, /* <|assistant|> */
  MRL_TOKEN_TOOL = 262,      /* <|tool|> */
  MRL_TOKEN_END = 263,       /* <|end|> */
  MRL_BYTE_VOCAB = 264
};

/* The byte tokenizer. *out: caller owns, mrl_tokenizer_free. */
MRL_API mrl_status mrl_tokenizer_bytes(mrl_engine *e, mrl_tokenizer **out);
/* Loads a tokenizer.json file (MRL_ERR_IO when it cannot be read, MRL_ERR_INVALID when it is
 * malformed, MRL_ERR_UNSUPPORTED for features listed above). *out: caller owns. */
MRL_API mrl_status mrl_tokenizer_load(mrl_engine *e, const char *path, mrl_tokenizer **out);
/* The same from the text json[0..len), which is not kept (the caller may free it at once). */
MRL_API mrl_status mrl_tokenizer_load_json(mrl_engine *e, const char *json, size_t len,
                                           mrl_tokenizer **out);
MRL_API void mrl_tokenizer_free(mrl_tokenizer *t);

/* Largest token id + 1 (ids below it may still lack a token in a sparse vocabulary); -1 for
 * NULL. */
MRL_API int32_t mrl_tokenizer_vocab_size(const mrl_tokenizer *t);

/* Encoding flags. Without MRL_ENCODE_SPECIAL the text of a special token is plain text (its
 * bytes are encoded like any other), which is what observations and user content need; added
 * tokens that are not special are always recognised, as Hugging Face does. */
enum { MRL_ENCODE_SPECIAL = 1 /* text spelling a special token is that token */ };

/* Encodes text[0..len) (text may be NULL when len is 0). Writes at most cap ids into ids (which
 * may be NULL when cap is 0); *count receives the total, as snprintf does: call again with a
 * larger buffer when *count > cap. The total is at most len (every token covers at least one
 * byte) when the tokenizer has no normalizer or the text is in NFC, and at most 3 * len in any
 * case (NFC can lengthen text). */
MRL_API mrl_status mrl_tokenizer_encode(mrl_tokenizer *t, const char *text, size_t len, int flags,
                                        int32_t *ids, size_t cap, size_t *count);

/* Decodes ids[0..count) to the exact bytes they stand for (special tokens as their text). Writes
 * at most cap bytes including a terminating NUL into buf (buf may be NULL when cap is 0); *len
 * receives the full length without the NUL, as snprintf does. The text may contain NUL bytes.
 * An id without a token fails with MRL_ERR_RANGE. */
MRL_API mrl_status mrl_tokenizer_decode(mrl_tokenizer *t, const int32_t *ids, size_t count,
                                        char *buf, size_t cap, size_t *len);

/* The token `id` as the vocabulary spells it (byte-level BPE spells a space "Ġ"; the byte
 * tokenizer spells byte b as that byte), or NULL when id has no token. Borrowed: valid until
 * mrl_tokenizer_free; NUL-terminated, and *len (optional) gets the length, which counts any
 * NUL bytes inside. */
MRL_API const char *mrl_tokenizer_token(const mrl_tokenizer *t, int32_t id, size_t *len);
/* The id of the token spelled token[0..len) (added tokens first), or -1 when there is none. */
MRL_API int32_t mrl_tokenizer_token_id(const mrl_tokenizer *t, const char *token, size_t len);

/* Chat templates, written in C. Message text is encoded as plain text (special-token spellings
 * in it are not special); the template's own markers are the special tokens.
 *   MRL_CHAT_ROLES  (byte tokenizer): per message <|role|>content<|end|>, where role is system,
 *                   user, assistant or tool (another role fails with MRL_ERR_INVALID);
 *                   generation prompt <|assistant|>. No BOS.
 *   MRL_CHAT_CHATML (Qwen): per message <|im_start|>role\ncontent<|im_end|>\n; generation prompt
 *                   <|im_start|>assistant\n. No default system message is added.
 *   MRL_CHAT_LLAMA3 (Llama 3): <|begin_of_text|>, then per message
 *                   <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>; generation
 *                   prompt <|start_header_id|>assistant<|end_header_id|>\n\n. Content is used
 *                   as given (the official Jinja template strips surrounding white space).
 *   MRL_CHAT_AUTO   ROLES for the byte tokenizer, else CHATML when <|im_start|> is a token, else
 *                   LLAMA3 when <|start_header_id|> is, else MRL_ERR_UNSUPPORTED.
 * A template whose markers the tokenizer lacks fails with MRL_ERR_UNSUPPORTED. Text between two
 * markers is encoded as one piece of text, so the ids equal those of encoding the rendered
 * string with MRL_ENCODE_SPECIAL whenever the content spells no special token. */
typedef enum mrl_chat_template {
  MRL_CHAT_AUTO = 0,
  MRL_CHAT_ROLES = 1,
  MRL_CHAT_CHATML = 2,
  MRL_CHAT_LLAMA3 = 3
} mrl_chat_template;

typedef struct mrl_chat_message {
  const char *role;    /* NUL-terminated, not empty */
  const char *content; /* content_len bytes (any bytes); may be NULL when content_len is 0 */
  size_t content_len;
} mrl_chat_message;

/* Encodes `count` messages (and the generation prompt when add_generation_prompt is non-zero)
 * into ids, with the output convention of mrl_tokenizer_encode. The total is at most
 * 16 + the sum over messages of (3 * (role length + content length) + 10). */
MRL_API mrl_status mrl_tokenizer_chat(mrl_tokenizer *t, mrl_chat_template tmpl,
                                      const mrl_chat_message *messages, size_t count,
                                      int add_generation_prompt, int32_t *ids, size_t cap,
                                      size_t *total);

/* ---- generation with stop ids and stop strings -------------------------------------------
 * Continuations of a batch of prompts sampled together over a KV cache, each sequence with its
 * own random stream, so a sequence's tokens do not depend on the others in the batch. (Part of
 * the rollout layer: stop strings need the tokenizer, which the model does not know.) */
typedef struct mrl_generate_options {
  mrl_sampling sampling;
  int max_new_tokens; /* > 0: tokens per sequence at most */
  /* Sequence b samples with seed + b, wrapping around modulo 2^64 (so any seed is valid). */
  uint64_t seed;
  const int32_t *stop; /* n_stop token ids (each in 0..vocab-1); may be NULL when n_stop is 0 */
  int n_stop;
  /* n_stop_strings non-empty strings (stop_strings[i] has stop_lengths[i] bytes, any bytes),
   * matched in the decoded text of the generated tokens, across token boundaries; they need
   * the tokenizer. All three may be NULL when n_stop_strings is 0. */
  const char *const *stop_strings;
  const size_t *stop_lengths;
  int n_stop_strings;
  mrl_tokenizer *tokenizer;
  /* Optional: a cache of this model to sample in (its slots 0..batch-1 are reset), with at least
   * batch slots and room for min(longest prompt + max_new_tokens, ctx) tokens; NULL: one is
   * made for the call and freed. Reusing one saves allocating it on every call. */
  mrl_kv_cache *cache;
} mrl_generate_options;

/* Samples up to opts->max_new_tokens tokens after each of `batch` prompts (prompt b has
 * prompt_lengths[b] tokens, 1..ctx; the prompts are concatenated in order in `prompts`). A
 * sequence stops after the token that is a stop id or completes a stop string (the token is
 * kept), after max_new_tokens tokens, or when it fills the model's context. Outputs, for each
 * sequence b: tokens[b * max_new_tokens + i] and logprobs[...] (the behaviour log-probability,
 * as mrl_kv_cache_sample gives it; logprobs may be NULL) for i < lengths[b], and reasons[b]:
 * MRL_TURN_STOP, MRL_TURN_LENGTH (max_new_tokens) or MRL_TURN_FULL (the context). The outputs
 * are written only on success; the scratch memory is the engine's, freed before returning. */
MRL_API mrl_status mrl_model_generate(mrl_model *m, int batch, const int32_t *prompts,
                                      const int *prompt_lengths,
                                      const mrl_generate_options *opts, int32_t *tokens,
                                      float *logprobs, int *lengths, int *reasons);

/* ---- environments and whole episodes ------------------------------------------------------
 * An environment, as a C vtable: the rollout driver below talks to every environment through
 * it (the Lua binding wraps Lua environments in the same shape). Strings an environment returns
 * are borrowed: valid until its next call. */
typedef struct mrl_env {
  void *self;
  /* Starts an episode: the first observation. */
  mrl_status (*reset)(void *self, const char **obs, size_t *obs_len);
  /* Takes the policy's action text; gives the next observation, the turn's reward and whether
   * the episode is over. */
  mrl_status (*step)(void *self, const char *action, size_t action_len, const char **obs,
                     size_t *obs_len, double *reward, int *done);
  /* Optional (may be NULL): the message of the last failed call. */
  const char *(*error)(void *self);
  /* Optional (may be NULL; mrl_rollout_run_tree needs it): makes *out an independent copy of
   * the environment in its current state, for a branch of a tree. The copy is owned by whoever
   * called mrl_rollout_run_tree, which hands it back; how to free it is the environment's own
   * business. On failure return a status (error() giving the message); *out is then ignored. */
  mrl_status (*clone)(void *self, struct mrl_env **out);
} mrl_env;

/* How an episode ended. */
enum {
  MRL_END_NONE = 0,      /* still running (or never started) */
  MRL_END_DONE = 1,      /* the environment said done */
  MRL_END_MAX_TURNS = 2, /* reached max_turns */
  MRL_END_BUDGET = 3,    /* out of token capacity */
  MRL_END_ENV_ERROR = 4, /* reset or step failed; mrl_rollout_error has the message */
  MRL_END_PAUSED = 5,    /* stopped at cfg->pause_turn with its observation in; resumable */
  MRL_END_CUT = 6        /* stopped with its group by a group hook (mrl_rollout_run_hooks) */
};

typedef struct mrl_rollout_config {
  mrl_sampling sampling;
  int max_turns;          /* actions per episode */
  int max_turn_tokens;    /* tokens per action */
  const char *system;     /* optional system message (NULL: none) */
  mrl_chat_template chat; /* how messages become tokens (MRL_CHAT_AUTO picks by tokenizer) */
  const char *observation_role; /* role of observations after the first: NULL means "user" */
  /* Tree rollouts. pause_turn > 0: an episode that goes on after that many turns stops there
   * (MRL_END_PAUSED) with the observation appended, so the caller can mrl_rollout_fork it (and
   * copy its environment) into other episodes. resume != 0: the n episodes are not reset but
   * continued: paused ones run on with the environments given, ended ones stay as they are. */
  int pause_turn;
  int resume;
  /* != 0: decode as mrl_kv_cache_set_batch_invariant says, so that an episode's tokens and
   * log-probabilities are the same floats whichever other episodes run beside it (alone, in
   * another batch, with groups cut or branches added by hooks); slower (about 1.5x). */
  int batch_invariant;
} mrl_rollout_config;

/* Runs n episodes (episode e with envs[e] and seeds[e], n <= the rollout's episodes) to the end,
 * all at once: reset, then turns of batched decoding; after each action the environment's
 * observation is appended (rendered with the chat template, loss mask 0) and the episode goes
 * on, until done, max_turns, capacity, or an environment error, which ends only that episode.
 * The action given to step is the turn's text without its end-of-turn token. Between an action
 * and the next observation go the template's own tokens (mask 0): the end-of-turn token when
 * the turn was cut by max_turn_tokens, and ChatML's "\n" after <|im_end|>. A reward that is
 * not finite (NaN, infinity) is an environment error. With cfg->pause_turn / cfg->resume it
 * runs the trunk of a tree, then (after forks) its branches, which mrl_rollout_run_tree does:
 *   cfg.pause_turn = t; run(n roots);  fork root i into episodes n..;  copy the environments;
 *   cfg.pause_turn = 0; cfg.resume = 1; run(all, seeds ignored). */
MRL_API mrl_status mrl_rollout_run(mrl_rollout *r, mrl_tokenizer *tok, int n,
                                   mrl_env *const *envs, const uint64_t *seeds,
                                   const mrl_rollout_config *cfg);
/* Tree rollouts: n roots, each branching into k episodes after tree_turn turns.
 *   - Root i is episode i (envs[i], seeds[i]). The roots run tree_turn turns and pause there
 *     with their observation in (cfg->pause_turn = tree_turn).
 *   - Branch j (1 <= j < k) of root i is episode n + i * (k - 1) + (j - 1): the root's record
 *     and KV cache at the pause, its own stream seeded mrl_rollout_branch_seed(seeds[i], j), and
 *     the environment envs[i]->clone() made then. A root that ended within tree_turn turns is
 *     copied as it ended (its branches are never stepped and get no clone). A clone that fails
 *     ends only its branch: MRL_END_ENV_ERROR, message "clone: <the environment's message>".
 *   - Then all n * k episodes run to the end (cfg->resume).
 * Needs n * k <= the rollout's episodes, tree_turn >= 1, k >= 2, cfg->pause_turn == 0 and
 * cfg->resume == 0 (the tree sets them), and a clone in every envs[i] (MRL_ERR_UNSUPPORTED
 * otherwise, before anything runs). clones (n * (k - 1) entries) receives the environment of
 * each branch in episode order (branch j of root i at i * (k - 1) + j - 1), NULL where none
 * was made; the caller owns them and frees them as its clone function says, also when the
 * call fails (an exception to the rule that failures leave outputs untouched). */
MRL_API mrl_status mrl_rollout_run_tree(mrl_rollout *r, mrl_tokenizer *tok, int n,
                                        mrl_env *const *envs, const uint64_t *seeds,
                                        const mrl_rollout_config *cfg, int tree_turn, int k,
                                        mrl_env **clones);
/* The seed of branch j of a root seeded `seed` in mrl_rollout_run_tree: splitmix64's output
 * for seed + (j + 1) * 0x9E3779B97F4A7C15 (mod 2^64); j + 1 is the branch's index when the root
 * itself counts as 1 (the Lua summaries' branch.index). */
MRL_API uint64_t mrl_rollout_branch_seed(uint64_t seed, int j);
/* After mrl_rollout_run: how episode e ended (MRL_END_*), its number of turns, the reward of each
 * turn (borrowed, turns entries), and the environment's error message (borrowed, or NULL). */
MRL_API int mrl_rollout_end(const mrl_rollout *r, int e);
MRL_API int mrl_rollout_turn_count(const mrl_rollout *r, int e);
MRL_API const double *mrl_rollout_rewards(const mrl_rollout *r, int e);
MRL_API const char *mrl_rollout_error(const mrl_rollout *r, int e);
/* The tokens the policy sampled in turn `turn` (0-based) of episode e, its end-of-turn token
 * included when it sampled one: *tokens (borrowed, as mrl_rollout_tokens) and the count, or -1
 * for bad arguments or a turn it has not taken. */
MRL_API int mrl_rollout_action(const mrl_rollout *r, int e, int turn, const int32_t **tokens);

/* -- rollout hooks --
 * mrl_rollout_run_hooks runs episodes as mrl_rollout_run does, calling the caller's functions
 * at points of the episodes' lives. A hook reads an episode through the accessors above (its
 * record, turns, rewards, end), runs on the calling thread between decoding steps, and returns
 * MRL_OK or a status that stops the run: mrl_rollout_run_hooks then fails with that status and
 * a message naming the hook and the episode (the hook's own engine message kept when it set
 * one, as a failing mrl_ call does). A hook must not run the rollout itself.
 *
 * Forks. mrl_rollout_branch, called from any hook, forks an episode between two of its turns
 * into k episodes: itself and k - 1 branches, new episodes numbered from the run's total so far,
 * each with the episode's record and KV cache as they are, its own stream seeded
 * mrl_rollout_branch_seed(its seed, f + j) for branch j = 1..k - 1 (f: branches it had before;
 * a root's seed is seeds[e], a branch's its own), and a copy of its environment made by clone()
 * then. A fork of an episode that has ended copies it as it ended (its branches are never
 * stepped and no clone is made). A clone that fails ends only its branch (MRL_END_ENV_ERROR,
 * "clone: <message>"). Forking every root after turn t into k gives, episode for episode, the
 * branches of mrl_rollout_run_tree(..., t, k, ...) (bit for bit with cfg->batch_invariant).
 * When all k episodes of a fork have ended, hooks->branches gets them: parent, the turns they
 * share, and the branches first .. first + count - 1. A branch's group is its parent's.
 *
 * Groups. With hooks->group, episode e of the n given belongs to group hooks->groups[e] (any
 * int ids). An episode that has taken hooks->group_turn (K) turns waits there until every
 * member of its group has taken K turns or ended; then hooks->group gets the group's members
 * (episode numbers in increasing order) and may set *cut. A cut group leaves the batch: every
 * member is dropped (mrl_rollout_dropped), and those still running stop (MRL_END_CUT, at K
 * turns) unless hooks->finish_cut is set, which runs them to the end anyway, still dropped (to
 * measure what a cut would have lost). mrl_rollout_gate_group is a ready group hook.
 *
 * Resampling. hooks->resample sees each turn's action (the text the environment would get)
 * before the environment does, and may set *again: the turn is taken back (record and cache
 * shortened to its start, the logits there restored) and sampled again, the episode's stream
 * going on. attempt counts the turn's earlier resamples; the hook is called while attempt <
 * hooks->max_resamples (0 counts as 1), after which the environment gets the action. */
typedef struct mrl_rollout_hooks {
  void *user; /* passed to every hook */
  /* After episode e's turn was taken by its environment (its observation appended when it goes
   * on, or after its last turn). */
  mrl_status (*turn)(void *user, mrl_rollout *r, int e);
  /* When every episode of a fork has ended (see Forks). */
  mrl_status (*branches)(void *user, mrl_rollout *r, int parent, int turn, int first,
                         int count);
  mrl_status (*resample)(void *user, mrl_rollout *r, int e, int attempt, const char *action,
                         size_t len, int *again);
  int max_resamples;
  /* See Groups; groups (n entries, borrowed for the run) and group_turn >= 1 are needed with a
   * group hook. */
  mrl_status (*group)(void *user, mrl_rollout *r, int group, int turn, const int *members,
                      int count, int *cut);
  const int *groups;
  int group_turn;
  int finish_cut;
  /* Once per episode of the n given, after its first observation (the prompt) went in and
   * before its first turn: where mrl_rollout_score sees the prompt-only context. Not called for
   * an episode whose reset failed or whose prompt did not fit. mrl_rollout_branch cannot be
   * called from it. */
  mrl_status (*start)(void *user, mrl_rollout *r, int e);
} mrl_rollout_hooks;

/* Runs n episodes like mrl_rollout_run (cfg->pause_turn and cfg->resume must be 0) with hooks.
 * *total receives the number of episodes at the end: n plus the branches forked, episodes
 * n .. *total - 1. clones (the rollout's episodes entries, set to NULL first) receives the
 * environment each branch's clone() made, filled in as branches are made, NULL elsewhere; the
 * caller owns them and frees them as its clone function says, also when the call fails. */
MRL_API mrl_status mrl_rollout_run_hooks(mrl_rollout *r, mrl_tokenizer *tok, int n,
                                         mrl_env *const *envs, const uint64_t *seeds,
                                         const mrl_rollout_config *cfg,
                                         const mrl_rollout_hooks *hooks, mrl_env **clones,
                                         int *total);
enum { MRL_BRANCH_DROP = 1 }; /* the fork's branches are dropped once hooks->branches saw them */
/* From inside a hook: forks episode e (not in the middle of a turn) into k >= 2 episodes (see
 * Forks); *first (may be NULL) receives the first branch's number. Fails, changing nothing, with
 * MRL_ERR_RANGE when the rollout has no room for k - 1 more episodes, MRL_ERR_UNSUPPORTED when
 * a running episode's environment has no clone, MRL_ERR_INVALID outside a hook. */
MRL_API mrl_status mrl_rollout_branch(mrl_rollout *r, int e, int k, int flags, int *first);
/* Where episode e came from: *parent the episode a hook forked it from (-1: not forked by a
 * hook), *index its place in that fork (the parent is 1, its branches 2..k; 1 when not forked),
 * *turn the turns it shares with its parent (0). Pointers may be NULL. -1 for bad arguments. */
MRL_API int mrl_rollout_origin(const mrl_rollout *r, int e, int *parent, int *index, int *turn);
/* The seed of episode e's stream (seeds[e] for the episodes a run was given, a branch's
 * derived one for forks); 0 for bad arguments. */
MRL_API uint64_t mrl_rollout_seed(const mrl_rollout *r, int e);
/* 1 when episode e was dropped (cut with its group, or a branch of a dropped fork) and is no part
 * of the batch, 0 when it is, -1 for bad arguments. */
MRL_API int mrl_rollout_dropped(const mrl_rollout *r, int e);

/* -- forced-continuation scoring --
 * mrl_rollout_score gives the teacher-forced log-probability of each of the given tokens after
 * each listed episode's current context: episode eps[i] gets counts[i] >= 1 tokens (tokens
 * concatenated in that order) and logprobs (as many floats) receives log p(token j | context,
 * tokens 0..j-1) at temperature 1 from the model's raw logits, in the same order. The episodes
 * are scored together: step j appends token j of every episode that has a token after it, in
 * one batched pass (so with cfg->batch_invariant, or outside a run after
 * mrl_kv_cache_set_batch_invariant, an episode's scores do not depend on which others share the
 * call). Afterwards every episode's KV cache is as it was (shortened back to its length with its
 * saved logits: mrl_kv_cache_truncate), and its record, turns and random stream are untouched,
 * so a scored episode samples exactly what it would have sampled unscored. The scored tokens
 * are never recorded. For information gain: the gold answer forced after each turn (IGPO,
 * A2TGPO; a start hook scores it after the prompt alone).
 * Callable from any hook (the episode is between turns there) and after a run. Fails, changing
 * nothing, with MRL_ERR_RANGE for an episode outside the rollout, a token outside the vocabulary,
 * or an episode without room for counts[i] - 1 more tokens (the last one is never appended),
 * and MRL_ERR_INVALID for an episode listed twice, in the middle of a turn, without a context
 * (not started, or its reset failed), or counts[i] < 1; each message names the episode. */
MRL_API mrl_status mrl_rollout_score(mrl_rollout *r, int n, const int *eps,
                                     const int32_t *tokens, const int *counts, float *logprobs);

/* The selective rollout gate as a group hook: hooks->user points to an mrl_rollout_gate.
 * Each member's first K actions (K: hooks->group_turn; an action is the token sequence of a
 * turn, mrl_rollout_action, and two actions are one symbol when their tokens are equal) go to
 * mrl_selective_gate_eval with d_low and t_high: a member that ended before K is padded with an
 * end symbol, the Levenshtein distance of two prefixes is divided by K (their length after
 * padding), and the group is cut when the mean over its G (G - 1) / 2 pairs is below d_low, or
 * when at least t_high of its members ended before K. A group of one is never cut. */
typedef struct mrl_rollout_gate {
  double d_low;       /* 0.12 in the paper */
  double t_high;      /* the released code's OR-rule; above 1 (say 2): off, the paper's gate */
  int groups, cut;    /* out: groups seen and cut so far */
  double distance;    /* out: the last group's mean pairwise distance (0 for a group of one) */
  double termination; /* out: the last group's fraction ended before K */
} mrl_rollout_gate;
MRL_API mrl_status mrl_rollout_gate_group(void *gate, mrl_rollout *r, int group, int turn,
                                          const int *members, int count, int *cut);

/* ---- advantages and losses -----------------------------------------------------------------
 * The advantage estimators, KL estimators and policy losses of shared/spec/advantage.md (section
 * numbers below are that file's), as pure functions on caller arrays: no model, no Lua, no I/O.
 * - Token arrays are (rows, cols) row-major floats: a row is one response, or one step (turn) of
 *   a multi-turn trajectory, right-padded. A mask holds exactly 0 or 1; 1 marks the tokens the
 *   policy generated and is trained on (observation tokens inside a row are 0).
 * - Per-row values (scores, baselines, step rewards) are doubles. Ids (prompt group, trajectory,
 *   agent, anchor state, segment) are int64_t labels compared only for equality: rows with equal
 *   ids form a group, whatever the values.
 * - Everything is computed in double; float outputs are rounded once, at the end.
 * - Inputs must be finite, except the token inputs of losses at mask-0 positions (ignored). A
 *   required pointer may be NULL only when its array is empty. Outputs are caller buffers of the
 *   stated size that do not overlap the inputs (unless a function says it works in place);
 *   optional outputs may be NULL. Nothing is kept after a call: the caller owns every array. e is
 *   required (messages, and scratch memory counted toward its limit). Every check comes first:
 *   on failure no output has been written.
 * - Gradients are ADDED to the caller's buffer (zero it first), so a policy loss, a KL loss and an
 *   entropy bonus sum into the one dlogprobs (and dentropy) that mrl_model_backward consumes.
 * - Losses are to be minimised. Empty denominators give 0 (a batch without valid tokens has loss
 *   0), except whitening, which fails: its variance is undefined below 2 tokens. */

/* -- loss aggregation (spec section 3): how a (rows, cols) per-token loss becomes one number -- */
typedef enum mrl_loss_agg {
  MRL_AGG_TOKEN_MEAN = 0,              /* sum(l m) / sum(m) (DAPO's token-level loss) */
  MRL_AGG_SEQ_MEAN_TOKEN_SUM = 1,      /* mean over rows with a token of sum_t(l m) */
  MRL_AGG_SEQ_MEAN_TOKEN_MEAN = 2,     /* mean over rows with a token of sum_t(l m)/sum_t(m) */
  MRL_AGG_SEQ_MEAN_TOKEN_SUM_NORM = 3, /* mean over rows with a token of sum_t(l m), then / C
                                          (Dr. GRPO in verl 1dda039; before verl b8d91ef8d it was
                                          sum(l m) / C, without the mean over rows) */
  MRL_AGG_OAT_DRGRPO = 4,              /* mean over all rows of sum_t(l m) / C (Dr. GRPO's code) */
  MRL_AGG_TOKEN_SUM = 5                /* sum(l m) (verl 1dda039) */
} mrl_loss_agg;

/* *out = the aggregated loss. norm is C of the two sum-norm modes (<= 0: cols). Values of loss
 * at mask-0 positions are ignored, NaN included. */
MRL_API mrl_status mrl_agg_loss(mrl_engine *e, mrl_loss_agg mode, double norm, const float *loss,
                                const float *mask, int64_t rows, int64_t cols, double *out);

/* -- outcome advantages (section 1): one score per row, S = the row's sum of token rewards over
 * every position (a reward on a mask-0 position counts), normalised within prompt groups, then
 * written to every token as adv = a * mask. -- */
typedef enum mrl_outcome_kind {
  MRL_ADV_GRPO = 0,       /* (S - mean)/(std + eps); Dr. GRPO when norm_by_std is 0: S - mean */
  MRL_ADV_GRPO_PASSK = 1, /* best member: max - second max (/(std + eps)); others 0; size >= 2 */
  MRL_ADV_RLOO = 2,       /* S - mean of the others; a group of one: S, or 0 (singleton_zero) */
  MRL_ADV_OPO = 3,        /* S - length-weighted mean (lengths: mask sums); a group of one: S */
  MRL_ADV_GPG = 4,        /* B / max(#{S != 0}, 1) * (S - mean) / f_norm */
  MRL_ADV_REINFORCE_PP_BASELINE = 5 /* S - mean, then whitened over every mask-1 token */
} mrl_outcome_kind;

/* Groups of one use mean 0 and std 1 (they keep their raw score); std is the unbiased one. */
typedef struct mrl_outcome_opts {
  double epsilon;     /* added to the std (1e-6) */
  int norm_by_std;    /* GRPO and pass@k: divide by std + epsilon (1) */
  int singleton_zero; /* RLOO: a group of one gets 0 (0) */
  double f_norm;      /* GPG's normaliser (1) */
} mrl_outcome_opts;

/* Fills *opts with the defaults above. */
MRL_API void mrl_outcome_defaults(mrl_outcome_opts *opts);
/* rewards, mask, adv: (rows, cols); group: rows prompt-group ids; opts NULL: defaults. */
MRL_API mrl_status mrl_outcome_advantage(mrl_engine *e, mrl_outcome_kind kind,
                                         const mrl_outcome_opts *opts, const float *rewards,
                                         const float *mask, const int64_t *group, int64_t rows,
                                         int64_t cols, float *adv);
/* GDPO (verl "gdpo"): each reward term k (scores + k * rows: one score per row) is normalised
 * within the prompt groups as GRPO does (opts: epsilon, norm_by_std; groups of one keep their
 * score), the normalised terms are summed with weights (terms entries; NULL: 1 each), written to
 * every token (* mask) and whitened over the mask-1 tokens (needs 2 of them), * mask. */
MRL_API mrl_status mrl_gdpo(mrl_engine *e, const mrl_outcome_opts *opts, const double *scores,
                            const double *weights, int64_t terms, const float *mask,
                            const int64_t *group, int64_t rows, int64_t cols, float *adv);

/* -- the optimal token baseline (verl "optimal_token_baseline", "tir_optimal_token_baseline") */
typedef struct mrl_otb_opts {
  double epsilon;       /* added to the baseline's denominator (1e-8) */
  int handle_zero_tail; /* the longest row of a group, when it is the only one that long, gets
                           baseline 0 past the second-longest row's length (1) */
  int multi_turn;       /* 1: "tir_": each row's mask-1 tokens are packed to the left first, so
                           step j is a row's j-th sampled token (observations do not count) (0) */
} mrl_otb_opts;
MRL_API void mrl_otb_defaults(mrl_otb_opts *opts);
/* returns G = reverse cumulative sum of rewards * mask; per token w = 1 - 2 exp(old_logp) +
 * sum_pi_sq (the squared norm of the score function), times is_weights^2 when given (optional);
 * W = cumulative sum of w * mask along the row. Within a prompt group of 2 or more rows the
 * baseline of step t is B_t = sum G W m / (sum W m + epsilon) over the group's rows (a group of
 * one: B = 0); adv = (G - B) * mask. sum_pi_sq: the sum over the vocabulary of the squared
 * probabilities of the distribution each token was sampled from. All token arrays (rows, cols);
 * returns may be NULL. Token inputs at mask-0 positions are ignored. */
MRL_API mrl_status mrl_optimal_token_baseline(mrl_engine *e, const mrl_otb_opts *opts,
                                              const float *rewards, const float *mask,
                                              const int64_t *group, const float *old_logp,
                                              const float *sum_pi_sq, const float *is_weights,
                                              int64_t rows, int64_t cols, float *adv,
                                              float *returns);

/* -- token-level returns (1.1, 1.6, 1.8); all arrays (rows, cols); returns may be NULL -- */
/* GAE with a critic: mask-0 tokens neither bootstrap nor advance the recursion (observation
 * tokens are transparent). returns = advantages + values; adv is then whitened over the mask-1
 * tokens (fails below 2 of them) and left unmasked. gamma, lambda in [0, 1] (verl: 1, 1). */
MRL_API mrl_status mrl_gae(mrl_engine *e, const float *rewards, const float *values,
                           const float *mask, int64_t rows, int64_t cols, double gamma,
                           double lambda, float *adv, float *returns);
/* How REINFORCE++'s running return meets a mask-0 token (an observation inside a row). */
typedef enum mrl_return_rule {
  MRL_RETURN_CARRY = 0, /* verl 1dda039: the token gets return 0 and the running return passes it
                           unchanged, so credit crosses observations */
  MRL_RETURN_RESET = 1  /* before verl 8a1bf6d5b: the token gets the running return, which then
                           restarts from 0 (credit stops at each observation) */
} mrl_return_rule;
/* REINFORCE++: discounted return-to-go per row over the mask-1 tokens (returns; mask-0 tokens as
 * rule says); adv = returns whitened over the mask-1 tokens, * mask. */
MRL_API mrl_status mrl_reinforce_pp(mrl_engine *e, const float *rewards, const float *mask,
                                    int64_t rows, int64_t cols, double gamma, mrl_return_rule rule,
                                    float *adv, float *returns);
/* ReMax: returns = reverse cumulative sum of rewards * mask; adv = returns - baseline[b] * mask
 * (unmasked). baseline: rows rewards of the greedy rollouts. */
MRL_API mrl_status mrl_remax(mrl_engine *e, const float *rewards, const float *mask,
                             const double *baseline, int64_t rows, int64_t cols, float *adv,
                             float *returns);

/* -- OpenSearch-VL fatal-aware training (6.8) -- */
typedef enum mrl_fatal_reason {
  MRL_FATAL_NONE = 0,               /* not fatal */
  MRL_FATAL_CONSECUTIVE_ERRORS = 1, /* index: the first step of the first run of threshold errors */
  MRL_FATAL_NO_FINAL_ANSWER = 2,    /* no such run, no answer: index = steps (nothing masked) */
  MRL_FATAL_NO_STEPS = 3            /* index 0 */
} mrl_fatal_reason;
/* The fatal step of one trajectory from its per-step error flags (non-zero: the step failed).
 * *index gets -1 when the trajectory is not fatal. threshold >= 1 (3). */
MRL_API mrl_status mrl_fatal_step(mrl_engine *e, const uint8_t *step_is_error, int64_t steps,
                                  int answered, int threshold, int64_t *index,
                                  mrl_fatal_reason *reason);
/* In place on mask (rows, cols): for each row with fatal_index[b] >= 0, zeroes the mask from the
 * first token of its fatal_index[b]-th run of 1s (runs counted from 0) to the end. */
MRL_API mrl_status mrl_fatal_mask(mrl_engine *e, const int64_t *fatal_index, int64_t rows,
                                  int64_t cols, float *mask);
/* In place on adv (rows, cols): adv = max(adv, 0) on the rows whose is_fatal is non-zero, after
 * any estimator has used them in its group statistics. */
MRL_API mrl_status mrl_fatal_clamp(mrl_engine *e, const uint8_t *is_fatal, int64_t rows,
                                   int64_t cols, float *adv);

/* -- step- and trajectory-level methods (6.1 - 6.4, 6.5): rows are steps of trajectories -- */
/* Discounted returns R_k = r_k + gamma R_(k+1) over each trajectory's rows in batch order
 * (traj NULL: all rows are one trajectory, e.g. the turns of one episode). With env_step (Dr. MAS),
 * consecutive rows of a trajectory with equal env_step form one step whose reward is its first
 * row's and whose return every row of it gets. rewards, returns: n. */
MRL_API mrl_status mrl_step_returns(mrl_engine *e, const double *rewards, const int64_t *traj,
                                    const int64_t *env_step, int64_t n, double gamma,
                                    double *returns);

typedef enum mrl_norm_mode {
  MRL_NORM_MEAN = 0,    /* x - mean */
  MRL_NORM_MEAN_STD = 1 /* (x - mean) / (std + epsilon) */
} mrl_norm_mode;

typedef struct mrl_gigpo_opts {
  double epsilon;     /* 1e-6 */
  double step_weight; /* w of the step term (1) */
  mrl_norm_mode mode; /* MRL_NORM_MEAN */
  int dedup_traj;     /* episode statistics over one row per (group, traj), the first (0) */
} mrl_gigpo_opts;
MRL_API void mrl_gigpo_defaults(mrl_gigpo_opts *opts);

/* GiGPO: adv = (A_episode + w A_step) * mask. A_episode: the row score S (sum of its token
 * rewards) normalised within its prompt group (groups of one: mean 0, std 1). A_step: step_rewards
 * (the discounted returns of mrl_step_returns) normalised within the step group, the rows of one
 * prompt group with equal anchor (the environment state the step acted on; groups of one: 0).
 * BEACON's dual-scale advantage is this function with its milestone segment ids as anchors and
 * its shaped rewards as step_rewards. rewards, mask, adv, episode_adv, step_adv: (rows, cols);
 * step_rewards, group, traj, anchor, step_group: rows. step_group (optional) gets the dense step
 * group of each row, numbered in order of first appearance; traj is needed only with dedup_traj.
 * opts NULL: defaults. */
MRL_API mrl_status mrl_gigpo(mrl_engine *e, const mrl_gigpo_opts *opts, const float *rewards,
                             const double *step_rewards, const float *mask, const int64_t *group,
                             const int64_t *traj, const int64_t *anchor, int64_t rows, int64_t cols,
                             float *adv, float *episode_adv, float *step_adv, int64_t *step_group);

/* Dr. MAS (6.4). agent_wise: rows normalised within (prompt group, agent). Otherwise each
 * (group, traj) trajectory's rows' mean score is normalised among the trajectories of its prompt
 * group and given to all its rows. Groups of one keep their score. agent may be NULL when
 * agent_wise is 0. adv: (rows, cols). */
MRL_API mrl_status mrl_drmas(mrl_engine *e, const float *rewards, const float *mask,
                             const int64_t *group, const int64_t *traj, const int64_t *agent,
                             int64_t rows, int64_t cols, int agent_wise, int norm_by_std,
                             double epsilon, float *adv);

/* StepPO step-level GAE (6.3): step reward = sum of rewards * mask, step value = values[b, 0];
 * GAE along each trajectory's step indices (gaps are zero-reward, zero-value steps; a (traj, step)
 * pair appears once), whitened over the rows (unbiased std + 1e-8; needs 2 rows). adv and returns
 * (rows, cols) are masked. */
MRL_API mrl_status mrl_steppo_gae(mrl_engine *e, const float *rewards, const float *values,
                                  const float *mask, const int64_t *traj, const int64_t *step,
                                  int64_t rows, int64_t cols, double gamma, double lambda,
                                  float *adv, float *returns);

/* -- BEACON milestones (6.5) -- */
/* Static milestones: match[k] = the first action after milestone k-1's that is similar to
 * milestone k (mrl_text_similarity >= threshold), or -1 (and -1 for every later one). Texts are
 * len bytes (lens NULL: NUL-terminated). match: n_milestones. */
MRL_API mrl_status mrl_match_milestones(mrl_engine *e, const char *const *actions,
                                        const size_t *action_lens, int64_t n_actions,
                                        const char *const *milestones, const size_t *milestone_lens,
                                        int64_t n_milestones, double threshold, int64_t *match);
/* Segment rewards of one trajectory of `steps` steps from static matches (increasing, then -1s):
 * steps up to the k-th matched step get gamma^(distance to it) in segment k; after the last
 * match, 0 in the segment of the first unmatched milestone, or -1 when all matched. rewards,
 * segment: steps (unscaled: multiply by R_ms). */
MRL_API mrl_status mrl_milestone_segments(mrl_engine *e, int64_t steps, const int64_t *match,
                                          int64_t n_milestones, double gamma, double *rewards,
                                          int64_t *segment);
/* Dynamic milestones: rows are steps of trajectories (traj, batch order); a row with
 * is_milestone non-zero closes a segment. Rows up to it get scale * gamma^(distance), rows after a
 * trajectory's last milestone 0; segment = number of milestone rows before it in its trajectory. */
MRL_API mrl_status mrl_milestone_segments_dynamic(mrl_engine *e, const uint8_t *is_milestone,
                                                  const int64_t *traj, int64_t n, double gamma,
                                                  double scale, double *rewards, int64_t *segment);

/* -- text and action-sequence similarity -- */
/* Python difflib's SequenceMatcher(None, a, b).ratio() over Unicode code points (UTF-8 decoded;
 * each maximal invalid subpart counts as one symbol), with difflib's "popular element" heuristic
 * (autojunk) for b of 200 or more symbols. */
MRL_API mrl_status mrl_text_similarity(mrl_engine *e, const char *a, size_t a_len, const char *b,
                                       size_t b_len, double *ratio);
/* GiGPO's similarity step groups: within each prompt group, rows in batch order join the first
 * cluster whose first member is similar (ratio >= threshold, 0 < threshold < 1) or open a new
 * one. out: n dense cluster ids in order of creation. lens NULL: NUL-terminated texts. */
MRL_API mrl_status mrl_similarity_groups(mrl_engine *e, const char *const *texts,
                                         const size_t *lens, const int64_t *group, int64_t n,
                                         double threshold, int64_t *out);
/* Levenshtein distance of two symbol sequences divided by the longer length (0 when both are
 * empty). */
MRL_API mrl_status mrl_edit_distance(mrl_engine *e, const int64_t *a, int64_t a_len,
                                     const int64_t *b, int64_t b_len, double *out);

/* Selective rollout gate (6.9) over a group of trajs >= 2 action sequences: trajectory i's
 * actions (symbol ids) are actions[offsets[i] .. offsets[i + 1]). Prefixes of K actions are padded
 * with an end symbol unlike every action. */
typedef struct mrl_selective_gate {
  double edit_distance;  /* mean pairwise normalised edit distance of the prefixes */
  double termination;    /* fraction of trajectories with at most K - 1 actions */
  double unique_action;  /* distinct actions at position K - 1 / trajs */
  double unique_prefix;  /* distinct prefixes / trajs */
  double bigram_jaccard; /* mean pairwise Jaccard distance of the prefixes' bigram sets */
  double action_entropy; /* entropy of the actions at K - 1 / log(trajs) */
  int cut;               /* edit_distance < d_low or termination >= t_high */
} mrl_selective_gate;
MRL_API mrl_status mrl_selective_gate_eval(mrl_engine *e, const int64_t *actions,
                                           const int64_t *offsets, int64_t trajs, int64_t K,
                                           double d_low, double t_high, mrl_selective_gate *out);

/* -- A2TGPO (6.6) -- */
typedef struct mrl_a2tgpo_opts {
  double epsilon;   /* 1e-6 */
  double gamma;     /* discount of the accumulation (1) */
  double alpha;     /* weight of the information-gain term (0.3) */
  double clip_beta; /* turn clip scale 1 + beta (2 sigmoid(g) - 1) (0.3) */
  int ig_ddof;      /* 0: population std of the (group, turn) groups; 1: unbiased */
} mrl_a2tgpo_opts;
MRL_API void mrl_a2tgpo_defaults(mrl_a2tgpo_opts *opts);
/* trajs trajectories; trajectory i's information gains are ig[offsets[i] .. offsets[i + 1]), its
 * prompt group group[i] and its outcome reward outcome[i]. Per IG turn (offsets[trajs] entries):
 * normed (g, normalised within (group, turn index); groups of one: 0), accumulated (D),
 * turn_adv (alpha D + A_o) and clip_scale; per trajectory outcome_adv (A_o: GRPO of the outcomes,
 * the answer turn's advantage, clip scale 1). Outputs may be NULL. */
MRL_API mrl_status mrl_a2tgpo_advantages(mrl_engine *e, const mrl_a2tgpo_opts *opts,
                                         const double *ig, const int64_t *offsets,
                                         const int64_t *group, const double *outcome, int64_t trajs,
                                         double *normed, double *accumulated, double *turn_adv,
                                         double *clip_scale, double *outcome_adv);
/* The variance-rescaled discounted accumulation of one trajectory's normalised gains:
 * out[t] = sum_(j >= t) gamma^(j - t) g[j] / sqrt(n - t). */
MRL_API mrl_status mrl_a2tgpo_accumulate(mrl_engine *e, const double *g, int64_t n, double gamma,
                                         double *out);
/* Information gain per turn from f(c_0 .. c_n), the answer log-probability after each turn:
 * ig_logprob[t] = f[t + 1] - f[t], ig_prob[t] = exp(f[t + 1]) - exp(f[t]) (n - 1 entries each). */
MRL_API mrl_status mrl_information_gain(mrl_engine *e, const double *answer_logp, int64_t n,
                                        double *ig_logprob, double *ig_prob);

/* -- AEM (6.7): response-level entropy modulation -- */
/* Per group: alpha = 1 when max - min of mean_entropy < min_range, else
 * exp(-lambda h) / mean over the group, h the entropy scaled to [0, 1]; adv = alpha base_adv.
 * All arrays n; alpha optional. */
MRL_API mrl_status mrl_aem(mrl_engine *e, const double *base_adv, const double *mean_entropy,
                           const int64_t *group, int64_t n, double lambda, double min_range,
                           double *adv, double *alpha);
/* out[b] = mean of x over row b's mask-1 tokens (0 for an empty row). */
MRL_API mrl_status mrl_row_mean(mrl_engine *e, const float *x, const float *mask, int64_t rows,
                                int64_t cols, double *out);

/* -- DAPO (5) -- */
/* Dynamic sampling: keep[i] = 1 when row i's group has a population std of metric > 0 or a single
 * member, else 0 (a zero-variance group teaches nothing). kept_groups (optional) gets the number
 * of groups kept. The caller samples on until it has enough. */
MRL_API mrl_status mrl_dapo_filter(mrl_engine *e, const double *metric, const int64_t *group,
                                   int64_t n, uint8_t *keep, int64_t *kept_groups);
/* Overlong shaping: penalty[i] = min(-(len - (max_len - buffer)) / buffer * factor, 0), added to
 * the reward of a response of len tokens; paper_floor also floors it at -factor. */
MRL_API mrl_status mrl_overlong_penalty(mrl_engine *e, const int64_t *lengths, int64_t n,
                                        int64_t max_len, int64_t buffer, double factor,
                                        int paper_floor, double *penalty);

/* -- Freshness-aware prioritised replay (6.10) -- */
/* priority = (|reward| + eps) exp(-max(age, 0) / decay). */
MRL_API mrl_status mrl_per_reward_priority(mrl_engine *e, const double *reward, const double *age,
                                           int64_t n, double eps, double decay, double *out);
/* priority = max(base exp(-max(age, 0) / decay), floor). */
MRL_API mrl_status mrl_per_priority(mrl_engine *e, const double *base, const double *age, int64_t n,
                                    double decay, double floor, double *out);
/* probs[i] = p^alpha / sum p^alpha over n; weights[j] of the sampled entries =
 * (n P)^(-beta) / max over all entries of (n P)^(-beta). Either output may be NULL. */
MRL_API mrl_status mrl_per_sampling(mrl_engine *e, const double *priority, int64_t n, double alpha,
                                    double beta, const int64_t *sampled, int64_t n_sampled,
                                    double *probs, double *weights);
/* beta annealed linearly from start (step 0) to end (step total - 1), constant after. */
MRL_API mrl_status mrl_per_beta(mrl_engine *e, int64_t step, int64_t total, double start,
                                double end, double *out);

/* -- Replay buffer arithmetic (rl.replay) -- */
/* Sampling weight of each entry: w[i] = max(priority[i], floor)^alpha * exp(-max(age[i], 0) /
 * decay), so that a weight halves every decay * ln 2 steps whatever alpha is (decay = INFINITY:
 * no decay). priority >= 0 and age finite; alpha >= 0, decay > 0, floor > 0. */
MRL_API mrl_status mrl_replay_weights(mrl_engine *e, const double *priority, const double *age,
                                      int64_t n, double alpha, double decay, double floor,
                                      double *w);
/* k distinct entries of n (k <= n) drawn one after the other without replacement. Draw j reads
 * the uniforms u[2j] and u[2j + 1] (each in [0, 1)): when u[2j] < staleness, or when no entry
 * left has a positive weight, it takes the least recently used entry left (smallest last[i],
 * then smallest i: PLR's staleness revisit) and sets stale[j] = 1; otherwise the entry whose
 * cumulative weight among those left (in index order) first exceeds u[2j + 1] times their total.
 * out[j] gets the entry's index (0-based). prob[j] (optional) gets its first-draw probability
 * (1 - staleness) w / sum w + staleness [it is the least recently used entry], is_weight[j]
 * (optional) the importance weight (n prob[j])^-beta divided by the largest of the k;
 * stale (optional) as said. w >= 0 and finite; staleness in [0, 1], beta >= 0. */
MRL_API mrl_status mrl_replay_draw(mrl_engine *e, const double *w, const int64_t *last, int64_t n,
                                   double staleness, double beta, const double *u, int64_t k,
                                   int64_t *out, double *prob, double *is_weight, uint8_t *stale);
/* Importance ratios of episodes laid out flat (episode i holds positions offsets[i] ..
 * offsets[i + 1] - 1, offsets[0] = 0, non-decreasing, offsets[episodes] = the token count):
 * ratio[i] = exp(mean over episode i's mask-1 tokens of logp - behaviour) (1 when it has none),
 * the per-token geometric mean of pi / pi_behaviour. token_weight (optional, offsets[episodes]
 * floats) gets min(exp(logp - behaviour), cap) on mask-1 tokens and 1 elsewhere (cap > 0, may be
 * INFINITY). */
MRL_API mrl_status mrl_replay_ratios(mrl_engine *e, const float *logp, const float *behaviour,
                                     const float *mask, const int64_t *offsets, int64_t episodes,
                                     double cap, double *ratio, float *token_weight);

/* -- PACEvolve++ (6.11) -- */
/* Best-of-k frontier weights over all size-k subsets S (2 <= k <= n), in closed form:
 * SLOO (pkpo 0): mean over S containing i of max(S) - max(S without i); PKPO: of max(S). */
MRL_API mrl_status mrl_frontier_weights(mrl_engine *e, const double *rewards, int64_t n, int64_t k,
                                        int pkpo, double *out);
/* Reward shaping: scale * clip((y - y_init) / (y_target - y_init), 0, 1)^alpha_r; y not finite
 * (a failed evaluation): -1. y_target must be above y_init (below it when lower_is_better). */
MRL_API mrl_status mrl_pace_shape(mrl_engine *e, const double *y, int64_t n, double y_init,
                                  double y_target, int lower_is_better, double alpha_r,
                                  double scale, double *out);
/* Phase weight clip(step / (total - 1), 0, 1) (0 when total <= 1). */
MRL_API double mrl_pace_phase(int64_t step, int64_t total);
enum {
  MRL_PACE_COLLAPSED_GROUP = 1, /* the group branch has weight and population std < 1e-6 */
  MRL_PACE_COLLAPSED_TOPK = 2,  /* the top-k branch likewise */
  MRL_PACE_NONFINITE = 4        /* a reward is not finite */
};
/* adv = (1 - alpha) z(r - mean) + alpha z(SLOO_k) with z(x) = (x - mean)/(population std + 1e-8)
 * (0 for a constant x). *skip gets the MRL_PACE_* reasons to skip the update (0: none; adv is then
 * not written). a_group and a_topk (optional) get the two branches. All arrays n. */
MRL_API mrl_status mrl_pace_advantage(mrl_engine *e, const double *rewards, int64_t n, int64_t k,
                                      double alpha, double *adv, double *a_group, double *a_topk,
                                      int *skip);

/* -- KL to a reference (2) -- */
typedef enum mrl_kl_kind {
  MRL_KL_K1 = 0,      /* d = logp - ref_logp ("kl") */
  MRL_KL_ABS = 1,     /* |d| */
  MRL_KL_K2 = 2,      /* d^2 / 2 ("mse") */
  MRL_KL_K3 = 3,      /* low-variance: x = clip(-d, -20, 20), clip(e^x - x - 1, -10, 10) */
  MRL_KL_K1_PLUS = 4, /* k1's value with k2's gradient (straight-through; verl "kl+", "k1+") */
  MRL_KL_K3_PLUS = 5, /* k3's value with k2's gradient ("low_var_kl+", "k3+") */
  MRL_KL_ABS_PLUS = 6 /* |d| with k2's gradient ("abs+"; "mse+" and "k2+" are k2 itself) */
} mrl_kl_kind;
/* Per element: kl[i] and grad[i] = d kl / d logp (either may be NULL). */
MRL_API mrl_status mrl_kl(mrl_engine *e, mrl_kl_kind kind, const float *logp, const float *ref_logp,
                          int64_t n, float *kl, float *grad);
/* KL as a loss term: *loss = coef * agg(KL(logp, ref_logp)); dlogp += its gradient. */
MRL_API mrl_status mrl_kl_loss(mrl_engine *e, mrl_kl_kind kind, mrl_loss_agg mode, double norm,
                               double coef, const float *logp, const float *ref_logp,
                               const float *mask, int64_t rows, int64_t cols, double *loss,
                               float *dlogp);
/* KL in the reward: rewards = scores - beta KL(old_logp, ref_logp) mask; *current_kl (optional) =
 * mean over rows of the masked mean of KL (what the adaptive controller reads). */
MRL_API mrl_status mrl_kl_reward(mrl_engine *e, mrl_kl_kind kind, double beta, const float *scores,
                                 const float *old_logp, const float *ref_logp, const float *mask,
                                 int64_t rows, int64_t cols, float *rewards, double *current_kl);
/* The adaptive KL controller: *out = value (1 + clip(current_kl / target - 1, -0.2, 0.2)
 * n_steps / horizon). */
MRL_API mrl_status mrl_kl_adaptive(mrl_engine *e, double value, double current_kl, int64_t n_steps,
                                   double target, double horizon, double *out);
/* TT-OPD turn-level KL (6.12): per row, per turn k < turns (turn[b, t]: the token's 0-based turn,
 * -1 for none), KL_k = mean over the turn's mask-1 tokens of the estimator of student - teacher;
 * a row's value is the weights-weighted mean of its turns that have tokens (turn_weights
 * (rows, turns), NULL: 1), and *loss the mean over rows with such turns. per_turn (rows, turns)
 * gets KL_k (0 for a turn without tokens); dlogp += the gradient with respect to student. */
MRL_API mrl_status mrl_turn_kl_loss(mrl_engine *e, mrl_kl_kind kind, const float *student,
                                    const float *teacher, const float *mask, const int32_t *turn,
                                    int64_t rows, int64_t cols, int64_t turns,
                                    const double *turn_weights, double *loss, double *per_turn,
                                    float *dlogp);
/* In place: teacher = decay teacher + (1 - decay) student, decay in [0, 1]. */
MRL_API mrl_status mrl_ema_update(mrl_engine *e, float *teacher, const float *student, int64_t n,
                                  double decay);

/* -- entropy bonus and value loss -- */
/* *loss = -coef * agg(entropy) (a bonus: minimising it raises entropy); dentropy += gradient. */
MRL_API mrl_status mrl_entropy_bonus(mrl_engine *e, mrl_loss_agg mode, double norm, double coef,
                                     const float *entropy, const float *mask, int64_t rows,
                                     int64_t cols, double *loss, float *dentropy);
/* Clipped critic loss (4.7): vc = clip(vpred, values - clip, values + clip),
 * *loss = agg(max((vpred - R)^2, (vc - R)^2)) / 2, *clipfrac (optional) = share of tokens where
 * the clipped term is larger; dvpred += the gradient with respect to vpred. */
MRL_API mrl_status mrl_value_loss(mrl_engine *e, mrl_loss_agg mode, double norm, double clip,
                                  const float *vpred, const float *values, const float *returns,
                                  const float *mask, int64_t rows, int64_t cols, double *loss,
                                  double *clipfrac, float *dvpred);

/* -- policy losses (4) -- with ratio = exp(clip(logp - old_logp, -20, 20)) per token -- */
typedef enum mrl_pg_kind {
  MRL_PG_PPO = 0,   /* max(-A r, -A clip(r, 1 - lo, 1 + hi)), capped at -A c when A < 0 (dual) */
  MRL_PG_GSPO = 1,  /* PPO on the sequence ratio exp(min(masked mean log ratio, 10)), each token
                       getting its gradient through its own log-probability; seq-mean-token-mean */
  MRL_PG_CISPO = 2, /* -stopgrad(clip(r, 1 - lo, 1 + hi)) A logp */
  MRL_PG_SAPO = 3,  /* -A sigmoid(tau (r - 1)) 4 / tau, tau by the sign of A; seq-mean-token-mean */
  MRL_PG_GPG = 4,   /* -A logp (REINFORCE); old_logp may be NULL */
  MRL_PG_GMPO = 5,  /* geometric mean: mean over rows of -mean(A) exp(mean log ratio clipped to
                       [-lo, hi] on the side of A's sign), times the row's geometric mean of the
                       IS weights (verl 1dda039); no per-token loss */
  /* DPPO (verl "dppo_tv", "dppo_kl"): -A sg(min(r, c)) logp on the tokens inside the divergence
   * trust region, 0 outside it. p = exp(logp), q = exp(old_logp). */
  MRL_PG_DPPO_TV = 6, /* inside: A > 0 and p - q <= hi, or A <= 0 and p - q >= -lo */
  MRL_PG_DPPO_KL = 7, /* inside, with the binary KL k = q log(q / p) + (1 - q)
                         log((1 - q + 1e-8) / (1 - p + 1e-8)): A > 0 and (k <= hi or p <= q), or
                         A <= 0 and (k <= lo or p >= q) */
  MRL_PG_CLIP_COV = 8, /* verl "clip_cov": PPO without dual clip and without the +-20 clamp,
                          except on a random cov_ratio share (at least 1) of the unclipped tokens
                          whose covariance (A - mean A)(logp - mean logp) lies in (cov_lb,
                          cov_ub): they get loss 0 */
  MRL_PG_KL_COV = 9,   /* verl "kl_cov": -A r (no clip, no clamp) plus kl_coef |logp - old_logp|
                          on the cov_ratio share (at least 1) of tokens with the largest
                          covariance (ties: the earlier token) */
  MRL_PG_DRO = 10,     /* verl "dro": -A logp + dro_beta / 2 (logp - old_logp)^2 */
  MRL_PG_REINFORCE = 11 /* verl's REINFORCE loss (bypass mode): -A logp, times the IS weights;
                           seq-mean-token-sum by default; old_logp (the rollout's) optional */
} mrl_pg_kind;

typedef struct mrl_pg_opts {
  mrl_loss_agg agg; /* token-mean; REINFORCE seq-mean-token-sum (GSPO, SAPO, GMPO: their own) */
  double agg_norm;  /* C of the sum-norm modes (<= 0: cols) */
  double clip_low;  /* PPO, DPPO, clip-cov 0.2; GSPO 3e-4; CISPO 10 (>= 1: no lower bound); GMPO
                       0.4 (log); DPPO: the divergence bounds */
  double clip_high; /* PPO, DPPO, clip-cov 0.2 (0.28: DAPO clip-higher); GSPO 4e-4; CISPO 0.2;
                       GMPO 0.4 */
  double clip_c;    /* PPO dual clip, > 1 (3; INFINITY: off); DPPO's truncation of the ratio,
                       > 0 (3, verl's ActorConfig; its DPPO recipe sets 10000) */
  double tau_pos;   /* SAPO gate temperature for A > 0 (1) */
  double tau_neg;   /* ... and for A <= 0 (1.05) */
  double cov_ratio; /* clip-cov, kl-cov: the share of tokens chosen (2e-4) */
  double cov_lb;    /* clip-cov: the covariance window (1) ... */
  double cov_ub;    /* ... (5) */
  double kl_coef;   /* kl-cov: the coefficient of |log ratio| (0.1, verl's ppo_kl_coef) */
  double dro_beta;  /* DRO: the quadratic penalty, > 0 (no default: 0 is refused) */
  uint64_t seed;    /* clip-cov: the random choice of tokens (0) */
} mrl_pg_opts;
/* Fills *opts with kind's defaults (listed above). */
MRL_API void mrl_pg_defaults(mrl_pg_kind kind, mrl_pg_opts *opts);

typedef struct mrl_pg_stats {
  double loss;
  double clipfrac;       /* PPO, GSPO: masked share of clipped tokens; CISPO: ratio != clip;
                            GMPO: clipped tokens with A > 0; DPPO: tokens outside the trust
                            region; clip-cov: tokens given loss 0; kl-cov: tokens given the KL */
  double clipfrac_lower; /* PPO: share of A < 0 tokens under the dual clip; GMPO: clipped, A < 0;
                            DPPO: tokens inside whose ratio exceeds clip_c */
  double ppo_kl;         /* masked mean of old_logp - logp (0 without old_logp); kl-cov: of
                            |logp - old_logp| */
} mrl_pg_stats;

/* logp (the policy's log-probabilities of the sampled tokens, what the gradient is taken with
 * respect to), old_logp (behaviour), adv, mask, is_weights (optional per-token importance
 * weights multiplying the loss; GMPO: >= 0, their per-row geometric mean
 * exp(sum m log(w + 1e-10) / (sum m + 1e-8)) multiplies the row's term): (rows, cols). Outputs: *stats; token_loss (rows, cols, not for
 * GMPO) the per-token loss before aggregation; seq_ratio (rows, GSPO and GMPO) and seq_adv (rows,
 * GMPO); dlogp (rows, cols) += d loss / d logp. opts NULL: kind's defaults. */
MRL_API mrl_status mrl_policy_loss(mrl_engine *e, mrl_pg_kind kind, const mrl_pg_opts *opts,
                                   const float *logp, const float *old_logp, const float *adv,
                                   const float *mask, const float *is_weights, int64_t rows,
                                   int64_t cols, mrl_pg_stats *stats, float *token_loss,
                                   double *seq_ratio, double *seq_adv, float *dlogp);
/* A2TGPO's loss (6.6): PPO without dual clip whose clip range is scaled per token,
 * [1 - clip_low c, 1 + clip_high c] with c = clip_scale[b, t]; with turn_level, the ratio of a
 * token is exp(mean log ratio over the mask-1 tokens of its turn) (turn[b, t] >= 0; tokens
 * outside turns get ratio 1). ratio (optional, rows x cols) gets the ratios used. opts: clip_low,
 * clip_high, agg and agg_norm are read (NULL: PPO's defaults). */
MRL_API mrl_status mrl_a2tgpo_loss(mrl_engine *e, const mrl_pg_opts *opts, int turn_level,
                                   const float *logp, const float *old_logp, const float *adv,
                                   const float *mask, const int32_t *turn, const float *clip_scale,
                                   int64_t rows, int64_t cols, mrl_pg_stats *stats,
                                   float *token_loss, float *ratio, float *dlogp);

/* -- rollout correction (verl's rollout_corr_helper): importance weights and rejection masks for
 * the mismatch between the policy that sampled (rollout_logp) and the one trained (logp) -- */
typedef enum mrl_rollout_is_level {
  MRL_ROLLOUT_IS_NONE = 0,    /* no weights */
  MRL_ROLLOUT_IS_TOKEN = 1,   /* w = exp(clip(logp - rollout_logp, -20, 20)) per token */
  MRL_ROLLOUT_IS_SEQUENCE = 2 /* w = exp(clip(sum over the row's mask-1 tokens, -20, 20)) */
} mrl_rollout_is_level;

/* Rejection criteria on the log ratio x = clip(logp - rollout_logp, -20, 20) per token:
 * k1 = -x, k2 = x^2 / 2, k3 = e^x - 1 - x. Token criteria reject tokens; the others reject whole
 * rows: their sum (seq_sum), masked mean (seq_mean) or maximum (seq_max) over the row's mask-1
 * tokens. A k1 criterion keeps log(lower) <= value <= log(upper); the others value <= upper. */
typedef enum mrl_rollout_rs_kind {
  MRL_RS_TOKEN_K1 = 0,
  MRL_RS_TOKEN_K2 = 1,
  MRL_RS_TOKEN_K3 = 2,
  MRL_RS_SEQ_SUM_K1 = 3,
  MRL_RS_SEQ_SUM_K2 = 4,
  MRL_RS_SEQ_SUM_K3 = 5,
  MRL_RS_SEQ_MEAN_K1 = 6,
  MRL_RS_SEQ_MEAN_K2 = 7,
  MRL_RS_SEQ_MEAN_K3 = 8,
  MRL_RS_SEQ_MAX_K2 = 9,
  MRL_RS_SEQ_MAX_K3 = 10,
  MRL_RS_BINARY_KL = 11 /* per token max(KL(p || q), KL(q || p)) of the Bernoulli distributions
                           of p = exp(logp), q = exp(rollout_logp), each clamped to
                           [1e-6, 1 - 1e-6] */
} mrl_rollout_rs_kind;

typedef struct mrl_rollout_rs {
  mrl_rollout_rs_kind kind;
  double upper; /* > 0 */
  double lower; /* k1 criteria: > 0, <= upper (<= 0: 1 / upper); ignored by the others */
} mrl_rollout_rs;

typedef struct mrl_rollout_corr_opts {
  mrl_rollout_is_level is;
  double is_upper;        /* truncation: w = min(w, is_upper) (> 0; verl's default 2) */
  double is_lower;        /* > 0: mask instead of truncate ("IcePop"): w = 0 outside
                             [is_lower, is_upper]; 0: truncate */
  int is_batch_normalize; /* divide by the mean weight (over tokens, or over rows with a token
                             for sequence weights) when it is above 1e-8 */
  const mrl_rollout_rs *rs; /* n_rs criteria, all of which a token must pass (borrowed) */
  int64_t n_rs;
} mrl_rollout_corr_opts;

typedef struct mrl_rollout_corr_stats {
  double is_mean;            /* masked mean of the weights before batch normalisation */
  double is_fraction_high;   /* share of tokens (rows, sequence level) whose raw weight is above
                                is_upper ... */
  double is_fraction_low;    /* ... or below is_lower (1 / is_upper when truncating) */
  double is_norm_factor;     /* what batch normalisation divided by (1: none) */
  double rs_masked_fraction; /* share of mask-1 tokens rejected */
  double rs_seq_masked_fraction; /* share of rows with a rejected token */
  double kl;                 /* masked mean of rollout_logp - logp */
  double k3_kl;              /* masked mean of e^x - x - 1 (x unclamped) */
} mrl_rollout_corr_stats;

/* logp, rollout_logp, mask: (rows, cols); the mask needs a mask-1 token. weights (rows, cols;
 * needed when opts->is is not NONE) get the IS weights (0 at mask-0 tokens), mask_out (rows,
 * cols; may be mask itself) the mask with the rejected tokens zeroed, stats (optional) the
 * diagnostics. */
MRL_API mrl_status mrl_rollout_correction(mrl_engine *e, const mrl_rollout_corr_opts *opts,
                                          const float *logp, const float *rollout_logp,
                                          const float *mask, int64_t rows, int64_t cols,
                                          float *weights, float *mask_out,
                                          mrl_rollout_corr_stats *stats);

/* ---- sandbox -------------------------------------------------------------------------------
 * Runs tool commands that a model wrote, in fresh Linux namespaces set up in-process (no helper
 * binary): user (the tool runs as an unprivileged host uid, uid 1000 inside), mount (a read-only
 * view of an allow-list of host paths, a private tmpfs working dir /work and a tmpfs /tmp, a fresh
 * /proc, no /sys), pid (a reaper is pid 1; when the tool ends every process left is killed), net
 * (only a loopback interface, down), ipc and uts; an empty environment plus PATH, HOME=/work and
 * LANG=C.UTF-8; only fds 0-2; rlimits; pids, memory and CPU cgroups where the host has them;
 * no_new_privs, a parent-death signal and a seccomp filter compiled once per pool.
 *
 * A pool (mrl_sandbox) is created once: it probes what the host offers and compiles the filter.
 * A call runs blocking (mrl_sandbox_run) or starts a job (mrl_sandbox_start) whose fd can be
 * polled; at most `max_jobs` run at once and further jobs wait in a FIFO queue. Time limits and
 * output are handled while the pool is pumped: by mrl_sandbox_run and mrl_sandbox_job_wait, and
 * by mrl_sandbox_job_poll on any of its jobs (call it whenever a job's fd is readable). An idle
 * pool keeps one sandbox ready (namespaces made, root built): a process and six fds.
 *
 * Linux (x86_64, aarch64) only. The sandbox's pid 1 shares the caller's memory (it never execs),
 * so a big engine costs no page-table copy per call; it receives SIGKILL when the thread that
 * made it ends (the parent-death signal): use a pool from one long-lived thread. */
typedef struct mrl_sandbox mrl_sandbox;         /* a pool */
typedef struct mrl_sandbox_job mrl_sandbox_job; /* one started (or queued) call */

/* Protections, as bits. Mount and pid namespaces are the foundation: a host without them (and
 * without root or user namespaces) gets no pool at all. The others can be missing on a host, or
 * be turned off on purpose (mrl_sandbox_config.disable). Rlimits, no_new_privs and the
 * parent-death signal are always applied. */
enum {
  MRL_SANDBOX_PROT_USER = 1 << 0,    /* "user": user namespace, the tool's uid is unprivileged */
  MRL_SANDBOX_PROT_MOUNT = 1 << 1,   /* "mount": read-only view, private /work and /tmp */
  MRL_SANDBOX_PROT_PID = 1 << 2,     /* "pid": pid namespace with a reaper, fresh /proc */
  MRL_SANDBOX_PROT_NET = 1 << 3,     /* "net": no network */
  MRL_SANDBOX_PROT_IPC = 1 << 4,     /* "ipc": private System V IPC and POSIX queues */
  MRL_SANDBOX_PROT_UTS = 1 << 5,     /* "uts": own hostname ("sandbox") */
  MRL_SANDBOX_PROT_SECCOMP = 1 << 6, /* "seccomp": the system-call filter */
  MRL_SANDBOX_PROT_PIDS = 1 << 7,    /* "pids": pids cgroup (fork bombs stop at the limit) */
  MRL_SANDBOX_PROT_MEMORY = 1 << 8,  /* "memory": memory cgroup (clean OOM kill; else RLIMIT_AS) */
  MRL_SANDBOX_PROT_CPU = 1 << 9,     /* "cpu": CPU time of the whole process tree (cgroup) */
  MRL_SANDBOX_PROT_ALL = (1 << 10) - 1
};

/* Static name of one protection bit ("user", "net", ...); NULL for anything else. */
MRL_API const char *mrl_sandbox_protection_name(unsigned bit);

/* Limits of one call. A field left 0 takes the pool's value, and the pool's 0 fields take the
 * defaults in parentheses. Negative values are invalid. */
typedef struct mrl_sandbox_limits {
  int64_t wall_ms;   /* wall-clock time, then SIGKILL of the whole tree (10000) */
  int64_t cpu_ms;    /* CPU time of the whole tree; per process without the cpu cgroup (10000) */
  int64_t mem_bytes; /* memory: cgroup limit, else RLIMIT_AS per process (1 GiB) */
  int64_t pids;      /* processes and threads: cgroup, else RLIMIT_NPROC (64) */
  int64_t out_cap;   /* bytes of stdout and of stderr kept, head and tail halves (1 MiB) */
  int64_t out_kill;  /* total output past which the tool is killed (64 MiB) */
  int64_t fsize;     /* largest file the tool may write (16 MiB) */
  int64_t nofile;    /* open files per process (64) */
  int64_t disk_bytes; /* size of each of the tmpfs /work and /tmp (64 MiB) */
  int64_t files_cap; /* bytes of written files returned; later files are left out (16 MiB) */
} mrl_sandbox_limits;

/* Pool settings; a zeroed struct (or NULL) gives the defaults. */
typedef struct mrl_sandbox_config {
  mrl_sandbox_limits limits;   /* defaults for the pool's calls */
  int max_jobs;                /* jobs running at once (32); more wait in a FIFO queue */
  const char *const *ro_paths; /* NULL-terminated absolute host paths shown read-only in
                                  addition to the built-in list (/usr, /bin, /sbin, /lib*,
                                  and a few files of /etc); NULL for none */
  unsigned require;            /* protections the pool must have: else MRL_ERR_UNSUPPORTED */
  unsigned disable;            /* protections to leave off (user, net, ipc, uts, seccomp,
                                  pids, memory, cpu; mount and pid cannot be turned off) */
  int64_t host_uid, host_gid;  /* when the caller is root: the host ids tools run as (65534,
                                  65534); 0 means the default (a tool never runs as root) */
} mrl_sandbox_config;

/* Creates a pool (probing takes a few milliseconds: it runs one trial call). Fails with
 * MRL_ERR_UNSUPPORTED and a message naming each missing protection when `require` asks for one
 * the host lacks, or when the host cannot run a sandbox at all. The config and its strings are
 * copied. *out: caller owns, free with mrl_sandbox_free. Retains e. */
MRL_API mrl_status mrl_sandbox_new(mrl_engine *e, const mrl_sandbox_config *config,
                                   mrl_sandbox **out);
/* Releases the caller's reference: jobs still running are killed and reaped. The pool's memory
 * lives on until its last job is freed. */
MRL_API void mrl_sandbox_free(mrl_sandbox *p);

/* The protections in effect (MRL_SANDBOX_* bits); 0 for NULL. */
MRL_API unsigned mrl_sandbox_protections(const mrl_sandbox *p);
/* Why a protection is off ("disabled by the caller", "user namespaces are not available: ..."),
 * or how it is provided when on ("cgroup v1 /sys/fs/cgroup/pids/..."). Borrowed: lives as long
 * as the pool. NULL for an unknown bit or a NULL pool. */
MRL_API const char *mrl_sandbox_protection_note(const mrl_sandbox *p, unsigned bit);

/* A file placed in the working dir before the call, or written there by the tool. */
typedef struct mrl_sandbox_file {
  const char *name; /* relative path ("a.txt", "src/main.c"): no "..", no empty components */
  const char *data; /* len bytes, any bytes */
  size_t len;
} mrl_sandbox_file;

/* One call. Zero-initialize, then set argv and whatever else is needed. Everything is copied by
 * mrl_sandbox_run / mrl_sandbox_start: the caller may free it when they return. */
typedef struct mrl_sandbox_call {
  const char *const *argv;   /* NULL-terminated; argv[0] is searched in PATH unless it has '/' */
  const char *const *env;    /* NULL-terminated "NAME=value" entries added to (or replacing)
                                PATH, HOME and LANG; NULL for none */
  const char *stdin_data;    /* the tool's stdin (a sealed read-only file); NULL: empty */
  size_t stdin_len;
  const mrl_sandbox_file *files; /* nfiles entries written into /work before the start */
  size_t nfiles;
  mrl_sandbox_limits limits; /* 0 fields: the pool's limits */
} mrl_sandbox_call;

/* What happened, in order of precedence. */
typedef enum mrl_sandbox_status {
  MRL_SANDBOX_EXITED = 0,       /* "exited": the tool exited (exit_code) */
  MRL_SANDBOX_SIGNALED = 1,     /* "signaled": a signal ended it (signal), incl. a caller kill */
  MRL_SANDBOX_TIMEOUT = 2,      /* "timeout": wall-clock limit; the tree was killed */
  MRL_SANDBOX_CPU_LIMIT = 3,    /* "cpu_limit": CPU time limit */
  MRL_SANDBOX_OOM = 4,          /* "oom": killed by the memory cgroup's OOM killer */
  MRL_SANDBOX_PIDS_LIMIT = 5,   /* "pids_limit": a fork failed at the process limit: killed */
  MRL_SANDBOX_OUTPUT_LIMIT = 6, /* "output_limit": more than out_kill bytes of output: killed */
  MRL_SANDBOX_SECCOMP = 7,      /* "seccomp": killed for a forbidden system call */
  MRL_SANDBOX_SETUP_ERROR = 8   /* "setup_error": the call could not be started (message) */
} mrl_sandbox_status;

/* Static name of a status ("exited", ...); "unknown" for other values. */
MRL_API const char *mrl_sandbox_status_name(mrl_sandbox_status s);

/* The result of a call. Read-only for the caller; freed with mrl_sandbox_result_free. */
typedef struct mrl_sandbox_result {
  mrl_sandbox_status status;
  int exit_code;          /* EXITED: the exit code (0..255); otherwise -1 */
  int signal;             /* the signal that ended the tool (SIGKILL for kills), else 0 */
  const char *out;        /* stdout bytes kept (NUL-terminated for convenience; may hold NULs) */
  size_t out_len;
  uint64_t out_total;     /* bytes the tool wrote to stdout */
  int out_truncated;      /* out_total > out_len: out is the first ceil(cap/2) bytes followed
                             by the last floor(cap/2) bytes */
  const char *err;        /* the same for stderr */
  size_t err_len;
  uint64_t err_total;
  int err_truncated;
  double wall_ms;         /* from the start to the end of the teardown */
  double cpu_ms;          /* user + system time of the whole tree */
  int64_t max_rss_kb;     /* peak resident memory of the largest process */
  const mrl_sandbox_file *files; /* regular files in /work that are new or changed, by path */
  size_t nfiles;
  int files_truncated;    /* some were left out (files_cap, or more than 1024 files) */
  const char *message;    /* what went wrong for SETUP_ERROR and the limits, else "" */
} mrl_sandbox_result;

MRL_API void mrl_sandbox_result_free(mrl_sandbox_result *r);

/* Runs a call and waits for it. Errors of the call itself (a program that does not exist, a
 * limit) are results, not failures: the function fails only for bad arguments (MRL_ERR_NULL,
 * MRL_ERR_INVALID: a file name with "..", an empty argv) and for resources the engine lacks
 * (MRL_ERR_NOMEM, MRL_ERR_IO when pipes or processes cannot be created). *out: caller owns. */
MRL_API mrl_status mrl_sandbox_run(mrl_sandbox *p, const mrl_sandbox_call *call,
                                   mrl_sandbox_result **out);

/* Starts a call (or queues it when max_jobs are running). *out: caller owns, free with
 * mrl_sandbox_job_free; the pool lives at least as long as its jobs. */
MRL_API mrl_status mrl_sandbox_start(mrl_sandbox *p, const mrl_sandbox_call *call,
                                     mrl_sandbox_job **out);
/* A file descriptor that is readable whenever the job needs attention (and from the moment it
 * is done on): poll it, then call mrl_sandbox_job_poll. Borrowed: valid until job_free. -1 for
 * NULL. */
MRL_API int mrl_sandbox_job_fd(const mrl_sandbox_job *j);
/* Makes progress on every job of the pool without blocking; *done tells whether this job is. */
MRL_API mrl_status mrl_sandbox_job_poll(mrl_sandbox_job *j, int *done);
/* Waits until the job is done and hands over its result (once: a second call fails with
 * MRL_ERR_INVALID). *out: caller owns, mrl_sandbox_result_free. */
MRL_API mrl_status mrl_sandbox_job_wait(mrl_sandbox_job *j, mrl_sandbox_result **out);
/* Kills the job's whole process tree (a queued job never starts); its status becomes
 * SIGNALED with SIGKILL unless it had already ended. Killing a finished job does nothing. */
MRL_API mrl_status mrl_sandbox_job_kill(mrl_sandbox_job *j);
/* Kills the job if it still runs, reaps it, and releases it (and its result if not taken). */
MRL_API void mrl_sandbox_job_free(mrl_sandbox_job *j);

/* ---- HTTP client ---------------------------------------------------------------------------
 * An HTTP/1.1 (and HTTP/2 over TLS) client over libcurl's multi interface, for remote policies,
 * judges and task synthesizers. One client (mrl_http) owns one connection pool and drives any
 * number of requests at once from the calling thread: mrl_http_poll makes progress on all of them.
 * At most `max_connections` requests run at once per endpoint (scheme, host and port); the rest
 * wait in FIFO order. A failed attempt is retried (up to `retries` more) when it failed before
 * any byte reached the caller's on_data: connection errors (refused, reset, nothing received,
 * timeouts) and the statuses 408, 409, 429 and 5xx (a response header `x-should-retry: true` or
 * `false` overrides the status). The wait before a retry is the response's `retry-after-ms`, else
 * its `Retry-After` (seconds or an HTTP date), capped at `retry_after_max_ms`; without either it
 * is backoff_ms * 2^(n-1), capped at backoff_max_ms, less up to 25% jitter drawn from the
 * client's own RNG (seeded with `seed`: the same seed gives the same waits). Once a byte of a
 * streamed body was handed to on_data the request is never retried: a failure after that point
 * ends it with MRL_HTTP_FAILED and `delivered` > 0.
 *
 * Nothing is printed. Proxies follow libcurl's environment variables (http_proxy, no_proxy). */
typedef struct mrl_http mrl_http;                 /* a client: connection pool and requests */
typedef struct mrl_http_request mrl_http_request; /* one request, queued, running or finished */

/* Client settings; a zeroed struct (or NULL) gives the defaults in parentheses. */
typedef struct mrl_http_config {
  int max_connections;        /* requests (and connections) at once per endpoint (16) */
  int retries;                /* attempts after the first (2); MRL_HTTP_NO_RETRIES for none */
  int64_t connect_timeout_ms; /* to establish a connection (10000) */
  int64_t timeout_ms;         /* one attempt, first byte sent to last byte received (600000) */
  int64_t idle_timeout_ms;    /* an attempt that receives nothing for this long fails (0: off) */
  int64_t backoff_ms;         /* first wait before a retry without Retry-After (500) */
  int64_t backoff_max_ms;     /* longest such wait (8000) */
  int64_t retry_after_max_ms; /* longest Retry-After honoured; longer ones are cut (60000) */
  uint64_t seed;              /* the jitter RNG's seed (0 is a seed like any other) */
} mrl_http_config;

enum { MRL_HTTP_NO_RETRIES = -1 };

/* Receives the bytes of a streamed response body as they arrive (only for a 2xx status; other
 * bodies are kept in the response). Returning nonzero stops the request (MRL_HTTP_STOPPED). */
typedef int (*mrl_http_data_fn)(void *ud, const char *bytes, size_t len);

/* One request. Everything is copied by mrl_http_submit. */
typedef struct mrl_http_call {
  const char *method;          /* "GET", "POST", ...; NULL: POST with a body, else GET */
  const char *url;             /* absolute http:// or https:// URL */
  const char *const *headers;  /* NULL-terminated "Name: value" lines; NULL for none */
  const char *body;            /* body_len bytes sent as the request body; NULL: none */
  size_t body_len;
  mrl_http_data_fn on_data;    /* NULL: the body is kept in the response */
  void *ud;                    /* passed to on_data */
  int64_t timeout_ms;          /* this request's per-attempt timeout; 0: the client's */
} mrl_http_call;

/* How a request ended. */
typedef enum mrl_http_outcome {
  MRL_HTTP_PENDING = 0,   /* "pending": queued, running or waiting to retry */
  MRL_HTTP_DONE = 1,      /* "done": a response arrived (any status, see `status`) */
  MRL_HTTP_FAILED = 2,    /* "failed": no usable response after the last attempt (message) */
  MRL_HTTP_TIMEOUT = 3,   /* "timeout": the last attempt ran out of time (total or idle) */
  MRL_HTTP_CANCELLED = 4, /* "cancelled": mrl_http_cancel, or the client was freed */
  MRL_HTTP_STOPPED = 5    /* "stopped": on_data returned nonzero */
} mrl_http_outcome;

/* Static name of an outcome ("done", ...); "unknown" for other values. */
MRL_API const char *mrl_http_outcome_name(mrl_http_outcome o);

/* A request's result. Borrowed from the request: valid until mrl_http_request_free. */
typedef struct mrl_http_response {
  mrl_http_outcome outcome;
  int status;                        /* the last response's HTTP status; 0 when none came */
  size_t nheaders;                   /* its header fields, in order: names in lower case */
  const char *const *header_names;
  const char *const *header_values;
  const char *body;                  /* the body kept (NUL-terminated; may hold NULs) */
  size_t body_len;
  uint64_t delivered;                /* body bytes handed to on_data */
  int attempts;                      /* attempts started (1 + retries made) */
  int64_t connects;                  /* new connections the attempts opened */
  double elapsed_ms;                 /* from submit to the end */
  const char *message;               /* what went wrong ("" for DONE) */
} mrl_http_response;

/* Creates a client. Fails with MRL_ERR_INVALID for a negative setting, MRL_ERR_UNSUPPORTED when
 * libcurl cannot be initialised. *out: caller owns, free with mrl_http_free. Retains e. */
MRL_API mrl_status mrl_http_new(mrl_engine *e, const mrl_http_config *config, mrl_http **out);
/* Cancels every unfinished request (their outcome becomes CANCELLED; the request handles stay
 * the caller's to free) and closes the connections. */
MRL_API void mrl_http_free(mrl_http *h);

/* Queues a request; it starts on the next mrl_http_poll. Fails with MRL_ERR_INVALID for a URL
 * libcurl cannot parse or a header line without ':'. *out: caller owns, free with
 * mrl_http_request_free (which cancels it if unfinished). */
MRL_API mrl_status mrl_http_submit(mrl_http *h, const mrl_http_call *call, mrl_http_request **out);
/* Makes progress on every request: starts what may start, waits up to timeout_ms (0: do not
 * wait) for network activity or the next retry, and finishes what is done. *n_done (may be
 * NULL): requests that finished during this call. Returns at once when nothing is pending. */
MRL_API mrl_status mrl_http_poll(mrl_http *h, int64_t timeout_ms, int *n_done);
/* Requests not yet finished; 0 for NULL. */
MRL_API int mrl_http_pending(const mrl_http *h);
/* The finished requests in the order they finished, each once: *out is NULL when there are no
 * more. Borrowed: the caller still owns (and frees) each request. */
MRL_API mrl_status mrl_http_next_done(mrl_http *h, mrl_http_request **out);
/* Interrupts a mrl_http_poll that is waiting (the one call that may come from another thread). */
MRL_API mrl_status mrl_http_wakeup(mrl_http *h);

/* Polls the client until r has finished (other requests progress too). */
MRL_API mrl_status mrl_http_wait(mrl_http_request *r);
/* Ends r at once with outcome CANCELLED (its connection is closed); nothing for a finished one. */
MRL_API mrl_status mrl_http_cancel(mrl_http_request *r);
/* Whether r has finished (1) or not (0); -1 for NULL. */
MRL_API int mrl_http_request_finished(const mrl_http_request *r);
/* r's result so far (outcome PENDING until it finishes). Borrowed: valid until r is freed. */
MRL_API const mrl_http_response *mrl_http_response_of(const mrl_http_request *r);
/* The value of header `name` (any case) in r's response, the last if repeated; NULL if none.
 * Borrowed: valid until r is freed. */
MRL_API const char *mrl_http_response_header(const mrl_http_request *r, const char *name);
MRL_API void mrl_http_request_free(mrl_http_request *r);

/* ---- Server-Sent Events ----------------------------------------------------------------------
 * An incremental parser of the text/event-stream format (the HTML standard's rules), fed with
 * bytes cut anywhere: inside a line, a field name, a UTF-8 sequence or between CR and LF. Lines
 * end with CRLF, LF or CR; a leading byte-order mark is skipped; lines starting with ':' are
 * comments; `data:` lines accumulate (joined with LF), `event:` sets the event's type, `id:` the
 * last event id (kept for later events; ignored when it holds a NUL), `retry:` (digits only) the
 * reconnection time; a blank line dispatches the event when it has data. Unknown fields are
 * ignored. Needs no network and no libcurl. */
typedef struct mrl_sse mrl_sse;

/* One event. Borrowed: valid during the callback only. Strings are NUL-terminated. */
typedef struct mrl_sse_event {
  const char *type;   /* the `event:` value, or "message" */
  const char *data;   /* the data lines joined with LF (no final LF) */
  size_t data_len;
  const char *id;     /* the last event id so far ("" when none) */
  int64_t retry_ms;   /* the last `retry:` value so far; -1 when none */
  int done;           /* data is exactly "[DONE]" (the OpenAI stream's end) */
} mrl_sse_event;

/* Called for every event; returning nonzero stops mrl_sse_feed, which then returns
 * MRL_ERR_INVALID with "stopped by the callback" (bytes after the event are not parsed). */
typedef int (*mrl_sse_event_fn)(void *ud, const mrl_sse_event *ev);

/* *out: caller owns, free with mrl_sse_free. Lines longer than max_line bytes (0: 16 MiB) fail
 * mrl_sse_feed with MRL_ERR_RANGE. Retains e. */
MRL_API mrl_status mrl_sse_new(mrl_engine *e, size_t max_line, mrl_sse **out);
MRL_API void mrl_sse_free(mrl_sse *p);
/* Parses len more bytes, calling fn(ud, event) for each event they complete. */
MRL_API mrl_status mrl_sse_feed(mrl_sse *p, const char *bytes, size_t len, mrl_sse_event_fn fn,
                                void *ud);
/* The end of the stream: an unterminated last line and an event not closed by a blank line are
 * dropped, as the standard says; *dropped (may be NULL) tells whether anything was. The parser
 * can then be fed the next stream (the last event id and retry are kept, as for a reconnection). */
MRL_API mrl_status mrl_sse_finish(mrl_sse *p, int *dropped);
/* Comment lines seen so far (keep-alive pings). */
MRL_API int64_t mrl_sse_comments(const mrl_sse *p);

/* ---- the OpenAI-compatible server (`moonrl serve`) ---------------------------------------
 * An HTTP/1.1 server (libmicrohttpd, one thread per connection) in front of one model and its
 * tokenizer. HTTP threads only check the key, read the body and queue a job; one engine thread
 * owns the model, the tokenizer and the engine from mrl_server_start on, parses and validates the
 * queued jobs, and decodes every running generation together in one batched step over a KV cache
 * (continuous batching: a new request joins at the next step, a finished one leaves). Endpoints,
 * fields and error shapes are listed in the README's "Serving" section. */
typedef struct mrl_server mrl_server;

typedef struct mrl_server_config {
  const char *host;       /* IPv4 address to bind; NULL: "127.0.0.1" (loopback only) */
  int port;               /* 0: a free port chosen by the system (see mrl_server_port) */
  const char *api_key;    /* NULL or "": no key; else every endpoint but GET /health needs
                             "Authorization: Bearer KEY" (401 otherwise) */
  const char *model_name; /* the id /v1/models reports and requests may name; NULL: "moonrl" */
  int max_queue;          /* jobs waiting for the engine thread at most; beyond: 429 (0: 64) */
  int max_batch;          /* sequences decoded together at most (0: 8) */
  size_t max_body;        /* request body bytes at most; beyond: 413 (0: 64 MiB) */
  int batch_invariant;    /* 1: every running sequence is decoded on its own (one row a
                             matrix product) instead of all together, so a request's logits and
                             log-probs are bit for bit the same whatever else is running (a
                             row's floats depend on how many rows the product has); slower */
  const char *tool_format; /* how the model writes tool calls (moonrl.parse's formats):
                              "hermes" (NULL: <tool_call>{"name", "arguments"}</tool_call>) or
                              "line" (CALL name arg ...) */
} mrl_server_config;

MRL_API void mrl_server_config_default(mrl_server_config *cfg);
/* Starts serving: binds, then starts the engine thread. On success the server owns m and t (it
 * frees them) and uses e from its own thread: the caller must not use e, m or t until
 * mrl_server_stop returns. On failure nothing is taken and the message is e's last error.
 * cfg's strings are copied. *out: free with mrl_server_stop. */
MRL_API mrl_status mrl_server_start(mrl_engine *e, mrl_model *m, mrl_tokenizer *t,
                                    const mrl_server_config *cfg, mrl_server **out);
/* The port the server listens on (the chosen one when cfg->port was 0); -1 for NULL. */
MRL_API int mrl_server_port(const mrl_server *s);
/* Stops accepting, ends running requests (streams get an error event), joins every thread and
 * frees the server with its model and tokenizer. NULL is a no-op. */
MRL_API void mrl_server_stop(mrl_server *s);

/* ---- data-parallel communication (mrl_comm) ------------------------------------------------
 * The ranks of a data-parallel job and the few collectives training needs. Two backends:
 * "self" (a group of one: rank 0, size 1, every collective a copy or nothing; always built) and
 * "mpi" (MPI_COMM_WORLD; only in a build with MPI, `make MPI=1`: started by mpirun or srun, or
 * alone as a singleton of size 1). Every rank must call the collectives in the same order with
 * the same lengths; they return when all ranks have taken part. Sums are in place and the same
 * bits land on every rank. The first handle initialises MPI (thread level FUNNELED: call these
 * from the thread that made the handle) unless the program already did; the last mrl_comm_free
 * finalises it, after which MPI cannot start again in this process (mrl_comm_new then fails
 * with MRL_ERR_UNSUPPORTED). */
typedef struct mrl_comm mrl_comm;
/* The backends compiled in: "self" or "self mpi" (static string). */
MRL_API const char *mrl_comm_backends(void);
/* The process's communicator: the MPI world in an MPI build, else a group of one. Retains e.
 * *out: caller owns, mrl_comm_free. */
MRL_API mrl_status mrl_comm_new(mrl_engine *e, mrl_comm **out);
MRL_API void mrl_comm_free(mrl_comm *c);
/* Rank (0-based) and size of the group; -1 for NULL. Backend: "self" or "mpi" (static). */
MRL_API int mrl_comm_rank(const mrl_comm *c);
MRL_API int mrl_comm_size(const mrl_comm *c);
MRL_API const char *mrl_comm_backend(const mrl_comm *c);
/* data[0..n) = the element-wise sum of every rank's data[0..n) (in pieces of 4 MB). */
MRL_API mrl_status mrl_comm_allreduce_f32(mrl_comm *c, float *data, int64_t n);
MRL_API mrl_status mrl_comm_allreduce_f64(mrl_comm *c, double *data, int64_t n);
/* data[0..bytes) of rank root, copied to every rank. */
MRL_API mrl_status mrl_comm_bcast(mrl_comm *c, void *data, int64_t bytes, int root);
/* recv[r * bytes ..] = rank r's send[0..bytes), for every rank r (recv: size x bytes). */
MRL_API mrl_status mrl_comm_allgather(mrl_comm *c, const void *send, int64_t bytes, void *recv);
/* Variable lengths: rank r sends counts[r] bytes (every rank passes the same counts, e.g. from
 * mrl_comm_allgather of the lengths); recv holds them in rank order, back to back. */
MRL_API mrl_status mrl_comm_allgatherv(mrl_comm *c, const void *send, const int64_t *counts,
                                       void *recv);
MRL_API mrl_status mrl_comm_barrier(mrl_comm *c);
/* For a command that failed on one rank: ends the whole MPI job with exit status code (the
 * other ranks would wait in their next collective for ever). Does nothing without a running
 * MPI world of more than one rank. */
MRL_API void mrl_comm_abort(int code);

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
