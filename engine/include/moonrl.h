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
 * held unless mrl_model_logits asks for them. */
MRL_API mrl_status mrl_model_forward(mrl_model *m, const int32_t *tokens, const int32_t *lengths,
                                     int batch, int steps);
MRL_API mrl_status mrl_model_score(mrl_model *m, const int32_t *targets, float *logprobs,
                                   float *entropy);
/* Logits of the last forward, (batch, steps, vocab). *out: caller owns. */
MRL_API mrl_status mrl_model_logits(mrl_model *m, mrl_tensor **out);
MRL_API mrl_status mrl_model_backward(mrl_model *m, const int32_t *targets,
                                      const float *dlogprobs, const float *dentropy);

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
/* Appends counts[i] tokens to slot slots[i] for i < n (tokens concatenated in that order). */
MRL_API mrl_status mrl_kv_cache_append(mrl_kv_cache *c, int n, const int *slots,
                                       const int32_t *tokens, const int *counts);
/* Draws the next token of each listed slot (it is not appended). logprobs (may be NULL) gets the
 * token's log-probability under the temperature-scaled distribution before top-k/top-p/min-p
 * (the behaviour log-probability; temperature 0 scores at temperature 1). */
MRL_API mrl_status mrl_kv_cache_sample(mrl_kv_cache *c, int n, const int *slots,
                                       const mrl_sampling *sampling, int32_t *tokens,
                                       float *logprobs);
/* The logits after a slot's last token (vocab floats). Borrowed: valid until the next append or
 * reset of any slot. */
MRL_API const float *mrl_kv_cache_logits(const mrl_kv_cache *c, int slot);

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
} mrl_env;

/* How an episode ended. */
enum {
  MRL_END_NONE = 0,      /* still running (or never started) */
  MRL_END_DONE = 1,      /* the environment said done */
  MRL_END_MAX_TURNS = 2, /* reached max_turns */
  MRL_END_BUDGET = 3,    /* out of token capacity */
  MRL_END_ENV_ERROR = 4  /* reset or step failed; mrl_rollout_error has the message */
};

typedef struct mrl_rollout_config {
  mrl_sampling sampling;
  int max_turns;          /* actions per episode */
  int max_turn_tokens;    /* tokens per action */
  const char *system;     /* optional system message (NULL: none) */
  mrl_chat_template chat; /* how messages become tokens (MRL_CHAT_AUTO picks by tokenizer) */
  const char *observation_role; /* role of observations after the first: NULL means "user" */
} mrl_rollout_config;

/* Runs n episodes (episode e with envs[e] and seeds[e], n <= the rollout's episodes) to the end,
 * all at once: reset, then turns of batched decoding; after each action the environment's
 * observation is appended (rendered with the chat template, loss mask 0) and the episode goes
 * on, until done, max_turns, capacity, or an environment error, which ends only that episode.
 * The action given to step is the turn's text without its end-of-turn token. */
MRL_API mrl_status mrl_rollout_run(mrl_rollout *r, mrl_tokenizer *tok, int n,
                                   mrl_env *const *envs, const uint64_t *seeds,
                                   const mrl_rollout_config *cfg);
/* After mrl_rollout_run: how episode e ended (MRL_END_*), its number of turns, the reward of each
 * turn (borrowed, turns entries), and the environment's error message (borrowed, or NULL). */
MRL_API int mrl_rollout_end(const mrl_rollout *r, int e);
MRL_API int mrl_rollout_turn_count(const mrl_rollout *r, int e);
MRL_API const double *mrl_rollout_rewards(const mrl_rollout *r, int e);
MRL_API const char *mrl_rollout_error(const mrl_rollout *r, int e);

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
