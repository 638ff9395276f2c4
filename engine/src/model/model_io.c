/* model_io.c - the model's files: Hugging Face directories (config.json, model.safetensors or
 * sharded files with model.safetensors.index.json) in and out, and moonrl's own training
 * checkpoints (weights, AdamW state, step and RNG in one safetensors file). */
#include "model.h"

#include "file.h"
#include "json.h"
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
  PATH_CAP = 4096,
  TEXT_CAP = 4096,             /* config texts (both kinds) are far smaller */
  MAX_JSON_FILE = 64 << 20,    /* config.json and the shard index */
  OPT_NAME_CAP = MRL_PARAM_NAME_CAP + 16,
  NAME_SHOWN = 200
};

static const char *const CHECKPOINT_FORMAT = "moonrl.checkpoint";
static const char *const CHECKPOINT_VERSION = "1";

/* ---- small helpers ---- */

static mrl_status join_path(mrl_engine *e, const char *fn, char *out, const char *dir,
                            const char *name) {
  int n = snprintf(out, PATH_CAP, "%s/%s", dir, name);
  if (n < 0 || n >= PATH_CAP)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s/%s: path is too long", dir, name);
  return MRL_OK;
}

static bool file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

static mrl_status parse_json_file(mrl_engine *e, const char *fn, const char *path,
                                  mrl_json_doc **doc) {
  char *text = NULL;
  size_t len = 0;
  mrl_status st = mrl__read_file(e, fn, path, MAX_JSON_FILE, &text, &len);
  if (st) return st;
  st = mrl__json_parse(e, fn, path, text, len, doc);
  mrl__free(e, text, len + 1);
  return st;
}

/* Appends to a fixed text buffer; overflow (impossible for the configs written here) is caught
 * by the caller through `len`. */
typedef struct {
  char s[TEXT_CAP];
  size_t len;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
  if (t->len >= sizeof t->s) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->s + t->len, sizeof t->s - t->len, fmt, ap);
  va_end(ap);
  t->len = n < 0 ? sizeof t->s : t->len + (size_t)n;
}

/* The shortest decimal that reads back (through the JSON reader: double, then float) as x;
 * whole numbers as Python writes floats ("10000.0"), for configs people read. */
static void float_text(char *buf, size_t cap, float x) {
  if (x == truncf(x) && fabsf(x) < 1e15f) {
    snprintf(buf, cap, "%.1f", (double)x);
    return;
  }
  for (int digits = 1; digits <= 17; digits++) {
    snprintf(buf, cap, "%.*g", digits, (double)x);
    if ((float)strtod(buf, NULL) == x) return;
  }
}

/* ---- config.json ---- */

typedef enum { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3 } arch_kind;

static const struct {
  const char *name, *model_type;
} archs[] = {
    {"LlamaForCausalLM", "llama"}, {"Qwen2ForCausalLM", "qwen2"}, {"Qwen3ForCausalLM", "qwen3"}};

/* Reads config.json. Honoured fields are read below; these are deliberately ignored because they
 * do not change the computation (or describe the other file formats): model_type (the
 * architecture decides), torch_dtype / dtype (weights are converted to float32 whatever they are),
 * bos_token_id, eos_token_id, pad_token_id, attention_dropout (training-time dropout, 0 in these
 * models), initializer_range, use_cache, transformers_version, max_window_layers and
 * sliding_window (used only with use_sliding_window), and for Qwen2 attention_bias (Qwen2 always
 * has q/k/v biases and no o bias, whatever the field says). Anything not named is ignored too. */
typedef struct {
  mrl_engine *e;
  const char *fn, *what;
  const mrl_json *root;
} config_reader;

/* JSON null counts as absent: Hugging Face writes None for "use the default". */
static const mrl_json *field(const mrl_json *obj, const char *key) {
  const mrl_json *v = mrl__json_get(obj, key);
  return v && v->type != MRL_JSON_NULL ? v : NULL;
}

static mrl_status read_int(const config_reader *r, const mrl_json *obj, const char *key,
                           bool required, int dflt, int *out) {
  const mrl_json *v = field(obj, key);
  if (!v) {
    if (required) return mrl__fail(r->e, MRL_ERR_INVALID, r->fn, "%s: %s is missing", r->what, key);
    *out = dflt;
    return MRL_OK;
  }
  if (v->type != MRL_JSON_NUMBER || !v->is_integer || v->integer < 1 || v->integer > INT_MAX)
    return mrl__fail(r->e, MRL_ERR_INVALID, r->fn, "%s: %s must be an integer from 1 to %d",
                     r->what, key, INT_MAX);
  *out = (int)v->integer;
  return MRL_OK;
}

static mrl_status read_positive(const config_reader *r, const mrl_json *obj, const char *key,
                                bool required, float dflt, float *out) {
  const mrl_json *v = field(obj, key);
  if (!v) {
    if (required) return mrl__fail(r->e, MRL_ERR_INVALID, r->fn, "%s: %s is missing", r->what, key);
    *out = dflt;
    return MRL_OK;
  }
  if (v->type != MRL_JSON_NUMBER || !(v->number > 0) || !isfinite((float)v->number) ||
      (float)v->number == 0.0f)
    return mrl__fail(r->e, MRL_ERR_INVALID, r->fn, "%s: %s must be a positive number", r->what,
                     key);
  *out = (float)v->number;
  return MRL_OK;
}

