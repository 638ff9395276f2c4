/* test_model_io.c - unit tests of the model's files: Hugging Face directories saved and loaded
 * bit for bit (F32), in BF16, sharded, tied and untied, Qwen2 biases and Qwen3 q/k norms, F16
 * weights, config.json fields honoured and refused, weight files refused, and training
 * checkpoints restoring weights, AdamW moments, steps and the RNG exactly. */
#include "support.h"
#include "model.h"
#include "safetensors.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- setup ---- */

static void finish(mrl_engine *e) {
  CHECKF(mrl_engine_memory_used(e) == 0, "%zu bytes still held", mrl_engine_memory_used(e));
  mrl_engine_free(e);
}




static void write_text(const char *dir, const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *fp = fopen(path, "wb");
  if (!fp || fputs(text, fp) < 0) {
    printf("Bail out! cannot write %s\n", path);
    exit(1);
  }
  fclose(fp);
}

/* The whole file as a string; caller frees. */
static char *read_text(const char *dir, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long len = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *p = malloc((size_t)len + 1);
  p[fread(p, 1, (size_t)len, fp)] = '\0';
  fclose(fp);
  return p;
}

static void path_in(char *out, size_t cap, const char *dir, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

static mrl_model_config small_config(void) {
  mrl_model_config c;
  memset(&c, 0, sizeof c);
  c.vocab = 32;
  c.dim = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 24;
  c.ctx = 64;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  return c;
}

/* A model with every parameter (biases and norms too) set to distinct values, so that a tensor
 * loaded into the wrong place shows. */
static mrl_model *new_model(mrl_engine *e, const mrl_model_config *c, uint64_t seed) {
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, c, seed, &m));
  for (int64_t i = 0; i < m->numel; i++)
    m->weights[i] += (float)((i * 7919 + (int64_t)seed) % 1009) / 4096.0f;
  return m;
}

/* Compares two models' weights bit for bit; returns the number of differing floats. */
static int64_t weight_diffs(const mrl_model *a, const mrl_model *b) {
  if (a->numel != b->numel) return -1;
  int64_t n = 0;
  for (int64_t i = 0; i < a->numel; i++) n += memcmp(&a->weights[i], &b->weights[i], 4) != 0;
  return n;
}

static bool same_config(const mrl_model_config *a, const mrl_model_config *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

/* Named tensors to write into a file: views of a model's parameters plus extras. */
enum { LIST_CAP = 96 };
typedef struct {
  const char *names[LIST_CAP];
  mrl_tensor *tensors[LIST_CAP];
  int n;
} tensor_list;

static void list_add(tensor_list *l, const char *name, mrl_tensor *t) {
  l->names[l->n] = name;
  l->tensors[l->n++] = t;
}

static void list_params(tensor_list *l, mrl_model *m) {
  for (int i = 0; i < mrl_model_param_count(m); i++) {
    const char *name;
    mrl_tensor *w = NULL;
    MUST(mrl_model_param(m, i, &name, &w, NULL));
    list_add(l, name, w);
  }
}

static void list_remove(tensor_list *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->names[i], name) == 0) {
      mrl_tensor_free(l->tensors[i]);
      l->names[i] = l->names[l->n - 1];
      l->tensors[i] = l->tensors[l->n - 1];
      l->n--;
      return;
    }
}

static void list_write(tensor_list *l, mrl_engine *e, const char *dir, const char *file,
                       int first, int count) {
  char path[512];
  path_in(path, sizeof path, dir, file);
  MUST(mrl_safetensors_write(e, path, count, l->names + first, l->tensors + first, MRL_DTYPE_F32,
                             0, NULL, NULL));
}

static void list_free(tensor_list *l) {
  for (int i = 0; i < l->n; i++) mrl_tensor_free(l->tensors[i]);
  l->n = 0;
}

/* Writes a file of the list's tensors in a dtype moonrl does not write: "F16" (values must be
 * exact in half precision) or "I64" (zeros). */
static void write_raw(tensor_list *l, const char *dir, const char *file, const char *dtype) {
  int size = strcmp(dtype, "F16") == 0 ? 2 : 8;
  size_t cap = 1 << 16, hn = 0, total = 0;
  char *header = malloc(cap);
  hn += (size_t)snprintf(header + hn, cap - hn, "{");
  for (int i = 0; i < l->n; i++) {
    const int64_t *s = mrl_tensor_shape(l->tensors[i]);
    int64_t numel = mrl_tensor_numel(l->tensors[i]);
    hn += (size_t)snprintf(header + hn, cap - hn, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld",
                           i ? "," : "", l->names[i], dtype, (long long)s[0]);
    if (mrl_tensor_rank(l->tensors[i]) == 2)
      hn += (size_t)snprintf(header + hn, cap - hn, ",%lld", (long long)s[1]);
    hn += (size_t)snprintf(header + hn, cap - hn, "],\"data_offsets\":[%zu,%zu]}", total,
                           total + (size_t)numel * (size_t)size);
    total += (size_t)numel * (size_t)size;
  }
  hn += (size_t)snprintf(header + hn, cap - hn, "}");
  char path[512];
  path_in(path, sizeof path, dir, file);
  FILE *fp = fopen(path, "wb");
  for (int b = 0; b < 8; b++) fputc((int)((uint64_t)hn >> (8 * b)) & 0xFF, fp);
  fwrite(header, 1, hn, fp);
  for (int i = 0; i < l->n; i++) {
    const float *v = mrl_tensor_data(l->tensors[i]); /* parameter views are contiguous */
    for (int64_t k = 0; k < mrl_tensor_numel(l->tensors[i]); k++) {
      uint64_t bits = 0;
      if (size == 2 && v[k] != 0.0f) {
        int ex;
        float frac = frexpf(fabsf(v[k]), &ex); /* |v| = frac * 2^ex, frac in [0.5, 1) */
        bits = (uint64_t)(signbit(v[k]) ? 0x8000 : 0) | (uint64_t)(ex - 1 + 15) << 10 |
               (uint64_t)((frac * 2.0f - 1.0f) * 1024.0f);
      }
      for (int b = 0; b < size; b++) fputc((int)(bits >> (8 * b)) & 0xFF, fp);
    }
  }
  fclose(fp);
  free(header);
}

