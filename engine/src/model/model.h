/* model.h - the policy model's internals shared by its source files (model.c: layout and
 * lifetime; block.c: the decoder block; attention.c: its attention kernels; model_forward.c /
 * model_backward.c: the passes over a batch; kv_cache.c: incremental decoding; sample.c: drawing a token; model_io.c:
 * Hugging Face files). Not installed. */
#ifndef MRL_MODEL_H
#define MRL_MODEL_H

#include "tensor_internal.h"

enum { MRL_PARAM_NAME_CAP = 96 };

typedef struct mrl_activations mrl_activations;

/* One named parameter: a row-major block of the flat buffers. Matrices are stored as Hugging Face
 * stores them, (out_features, in_features), so a projection is y = x W^T. */
typedef struct {
  char name[MRL_PARAM_NAME_CAP];
  int rank;          /* 1 or 2 */
  int64_t shape[2];
  int64_t offset;    /* in floats, into weights / grads / adam_m / adam_v */
  int64_t numel;
  bool decay;        /* AdamW weight decay applies (matrices; not norms or biases) */
} mrl_param;

/* Offsets of one block's parameters (-1 when the config has no such parameter). The layout puts
 * wq, wk, wv next to each other, and w_gate, w_up, so each trio (pair) is one matrix of
 * q_dim + 2 kv_dim (2 ffn) rows: one projection computes all three (both). */
typedef struct {
  int64_t attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, mlp_norm, w_gate, w_up, w_down;
} mrl_layer_params;

/* Scratch buffers that grow to the largest request and are kept for the next pass (no
 * allocation per step once warm). */
typedef enum {
  SCRATCH_XN,     /* normalised projection inputs, n x dim */
  SCRATCH_HIDDEN, /* MLP hidden activation, n x ffn */
  SCRATCH_HEAD,   /* a block of logits */
  SCRATCH_HEAD_ROWS, /* a block's gathered final hidden states and their gradients */
  SCRATCH_DX,     /* gradient of the residual stream */
  SCRATCH_DMID,
  SCRATCH_DXN,
  SCRATCH_DQKV,
  SCRATCH_DATTN,
  SCRATCH_DGATE_UP,
  SCRATCH_ATTN_WORK, /* per thread: what one unit of attention work needs */
  SCRATCH_COUNT
} mrl_scratch_slot;

typedef struct {
  float *p;
  int64_t cap; /* floats */
} mrl_scratch;

struct mrl_model {
  mrl_engine *engine;
  mrl_model_config cfg;
  int head_dim;           /* resolved cfg.head_dim */
  int q_dim, kv_dim;      /* heads * head_dim, kv_heads * head_dim */

  int nparams;
  mrl_param *params;
  mrl_layer_params *layer; /* cfg.layers entries */
  int64_t embed, final_norm, lm_head; /* lm_head == embed when tied */

  int64_t numel;
  /* flat buffers of numel floats, as tensors (views of parameters keep them alive) and as plain
   * pointers for the kernels; the AdamW moments are allocated by the first step */
  mrl_tensor *weights_t, *grads_t, *adam_m_t, *adam_v_t;
  float *weights, *grads, *adam_m, *adam_v;
  int64_t adam_step;

  float *rope_cos, *rope_sin; /* (ctx, head_dim / 2) tables */

  mrl_activations *act; /* what the last forward kept (model_forward.c) */
  mrl_scratch scratch[SCRATCH_COUNT];
  /* attention through the reference (OpenBLAS products, on the calling thread) instead of the
   * kernels on the engine's threads: what the tests compare the kernels against */
  bool reference_attention;
  /* the LM head over every row with libm's exp (head.c's reference) */
  bool reference_head;
  /* projections of few rows through OpenBLAS instead of skinny.c's kernels */
  bool reference_projections;
  /* a bfloat16 copy of the weights (numel) that KV-cache appends read instead of the float32
   * ones, or NULL (mrl_model_set_decode_bf16); mrl__model_refresh_bf16 rewrites it */
  uint16_t *decode_bf16;
};

/* What a forward pass keeps for the backward pass, for a batch of `batch` x `steps` tokens
 * (n = batch * steps rows). Buffers grow to the largest batch seen and are reused. Per layer l:
 * the residual input x[l], its RMSNorm scale, q/k/v after RoPE (and before the q/k norms when
 * the config has them), attention probabilities, the attention output, the residual after
 * attention, its RMSNorm scale, and the MLP's gate and up projections. The normalised inputs of
 * the projections and the MLP's hidden activation are recomputed in the backward pass. */