static mrl_status read_bool(const config_reader *r, const char *key, bool dflt, bool *out) {
  const mrl_json *v = field(r->root, key);
  if (!v) {
    *out = dflt;
    return MRL_OK;
  }
  if (v->type != MRL_JSON_TRUE && v->type != MRL_JSON_FALSE)
    return mrl__fail(r->e, MRL_ERR_INVALID, r->fn, "%s: %s must be true or false", r->what, key);
  *out = v->type == MRL_JSON_TRUE;
  return MRL_OK;
}

static mrl_status unsupported(const config_reader *r, const char *what_field) {
  return mrl__fail(r->e, MRL_ERR_UNSUPPORTED, r->fn, "%s: %s is not supported", r->what,
                   what_field);
}

static bool json_str_is(const mrl_json *v, const char *s) {
  return v && v->type == MRL_JSON_STRING && strcmp(v->string, s) == 0 && strlen(s) == v->length;
}

/* RoPE: rope_scaling (transformers 4) or rope_parameters (transformers 5, which also moves
 * rope_theta inside), each either absent/null, of type "default", or of type "llama3". */
static mrl_status read_rope(const config_reader *r, mrl_model_config *cfg) {
  const mrl_json *scaling = field(r->root, "rope_scaling");
  const mrl_json *params = field(r->root, "rope_parameters");
  const char *key = "rope_scaling";
  if (params) {
    if (scaling)
      return mrl__fail(r->e, MRL_ERR_INVALID, r->fn,
                       "%s: rope_scaling and rope_parameters are both given", r->what);
    scaling = params;
    key = "rope_parameters";
  }
  mrl_status st = read_positive(r, r->root, "rope_theta", false, 10000.0f, &cfg->rope_theta);
  if (st) return st;
  if (!scaling) return MRL_OK;
  if (scaling->type != MRL_JSON_OBJECT)
    return mrl__fail(r->e, MRL_ERR_INVALID, r->fn, "%s: %s is not an object", r->what, key);
  if (params && (st = read_positive(r, params, "rope_theta", false, cfg->rope_theta,
                                    &cfg->rope_theta)))
    return st;
  const mrl_json *type = field(scaling, "rope_type");
  if (!type) type = field(scaling, "type");
  if (!type || type->type != MRL_JSON_STRING)
    return mrl__fail(r->e, MRL_ERR_INVALID, r->fn, "%s: %s has no rope_type", r->what, key);
  if (json_str_is(type, "default")) return MRL_OK;
  if (!json_str_is(type, "llama3"))
    return mrl__fail(r->e, MRL_ERR_UNSUPPORTED, r->fn,
                     "%s: %s of type \"%.*s\" is not supported (only \"llama3\")", r->what, key,
                     NAME_SHOWN, type->string);
  if ((st = read_positive(r, scaling, "factor", true, 0, &cfg->rope_llama3_factor)) ||
      (st = read_positive(r, scaling, "low_freq_factor", true, 0,
                          &cfg->rope_llama3_low_freq_factor)) ||
      (st = read_positive(r, scaling, "high_freq_factor", true, 0,
                          &cfg->rope_llama3_high_freq_factor)) ||
      (st = read_int(r, scaling, "original_max_position_embeddings", true, 0,
                     &cfg->rope_llama3_original_ctx)))
    return st;
  return MRL_OK;
}