/* config.json from the small config's fields, minus `omit`, plus `extra` (later keys win). */
static void write_config(const char *dir, const char *arch, const char *omit, const char *extra) {
  static const char *const fields[][2] = {
      {"vocab_size", "32"},          {"hidden_size", "16"},
      {"intermediate_size", "24"},   {"num_hidden_layers", "2"},
      {"num_attention_heads", "4"},  {"num_key_value_heads", "2"},
      {"max_position_embeddings", "64"}, {"rms_norm_eps", "1e-05"},
      {"rope_theta", "10000.0"},     {"tie_word_embeddings", "false"},
      {"hidden_act", "\"silu\""},    {"torch_dtype", "\"bfloat16\""},
      {"bos_token_id", "1"},         {"transformers_version", "\"4.45.0\""},
  };
  char text[4096];
  size_t n = 0;
  n += (size_t)snprintf(text + n, sizeof text - n, "{\n");
  if (arch) n += (size_t)snprintf(text + n, sizeof text - n, "  \"architectures\": %s", arch);
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    if (omit && strcmp(omit, fields[i][0]) == 0) continue;
    n += (size_t)snprintf(text + n, sizeof text - n, "%s  \"%s\": %s", n > 2 ? ",\n" : "",
                          fields[i][0], fields[i][1]);
  }
  if (extra) n += (size_t)snprintf(text + n, sizeof text - n, ",\n  %s", extra);
  snprintf(text + n, sizeof text - n, "\n}\n");
  write_text(dir, "config.json", text);
}

#define LLAMA "[\"LlamaForCausalLM\"]"
#define QWEN2 "[\"Qwen2ForCausalLM\"]"
#define QWEN3 "[\"Qwen3ForCausalLM\"]"

/* ---- Hugging Face directories ---- */

static void test_save_load_f32(void) {
  mrl_engine *e = new_engine();
  const char *tmp = temp_dir();
  char dir[512];
  path_in(dir, sizeof dir, tmp, "nested/model"); /* created with its parent */
  mrl_model_config c = small_config();
  mrl_model *m = new_model(e, &c, 1);
  m->weights[5] = -0.0f;
  m->weights[6] = 1e-40f; /* a subnormal */
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  CHECK(count_entries(dir) == 2); /* config.json and model.safetensors, no temporary files */
  char *config = read_text(dir, "config.json");
  CHECK(config && strstr(config, "\"LlamaForCausalLM\"") && strstr(config, "\"float32\"") &&
        strstr(config, "\"tie_word_embeddings\": false"));
  free(config);
  mrl_model *back = NULL;
  MUST(mrl_model_load(e, dir, &back));
  CHECK(same_config(&m->cfg, &back->cfg));
  CHECK(mrl_model_param_count(back) == mrl_model_param_count(m));
  CHECKF(weight_diffs(m, back) == 0, "%lld weights differ", (long long)weight_diffs(m, back));
  CHECK(mrl__model_find_param(back, "lm_head.weight") >= 0);
  mrl_model_free(back);

  /* saving again over the directory replaces both files */
  m->weights[0] = 3.0f;
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  back = NULL;
  MUST(mrl_model_load(e, dir, &back));
  CHECK(back->weights[0] == 3.0f);
  mrl_model_free(back);
  mrl_model_free(m);
  remove_tree(tmp);
  finish(e);
}

static void test_save_load_bf16(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  mrl_model_config c = small_config();
  c.tie_embeddings = 1;
  mrl_model *m = new_model(e, &c, 2);
  MUST(mrl_model_save(m, dir, MRL_DTYPE_BF16));
  char *config = read_text(dir, "config.json");
  CHECK(config && strstr(config, "\"bfloat16\"") &&
        strstr(config, "\"tie_word_embeddings\": true"));
  free(config);
  mrl_model *back = NULL;
  MUST(mrl_model_load(e, dir, &back));
  int64_t bad = 0;
  for (int64_t i = 0; i < m->numel; i++) {
    uint32_t u;
    memcpy(&u, &back->weights[i], 4);
    float x = m->weights[i], y = back->weights[i];
    if ((u & 0xFFFF) != 0 || fabsf(x - y) > fabsf(x) * 0x1p-8f) bad++;
  }
  CHECKF(bad == 0, "%lld weights are not the BF16 rounding of the originals", (long long)bad);
  CHECK(back->cfg.tie_embeddings == 1 && mrl__model_find_param(back, "lm_head.weight") < 0);
  mrl_model_free(back);
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "models are saved as F32 or BF16",
              mrl_model_save(m, dir, MRL_DTYPE_F16));
  CHECK_FAILS(e, MRL_ERR_NULL, "dir is NULL", mrl_model_save(m, NULL, MRL_DTYPE_F32));
  CHECK(mrl_model_save(NULL, dir, MRL_DTYPE_F32) == MRL_ERR_NULL);
  mrl_model_free(m);
  remove_tree(dir);
  finish(e);
}

