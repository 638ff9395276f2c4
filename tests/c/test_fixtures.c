/* test_fixtures.c - the model against PyTorch: logits, loss, every gradient and three AdamW steps
 * (with clipping) from tests/fixtures/<config>.safetensors, written by an independent PyTorch
 * implementation (tests/fixtures/gen_model_fixtures.py), for a Llama, a Qwen2-style (biases, GQA,
 * untied head) and a Qwen3-style (q/k norms, head_dim != dim / heads) config; and loading the
 * Hugging Face directories PyTorch wrote. Run from the repository root. */
#include "json.h"
#include "model.h"
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  mrl_engine *e;
  mrl_safetensors *f;
  mrl_model *m;
  int batch, steps;
  int32_t *tokens, *lengths, *targets;
} fixture;

static mrl_tensor *read(fixture *fx, const char *name) {
  mrl_tensor *t = NULL;
  MUST(mrl_safetensors_read(fx->f, name, &t));
  return t;
}

static int json_int(const mrl_json *obj, const char *key) {
  const mrl_json *v = mrl__json_get(obj, key);
  if (!v || v->type != MRL_JSON_NUMBER) {
    printf("Bail out! fixture config lacks %s\n", key);
    exit(1);
  }
  return (int)v->number;
}

static bool json_true(const mrl_json *obj, const char *key) {
  const mrl_json *v = mrl__json_get(obj, key);
  return v && v->type == MRL_JSON_TRUE;
}

/* The model of a fixture, with its initial weights, and its batch. */
static fixture open_fixture(const char *name) {
  fixture fx;
  memset(&fx, 0, sizeof fx);
  fx.e = new_engine();
  char path[256];
  snprintf(path, sizeof path, "tests/fixtures/%s.safetensors", name);
  MUST(mrl_safetensors_open(fx.e, path, &fx.f));
  const char *text = mrl_safetensors_metadata(fx.f, "config");
  mrl_json_doc *doc = NULL;
  MUST(mrl__json_parse(fx.e, "test", "fixture config", text, strlen(text), &doc));
  const mrl_json *c = mrl__json_root(doc);
  mrl_model_config cfg;
  mrl_model_config_default(&cfg);
  cfg.vocab = json_int(c, "vocab");
  cfg.dim = json_int(c, "dim");
  cfg.layers = json_int(c, "layers");
  cfg.heads = json_int(c, "heads");
  cfg.kv_heads = json_int(c, "kv_heads");
  cfg.head_dim = json_int(c, "head_dim");
  cfg.ffn = json_int(c, "ffn");
  cfg.ctx = json_int(c, "ctx");
  cfg.rope_theta = (float)mrl__json_get(c, "theta")->number;
  cfg.norm_eps = (float)mrl__json_get(c, "eps")->number;
  cfg.tie_embeddings = json_true(c, "tie");
  cfg.qkv_bias = json_true(c, "qkv_bias");
  cfg.qk_norm = json_true(c, "qk_norm");
  mrl__json_free(doc);
  MUST(mrl_model_new(fx.e, &cfg, 0, &fx.m));
  for (int i = 0; i < fx.m->nparams; i++) {
    char key[160];
    snprintf(key, sizeof key, "w.%s", fx.m->params[i].name);
    mrl_tensor *w = read(&fx, key), *dst = NULL;
    MUST(mrl_model_param(fx.m, i, NULL, &dst, NULL));
    MUST(mrl_tensor_copy(dst, w));
    mrl_tensor_free(dst);
    mrl_tensor_free(w);
  }
  mrl_tensor *tok = read(&fx, "tokens"), *len = read(&fx, "lengths"), *tgt = read(&fx, "targets");
  fx.batch = (int)mrl_tensor_shape(tok)[0];
  fx.steps = (int)mrl_tensor_shape(tok)[1];
  int64_t n = (int64_t)fx.batch * fx.steps;
  fx.tokens = malloc(sizeof(int32_t) * (size_t)n);
  fx.targets = malloc(sizeof(int32_t) * (size_t)n);
  fx.lengths = malloc(sizeof(int32_t) * (size_t)fx.batch);
  for (int64_t i = 0; i < n; i++) {
    fx.tokens[i] = (int32_t)mrl_tensor_data(tok)[i];
    fx.targets[i] = (int32_t)mrl_tensor_data(tgt)[i];
  }
  for (int b = 0; b < fx.batch; b++) fx.lengths[b] = (int32_t)mrl_tensor_data(len)[b];
  mrl_tensor_free(tok);
  mrl_tensor_free(len);
  mrl_tensor_free(tgt);
  return fx;
}