static mrl_status config_from_json(mrl_engine *e, const char *fn, const char *what,
                                   const mrl_json *root, mrl_model_config *out) {
  config_reader r = {e, fn, what, root};
  if (root->type != MRL_JSON_OBJECT)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: not a JSON object", what);
  const mrl_json *list = field(root, "architectures");
  if (!list) return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: architectures is missing", what);
  if (list->type != MRL_JSON_ARRAY || list->length != 1 || list->items[0].type != MRL_JSON_STRING)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: architectures must list one name", what);
  int arch = 0;
  while (arch < 3 && !json_str_is(&list->items[0], archs[arch].name)) arch++;
  if (arch == 3)
    return mrl__fail(e, MRL_ERR_UNSUPPORTED, fn,
                     "%s: architectures: \"%.*s\" is not supported (LlamaForCausalLM, "
                     "Qwen2ForCausalLM, Qwen3ForCausalLM)",
                     what, NAME_SHOWN, list->items[0].string);

  mrl_model_config c;
  memset(&c, 0, sizeof c);
  mrl_status st;
  if ((st = read_int(&r, root, "vocab_size", true, 0, &c.vocab)) ||
      (st = read_int(&r, root, "hidden_size", true, 0, &c.dim)) ||
      (st = read_int(&r, root, "num_hidden_layers", true, 0, &c.layers)) ||
      (st = read_int(&r, root, "num_attention_heads", true, 0, &c.heads)) ||
      (st = read_int(&r, root, "num_key_value_heads", false, c.heads, &c.kv_heads)) ||
      /* Qwen3Config's head_dim defaults to 128; the others' to hidden_size / heads */
      (st = read_int(&r, root, "head_dim", false, arch == ARCH_QWEN3 ? 128 : 0, &c.head_dim)) ||
      (st = read_int(&r, root, "intermediate_size", true, 0, &c.ffn)) ||
      (st = read_int(&r, root, "max_position_embeddings", true, 0, &c.ctx)) ||
      (st = read_positive(&r, root, "rms_norm_eps", false, 1e-6f, &c.norm_eps)) ||
      (st = read_rope(&r, &c)))
    return st;
  if (c.heads % c.kv_heads != 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: num_key_value_heads (%d) must divide num_attention_heads (%d)", what,
                     c.kv_heads, c.heads);
  bool tie, mlp_bias, attention_bias, sliding;
  if ((st = read_bool(&r, "tie_word_embeddings", false, &tie)) ||
      (st = read_bool(&r, "mlp_bias", false, &mlp_bias)) ||
      (st = read_bool(&r, "attention_bias", false, &attention_bias)) ||
      (st = read_bool(&r, "use_sliding_window", false, &sliding)))
    return st;
  c.tie_embeddings = tie;
  const mrl_json *act = field(root, "hidden_act");
  if (act && !json_str_is(act, "silu")) return unsupported(&r, "hidden_act other than \"silu\"");
  if (mlp_bias) return unsupported(&r, "mlp_bias = true");
  /* Llama and Qwen3 put biases on q, k, v and o alike; the model has no o bias */
  if (attention_bias && arch != ARCH_QWEN2) return unsupported(&r, "attention_bias = true");
  if (sliding) return unsupported(&r, "use_sliding_window = true");
  const mrl_json *layer_types = field(root, "layer_types");
  if (layer_types) {
    if (layer_types->type != MRL_JSON_ARRAY)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: layer_types is not a list", what);
    for (size_t i = 0; i < layer_types->length; i++)
      if (!json_str_is(&layer_types->items[i], "full_attention"))
        return unsupported(&r, "layer_types other than \"full_attention\"");
  }
  const mrl_json *tp = field(root, "pretraining_tp");
  if (tp && !(tp->type == MRL_JSON_NUMBER && tp->is_integer && tp->integer == 1))
    return unsupported(&r, "pretraining_tp other than 1");
  c.qkv_bias = arch == ARCH_QWEN2;
  c.qk_norm = arch == ARCH_QWEN3;
  *out = c;
  return MRL_OK;
}

static mrl_status write_hf_config(const mrl_model *m, const char *fn, const char *path,
                                  mrl_dtype dtype, arch_kind arch) {
  const mrl_model_config *c = &m->cfg;
  text t = {.len = 0};
  char num[40];
  put(&t, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", archs[arch].name,
      archs[arch].model_type);
  put(&t, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n", c->vocab,
      c->dim, c->ffn);
  put(&t, "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n", c->layers, c->heads);
  put(&t, "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n", c->kv_heads, m->head_dim);
  put(&t, "  \"max_position_embeddings\": %d,\n", c->ctx);
  float_text(num, sizeof num, c->rope_theta);
  put(&t, "  \"rope_theta\": %s,\n", num);
  if (c->rope_llama3_factor > 0.0f) {
    float_text(num, sizeof num, c->rope_llama3_factor);
    put(&t, "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %s, ", num);
    float_text(num, sizeof num, c->rope_llama3_low_freq_factor);
    put(&t, "\"low_freq_factor\": %s, ", num);
    float_text(num, sizeof num, c->rope_llama3_high_freq_factor);
    put(&t, "\"high_freq_factor\": %s, \"original_max_position_embeddings\": %d},\n", num,
        c->rope_llama3_original_ctx);
  } else {
    put(&t, "  \"rope_scaling\": null,\n");
  }
  float_text(num, sizeof num, c->norm_eps);
  put(&t, "  \"rms_norm_eps\": %s,\n  \"tie_word_embeddings\": %s,\n  \"hidden_act\": \"silu\",\n",
      num, c->tie_embeddings ? "true" : "false");
  if (arch != ARCH_QWEN2) put(&t, "  \"attention_bias\": false,\n");
  if (arch == ARCH_LLAMA) put(&t, "  \"mlp_bias\": false,\n");
  if (arch != ARCH_LLAMA) put(&t, "  \"use_sliding_window\": false,\n");
  put(&t, "  \"torch_dtype\": \"%s\"\n}\n", dtype == MRL_DTYPE_F32 ? "float32" : "bfloat16");
  if (t.len >= sizeof t.s) return mrl__fail(m->engine, MRL_ERR_OVERFLOW, fn, "config too long");
  return mrl__write_file_atomic(m->engine, fn, path, t.s, t.len);
}

/* ---- loading weights ---- */

/* Hugging Face files of Llama-family models may carry RoPE frequency tables: buffers the model
 * recomputes, not parameters. */
static bool is_rope_buffer(const char *name) {
  static const char suffix[] = ".rotary_emb.inv_freq";
  size_t n = strlen(name), s = sizeof suffix - 1;
  return strncmp(name, "model.", 6) == 0 && n > s && strcmp(name + n - s, suffix) == 0;
}