struct mrl_activations {
  int batch, steps;
  int64_t rows_cap, probs_cap; /* sizes the buffers were allocated for */
  bool valid;                  /* a forward ran and no weight changed since */
  int32_t *tokens, *lengths;   /* copies of the batch */
  struct mrl_block_seq *seqs;  /* the batch's sequences as the block sees them (rows_cap) */
  float *x;           /* (layers + 1) x n x dim: residual stream; x[layers] feeds the final norm */
  float *rstd_attn;   /* layers x n */
  float *qkv;         /* layers x n x (q_dim + 2 kv_dim): q | k | v per row, after RoPE */
  float *qk_pre;      /* layers x n x (q_dim + kv_dim): q | k before their norms (qk_norm) */
  float *rstd_qk;     /* layers x n x (heads + kv_heads) (qk_norm) */
  float *probs;       /* layers x batch x heads x steps x steps */
  float *attn;        /* layers x n x q_dim: attention output, input of o_proj */
  float *x_mid;       /* layers x n x dim: residual after attention */
  float *rstd_mlp;    /* layers x n */
  float *gate_up;     /* layers x n x 2 ffn: gate | up per row (one projection) */
  float *rstd_final;  /* n */
  float *xf;          /* n x dim: final normalised hidden states, input of the LM head */
};

enum { MRL_HEAD_BLOCK = 64 }; /* rows of logits the LM head computes at a time */
/* Query rows per block of the reference attention: a block multiplies only the keys up to its
 * last row, skipping most of the causally masked upper triangle (at T = 256, 3/4 of the full
 * product). */
enum { MRL_ATTN_BLOCK = 128 };

/* One sequence's rows in a call of mrl__block_forward: rows [row, row + rows) of the call, at
 * positions pos, pos + 1, ...; the first len are real tokens, the rest right padding (their
 * attention output is zero and nothing attends to them). Row t attends to positions 0 .. pos + t.
 * Keys and values: with k == NULL they are the sequence's own rows of qkv (pos is 0: training);
 * otherwise they are a KV-cache slot's, of this layer. Its keys are transposed in blocks of
 * C = MRL_ATTN_COLS positions, a block's kv_dim rows of C side by side: component j of position
 * p's key at k[(p / C) kv_dim C + j C + p % C], blocks up to mrl__attn_key_columns(pos + len) / C
 * (a token's key lands in one block, a line per component); position p's value at v + p kv_dim.
 * Positions before pos are there already; the block writes those of its rows. */
typedef struct mrl_block_seq {
  int64_t row;
  int rows, len, pos;
  float *k, *v;
  float *probs; /* kept attention probabilities, heads x rows x probs_width; NULL: not kept */
} mrl_block_seq;

/* A block's rows and buffers. Kept activations (the backward pass's) are those pointers given;
 * NULL ones are not kept. */
typedef struct mrl_block_io {
  int64_t rows;
  int nseq;
  const mrl_block_seq *seq;
  float *x;           /* (rows, dim) input of the block */
  float *x_mid;       /* (rows, dim) residual after attention; may be x */
  float *x_out;       /* (rows, dim) output; may be x_mid */
  float *xn;          /* (rows, dim) scratch: normalised inputs of the projections */
  float *qkv;         /* (rows, q_dim + 2 kv_dim) q | k | v after RoPE */
  float *attn;        /* (rows, q_dim) attention output */
  float *gate_up;     /* (rows, 2 ffn) */
  float *hidden;      /* (rows, ffn) scratch */
  float *rstd_attn, *rstd_mlp;  /* (rows) RMSNorm scales, kept or NULL */
  float *qk_pre, *rstd_qk;      /* (rows, q_dim + kv_dim) and (rows, heads + kv_heads) (qk_norm) */
  int probs_width;    /* row length of the kept probabilities */
  float *work;        /* mrl_engine_threads x work_per_thread floats */
  int64_t work_per_thread;
  bool rows_apart;    /* one matrix product per row (mrl__gemm_rows): batch-invariant floats */
  bool decode_bf16;   /* the projections read the model's bfloat16 copy when it has one */
} mrl_block_io;