static void close_fixture(fixture *fx) {
  free(fx->tokens);
  free(fx->targets);
  free(fx->lengths);
  mrl_model_free(fx->m);
  mrl_safetensors_close(fx->f);
  CHECK(mrl_engine_memory_used(fx->e) == 0);
  mrl_engine_free(fx->e);
}

/* Forward, masked cross-entropy (returned) and its gradient, as the fixture's training does. */
static double train_pass(fixture *fx) {
  int64_t n = (int64_t)fx->batch * fx->steps, count = 0;
  for (int64_t i = 0; i < n; i++) count += fx->targets[i] >= 0;
  float *logp = malloc(sizeof(float) * (size_t)n), *dlogp = malloc(sizeof(float) * (size_t)n);
  MUST(mrl_model_forward(fx->m, fx->tokens, fx->lengths, fx->batch, fx->steps));
  MUST(mrl_model_score(fx->m, fx->targets, logp, NULL));
  double loss = 0.0;
  for (int64_t i = 0; i < n; i++) {
    loss -= fx->targets[i] >= 0 ? logp[i] : 0.0;
    dlogp[i] = fx->targets[i] >= 0 ? -1.0f / (float)count : 0.0f;
  }
  MUST(mrl_model_zero_grad(fx->m));
  MUST(mrl_model_backward(fx->m, fx->targets, dlogp, NULL));
  free(logp);
  free(dlogp);
  return loss / (double)count;
}

/* Largest |ours - ref| over a parameter block of a buffer, and the largest |ref|. */
static void compare_param(fixture *fx, int i, const float *buffer, const char *prefix,
                          double *diff, double *scale) {
  char key[160];
  snprintf(key, sizeof key, "%s.%s", prefix, fx->m->params[i].name);
  mrl_tensor *ref = read(fx, key);
  const mrl_param *p = &fx->m->params[i];
  const float *r = mrl_tensor_data(ref);
  *diff = *scale = 0.0;
  for (int64_t k = 0; k < p->numel; k++) {
    *diff = fmax(*diff, fabs((double)buffer[p->offset + k] - r[k]));
    *scale = fmax(*scale, fabs((double)r[k]));
  }
  mrl_tensor_free(ref);
}