static mrl_status shape_mismatch(mrl_engine *e, const char *fn, const char *file,
                                 const mrl_safetensors_entry *t, const mrl_param *p) {
  char have[MRL_MAX_RANK * 24], want[64];
  mrl__shape_str(have, sizeof have, t->rank, t->shape);
  mrl__shape_str(want, sizeof want, p->rank, p->shape);
  return mrl__fail(e, MRL_ERR_SHAPE, fn, "%s: tensor \"%s\" has shape %s, the config needs %s",
                   file, p->name, have, want);
}

static bool same_shape(const mrl_safetensors_entry *t, const mrl_param *p) {
  return t->rank == p->rank && t->shape[0] == p->shape[0] &&
         (p->rank == 1 || t->shape[1] == p->shape[1]);
}

/* Loads every tensor of one file into m; loaded_from[p] records the file number of parameter p
 * (-1: not yet), `files` names the earlier ones for messages. */
static mrl_status load_file(mrl_model *m, const char *fn, const char *path,
                            const mrl_safetensors *f, int file_no, int *loaded_from,
                            const char *const *files) {
  mrl_engine *e = m->engine;
  for (int64_t i = 0; i < mrl_safetensors_count(f); i++) {
    const mrl_safetensors_entry *t = mrl__safetensors_entry(f, i);
    int p = mrl__model_find_param(m, t->name);
    if (p < 0) {
      /* a tied model's head is the embedding: a stored copy adds nothing (transformers re-ties
       * it after loading too), but a copy of another shape means a config mismatch */
      if (m->cfg.tie_embeddings && strcmp(t->name, "lm_head.weight") == 0) {
        const mrl_param *embed = &m->params[mrl__model_find_param(m, "model.embed_tokens.weight")];
        if (!same_shape(t, embed)) return shape_mismatch(e, fn, path, t, embed);
        continue;
      }
      if (is_rope_buffer(t->name)) continue;
      return mrl__fail(e, MRL_ERR_INVALID, fn,
                       "%s: tensor \"%.*s\" is not a parameter of this model", path, NAME_SHOWN,
                       t->name);
    }
    const mrl_param *par = &m->params[p];
    if (!same_shape(t, par)) return shape_mismatch(e, fn, path, t, par);
    if (loaded_from[p] >= 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "tensor \"%s\" is in both %s and %s", par->name,
                       files[loaded_from[p]], files[file_no]);
    mrl_status st = mrl__safetensors_read_into(f, fn, i, m->weights + par->offset);
    if (st) return st;
    loaded_from[p] = file_no;
  }
  return MRL_OK;
}

/* A shard named by the index must be a plain file name inside the model directory. */
static bool plain_file_name(const mrl_json *v) {
  return v->type == MRL_JSON_STRING && v->length > 0 && strlen(v->string) == v->length &&
         !strchr(v->string, '/') && strcmp(v->string, ".") != 0 && strcmp(v->string, "..") != 0;
}

static mrl_status load_sharded(mrl_model *m, const char *fn, const char *dir,
                               const char *index_path, int *loaded_from) {
  mrl_engine *e = m->engine;
  mrl_json_doc *doc;
  mrl_status st = parse_json_file(e, fn, index_path, &doc);
  if (st) return st;
  const mrl_json *map = mrl__json_get(mrl__json_root(doc), "weight_map");
  const char **shards = NULL;
  size_t nshards = 0;
  if (!map || map->type != MRL_JSON_OBJECT) {
    st = mrl__fail(e, MRL_ERR_INVALID, fn, "%s: weight_map is missing or not an object",
                   index_path);
  } else if (map->length &&
             !(shards = mrl__alloc(e, sizeof *shards * map->length))) {
    st = mrl__fail(e, MRL_ERR_NOMEM, fn, "%s: out of memory", index_path);
  }
  /* the distinct shard files, in order of first mention: each is opened once */
  for (size_t i = 0; !st && i < map->length; i++) {
    const mrl_json *v = &map->items[i];
    if (!plain_file_name(v)) {
      st = mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: weight_map entry \"%.*s\" does not name a file in the directory",
                     index_path, NAME_SHOWN, map->keys[i]);
      break;
    }
    size_t k = 0;
    while (k < nshards && strcmp(shards[k], v->string) != 0) k++;
    if (k == nshards) shards[nshards++] = v->string;
  }
  char path[PATH_CAP];
  for (size_t s = 0; !st && s < nshards; s++) {
    mrl_safetensors *f;
    if ((st = join_path(e, fn, path, dir, shards[s])) ||
        (st = mrl__safetensors_open(e, fn, path, &f)))
      break;
    st = load_file(m, fn, path, f, (int)s, loaded_from, shards);
    for (size_t i = 0; !st && i < map->length; i++)
      if (strcmp(map->items[i].string, shards[s]) == 0 &&
          mrl__safetensors_find(f, map->keys[i]) < 0)
        st = mrl__fail(e, MRL_ERR_INVALID, fn,
                       "%s: weight_map puts \"%.*s\" in %s, which has no such tensor", index_path,
                       NAME_SHOWN, map->keys[i], shards[s]);
    mrl_safetensors_close(f);
  }
  mrl__free(e, shards, sizeof *shards * (map && map->type == MRL_JSON_OBJECT ? map->length : 0));
  mrl__json_free(doc);
  return st;
}