static void test_qwen2_biases(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  mrl_model_config c = small_config();
  c.qkv_bias = 1;
  mrl_model *m = new_model(e, &c, 3);
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  char *config = read_text(dir, "config.json");
  CHECK(config && strstr(config, "\"Qwen2ForCausalLM\"") && strstr(config, "\"qwen2\""));
  free(config);
  mrl_model *back = NULL;
  MUST(mrl_model_load(e, dir, &back));
  CHECK(back->cfg.qkv_bias == 1 && back->cfg.qk_norm == 0);
  int p = mrl__model_find_param(back, "model.layers.1.self_attn.k_proj.bias");
  CHECK(p >= 0 && back->params[p].rank == 1 && back->params[p].shape[0] == 8);
  CHECK(mrl__model_find_param(back, "model.layers.0.self_attn.o_proj.bias") < 0);
  CHECK(weight_diffs(m, back) == 0);
  mrl_model_free(back);
  /* Qwen2 always has q/k/v biases: its attention_bias field changes nothing */
  write_config(dir, QWEN2, NULL, "\"attention_bias\": true, \"use_sliding_window\": false, "
                                 "\"sliding_window\": 4096, \"max_window_layers\": 21");
  back = NULL;
  MUST(mrl_model_load(e, dir, &back));
  CHECK(weight_diffs(m, back) == 0);
  mrl_model_free(back);
  /* the same weights under a Llama config: the biases are tensors the model does not have */
  write_config(dir, LLAMA, NULL, NULL);
  CHECK_FAILS(e, MRL_ERR_INVALID,
              "tensor \"model.layers.0.self_attn.q_proj.bias\" is not a parameter of this model",
              mrl_model_load(e, dir, &back));
  mrl_model_free(m);
  remove_tree(dir);
  finish(e);
}

static void test_qwen3_norms(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  mrl_model_config c = small_config();
  c.qk_norm = 1;
  c.head_dim = 8; /* not hidden_size / heads (4), as in Qwen3 */
  c.tie_embeddings = 1;
  c.rope_theta = 1000000.0f;
  c.norm_eps = 1e-6f;
  mrl_model *m = new_model(e, &c, 4);
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  char *config = read_text(dir, "config.json");
  CHECK(config && strstr(config, "\"Qwen3ForCausalLM\"") && strstr(config, "\"head_dim\": 8"));
  free(config);
  mrl_model *back = NULL;
  MUST(mrl_model_load(e, dir, &back));
  CHECK(same_config(&m->cfg, &back->cfg));
  int p = mrl__model_find_param(back, "model.layers.0.self_attn.q_norm.weight");
  CHECK(p >= 0 && back->params[p].rank == 1 && back->params[p].shape[0] == 8);
  CHECK(mrl__model_find_param(back, "model.layers.1.self_attn.k_norm.weight") >= 0);
  p = mrl__model_find_param(back, "model.layers.0.self_attn.q_proj.weight");
  CHECK(p >= 0 && back->params[p].shape[0] == 32 && back->params[p].shape[1] == 16);
  CHECK(weight_diffs(m, back) == 0);
  mrl_model_free(back);
  /* without head_dim, Qwen3 takes transformers' default of 128 */
  write_config(dir, QWEN3, NULL, "\"tie_word_embeddings\": true");
  back = NULL;
  CHECK_FAILS(e, MRL_ERR_SHAPE,
              "tensor \"model.layers.0.self_attn.q_proj.weight\" has shape (32x16), the config "
              "needs (512x16)",
              mrl_model_load(e, dir, &back));
  /* q/k/v and o biases (attention_bias) are not part of the model */
  write_config(dir, QWEN3, NULL, "\"head_dim\": 8, \"attention_bias\": true");
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "attention_bias = true is not supported",
              mrl_model_load(e, dir, &back));
  /* and no architecture has both q/k/v biases and q/k norms */
  mrl_model *both = NULL;
  c.qkv_bias = 1;
  MUST(mrl_model_new(e, &c, 1, &both));
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "both q/k/v biases and q/k norms",
              mrl_model_save(both, dir, MRL_DTYPE_F32));
  mrl_model_free(both);
  mrl_model_free(m);
  remove_tree(dir);
  finish(e);
}

/* Configs as transformers writes them, with the fields moonrl ignores. */
static void test_hf_configs(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  mrl_model_config c = small_config();
  c.tie_embeddings = 1;
  c.rope_theta = 500000.0f;
  c.rope_llama3_factor = 8.0f;
  c.rope_llama3_low_freq_factor = 1.0f;
  c.rope_llama3_high_freq_factor = 4.0f;
  c.rope_llama3_original_ctx = 32;
  mrl_model *m = new_model(e, &c, 5);
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  mrl_model *back = NULL;
  MUST(mrl_model_load(e, dir, &back)); /* moonrl's own config.json, llama3 RoPE included */
  CHECK(same_config(&m->cfg, &back->cfg));
  mrl_model_free(back);

  write_text(dir, "config.json",
             "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,\n"
             " \"attention_dropout\": 0.0, \"bos_token_id\": 128000, \"eos_token_id\": [128001,"
             " 128008], \"head_dim\": 4, \"hidden_act\": \"silu\", \"hidden_size\": 16,\n"
             " \"initializer_range\": 0.02, \"intermediate_size\": 24, "
             "\"max_position_embeddings\": 64, \"mlp_bias\": false, \"model_type\": \"llama\",\n"
             " \"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"num_key_value_heads\": 2,"
             " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,\n"
             " \"rope_scaling\": {\"factor\": 8.0, \"high_freq_factor\": 4.0, \"low_freq_factor\":"
             " 1.0, \"original_max_position_embeddings\": 32, \"rope_type\": \"llama3\"},\n"
             " \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": "
             "\"bfloat16\", \"transformers_version\": \"4.45.0.dev0\", \"use_cache\": true,"
             " \"vocab_size\": 32}\n");
  back = NULL;
  MUST(mrl_model_load(e, dir, &back));
  CHECK(same_config(&m->cfg, &back->cfg));
  CHECK(weight_diffs(m, back) == 0);
  mrl_model_free(back);

  /* transformers 5: rope_theta inside rope_parameters */
  write_config(dir, LLAMA, "rope_theta",
               "\"tie_word_embeddings\": true, \"rope_parameters\": {\"rope_type\": \"llama3\", "
               "\"rope_theta\": 500000.0, \"factor\": 8.0, \"low_freq_factor\": 1.0, "
               "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 32}");
  back = NULL;
  MUST(mrl_model_load(e, dir, &back));
  CHECK(same_config(&m->cfg, &back->cfg));
  mrl_model_free(back);

  /* defaults: rope_theta 10000, rms_norm_eps 1e-6, kv heads = heads, head_dim = hidden/heads */
  mrl_model_config d = small_config();
  d.kv_heads = 4;
  d.norm_eps = 1e-6f;
  mrl_model *md = new_model(e, &d, 6);
  MUST(mrl_model_save(md, dir, MRL_DTYPE_F32));
  write_text(dir, "config.json",
             "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 32, \"hidden_size\": 16,"
             " \"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
             " \"max_position_embeddings\": 64, \"rope_scaling\": null, \"head_dim\": null,"
             " \"rope_parameters\": {\"rope_type\": \"default\"}}");
  back = NULL;
  MUST(mrl_model_load(e, dir, &back));
  d.head_dim = 4;
  CHECK(same_config(&d, &back->cfg));
  CHECK(weight_diffs(md, back) == 0);
  mrl_model_free(back);
  mrl_model_free(md);
  mrl_model_free(m);
  remove_tree(dir);
  finish(e);
}