/* One decoder block, layer `layer`, over io's rows. Cannot fail: every buffer is the caller's and
 * the engine's threads must have been started (mrl__pool_start). */
void mrl__block_forward(mrl_model *m, int layer, const mrl_block_io *io);
/* Floats of io->work one thread needs for sequences of up to max_rows rows and max_keys keys. */
int64_t mrl__block_work(const mrl_model *m, int max_rows, int max_keys);

/* attention.c: one head of one sequence. q (rows, hd; row stride ldq) are queries at positions
 * pos .. pos + rows - 1, attending to the keys and values of positions 0 .. pos + rows - 1.
 * Forward: out (rows, hd; ldo) = softmax(q k^T / sqrt(hd), causal) v, with the keys transposed
 * in column tiles of MRL_ATTN_COLS: component d of key s at kt[d ldkt + (s / C) ldkc + s % C]
 * (plain rows: ldkc = C), readable (any values) up to column mrl__attn_key_columns(pos + rows);
 * v (pos + rows, hd; ldv). probs (rows, ldp), when not NULL, receives the probabilities, zero
 * past each row's range up to width. The reference takes plain rows (kt, ldkt).
 * Backward (pos 0, probs kept): k, v (rows, hd; ldkv) as rows; dq (rows, hd; lddq) = the gradient
 * of q (written), dk and dv (rows, hd; lddkv) += those of k and v, from dout (rows, hd; lddo).
 * work: the _work floats. The _ref versions are the reference (mrl__gemm, calling thread only). */
enum { MRL_ATTN_COLS = 16 }; /* columns of the kernels' tiles */
int64_t mrl__attn_key_columns(int keys);
/* kt (hd, ldkt) = the transpose of keys rows of k (row stride ldk), zero past them. */
void mrl__attn_transpose_keys(float *kt, int64_t ldkt, const float *k, int64_t ldk, int keys,
                              int hd);
int64_t mrl__attn_forward_work(int hd, int keys);
void mrl__attn_forward(float *out, int64_t ldo, float *probs, int64_t ldp, int width,
                       const float *q, int64_t ldq, const float *kt, int64_t ldkt, int64_t ldkc,
                       const float *v, int64_t ldv, int rows, int pos, int hd, float *work);
int64_t mrl__attn_forward_ref_work(int rows, int keys);
void mrl__attn_forward_ref(float *out, int64_t ldo, float *probs, int64_t ldp, int width,
                           const float *q, int64_t ldq, const float *kt, int64_t ldkt,
                           const float *v, int64_t ldv, int rows, int pos, int hd, float *work);
int64_t mrl__attn_backward_work(int hd, int keys);
void mrl__attn_backward(float *dq, int64_t lddq, float *dk, float *dv, int64_t lddkv,
                        const float *dout, int64_t lddo, const float *probs, int64_t ldp,
                        const float *q, int64_t ldq, const float *k, const float *v,
                        int64_t ldkv, int rows, int hd, float *work);
int64_t mrl__attn_backward_ref_work(int rows);
void mrl__attn_backward_ref(float *dq, int64_t lddq, float *dk, float *dv, int64_t lddkv,
                            const float *dout, int64_t lddo, const float *probs, int64_t ldp,
                            const float *q, int64_t ldq, const float *k, const float *v,
                            int64_t ldkv, int rows, int hd, float *work);
/* dst[0..last] = softmax(src[0..last]), dst[last + 1 .. width) = 0; dst may be src. */
void mrl__softmax_causal(float *dst, const float *src, int last, int width);

/* Row-major C = alpha op(A) op(B) + beta C through OpenBLAS (or the reference kernel). */
void mrl__gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
               int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* The same for C = alpha A op(B) + beta C (A not transposed), and with apart = true one product
 * per row of A: OpenBLAS picks its kernels by the sizes (SkylakeX's small-matrix kernels below
 * about 10^6 multiply-adds), so a row's floats depend on how many rows share the product; one
 * row at a time they do not. */
void mrl__gemm_rows(bool apart, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                    int64_t ldc);