static mrl_status load_weights(mrl_model *m, const char *fn, const char *dir) {
  mrl_engine *e = m->engine;
  char index_path[PATH_CAP], single_path[PATH_CAP];
  mrl_status st;
  if ((st = join_path(e, fn, index_path, dir, "model.safetensors.index.json")) ||
      (st = join_path(e, fn, single_path, dir, "model.safetensors")))
    return st;
  int *loaded_from = mrl__alloc(e, sizeof *loaded_from * (size_t)m->nparams);
  if (!loaded_from) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  for (int p = 0; p < m->nparams; p++) loaded_from[p] = -1;
  /* the single file first, as transformers does: after mrl_model_save into the directory of a
   * sharded model, the saved weights are the ones loaded, not the old shards */
  const char *source = single_path;
  if (file_exists(single_path)) {
    mrl_safetensors *f;
    if (!(st = mrl__safetensors_open(e, fn, single_path, &f))) {
      const char *names[1] = {single_path};
      st = load_file(m, fn, single_path, f, 0, loaded_from, names);
      mrl_safetensors_close(f);
    }
  } else if (file_exists(index_path)) {
    source = index_path;
    st = load_sharded(m, fn, dir, index_path, loaded_from);
  } else {
    st = mrl__fail(e, MRL_ERR_IO, fn, "%s: no model.safetensors or model.safetensors.index.json",
                   dir);
  }
  for (int p = 0; !st && p < m->nparams; p++)
    if (loaded_from[p] < 0) {
      char want[64];
      mrl__shape_str(want, sizeof want, m->params[p].rank, m->params[p].shape);
      st = mrl__fail(e, MRL_ERR_INVALID, fn, "%s: tensor \"%s\" %s is missing", source,
                     m->params[p].name, want);
    }
  mrl__free(e, loaded_from, sizeof *loaded_from * (size_t)m->nparams);
  return st;
}

mrl_status mrl_model_load(mrl_engine *e, const char *dir, mrl_model **out) {
  const char *fn = "mrl_model_load";
  if (!e) return MRL_ERR_NULL;
  if (!dir || !out) return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", dir ? "out" : "dir");
  char path[PATH_CAP];
  mrl_json_doc *doc;
  mrl_status st;
  if ((st = join_path(e, fn, path, dir, "config.json")) ||
      (st = parse_json_file(e, fn, path, &doc)))
    return st;
  mrl_model_config cfg;
  st = config_from_json(e, fn, path, mrl__json_root(doc), &cfg);
  mrl__json_free(doc);
  if (st) return st;
  mrl_model *m;
  if ((st = mrl__model_alloc(e, fn, &cfg, &m))) return st;
  if ((st = load_weights(m, fn, dir))) {
    mrl_model_free(m);
    return st;
  }
  *out = m;
  return MRL_OK;
}

/* ---- writing weights ---- */


/* The tensors of a file being written: names and views of the model's buffers. */
typedef struct {
  mrl_engine *e;
  int n, cap;
  const char **names;
  mrl_tensor **tensors;
  char (*name_buf)[OPT_NAME_CAP];
} tensor_list;

static mrl_status list_init(tensor_list *l, mrl_engine *e, const char *fn, int cap) {
  memset(l, 0, sizeof *l);
  l->e = e;
  l->cap = cap;
  l->names = mrl__alloc(e, sizeof *l->names * (size_t)cap);
  l->tensors = mrl__alloc(e, sizeof *l->tensors * (size_t)cap);
  l->name_buf = mrl__alloc(e, sizeof *l->name_buf * (size_t)cap);
  if (!l->names || !l->tensors || !l->name_buf) {
    mrl__free(e, l->names, sizeof *l->names * (size_t)cap);
    mrl__free(e, l->tensors, sizeof *l->tensors * (size_t)cap);
    mrl__free(e, l->name_buf, sizeof *l->name_buf * (size_t)cap);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  }
  return MRL_OK;
}

static mrl_status list_add(tensor_list *l, const char *prefix, const mrl_param *p,
                           mrl_tensor *buffer) {
  mrl_status st = mrl__model_param_view(p, buffer, &l->tensors[l->n]);
  if (st) return st;
  snprintf(l->name_buf[l->n], OPT_NAME_CAP, "%s%s", prefix, p->name);
  l->names[l->n] = l->name_buf[l->n];
  l->n++;
  return MRL_OK;
}

static void list_free(tensor_list *l) {
  for (int i = 0; i < l->n; i++) mrl_tensor_free(l->tensors[i]);
  mrl__free(l->e, l->names, sizeof *l->names * (size_t)l->cap);
  mrl__free(l->e, l->tensors, sizeof *l->tensors * (size_t)l->cap);
  mrl__free(l->e, l->name_buf, sizeof *l->name_buf * (size_t)l->cap);
}