static void check_fixture(const char *name) {
  fixture fx = open_fixture(name);
  mrl_model *m = fx.m;
  /* logits at the real positions */
  MUST(mrl_model_forward(m, fx.tokens, fx.lengths, fx.batch, fx.steps));
  mrl_tensor *logits = NULL, *ref = read(&fx, "logits");
  MUST(mrl_model_logits(m, &logits));
  int V = m->cfg.vocab;
  double worst = 0.0;
  for (int b = 0; b < fx.batch; b++)
    for (int t = 0; t < fx.lengths[b]; t++)
      for (int j = 0; j < V; j++) {
        int64_t k = ((int64_t)b * fx.steps + t) * V + j;
        worst = fmax(worst, fabs(mrl_tensor_data(logits)[k] - mrl_tensor_data(ref)[k]));
      }
  check_note("%s: logits max |moonrl - PyTorch| %.2e", name, worst);
  CHECKF(worst <= 1e-4, "%s: logits differ by %.3g", name, worst);
  mrl_tensor_free(logits);
  mrl_tensor_free(ref);

  /* loss and gradients of the first step */
  mrl_tensor *losses = read(&fx, "loss");
  double loss = train_pass(&fx);
  check_note("%s: loss %.7f, PyTorch %.7f", name, loss, mrl_tensor_data(losses)[0]);
  CHECK(fabs(loss - mrl_tensor_data(losses)[0]) < 1e-5);
  double worst_rel = 0.0;
  for (int i = 0; i < m->nparams; i++) {
    double diff, scale;
    compare_param(&fx, i, m->grads, "grad", &diff, &scale);
    double rel = diff / fmax(scale, 1e-6);
    worst_rel = fmax(worst_rel, rel);
    CHECKF(rel <= 1e-3, "%s: gradient of %s differs: max %.3g relative to %.3g", name,
           m->params[i].name, diff, scale);
  }
  check_note("%s: gradients, worst max |difference| / max |gradient| over tensors %.2e", name,
             worst_rel);

  /* three AdamW steps with clipping, weights after each */
  mrl_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  for (int step = 1; step <= 3; step++) {
    double l = step == 1 ? loss : train_pass(&fx);
    CHECKF(fabs(l - mrl_tensor_data(losses)[step - 1]) < 1e-4, "%s: loss at step %d: %.6f vs %.6f",
           name, step, l, mrl_tensor_data(losses)[step - 1]);
    MUST(mrl_model_clip_grad(m, 1.0, NULL));
    MUST(mrl_model_adamw_step(m, &opt));
    double step_worst = 0.0;
    char prefix[16];
    snprintf(prefix, sizeof prefix, "step%d", step);
    for (int i = 0; i < m->nparams; i++) {
      double diff, scale;
      compare_param(&fx, i, m->weights, prefix, &diff, &scale);
      step_worst = fmax(step_worst, diff);
    }
    check_note("%s: weights after AdamW step %d: max |difference| %.2e", name, step, step_worst);
    CHECKF(step_worst <= 1e-4, "%s: weights after step %d differ by %.3g", name, step, step_worst);
  }
  mrl_tensor_free(losses);
  close_fixture(&fx);
}

static void test_llama(void) { check_fixture("llama"); }
static void test_qwen2(void) { check_fixture("qwen2"); }
static void test_qwen3(void) { check_fixture("qwen3"); }

/* The Hugging Face directory PyTorch wrote loads into moonrl and gives PyTorch's logits. */
static void check_load(const char *name) {
  fixture fx = open_fixture(name);
  char dir[256];
  snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
  mrl_model *loaded = NULL;
  MUST(mrl_model_load(fx.e, dir, &loaded));
  CHECK(loaded->numel == fx.m->numel);
  MUST(mrl_model_forward(loaded, fx.tokens, fx.lengths, fx.batch, fx.steps));
  mrl_tensor *logits = NULL, *ref = read(&fx, "logits");
  MUST(mrl_model_logits(loaded, &logits));
  int V = loaded->cfg.vocab;
  double worst = 0.0;
  for (int b = 0; b < fx.batch; b++)
    for (int t = 0; t < fx.lengths[b]; t++)
      for (int j = 0; j < V; j++) {
        int64_t k = ((int64_t)b * fx.steps + t) * V + j;
        worst = fmax(worst, fabs(mrl_tensor_data(logits)[k] - mrl_tensor_data(ref)[k]));
      }
  check_note("%s: model loaded from PyTorch's files, logits max |difference| %.2e", name, worst);
  CHECK(worst <= 1e-4);
  mrl_tensor_free(logits);
  mrl_tensor_free(ref);
  mrl_model_free(loaded);
  close_fixture(&fx);
}

static void test_load_llama(void) { check_load("llama"); }
static void test_load_qwen2(void) { check_load("qwen2"); }
static void test_load_qwen3(void) { check_load("qwen3"); }

static const test_case tests[] = {{"pytorch_llama", test_llama},
                                  {"pytorch_qwen2", test_qwen2},
                                  {"pytorch_qwen3", test_qwen3},
                                  {"load_pytorch_files_llama", test_load_llama},
                                  {"load_pytorch_files_qwen2", test_load_qwen2},
                                  {"load_pytorch_files_qwen3", test_load_qwen3},
                                  {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