/* skinny.c: y (n, out; ldy) = beta y + x (n, in; ldx) W^T for W (out, in; ldw) on the engine's
 * threads (started), each row's result independent of the others and of the thread count.
 * mrl__project: the same for the parameter at w_offset, through those kernels when n <=
 * MRL_SKINNY_ROWS or apart (rows must not depend on each other), else through OpenBLAS
 * (mrl__gemm_rows); with m->reference_projections always through OpenBLAS. */
enum { MRL_SKINNY_ROWS = 16 };
void mrl__skinny_gemm(mrl_engine *e, float *y, int64_t ldy, const float *x, int64_t ldx,
                      const float *w, int64_t ldw, int64_t n, int64_t out, int64_t in,
                      float beta);
void mrl__skinny_gemm_bf16(mrl_engine *e, float *y, int64_t ldy, const float *x, int64_t ldx,
                           const uint16_t *w, int64_t ldw, int64_t n, int64_t out, int64_t in,
                           float beta);
/* Test hook: run the skinny kernels of level `which` (0 = the best this CPU runs, then the next
 * best; the portable one last) from now on, or the best again for which < 0; returns the kernel's
 * name ("avx512", "avx2", "portable"), NULL when this CPU has no such level. Every level gives a
 * row the same bits whatever the other rows and threads; levels differ from each other in the
 * order of the additions. */
const char *mrl__skinny_use(int which);
/* With bf16 and a bfloat16 copy of the weights (m->decode_bf16), through that copy always. */
void mrl__project(mrl_model *m, bool apart, bool bf16, float *y, int64_t ldy, const float *x,
                  int64_t ldx, int64_t w_offset, int64_t n, int64_t out, int64_t in, float beta);
/* f to bfloat16, rounded to nearest (ties to even); NaN stays NaN */
uint16_t mrl__bf16_round(float f);
/* m->decode_bf16 = the weights rounded to bfloat16 (nothing without a copy) */
void mrl__model_refresh_bf16(mrl_model *m);
/* Allocates the AdamW moments (zeros) unless they exist; fails naming fn. */
mrl_status mrl__model_alloc_adam(mrl_model *m, const char *fn);

/* A view of one parameter's block of a flat buffer (weights_t, grads_t, ...), shaped as the
 * parameter. *out: caller owns. */
mrl_status mrl__model_param_view(const mrl_param *p, mrl_tensor *buffer, mrl_tensor **out);

/* Index of the parameter with this Hugging Face name, or -1. */
int mrl__model_find_param(const mrl_model *m, const char *name);

/* Checks a config (including that sizes stay within what the kernels index with int); fills
 * *head_dim. Fails with a message naming the field. */
mrl_status mrl__model_check_config(mrl_engine *e, const char *fn, const mrl_model_config *cfg,
                                   int *head_dim);

/* Allocates a model for cfg with zeroed buffers (no initialisation). */
mrl_status mrl__model_alloc(mrl_engine *e, const char *fn, const mrl_model_config *cfg,
                            mrl_model **out);

/* A scratch buffer of at least `floats` floats (contents undefined), or NULL when out of
 * memory. */
float *mrl__model_scratch(mrl_model *m, mrl_scratch_slot slot, int64_t floats);
/* Growing several scratch buffers as one step of a call that may still fail after it:
 * mrl__scratch_prepare allocates what the listed buffers lack (false when out of memory, holding
 * nothing then), mrl__scratch_finish puts them in place (commit) or frees them (a later step
 * failed), so that a failed call holds no more memory than before. */
typedef struct {
  int count;
  mrl_scratch_slot slot[SCRATCH_COUNT];
  int64_t floats[SCRATCH_COUNT];
  float *fresh[SCRATCH_COUNT];
} mrl_scratch_plan;
bool mrl__scratch_prepare(mrl_model *m, mrl_scratch_plan *plan, int count,
                          const mrl_scratch_slot *slots, const int64_t *floats);
void mrl__scratch_finish(mrl_model *m, mrl_scratch_plan *plan, bool commit);
/* Both at once: all the buffers grown, or (false) none. */
bool mrl__model_reserve(mrl_model *m, int count, const mrl_scratch_slot *slots,
                        const int64_t *floats);

/* Frees the activations kept for backward (model_forward.c). */
void mrl__model_free_activations(mrl_model *m);

/* block.c row kernels. RMSNorm: out (n, d) = x / rms(x) * w, and rstd (n) = 1 / rms(x) unless
 * NULL; out may be x. _apply: the same from a kept rstd (the backward pass recomputes it). */