mrl_status mrl_model_save(mrl_model *m, const char *dir, mrl_dtype dtype) {
  const char *fn = "mrl_model_save";
  if (!m) return MRL_ERR_NULL;
  mrl_engine *e = m->engine;
  if (!dir) return mrl__fail(e, MRL_ERR_NULL, fn, "dir is NULL");
  if (dtype != MRL_DTYPE_F32 && dtype != MRL_DTYPE_BF16)
    return mrl__fail(e, dtype == MRL_DTYPE_F16 ? MRL_ERR_UNSUPPORTED : MRL_ERR_INVALID, fn,
                     "dtype %d: models are saved as F32 or BF16", (int)dtype);
  if (m->cfg.qk_norm && m->cfg.qkv_bias)
    return mrl__fail(e, MRL_ERR_UNSUPPORTED, fn,
                     "no Hugging Face architecture has both q/k/v biases and q/k norms");
  arch_kind arch = m->cfg.qk_norm ? ARCH_QWEN3 : m->cfg.qkv_bias ? ARCH_QWEN2 : ARCH_LLAMA;
  char weights_path[PATH_CAP], config_path[PATH_CAP];
  mrl_status st;
  if ((st = join_path(e, fn, weights_path, dir, "model.safetensors")) ||
      (st = join_path(e, fn, config_path, dir, "config.json")) || (st = mrl__make_dirs(e, fn, dir)))
    return st;
  tensor_list l;
  if ((st = list_init(&l, e, fn, m->nparams))) return st;
  for (int p = 0; p < m->nparams && !st; p++) st = list_add(&l, "", &m->params[p], m->weights_t);
  /* transformers expects the "format" entry in files it loads */
  static const char *const keys[1] = {"format"}, *const values[1] = {"pt"};
  if (!st)
    st = mrl__safetensors_write(e, fn, weights_path, l.n, l.names, l.tensors, dtype, 1, keys,
                                values);
  list_free(&l);
  if (st) return st;
  return write_hf_config(m, fn, config_path, dtype, arch);
}

/* ---- checkpoints ---- */

/* Every field of mrl_model_config, for the checkpoint's exact copy of the configuration. */
static const struct {
  const char *name;
  size_t offset;
  bool is_float;
} cfg_fields[] = {
#define INT_FIELD(f) {#f, offsetof(mrl_model_config, f), false}
#define FLOAT_FIELD(f) {#f, offsetof(mrl_model_config, f), true}
    INT_FIELD(vocab),          INT_FIELD(dim),
    INT_FIELD(layers),         INT_FIELD(heads),
    INT_FIELD(kv_heads),       INT_FIELD(head_dim),
    INT_FIELD(ffn),            INT_FIELD(ctx),
    FLOAT_FIELD(rope_theta),   FLOAT_FIELD(norm_eps),
    INT_FIELD(tie_embeddings), INT_FIELD(qkv_bias),
    INT_FIELD(qk_norm),        FLOAT_FIELD(rope_llama3_factor),
    FLOAT_FIELD(rope_llama3_low_freq_factor), FLOAT_FIELD(rope_llama3_high_freq_factor),
    INT_FIELD(rope_llama3_original_ctx),
#undef INT_FIELD
#undef FLOAT_FIELD
};
enum { CFG_FIELDS = sizeof cfg_fields / sizeof cfg_fields[0] };

static int cfg_int(const mrl_model_config *c, int i) {
  int v;
  memcpy(&v, (const char *)c + cfg_fields[i].offset, sizeof v);
  return v;
}

static float cfg_float(const mrl_model_config *c, int i) {
  float v;
  memcpy(&v, (const char *)c + cfg_fields[i].offset, sizeof v);
  return v;
}

static void checkpoint_config_text(const mrl_model_config *c, text *t) {
  put(t, "{");
  for (int i = 0; i < CFG_FIELDS; i++) {
    char num[40];
    if (cfg_fields[i].is_float)
      float_text(num, sizeof num, cfg_float(c, i));
    else
      snprintf(num, sizeof num, "%d", cfg_int(c, i));
    put(t, "%s\"%s\":%s", i ? "," : "", cfg_fields[i].name, num);
  }
  put(t, "}");
}

mrl_status mrl_model_save_checkpoint(mrl_model *m, const char *path, int64_t step,
                                     const mrl_rng *rng) {
  const char *fn = "mrl_model_save_checkpoint";
  if (!m) return MRL_ERR_NULL;
  mrl_engine *e = m->engine;
  if (!path) return mrl__fail(e, MRL_ERR_NULL, fn, "path is NULL");
  bool moments = m->adam_m_t && m->adam_v_t;
  tensor_list l;
  mrl_status st = list_init(&l, e, fn, m->nparams * (moments ? 3 : 1));
  if (st) return st;
  for (int p = 0; p < m->nparams && !st; p++) {
    st = list_add(&l, "", &m->params[p], m->weights_t);
    if (!st && moments) st = list_add(&l, "optimizer.m.", &m->params[p], m->adam_m_t);
    if (!st && moments) st = list_add(&l, "optimizer.v.", &m->params[p], m->adam_v_t);
  }
  text config = {.len = 0};
  checkpoint_config_text(&m->cfg, &config);
  char adam_step[24], step_text[24], s[4][20], spare[20];
  snprintf(adam_step, sizeof adam_step, "%lld", (long long)m->adam_step);
  snprintf(step_text, sizeof step_text, "%lld", (long long)step);
  const char *keys[11] = {"format", "format_version", "config", "adam_step", "step"};
  const char *values[11] = {CHECKPOINT_FORMAT, CHECKPOINT_VERSION, config.s, adam_step, step_text};
  int nmeta = 5;
  if (rng) {
    /* the generator's exact state, so a resumed run draws the same numbers */
    static const char *const s_keys[4] = {"rng.s0", "rng.s1", "rng.s2", "rng.s3"};
    for (int i = 0; i < 4; i++) {
      snprintf(s[i], sizeof s[i], "%016llx", (unsigned long long)rng->s[i]);
      keys[nmeta] = s_keys[i];
      values[nmeta++] = s[i];
    }
    uint64_t bits;
    memcpy(&bits, &rng->spare, sizeof bits);
    snprintf(spare, sizeof spare, "%016llx", (unsigned long long)bits);
    keys[nmeta] = "rng.spare";
    values[nmeta++] = spare;
    keys[nmeta] = "rng.has_spare";
    values[nmeta++] = rng->has_spare ? "1" : "0";
  }
  if (!st)
    st = mrl__safetensors_write(e, fn, path, l.n, l.names, l.tensors, MRL_DTYPE_F32, nmeta, keys,
                                values);
  list_free(&l);
  return st;
}

