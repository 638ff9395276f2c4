/* model.h - the policy model's internals shared by its source files (model.c: layout and
 * lifetime; model_forward.c / model_backward.c: the maths; model_io.c: Hugging Face files).
 * Not installed. */
#ifndef MRL_MODEL_H
#define MRL_MODEL_H

#include "internal.h"

enum { MRL_PARAM_NAME_CAP = 96 };

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

/* Offsets of one block's parameters (-1 when the config has no such parameter). */
typedef struct {
  int64_t attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, mlp_norm, w_gate, w_up, w_down;
} mrl_layer_params;

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

  struct mrl_activations *act; /* training activations for the last forward (model_forward.c) */
};

/* Index of the parameter with this Hugging Face name, or -1. */
int mrl__model_find_param(const mrl_model *m, const char *name);

/* Checks a config (including that sizes stay within what the kernels index with int); fills
 * *head_dim. Fails with a message naming the field. */
mrl_status mrl__model_check_config(mrl_engine *e, const char *fn, const mrl_model_config *cfg,
                                   int *head_dim);

/* Allocates a model for cfg with zeroed buffers (no initialisation). */
mrl_status mrl__model_alloc(mrl_engine *e, const char *fn, const mrl_model_config *cfg,
                            mrl_model **out);

/* Frees the activations kept for backward (model_forward.c). */
void mrl__model_free_activations(mrl_model *m);

#endif /* MRL_MODEL_H */