/* Each refused config: the status and the field named in the message. */
static void test_config_refusals(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  mrl_model *m = NULL;
  static const struct {
    const char *arch, *omit, *extra;
    mrl_status want;
    const char *needle;
  } cases[] = {
      {LLAMA, NULL, "\"hidden_act\": \"gelu\"", MRL_ERR_UNSUPPORTED, "hidden_act"},
      {QWEN2, NULL, "\"hidden_act\": \"relu\"", MRL_ERR_UNSUPPORTED, "hidden_act"},
      {LLAMA, NULL, "\"mlp_bias\": true", MRL_ERR_UNSUPPORTED, "mlp_bias"},
      {LLAMA, NULL, "\"attention_bias\": true", MRL_ERR_UNSUPPORTED, "attention_bias"},
      {LLAMA, NULL, "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}",
       MRL_ERR_UNSUPPORTED, "rope_scaling of type \"yarn\" is not supported"},
      {LLAMA, NULL, "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}",
       MRL_ERR_UNSUPPORTED, "rope_scaling of type \"linear\""},
      {LLAMA, NULL, "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}",
       MRL_ERR_UNSUPPORTED, "\"dynamic\""},
      {LLAMA, NULL,
       "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
       " \"high_freq_factor\": 4.0}",
       MRL_ERR_INVALID, "original_max_position_embeddings is missing"},
      {LLAMA, NULL,
       "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": -8.0, \"low_freq_factor\": 1.0,"
       " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 32}",
       MRL_ERR_INVALID, "factor must be a positive number"},
      {LLAMA, NULL, "\"rope_scaling\": {\"factor\": 2.0}", MRL_ERR_INVALID,
       "rope_scaling has no rope_type"},
      {LLAMA, NULL, "\"rope_scaling\": 5", MRL_ERR_INVALID, "rope_scaling is not an object"},
      {LLAMA, NULL,
       "\"rope_scaling\": {\"rope_type\": \"default\"}, \"rope_parameters\": {\"rope_type\": "
       "\"default\"}",
       MRL_ERR_INVALID, "rope_scaling and rope_parameters are both given"},
      {LLAMA, NULL, "\"rope_parameters\": {\"rope_type\": \"longrope\"}", MRL_ERR_UNSUPPORTED,
       "rope_parameters of type \"longrope\""},
      {QWEN2, NULL, "\"use_sliding_window\": true", MRL_ERR_UNSUPPORTED, "use_sliding_window"},
      {QWEN3, NULL, "\"layer_types\": [\"full_attention\", \"sliding_attention\"]",
       MRL_ERR_UNSUPPORTED, "layer_types"},
      {LLAMA, NULL, "\"pretraining_tp\": 2", MRL_ERR_UNSUPPORTED, "pretraining_tp"},
      {"[\"MistralForCausalLM\"]", NULL, NULL, MRL_ERR_UNSUPPORTED,
       "architectures: \"MistralForCausalLM\" is not supported"},
      {"[\"LlamaForCausalLM\", \"Qwen2ForCausalLM\"]", NULL, NULL, MRL_ERR_INVALID,
       "architectures must list one name"},
      {"\"LlamaForCausalLM\"", NULL, NULL, MRL_ERR_INVALID, "architectures must list one name"},
      {NULL, NULL, NULL, MRL_ERR_INVALID, "architectures is missing"},
      {LLAMA, "vocab_size", NULL, MRL_ERR_INVALID, "vocab_size is missing"},
      {LLAMA, "hidden_size", NULL, MRL_ERR_INVALID, "hidden_size is missing"},
      {LLAMA, "num_hidden_layers", NULL, MRL_ERR_INVALID, "num_hidden_layers is missing"},
      {LLAMA, "num_attention_heads", NULL, MRL_ERR_INVALID, "num_attention_heads is missing"},
      {LLAMA, "intermediate_size", NULL, MRL_ERR_INVALID, "intermediate_size is missing"},
      {LLAMA, "max_position_embeddings", NULL, MRL_ERR_INVALID,
       "max_position_embeddings is missing"},
      {LLAMA, NULL, "\"hidden_size\": null", MRL_ERR_INVALID, "hidden_size is missing"},
      {LLAMA, NULL, "\"hidden_size\": 16.5", MRL_ERR_INVALID, "hidden_size must be an integer"},
      {LLAMA, NULL, "\"hidden_size\": 16.0", MRL_ERR_INVALID, "hidden_size must be an integer"},
      {LLAMA, NULL, "\"hidden_size\": \"16\"", MRL_ERR_INVALID, "hidden_size must be an integer"},
      {LLAMA, NULL, "\"vocab_size\": 0", MRL_ERR_INVALID, "vocab_size must be an integer"},
      {LLAMA, NULL, "\"num_hidden_layers\": -2", MRL_ERR_INVALID, "num_hidden_layers must be"},
      {LLAMA, NULL, "\"intermediate_size\": 4294967296", MRL_ERR_INVALID,
       "intermediate_size must be an integer from 1 to"},
      {LLAMA, NULL, "\"head_dim\": 0", MRL_ERR_INVALID, "head_dim must be"},
      {LLAMA, NULL, "\"head_dim\": 3", MRL_ERR_INVALID, "head_dim must be even"},
      {LLAMA, NULL, "\"num_key_value_heads\": 3", MRL_ERR_INVALID,
       "num_key_value_heads (3) must divide num_attention_heads (4)"},
      {LLAMA, NULL, "\"rms_norm_eps\": -1", MRL_ERR_INVALID, "rms_norm_eps must be a positive"},
      {LLAMA, NULL, "\"rms_norm_eps\": 1e-60", MRL_ERR_INVALID, "rms_norm_eps must be a positive"},
      {LLAMA, NULL, "\"rope_theta\": \"big\"", MRL_ERR_INVALID, "rope_theta must be a positive"},
      {LLAMA, NULL, "\"rope_theta\": 1e39", MRL_ERR_INVALID, "rope_theta must be a positive"},
      {LLAMA, NULL, "\"tie_word_embeddings\": \"yes\"", MRL_ERR_INVALID,
       "tie_word_embeddings must be true or false"},
      {LLAMA, NULL, "\"use_sliding_window\": 1", MRL_ERR_INVALID,
       "use_sliding_window must be true or false"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_config(dir, cases[i].arch, cases[i].omit, cases[i].extra);
    CHECK_FAILS(e, cases[i].want, cases[i].needle, mrl_model_load(e, dir, &m));
  }
  write_text(dir, "config.json", "{\"architectures\": ");
  CHECK_FAILS(e, MRL_ERR_INVALID, "config.json: unexpected end of input",
              mrl_model_load(e, dir, &m));
  write_text(dir, "config.json", "[]");
  CHECK_FAILS(e, MRL_ERR_INVALID, "config.json: not a JSON object", mrl_model_load(e, dir, &m));
  char path[512];
  path_in(path, sizeof path, dir, "config.json");
  unlink(path);
  CHECK_FAILS(e, MRL_ERR_IO, "config.json: cannot open", mrl_model_load(e, dir, &m));
  CHECK_FAILS(e, MRL_ERR_NULL, "dir is NULL", mrl_model_load(e, NULL, &m));
  CHECK_FAILS(e, MRL_ERR_NULL, "out is NULL", mrl_model_load(e, dir, NULL));
  CHECK(mrl_model_load(NULL, dir, &m) == MRL_ERR_NULL);
  CHECK(m == NULL);
  remove_tree(dir);
  finish(e);
}

static void test_weight_refusals(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  mrl_model_config c = small_config();
  mrl_model *m = new_model(e, &c, 7), *back = NULL;
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  tensor_list l = {.n = 0};

  list_params(&l, m);
  list_remove(&l, "model.norm.weight");
  list_write(&l, e, dir, "model.safetensors", 0, l.n);
  CHECK_FAILS(e, MRL_ERR_INVALID, "tensor \"model.norm.weight\" (16) is missing",
              mrl_model_load(e, dir, &back));
  list_free(&l);

  list_params(&l, m);
  list_remove(&l, "model.layers.0.mlp.up_proj.weight");
  mrl_tensor *wrong = NULL;
  MUST(mrl_tensor_new(e, SHAPE(16, 24), &wrong));
  list_add(&l, "model.layers.0.mlp.up_proj.weight", wrong);
  list_write(&l, e, dir, "model.safetensors", 0, l.n);
  CHECK_FAILS(e, MRL_ERR_SHAPE,
              "tensor \"model.layers.0.mlp.up_proj.weight\" has shape (16x24), the config needs "
              "(24x16)",
              mrl_model_load(e, dir, &back));
  list_free(&l);

  list_params(&l, m);
  mrl_tensor *extra = NULL;
  MUST(mrl_tensor_new(e, SHAPE(16), &extra));
  list_add(&l, "model.layers.0.self_attn.o_proj.bias", extra);
  list_write(&l, e, dir, "model.safetensors", 0, l.n);
  CHECK_FAILS(e, MRL_ERR_INVALID,
              "model.safetensors: tensor \"model.layers.0.self_attn.o_proj.bias\" is not a "
              "parameter of this model",
              mrl_model_load(e, dir, &back));
  list_free(&l);

  /* RoPE frequency buffers some exports carry are ignored */
  list_params(&l, m);
  mrl_tensor *inv_freq = NULL;
  MUST(mrl_tensor_new(e, SHAPE(2), &inv_freq));
  list_add(&l, "model.layers.1.self_attn.rotary_emb.inv_freq", inv_freq);
  list_write(&l, e, dir, "model.safetensors", 0, l.n);
  MUST(mrl_model_load(e, dir, &back));
  CHECK(weight_diffs(m, back) == 0);
  mrl_model_free(back);
  back = NULL;
  list_free(&l);

  /* a dtype that cannot become float32 */
  list_params(&l, m);
  write_raw(&l, dir, "model.safetensors", "I64");
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "has dtype I64", mrl_model_load(e, dir, &back));
  list_free(&l);

  /* a file that is no safetensors file, and none at all */
  write_text(dir, "model.safetensors", "junk");
  CHECK_FAILS(e, MRL_ERR_INVALID, "model.safetensors: the file is shorter than",
              mrl_model_load(e, dir, &back));
  char path[512];
  path_in(path, sizeof path, dir, "model.safetensors");
  unlink(path);
  CHECK_FAILS(e, MRL_ERR_IO, "no model.safetensors or model.safetensors.index.json",
              mrl_model_load(e, dir, &back));
  CHECK(back == NULL);

  /* the target directory cannot be made: a file stands in its way */
  path_in(path, sizeof path, dir, "config.json");
  char below[600];
  snprintf(below, sizeof below, "%s/sub", path);
  CHECK_FAILS(e, MRL_ERR_IO, "cannot create directory", mrl_model_save(m, below, MRL_DTYPE_F32));
  mrl_model_free(m);
  remove_tree(dir);
  finish(e);
}