static bool parse_i64(const char *s, int64_t *out) {
  if (!s) return false;
  bool neg = *s == '-';
  const char *d = s + neg;
  if (!*d) return false;
  uint64_t v = 0;
  for (; *d; d++) {
    if (*d < '0' || *d > '9') return false;
    unsigned digit = (unsigned)(*d - '0');
    if (v > ((uint64_t)INT64_MAX + neg - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return true;
}

static bool parse_hex64(const char *s, uint64_t *out) {
  if (!s || strlen(s) != 16) return false;
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char c = s[i];
    int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (h < 0) return false;
    v = v << 4 | (uint64_t)h;
  }
  *out = v;
  return true;
}

/* Everything a checkpoint restores, gathered and checked before the model is touched. */
typedef struct {
  int64_t adam_step, step;
  bool has_rng, has_moments;
  struct mrl_rng rng;
  int64_t *index; /* 3 x nparams file indices: weights, first moments, second moments (-1: none) */
} checkpoint_plan;

static mrl_status check_config_text(const mrl_model *m, const char *fn, const char *path,
                                    const char *text_value) {
  mrl_engine *e = m->engine;
  if (!text_value) return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: no config in the metadata", path);
  mrl_json_doc *doc;
  mrl_status st = mrl__json_parse(e, fn, path, text_value, strlen(text_value), &doc);
  if (st) return st;
  const mrl_json *root = mrl__json_root(doc);
  if (root->type != MRL_JSON_OBJECT || root->length != CFG_FIELDS)
    st = mrl__fail(e, MRL_ERR_INVALID, fn, "%s: the config does not list the %d fields of a model "
                   "config", path, (int)CFG_FIELDS);
  for (int i = 0; !st && i < CFG_FIELDS; i++) {
    const mrl_json *v = mrl__json_get(root, cfg_fields[i].name);
    if (!v || v->type != MRL_JSON_NUMBER) {
      st = mrl__fail(e, MRL_ERR_INVALID, fn, "%s: the config lacks %s", path, cfg_fields[i].name);
    } else if (cfg_fields[i].is_float ? (float)v->number != cfg_float(&m->cfg, i)
                                      : !v->is_integer || v->integer != cfg_int(&m->cfg, i)) {
      char have[40], want[40];
      if (cfg_fields[i].is_float) {
        float_text(have, sizeof have, (float)v->number);
        float_text(want, sizeof want, cfg_float(&m->cfg, i));
      } else {
        snprintf(have, sizeof have, "%.17g", v->number);
        snprintf(want, sizeof want, "%d", cfg_int(&m->cfg, i));
      }
      st = mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: written for another configuration: %s is %s there, %s in this model",
                     path, cfg_fields[i].name, have, want);
    }
  }
  mrl__json_free(doc);
  return st;
}

static mrl_status plan_checkpoint(const mrl_model *m, const char *fn, const char *path,
                                  const mrl_safetensors *f, bool want_rng, checkpoint_plan *plan) {
  mrl_engine *e = m->engine;
  const char *format = mrl_safetensors_metadata(f, "format");
  const char *version = mrl_safetensors_metadata(f, "format_version");
  if (!format || strcmp(format, CHECKPOINT_FORMAT) != 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: not a moonrl checkpoint (no format \"%s\")",
                     path, CHECKPOINT_FORMAT);
  if (!version || strcmp(version, CHECKPOINT_VERSION) != 0)
    return mrl__fail(e, MRL_ERR_UNSUPPORTED, fn, "%s: checkpoint format version %s (this is %s)",
                     path, version ? version : "(none)", CHECKPOINT_VERSION);
  mrl_status st = check_config_text(m, fn, path, mrl_safetensors_metadata(f, "config"));
  if (st) return st;
  if (!parse_i64(mrl_safetensors_metadata(f, "adam_step"), &plan->adam_step) ||
      plan->adam_step < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: adam_step is missing or not a count", path);
  if (!parse_i64(mrl_safetensors_metadata(f, "step"), &plan->step))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: step is missing or not an integer", path);
  plan->has_rng = mrl_safetensors_metadata(f, "rng.s0") != NULL;
  if (want_rng && !plan->has_rng)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: the checkpoint holds no RNG state", path);
  if (plan->has_rng) {
    static const char *const s_keys[4] = {"rng.s0", "rng.s1", "rng.s2", "rng.s3"};
    uint64_t spare_bits;
    const char *has_spare = mrl_safetensors_metadata(f, "rng.has_spare");
    bool ok = parse_hex64(mrl_safetensors_metadata(f, "rng.spare"), &spare_bits) && has_spare &&
              (strcmp(has_spare, "0") == 0 || strcmp(has_spare, "1") == 0);
    for (int i = 0; ok && i < 4; i++)
      ok = parse_hex64(mrl_safetensors_metadata(f, s_keys[i]), &plan->rng.s[i]);
    if (!ok) return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: malformed RNG state", path);
    memcpy(&plan->rng.spare, &spare_bits, sizeof spare_bits);
    plan->rng.has_spare = has_spare[0] == '1';
  }

  int np = m->nparams, moment_count[3] = {0, 0, 0};
  for (int64_t i = 0; i < mrl_safetensors_count(f); i++) {
    const mrl_safetensors_entry *t = mrl__safetensors_entry(f, i);
    int kind = strncmp(t->name, "optimizer.m.", 12) == 0   ? 1
               : strncmp(t->name, "optimizer.v.", 12) == 0 ? 2
                                                           : 0;
    int p = mrl__model_find_param(m, t->name + (kind ? 12 : 0));
    if (p < 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: tensor \"%.*s\" is not part of this model",
                       path, NAME_SHOWN, t->name);
    if (!same_shape(t, &m->params[p])) return shape_mismatch(e, fn, path, t, &m->params[p]);
    if (!t->readable)
      return mrl__fail(e, MRL_ERR_UNSUPPORTED, fn, "%s: tensor \"%.*s\" has dtype %s", path,
                       NAME_SHOWN, t->name, t->dtype);
    plan->index[kind * np + p] = i;
    moment_count[kind]++;
  }
  for (int p = 0; p < np; p++)
    if (plan->index[p] < 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: tensor \"%s\" is missing", path,
                       m->params[p].name);
  if (moment_count[1] != moment_count[2] || (moment_count[1] != 0 && moment_count[1] != np))
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: AdamW moments for only some parameters (%d first, %d second, of %d)",
                     path, moment_count[1], moment_count[2], np);
  plan->has_moments = moment_count[1] == np;
  return MRL_OK;
}

/* Allocates a moment buffer like the model's weights (zeroed). */
static mrl_status alloc_moment(mrl_model *m, const char *fn, mrl_tensor **t, float **data) {
  if (*t) return MRL_OK;
  mrl_status st = mrl__tensor_alloc(m->engine, fn, 1, &m->numel, t);
  if (!st) *data = (*t)->data;
  return st;
}

static void free_moment(mrl_tensor **t, float **data) {
  mrl_tensor_free(*t);
  *t = NULL;
  *data = NULL;
}

mrl_status mrl_model_load_checkpoint(mrl_model *m, const char *path, int64_t *step,
                                     mrl_rng *rng) {
  const char *fn = "mrl_model_load_checkpoint";
  if (!m) return MRL_ERR_NULL;
  mrl_engine *e = m->engine;
  if (!path) return mrl__fail(e, MRL_ERR_NULL, fn, "path is NULL");
  int np = m->nparams;
  checkpoint_plan plan = {.index = mrl__alloc(e, sizeof *plan.index * 3 * (size_t)np)};
  if (!plan.index) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  for (int i = 0; i < 3 * np; i++) plan.index[i] = -1;
  mrl_safetensors *f = NULL;
  mrl_status st = mrl__safetensors_open(e, fn, path, &f);
  if (!st) st = plan_checkpoint(m, fn, path, f, rng != NULL, &plan);
  if (!st && plan.has_moments) {
    bool had_m = m->adam_m_t != NULL;
    st = alloc_moment(m, fn, &m->adam_m_t, &m->adam_m);
    if (!st) st = alloc_moment(m, fn, &m->adam_v_t, &m->adam_v);
    if (st && !had_m) free_moment(&m->adam_m_t, &m->adam_m); /* leave m as it was */
  }
  if (!st) {
    /* validated above: the reads cannot fail any more */
    for (int p = 0; p < np; p++) {
      int64_t off = m->params[p].offset;
      mrl__safetensors_read_into(f, fn, plan.index[p], m->weights + off);
      if (plan.has_moments) {
        mrl__safetensors_read_into(f, fn, plan.index[np + p], m->adam_m + off);
        mrl__safetensors_read_into(f, fn, plan.index[2 * np + p], m->adam_v + off);
      }
    }
    if (!plan.has_moments) {
      /* the saved optimizer had not stepped yet: neither has the restored one */
      free_moment(&m->adam_m_t, &m->adam_m);
      free_moment(&m->adam_v_t, &m->adam_v);
    }
    m->adam_step = plan.adam_step;
    mrl__model_refresh_bf16(m); /* decoding follows the restored weights */
    if (rng) {
      memcpy(rng->s, plan.rng.s, sizeof rng->s);
      rng->spare = plan.rng.spare;
      rng->has_spare = plan.rng.has_spare;
    }
    if (step) *step = plan.step;
  }
  mrl_safetensors_close(f);
  mrl__free(e, plan.index, sizeof *plan.index * 3 * (size_t)np);
  return st;
}