void mrl__rmsnorm(float *out, float *rstd, const float *x, const float *w, int64_t n, int64_t d,
                  float eps);
void mrl__rmsnorm_apply(float *out, const float *rstd, const float *x, const float *w, int64_t n,
                        int64_t d);
/* Rotates each head of one row (heads x hd, row stride hd) by the angles of one position; sign
 * -1 rotates back (the backward pass). Pairs are (i, i + hd/2) as in Hugging Face. */
void mrl__rope(float *v, int heads, int hd, const float *cos_t, const float *sin_t, float sign);
/* hidden (n, f) = silu(gate) * up, from rows of gate | up (n, 2f) */
void mrl__swiglu(float *hidden, const float *gate_up, int64_t n, int64_t f);
/* The same on the engine's threads, and its backward: dgate_up (n, 2f) = the gradients of gate
 * and up from dhidden (n, f). */
void mrl__swiglu_rows(mrl_engine *e, float *hidden, const float *gate_up, int64_t n, int64_t f);
void mrl__swiglu_backward_rows(mrl_engine *e, float *dgate_up, const float *dhidden,
                               const float *gate_up, int64_t n, int64_t f);

/* head.c: the LM head. check_head: a forward pass to use and targets in -1 .. vocab - 1.
 * head_logits: out (rows, vocab) = the logits of rows [r0, r0 + rows) of the last forward.
 * head_reserve: the scratch scoring and the head's backward need (and the engine's threads).
 * head_backward: dxf (n, dim) = the gradient of the final hidden states and the head weights'
 * gradient += that of sum_i dlogprobs_i log p_i(target_i) + dentropy_i H_i (rows with target -1
 * or zero coefficients skipped); needs head_reserve. */
mrl_status mrl__model_check_head(mrl_model *m, const char *fn, const int32_t *targets);
void mrl__model_head_logits(mrl_model *m, float *out, int64_t r0, int64_t rows);
mrl_status mrl__model_head_reserve(mrl_model *m, const char *fn);
void mrl__model_head_backward(mrl_model *m, float *dxf, const int32_t *targets,
                              const float *dlogprobs, const float *dentropy);

/* A token and its unnormalised probability: sampling's candidates. */
typedef struct {
  float p;
  int32_t id;
} mrl_candidate;

/* Draws one token from logits z (vocab V) with rng, using the scratch p and cand (V each), and
 * returns it; *logp gets its log-probability under the temperature-scaled distribution
 * (temperature 1 when greedy). With allowed (vocab bytes, may be NULL) only the tokens it marks
 * non-zero can be drawn, and the distribution is renormalised over them. Returns -1 with *bad set
 * to the index of the first logit that is not finite (there is no distribution to draw from), -2
 * when allowed marks no token. The kept set is the first tokens of the order (probability
 * descending, id ascending) cut by top-k, then the shortest prefix of those whose mass reaches
 * top_p times the total (at least one), then the tokens under min_p times the top probability
 * dropped.
 * mrl__sample_one_ref sorts the vocabulary and walks the kept set in that order. mrl__sample_one
 * finds the same cut by partial selection (sample.c) and walks the kept set in id order: the
 * same kept set with the same probabilities and log-probabilities, and the same draws as the
 * reference for greedy, plain and min-p-only sampling (which the reference walks in id order
 * too), but under top-k or top-p a seed may draw another token than the reference's (and than
 * before this change). support (may be NULL; for the tests) gets the size of the kept set left at
 * the head of cand (the reference: in its order, before min-p and allowed are applied;
 * mrl__sample_one: after them, in id order), or -1 when mrl__sample_one kept every token (no
 * top-k/top-p; min-p and allowed then apply); greedy leaves it unset. */
int32_t mrl__sample_one(const float *z, int64_t V, const mrl_sampling *s, const uint8_t *allowed,
                        struct mrl_rng *rng, float *p, mrl_candidate *cand, float *logp,
                        int64_t *bad, int64_t *support);
int32_t mrl__sample_one_ref(const float *z, int64_t V, const mrl_sampling *s,
                            const uint8_t *allowed, struct mrl_rng *rng, float *p,
                            mrl_candidate *order, float *logp, int64_t *bad, int64_t *support);

#endif /* MRL_MODEL_H */