/* A tied model's file may carry lm_head.weight: ignored when its shape fits. */
static void test_tied_head_in_file(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  mrl_model_config c = small_config();
  c.tie_embeddings = 1;
  mrl_model *m = new_model(e, &c, 8), *back = NULL;
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  tensor_list l = {.n = 0};
  list_params(&l, m);
  mrl_tensor *head = NULL;
  MUST(mrl_tensor_new(e, SHAPE(32, 16), &head));
  list_add(&l, "lm_head.weight", head);
  list_write(&l, e, dir, "model.safetensors", 0, l.n);
  MUST(mrl_model_load(e, dir, &back));
  CHECK(weight_diffs(m, back) == 0); /* the embedding, not the zeros of the stored head */
  mrl_model_free(back);
  back = NULL;
  list_remove(&l, "lm_head.weight");
  MUST(mrl_tensor_new(e, SHAPE(16, 32), &head));
  list_add(&l, "lm_head.weight", head);
  list_write(&l, e, dir, "model.safetensors", 0, l.n);
  CHECK_FAILS(e, MRL_ERR_SHAPE, "has shape (16x32), the config needs (32x16)",
              mrl_model_load(e, dir, &back));
  list_free(&l);
  /* untied: lm_head.weight is required */
  list_params(&l, m);
  list_write(&l, e, dir, "model.safetensors", 0, l.n);
  write_config(dir, LLAMA, NULL, NULL);
  CHECK_FAILS(e, MRL_ERR_INVALID, "tensor \"lm_head.weight\" (32x16) is missing",
              mrl_model_load(e, dir, &back));
  list_free(&l);
  mrl_model_free(m);
  remove_tree(dir);
  finish(e);
}

static void test_f16_weights(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  mrl_model_config c = small_config();
  mrl_model *m = new_model(e, &c, 9), *back = NULL;
  for (int64_t i = 0; i < m->numel; i++) m->weights[i] = (float)(i % 17 - 8) / 16.0f; /* exact */
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  tensor_list l = {.n = 0};
  list_params(&l, m);
  write_raw(&l, dir, "model.safetensors", "F16");
  list_free(&l);
  MUST(mrl_model_load(e, dir, &back));
  CHECK(weight_diffs(m, back) == 0);
  mrl_model_free(back);
  mrl_model_free(m);
  remove_tree(dir);
  finish(e);
}

/* An index in transformers' layout naming each tensor's shard. */
static void write_index(const char *dir, tensor_list *l, int split, const char *first,
                        const char *second) {
  char *text = malloc(1 << 16);
  size_t n = (size_t)snprintf(text, 1 << 16, "{\"metadata\": {\"total_size\": 1234},\n"
                                             " \"weight_map\": {");
  for (int i = 0; i < l->n; i++)
    n += (size_t)snprintf(text + n, (1 << 16) - n, "%s\n  \"%s\": \"%s\"", i ? "," : "",
                          l->names[i], i < split ? first : second);
  snprintf(text + n, (1 << 16) - n, "\n }\n}\n");
  write_text(dir, "model.safetensors.index.json", text);
  free(text);
}

static void test_sharded(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  mrl_model_config c = small_config();
  mrl_model *m = new_model(e, &c, 10), *back = NULL;
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  char path[512];
  path_in(path, sizeof path, dir, "model.safetensors");
  unlink(path);
  const char *s1 = "model-00001-of-00002.safetensors", *s2 = "model-00002-of-00002.safetensors";
  tensor_list l = {.n = 0};
  list_params(&l, m);
  int split = 9;
  list_write(&l, e, dir, s1, 0, split);
  list_write(&l, e, dir, s2, split, l.n - split);
  write_index(dir, &l, split, s1, s2);
  MUST(mrl_model_load(e, dir, &back));
  CHECK(weight_diffs(m, back) == 0);
  mrl_model_free(back);
  back = NULL;

  /* a model saved into the directory of a sharded one: the saved file wins, as in transformers */
  mrl_model *newer = new_model(e, &c, 20);
  MUST(mrl_model_save(newer, dir, MRL_DTYPE_F32));
  MUST(mrl_model_load(e, dir, &back));
  CHECK(weight_diffs(newer, back) == 0);
  mrl_model_free(back);
  back = NULL;
  mrl_model_free(newer);
  unlink(path);

  /* the index lies about where a tensor is */
  write_index(dir, &l, split - 1, s1, s2);
  CHECK_FAILS(e, MRL_ERR_INVALID, "weight_map puts \"", mrl_model_load(e, dir, &back));
  CHECK_FAILS(e, MRL_ERR_INVALID, "in model-00002-of-00002.safetensors, which has no such tensor",
              mrl_model_load(e, dir, &back));
  /* a shard outside the directory, a missing shard, no weight_map */
  write_index(dir, &l, split, s1, "../model-00002-of-00002.safetensors");
  CHECK_FAILS(e, MRL_ERR_INVALID, "does not name a file in the directory",
              mrl_model_load(e, dir, &back));
  write_index(dir, &l, split, s1, "model-00003-of-00002.safetensors");
  CHECK_FAILS(e, MRL_ERR_IO, "model-00003-of-00002.safetensors: cannot open",
              mrl_model_load(e, dir, &back));
  write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
  CHECK_FAILS(e, MRL_ERR_INVALID, "weight_map is missing", mrl_model_load(e, dir, &back));
  write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": 5}}");
  CHECK_FAILS(e, MRL_ERR_INVALID, "weight_map entry \"a\" does not name a file",
              mrl_model_load(e, dir, &back));
  /* a tensor stored in two shards */
  list_write(&l, e, dir, s2, split - 1, l.n - split + 1);
  write_index(dir, &l, split, s1, s2);
  CHECK_FAILS(e, MRL_ERR_INVALID, "is in both", mrl_model_load(e, dir, &back));
  /* a tensor in no shard and not in the index */
  list_write(&l, e, dir, s2, split, l.n - split - 1);
  tensor_list shorter = l;
  shorter.n--;
  write_index(dir, &shorter, split, s1, s2);
  CHECK_FAILS(e, MRL_ERR_INVALID,
              "model.safetensors.index.json: tensor \"lm_head.weight\" (32x16) is missing",
              mrl_model_load(e, dir, &back));
  CHECK(back == NULL);
  list_free(&l);
  mrl_model_free(m);
  remove_tree(dir);
  finish(e);
}

/* ---- checkpoints ---- */

static void give_moments(mrl_model *m, uint32_t salt) {
  MUST(mrl__tensor_alloc(m->engine, "test", 1, &m->numel, &m->adam_m_t));
  MUST(mrl__tensor_alloc(m->engine, "test", 1, &m->numel, &m->adam_v_t));
  m->adam_m = m->adam_m_t->data;
  m->adam_v = m->adam_v_t->data;
  for (int64_t i = 0; i < m->numel; i++) {
    m->adam_m[i] = (float)((i * 31 + salt) % 101) * 1e-3f - 0.05f;
    m->adam_v[i] = (float)((i * 17 + salt) % 89) * 1e-7f;
  }
}

static bool same_rng(const mrl_rng *a, const mrl_rng *b) {
  return memcmp(a->s, b->s, sizeof a->s) == 0 &&
         memcmp(&a->spare, &b->spare, sizeof a->spare) == 0 && a->has_spare == b->has_spare;
}

static void test_checkpoint_round_trip(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  char path[512], path2[512];
  path_in(path, sizeof path, dir, "step-123.safetensors");
  path_in(path2, sizeof path2, dir, "fresh.safetensors");
  mrl_model_config c = small_config();
  c.qk_norm = 1;
  c.qkv_bias = 1; /* any configuration checkpoints, even one no Hugging Face class has */
  c.rope_theta = 1234.5f;
  mrl_model *m = new_model(e, &c, 11);
  uint32_t nan_bits = 0x7FC01234u;
  memcpy(&m->weights[3], &nan_bits, 4);
  give_moments(m, 1);
  m->adam_step = 7;
  mrl_rng *rng = NULL, *rng2 = NULL;
  MUST(mrl_rng_new(e, 99, &rng));
  double x;
  uint64_t u;
  MUST(mrl_rng_normal(rng, &x)); /* leaves a spare normal */
  CHECK(rng->has_spare == 1);
  MUST(mrl_model_save_checkpoint(m, path, 123, rng));
  CHECK(count_entries(dir) == 1);

  mrl_model *m2 = new_model(e, &c, 12);
  MUST(mrl_rng_new(e, 5, &rng2));
  int64_t step = -1;
  MUST(mrl_model_load_checkpoint(m2, path, &step, rng2));
  CHECK(step == 123);
  CHECK(weight_diffs(m, m2) == 0);
  CHECK(m2->adam_m && m2->adam_v && m2->adam_step == 7);
  CHECK(memcmp(m->adam_m, m2->adam_m, sizeof(float) * (size_t)m->numel) == 0);
  CHECK(memcmp(m->adam_v, m2->adam_v, sizeof(float) * (size_t)m->numel) == 0);
  CHECK(same_rng(rng, rng2));
  double x1, x2;
  MUST(mrl_rng_normal(rng, &x1));
  MUST(mrl_rng_normal(rng2, &x2));
  CHECK(x1 == x2);
  MUST(mrl_rng_u64(rng, &u));
  uint64_t u2;
  MUST(mrl_rng_u64(rng2, &u2));
  CHECK(u == u2);

  /* a model that has not stepped has no moments: restoring it drops m2's */
  mrl_model *fresh = new_model(e, &c, 13);
  MUST(mrl_model_save_checkpoint(fresh, path2, -5, NULL));
  MUST(mrl_model_load_checkpoint(m2, path2, NULL, NULL));
  CHECK(m2->adam_m == NULL && m2->adam_m_t == NULL && m2->adam_v == NULL && m2->adam_step == 0);
  CHECK(weight_diffs(fresh, m2) == 0);
  /* and restoring moments into a model without them allocates them */
  MUST(mrl_model_load_checkpoint(fresh, path, &step, NULL));
  CHECK(fresh->adam_m && memcmp(m->adam_v, fresh->adam_v, sizeof(float) * (size_t)m->numel) == 0);
  MUST(mrl_model_load_checkpoint(m2, path2, &step, NULL));
  CHECK(step == -5);

  mrl_model_free(fresh);
  mrl_model_free(m2);
  mrl_model_free(m);
  mrl_rng_free(rng);
  mrl_rng_free(rng2);
  remove_tree(dir);
  finish(e);
}

static void test_checkpoint_refusals(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  char path[512], bad[512], hf[512];
  path_in(path, sizeof path, dir, "ckpt.safetensors");
  path_in(bad, sizeof bad, dir, "bad.safetensors");
  mrl_model_config c = small_config();
  mrl_model *m = new_model(e, &c, 14);
  give_moments(m, 2);
  MUST(mrl_model_save_checkpoint(m, path, 1, NULL));

  mrl_model_config other = small_config();
  other.dim = 32;
  mrl_model *o = new_model(e, &other, 15);
  float before = o->weights[0];
  int64_t step = 77;
  CHECK_FAILS(e, MRL_ERR_INVALID, "written for another configuration: dim is 16 there, 32 in this",
              mrl_model_load_checkpoint(o, path, &step, NULL));
  mrl_model_free(o);
  other = small_config();
  other.rope_theta = 500000.0f;
  o = new_model(e, &other, 15);
  CHECK_FAILS(e, MRL_ERR_INVALID, "rope_theta is 10000.0 there, 500000.0 in this model",
              mrl_model_load_checkpoint(o, path, &step, NULL));
  CHECK(o->weights[0] == before && o->adam_m == NULL && step == 77); /* untouched */
  mrl_model_free(o);

  mrl_model *m2 = new_model(e, &c, 16);
  mrl_rng *rng = NULL;
  MUST(mrl_rng_new(e, 1, &rng));
  mrl_rng saved = *rng;
  CHECK_FAILS(e, MRL_ERR_INVALID, "the checkpoint holds no RNG state",
              mrl_model_load_checkpoint(m2, path, &step, rng));
  CHECK(same_rng(rng, &saved) && m2->adam_m == NULL);
  MUST(mrl_model_save(m, dir, MRL_DTYPE_F32));
  path_in(hf, sizeof hf, dir, "model.safetensors");
  CHECK_FAILS(e, MRL_ERR_INVALID, "not a moonrl checkpoint",
              mrl_model_load_checkpoint(m2, hf, &step, NULL));
  CHECK_FAILS(e, MRL_ERR_IO, "cannot open",
              mrl_model_load_checkpoint(m2, "/nonexistent/ckpt.safetensors", &step, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "path is NULL", mrl_model_load_checkpoint(m2, NULL, &step, NULL));
  CHECK(mrl_model_load_checkpoint(NULL, path, &step, NULL) == MRL_ERR_NULL);

  /* files with the checkpoint's metadata but tensors left out or added */
  mrl_safetensors *f = NULL;
  MUST(mrl_safetensors_open(e, path, &f));
  static const char *const keys[5] = {"format", "format_version", "config", "adam_step", "step"};
  const char *values[5];
  for (int i = 0; i < 5; i++) values[i] = mrl_safetensors_metadata(f, keys[i]);
  tensor_list l = {.n = 0};
  for (int64_t i = 0; i < mrl_safetensors_count(f); i++) {
    const char *name = mrl_safetensors_name(f, i);
    if (strncmp(name, "optimizer.v.", 12) == 0 && strstr(name, "layers.1")) continue;
    mrl_tensor *t = NULL;
    MUST(mrl_safetensors_read(f, name, &t));
    list_add(&l, name, t);
  }
  MUST(mrl_safetensors_write(e, bad, l.n, l.names, l.tensors, MRL_DTYPE_F32, 5, keys, values));
  CHECK_FAILS(e, MRL_ERR_INVALID, "AdamW moments for only some parameters",
              mrl_model_load_checkpoint(m2, bad, &step, NULL));
  mrl_tensor *x = NULL;
  MUST(mrl_tensor_new(e, SHAPE(3), &x));
  list_add(&l, "optimizer.w.model.norm.weight", x);
  MUST(mrl_safetensors_write(e, bad, l.n, l.names, l.tensors, MRL_DTYPE_F32, 5, keys, values));
  CHECK_FAILS(e, MRL_ERR_INVALID, "tensor \"optimizer.w.model.norm.weight\" is not part of this",
              mrl_model_load_checkpoint(m2, bad, &step, NULL));
  list_remove(&l, "optimizer.w.model.norm.weight");
  list_remove(&l, "model.embed_tokens.weight");
  MUST(mrl_safetensors_write(e, bad, l.n, l.names, l.tensors, MRL_DTYPE_F32, 5, keys, values));
  CHECK_FAILS(e, MRL_ERR_INVALID, "tensor \"model.embed_tokens.weight\" is missing",
              mrl_model_load_checkpoint(m2, bad, &step, NULL));
  values[1] = "2";
  MUST(mrl_safetensors_write(e, bad, l.n, l.names, l.tensors, MRL_DTYPE_F32, 5, keys, values));
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "checkpoint format version 2",
              mrl_model_load_checkpoint(m2, bad, &step, NULL));
  values[1] = "1";
  values[3] = "seven";
  MUST(mrl_safetensors_write(e, bad, l.n, l.names, l.tensors, MRL_DTYPE_F32, 5, keys, values));
  CHECK_FAILS(e, MRL_ERR_INVALID, "adam_step is missing or not a count",
              mrl_model_load_checkpoint(m2, bad, &step, NULL));
  values[3] = "0";
  values[2] = "{\"vocab\": 32}";
  MUST(mrl_safetensors_write(e, bad, l.n, l.names, l.tensors, MRL_DTYPE_F32, 5, keys, values));
  CHECK_FAILS(e, MRL_ERR_INVALID, "the config does not list the",
              mrl_model_load_checkpoint(m2, bad, &step, NULL));
  list_free(&l);
  mrl_safetensors_close(f);
  CHECK(step == 77 && m2->adam_m == NULL);

  CHECK_FAILS(e, MRL_ERR_IO, "cannot create a temporary file",
              mrl_model_save_checkpoint(m, "/nonexistent/dir/ckpt.safetensors", 1, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "path is NULL", mrl_model_save_checkpoint(m, NULL, 1, NULL));
  mrl_rng_free(rng);
  mrl_model_free(m2);
  mrl_model_free(m);
  remove_tree(dir);
  finish(e);
}

static const test_case tests[] = {
    {"save and load F32 bit for bit", test_save_load_f32},
    {"save and load BF16, tied", test_save_load_bf16},
    {"Qwen2 q/k/v biases", test_qwen2_biases},
    {"Qwen3 q/k norms and head_dim", test_qwen3_norms},
    {"Hugging Face configs and defaults", test_hf_configs},
    {"config refusals", test_config_refusals},
    {"weight refusals", test_weight_refusals},
    {"tied head stored in the file", test_tied_head_in_file},
    {"F16 weights", test_f16_weights},
    {"sharded weights", test_sharded},
    {"checkpoint round trip", test_checkpoint_round_trip},
    {"checkpoint refusals", test_checkpoint_refusals},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
