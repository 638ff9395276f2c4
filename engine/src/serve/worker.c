/* worker.c - the engine thread of `moonrl serve`: it alone uses the engine, the model and the
 * tokenizer. It takes queued jobs, parses and validates them (OpenAI-shaped 400s naming the
 * field), answers tokenize/detokenize/load_weights, and runs every admitted generation in one
 * batched decode loop over a KV cache with a slot per request: each step samples one token for
 * every running request (grouped by sampling settings), records it, streams it, and appends the
 * tokens of those that go on in one batched call. */
#define _DEFAULT_SOURCE
#include "json.h"
#include "serve_internal.h"
#include "toolcall.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_STOPS = 16, MAX_TOP = 20 };

/* One running generation (completion or chat). */
typedef struct {
  srv_job *job;
  bool chat, stream, include_usage, return_token_ids, logprobs, echo;
  bool as_ids; /* return_tokens_as_token_ids: logprobs name tokens "token_id:N" */
  bool tito;   /* /inference/v1/generate: token ids in, token ids and logprobs out */
  int top_logprobs; /* entries per token; completions' integer logprobs */
  mrl_sampling sampling;
  uint64_t seed;
  int max_tokens;
  int32_t *prompt;
  int n_prompt;
  int32_t *tokens;
  float *lps;
  int n_tokens;
  int32_t stop_ids[MAX_STOPS + 8];
  int n_stop_ids;
  char *stops[MAX_STOPS];
  size_t stop_lens[MAX_STOPS];
  int n_stops;
  size_t max_stop_len;
  srv_buf text;    /* the generated text (the text of a stop token, or from a stop string on, is
                      left out) */
  size_t emitted;  /* bytes of text streamed so far */
  const char *finish;
  int slot;
  char id[48];
  long long created;
  srv_buf lp[4];   /* logprobs pieces: chat: content entries; completions: tokens,
                      token_logprobs, top_logprobs, text_offset */
  int lp_count;    /* entries in lp (since the last streamed chunk) */
  srv_tools tools; /* the request's tools (tools.n == 0: none) */
  bool use_tools;  /* calls are read out of the text (tools given, tool_choice not "none") */
  bool constrained; /* tool_choice "required" or a function: every token keeps tc a call */
  tc_state tc;
  uint8_t *mask;   /* constrained: the tokens allowed at this step (vocab bytes) */
  bool counted;    /* counted as finished in /health (count_finished) */
} gen;

typedef struct {
  mrl_server *s;
  mrl_kv_cache *cache;
  gen **slots; /* max_batch of them; NULL = free */
  int active;
  char *scratch;
  size_t scratch_cap;
  uint64_t next_id;
  /* for constrained decoding, made at the first forced call: every token's bytes */
  char *vocab_bytes;
  size_t *vocab_off; /* vocab + 1 offsets into vocab_bytes */
} worker;

/* ---- small helpers ---- */

static void gen_free(gen *g) {
  if (!g) return;
  free(g->prompt);
  free(g->tokens);
  free(g->lps);
  for (int i = 0; i < g->n_stops; i++) free(g->stops[i]);
  mrl__sb_free(&g->text);
  for (int i = 0; i < 4; i++) mrl__sb_free(&g->lp[i]);
  mrl__tools_free(&g->tools);
  free(g->mask);
  free(g);
}

/* Replies with an error and finishes the job. */
static void fail_job(mrl_server *s, srv_job *j, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void fail_job(mrl_server *s, srv_job *j, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&s->mu);
  if (j->streaming) { /* the stream has begun: the error is its last event */
    mrl__sb_str(&j->out, "data: ");
    mrl__sb_error(&j->out, msg, type, param, code);
    mrl__sb_str(&j->out, "\n\ndata: [DONE]\n\n");
    mrl__serve_finish(j, 200);
  } else {
    mrl__sb_free(&j->out);
    mrl__sb_error(&j->out, msg, type, param, code);
    mrl__serve_finish(j, status);
  }
  pthread_mutex_unlock(&s->mu);
}

/* A 400 naming the field; returns false so that checks read `return BAD(...)`. */
static bool bad(worker *w, srv_job *j, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool bad(worker *w, srv_job *j, const char *param, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fail_job(w->s, j, 400, "invalid_request_error", param, "invalid_value", "%s", msg);
  return false;
}
#define BAD(...) bad(w, j, __VA_ARGS__)

/* The decoded bytes of one token, in w->scratch (valid until the next call); NULL on failure. */
static const char *token_text(worker *w, int32_t id, size_t *len) {
  mrl_tokenizer *t = w->s->t;
  if (mrl_tokenizer_decode(t, &id, 1, w->scratch, w->scratch_cap, len) != MRL_OK) return NULL;
  if (*len + 1 > w->scratch_cap) {
    char *p = realloc(w->scratch, *len + 1);
    if (!p) return NULL;
    w->scratch = p;
    w->scratch_cap = *len + 1;
    if (mrl_tokenizer_decode(t, &id, 1, w->scratch, w->scratch_cap, len) != MRL_OK) return NULL;
  }
  return w->scratch;
}

static void json_bytes(srv_buf *b, const char *s, size_t n) {
  mrl__sb_add(b, "[", 1);
  for (size_t i = 0; i < n; i++) mrl__sb_printf(b, i ? ",%u" : "%u", (unsigned)(unsigned char)s[i]);
  mrl__sb_add(b, "]", 1);
}

/* Finishes a reply that the engine thread built in b. */
static void reply(mrl_server *s, srv_job *j, int status, srv_buf *b) {
  pthread_mutex_lock(&s->mu);
  mrl__sb_free(&j->out);
  j->out = *b;
  memset(b, 0, sizeof *b);
  mrl__serve_finish(j, status);
  pthread_mutex_unlock(&s->mu);
}

/* ---- validation ---- */

static bool only_keys(worker *w, srv_job *j, const mrl_json *obj, const char *const *keys) {
  for (size_t i = 0; i < obj->length; i++) {
    bool ok = false;
    for (const char *const *k = keys; *k && !ok; k++) ok = !strcmp(obj->keys[i], *k);
    if (!ok) return BAD(obj->keys[i], "unknown field '%s'", obj->keys[i]);
  }
  return true;
}

static bool is_null(const mrl_json *v) { return !v || v->type == MRL_JSON_NULL; }

static bool get_number(worker *w, srv_job *j, const mrl_json *obj, const char *key, double lo,
                       double hi, double *out) {
  const mrl_json *v = mrl__json_get(obj, key);
  if (is_null(v)) return true;
  if (v->type != MRL_JSON_NUMBER || !(v->number >= lo && v->number <= hi))
    return BAD(key, "'%s' must be a number in [%g, %g]", key, lo, hi);
  *out = v->number;
  return true;
}

static bool get_int(worker *w, srv_job *j, const mrl_json *obj, const char *key, int64_t lo,
                    int64_t hi, int64_t *out) {
  const mrl_json *v = mrl__json_get(obj, key);
  if (is_null(v)) return true;
  if (v->type != MRL_JSON_NUMBER || !v->is_integer || v->integer < lo || v->integer > hi)
    return BAD(key, "'%s' must be an integer in [%lld, %lld]", key, (long long)lo,
               (long long)hi);
  *out = v->integer;
  return true;
}

static bool get_bool(worker *w, srv_job *j, const mrl_json *obj, const char *key, bool *out) {
  const mrl_json *v = mrl__json_get(obj, key);
  if (is_null(v)) return true;
  if (v->type != MRL_JSON_TRUE && v->type != MRL_JSON_FALSE)
    return BAD(key, "'%s' must be a boolean", key);
  *out = v->type == MRL_JSON_TRUE;
  return true;
}

/* A field that is accepted with one value only (the one moonrl implements). */
static bool only_value(worker *w, srv_job *j, const mrl_json *obj, const char *key, double value) {
  const mrl_json *v = mrl__json_get(obj, key);
  if (is_null(v)) return true;
  if (v->type != MRL_JSON_NUMBER || v->number != value)
    return BAD(key, "'%s' other than %g is not supported by moonrl serve", key, value);
  return true;
}

static bool check_model(worker *w, srv_job *j, const mrl_json *root) {
  const mrl_json *v = mrl__json_get(root, "model");
  if (is_null(v)) return true;
  if (v->type != MRL_JSON_STRING) return BAD("model", "'model' must be a string");
  if (strcmp(v->string, w->s->model_name)) {
    fail_job(w->s, j, 404, "invalid_request_error", "model", "model_not_found",
             "the model '%s' does not exist; this server serves '%s'", v->string,
             w->s->model_name);
    return false;
  }
  return true;
}

/* Token ids of a JSON array into a malloc'ed array. */
static bool get_ids(worker *w, srv_job *j, const mrl_json *v, const char *key, int32_t **out,
                    int *n, bool allow_empty) {
  if (v->type != MRL_JSON_ARRAY || (!allow_empty && v->length == 0))
    return BAD(key, "'%s' must be a non-empty array of token ids", key);
  int32_t *ids = malloc((v->length ? v->length : 1) * sizeof *ids);
  if (!ids) return BAD(key, "out of memory");
  for (size_t i = 0; i < v->length; i++) {
    const mrl_json *x = &v->items[i];
    if (x->type != MRL_JSON_NUMBER || !x->is_integer || x->integer < 0 ||
        x->integer >= w->s->vocab) {
      free(ids);
      return BAD(key, "'%s'[%zu] is not a token id in 0..%d", key, i, w->s->vocab - 1);
    }
    ids[i] = (int32_t)x->integer;
  }
  *out = ids;
  *n = (int)v->length;
  return true;
}

static bool encode(worker *w, srv_job *j, const char *param, const char *text, size_t len,
                   int32_t **out, int *n) {
  size_t cap = 3 * len + 16, count = 0;
  int32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return BAD(param, "out of memory");
  if (mrl_tokenizer_encode(w->s->t, text, len, MRL_ENCODE_SPECIAL, ids, cap, &count) != MRL_OK ||
      count > cap) {
    free(ids);
    return BAD(param, "cannot encode '%s': %s", param, mrl_engine_last_error(w->s->e));
  }
  *out = ids;
  *n = (int)count;
  return true;
}

/* Chat messages through the engine's chat template. With tools (NULL: none), their description
 * joins the system message (or makes one), assistant tool_calls are written as the model writes
 * calls, and tool results as it reads them. */
static bool render_chat(worker *w, srv_job *j, const mrl_json *msgs, bool add_generation_prompt,
                        const srv_tools *tools, int32_t **out, int *n) {
  if (!msgs || msgs->type != MRL_JSON_ARRAY || msgs->length == 0)
    return BAD("messages", "'messages' must be a non-empty array");
  int format = tools && tools->n ? tools->format : w->s->tool_format;
  /* one more message when the tools need a system message of their own */
  size_t extra = tools && tools->n ? 1 : 0, count = msgs->length + extra;
  mrl_chat_message *cm = calloc(count, sizeof *cm);
  srv_buf *parts = calloc(count, sizeof *parts);
  bool ok = cm && parts;
  if (!ok) BAD("messages", "out of memory");
  static const char *const msg_keys[] = {"role", "content", "name", "tool_calls", "tool_call_id",
                                         NULL};
  size_t at = 0; /* the next message of cm */
  if (ok && extra) {
    const mrl_json *first = &msgs->items[0], *role = mrl__json_get(first, "role");
    bool has_system = first->type == MRL_JSON_OBJECT && role && role->type == MRL_JSON_STRING &&
                      (!strcmp(role->string, "system") || !strcmp(role->string, "developer"));
    if (!has_system) { /* a system message of its own, first */
      cm[0].role = "system";
      mrl__tools_prompt(tools, &parts[0]);
      at = 1;
    } else {
      count--;
    }
  }
  for (size_t i = 0; ok && i < msgs->length; i++, at++) {
    const mrl_json *m = &msgs->items[i];
    if (m->type != MRL_JSON_OBJECT) {
      ok = BAD("messages", "messages[%zu] must be an object", i);
      break;
    }
    if (!only_keys(w, j, m, msg_keys)) {
      ok = false;
      break;
    }
    const mrl_json *role = mrl__json_get(m, "role"), *content = mrl__json_get(m, "content");
    if (!role || role->type != MRL_JSON_STRING || role->length == 0) {
      ok = BAD("messages", "messages[%zu].role must be a non-empty string", i);
      break;
    }
    cm[at].role = role->string;
    srv_buf *text = &parts[at];
    if (content && content->type == MRL_JSON_STRING) {
      mrl__sb_add(text, content->string, content->length);
    } else if (content && content->type == MRL_JSON_ARRAY) {
      for (size_t k = 0; ok && k < content->length; k++) {
        const mrl_json *part = &content->items[k];
        const mrl_json *type = mrl__json_get(part, "type"), *txt = mrl__json_get(part, "text");
        if (!type || type->type != MRL_JSON_STRING || strcmp(type->string, "text") || !txt ||
            txt->type != MRL_JSON_STRING)
          ok = BAD("messages", "messages[%zu].content[%zu]: only text parts are supported", i,
                   k);
        else
          mrl__sb_add(text, txt->string, txt->length);
      }
    } else if (!is_null(content)) {
      ok = BAD("messages", "messages[%zu].content must be a string or an array of text parts", i);
    }
    if (!ok) break;
    if (i == 0 && extra && at == 0) { /* the system message: the tools after its text */
      if (text->len) mrl__sb_str(text, "\n\n");
      mrl__tools_prompt(tools, text);
    }
    if (!strcmp(role->string, "tool")) { /* a tool's result, as the model reads one */
      srv_buf wrapped = {0};
      mrl__tools_render_result(format, text->p ? text->p : "", text->len, &wrapped);
      mrl__sb_free(text);
      *text = wrapped;
    }
    const mrl_json *calls = mrl__json_get(m, "tool_calls");
    if (!is_null(calls)) {
      char err[256];
      if (strcmp(role->string, "assistant")) {
        ok = BAD("messages", "messages[%zu]: only assistant messages have tool_calls", i);
      } else if (!mrl__tools_render_calls(format, calls, w->s->e, text, err, sizeof err)) {
        ok = BAD("messages", "messages[%zu].%s", i, err);
      }
    }
    if (text->failed) ok = BAD("messages", "out of memory");
  }
  size_t total = 16;
  for (size_t i = 0; ok && i < count; i++) {
    cm[i].content = parts[i].p;
    cm[i].content_len = parts[i].len;
    total += 3 * (strlen(cm[i].role) + cm[i].content_len) + 10;
  }
  int32_t *ids = NULL;
  size_t got = 0;
  if (ok) {
    ids = malloc(total * sizeof *ids);
    if (!ids) {
      ok = BAD("messages", "out of memory");
    } else if (mrl_tokenizer_chat(w->s->t, MRL_CHAT_AUTO, cm, count, add_generation_prompt, ids,
                                  total, &got) != MRL_OK ||
               got > total) {
      ok = BAD("messages", "the chat template refused the messages: %s",
               mrl_engine_last_error(w->s->e));
    }
  }
  if (parts)
    for (size_t i = 0; i < msgs->length + extra; i++) mrl__sb_free(&parts[i]);
  free(parts);
  free(cm);
  if (!ok) {
    free(ids);
    return false;
  }
  *out = ids;
  *n = (int)got;
  return true;
}

/* The end-of-turn tokens of the tokenizer: what a generation stops at unless ignore_eos. */
static void default_stops(worker *w, gen *g) {
  static const char *const names[] = {"<|eos|>",   "<|end|>",     "<|im_end|>",
                                      "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int32_t id = mrl_tokenizer_token_id(w->s->t, names[i], strlen(names[i]));
    if (id >= 0 && id < w->s->vocab) g->stop_ids[g->n_stop_ids++] = id;
  }
}

static const char *const completion_keys[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "stop_token_ids", "ignore_eos", "logprobs", "echo", "n", "best_of", "stream",
    "stream_options", "return_token_ids", "return_tokens_as_token_ids", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "user", "logit_bias", "suffix", NULL};
static const char *const chat_keys[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "logprobs", "top_logprobs", "n",
    "stream", "stream_options", "return_token_ids", "return_tokens_as_token_ids", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "user", "add_generation_prompt", "tools", "tool_choice",
    "parallel_tool_calls", "response_format", "logit_bias", "tokens", NULL};

/* vLLM's token-in/token-out request and its sampling_params. */
static const char *const generate_keys[] = {"model", "token_ids", "sampling_params", "stream",
                                            "request_id", "cache_salt", "priority", NULL};
static const char *const generate_sampling_keys[] = {
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "ignore_eos", "logprobs", "n", "presence_penalty", "frequency_penalty", "repetition_penalty",
    NULL};

/* Reads a completion, chat or generate request into g; on failure the job has its error reply. */
static bool parse_gen(worker *w, srv_job *j, const mrl_json *root, gen *g) {
  mrl_server *s = w->s;
  g->chat = j->kind == JOB_CHAT || j->kind == JOB_CHAT_TOKENS;
  g->tito = j->kind == JOB_GENERATE;
  if (!only_keys(w, j, root, g->tito ? generate_keys : g->chat ? chat_keys : completion_keys))
    return false;
  if (j->kind == JOB_CHAT && mrl__json_get(root, "tokens"))
    return BAD("tokens", "unknown field 'tokens' (prompt ids go to /v1/chat/completions/tokens)");
  if (!check_model(w, j, root)) return false;
  /* where the sampling fields are: the body itself, or generate's sampling_params */
  const mrl_json *sp = root;
  static const mrl_json no_params = {.type = MRL_JSON_OBJECT};
  if (g->tito) {
    const mrl_json *p = mrl__json_get(root, "sampling_params");
    if (is_null(p)) {
      sp = &no_params;
    } else if (p->type != MRL_JSON_OBJECT) {
      return BAD("sampling_params", "'sampling_params' must be an object");
    } else {
      if (!only_keys(w, j, p, generate_sampling_keys)) return false;
      sp = p;
    }
  }
  if (!only_value(w, j, sp, "n", 1) || !only_value(w, j, sp, "best_of", 1) ||
      !only_value(w, j, sp, "presence_penalty", 0) ||
      !only_value(w, j, sp, "frequency_penalty", 0) ||
      !only_value(w, j, sp, "repetition_penalty", 1))
    return false;
  const mrl_json *v = mrl__json_get(sp, "logit_bias");
  if (!is_null(v) && (v->type != MRL_JSON_OBJECT || v->length))
    return BAD("logit_bias", "'logit_bias' is not supported by moonrl serve");
  v = mrl__json_get(sp, "user");
  if (!is_null(v) && v->type != MRL_JSON_STRING) return BAD("user", "'user' must be a string");

  double temperature = 1, top_p = 1, min_p = 0;
  int64_t top_k = 0, seed = -1, max_tokens = g->chat ? -1 : 16;
  if (!get_number(w, j, sp, "temperature", 0, 2, &temperature) ||
      !get_number(w, j, sp, "top_p", 0, 1, &top_p) ||
      !get_number(w, j, sp, "min_p", 0, 1, &min_p) ||
      !get_int(w, j, sp, "top_k", -1, INT32_MAX, &top_k) ||
      !get_int(w, j, sp, "seed", INT64_MIN, INT64_MAX, &seed) ||
      !get_int(w, j, sp, "max_tokens", 1, s->ctx, &max_tokens))
    return false;
  if (g->chat && !get_int(w, j, sp, "max_completion_tokens", 1, s->ctx, &max_tokens))
    return false;
  g->sampling.temperature = (float)temperature;
  g->sampling.top_p = (float)top_p;
  g->sampling.min_p = (float)min_p;
  g->sampling.top_k = top_k < 0 ? 0 : (int)top_k;
  g->seed = mrl__json_get(sp, "seed") && !is_null(mrl__json_get(sp, "seed"))
                ? (uint64_t)seed
                : 0x9E3779B97F4A7C15ull * ++w->next_id;
  g->max_tokens = (int)max_tokens;

  bool ignore_eos = false, add_gen = true;
  if (!get_bool(w, j, root, "stream", &g->stream) ||
      !get_bool(w, j, sp, "return_token_ids", &g->return_token_ids) ||
      !get_bool(w, j, sp, "return_tokens_as_token_ids", &g->as_ids) ||
      !get_bool(w, j, sp, "ignore_eos", &ignore_eos) ||
      !get_bool(w, j, sp, "echo", &g->echo))
    return false;
  if (g->echo) return BAD("echo", "'echo' is not supported by moonrl serve");
  v = mrl__json_get(root, "stream_options");
  if (!is_null(v)) {
    static const char *const so_keys[] = {"include_usage", "continuous_usage_stats", NULL};
    if (v->type != MRL_JSON_OBJECT) return BAD("stream_options", "'stream_options' must be an object");
    if (!only_keys(w, j, v, so_keys) || !get_bool(w, j, v, "include_usage", &g->include_usage))
      return false;
  }
  if (g->tito) {
    int64_t top = 0;
    if (!get_int(w, j, sp, "logprobs", 0, MAX_TOP, &top)) return false;
    g->logprobs = true;
    g->top_logprobs = (int)top;
    if (g->stream) return BAD("stream", "/inference/v1/generate does not stream in moonrl serve");
    v = mrl__json_get(root, "request_id");
    if (!is_null(v)) {
      if (v->type != MRL_JSON_STRING) return BAD("request_id", "'request_id' must be a string");
      snprintf(g->id, sizeof g->id, "%s", v->string);
    }
    v = mrl__json_get(root, "token_ids");
    if (!v) return BAD("token_ids", "'token_ids' is required");
    if (!get_ids(w, j, v, "token_ids", &g->prompt, &g->n_prompt, false)) return false;
  } else if (g->chat) {
    int64_t top = 0;
    if (!get_bool(w, j, root, "logprobs", &g->logprobs) ||
        !get_int(w, j, root, "top_logprobs", 0, MAX_TOP, &top) ||
        !get_bool(w, j, root, "add_generation_prompt", &add_gen))
      return false;
    g->top_logprobs = (int)top;
    bool parallel = true;
    if (!get_bool(w, j, root, "parallel_tool_calls", &parallel)) return false;
    const mrl_json *tools = mrl__json_get(root, "tools"),
                   *choice = mrl__json_get(root, "tool_choice");
    if (!is_null(tools) && !(tools->type == MRL_JSON_ARRAY && tools->length == 0)) {
      char err[512];
      const char *param = "tools";
      if (!mrl__tools_read(&g->tools, s->tool_format, tools, choice, parallel, err, sizeof err,
                           &param))
        return BAD(param, "%s", err);
      g->use_tools = g->tools.choice != TOOL_CHOICE_NONE;
      g->constrained =
          g->tools.choice == TOOL_CHOICE_REQUIRED || g->tools.choice == TOOL_CHOICE_FUNCTION;
      if (g->constrained) mrl__tc_start(&g->tc, &g->tools);
    } else if (!is_null(choice) && (choice->type != MRL_JSON_STRING ||
                                    (strcmp(choice->string, "none") &&
                                     strcmp(choice->string, "auto")))) {
      return BAD("tool_choice", "'tool_choice' other than \"none\" or \"auto\" needs tools");
    }
    v = mrl__json_get(root, "response_format");
    if (!is_null(v)) {
      const mrl_json *type = mrl__json_get(v, "type");
      if (!type || type->type != MRL_JSON_STRING || strcmp(type->string, "text"))
        return BAD("response_format", "only response_format {\"type\": \"text\"} is supported");
    }
    if (j->kind == JOB_CHAT_TOKENS) { /* the ids are the prompt; messages are not rendered */
      v = mrl__json_get(root, "tokens");
      if (!v) return BAD("tokens", "'tokens' (the prompt's token ids) is required");
      if (!get_ids(w, j, v, "tokens", &g->prompt, &g->n_prompt, false)) return false;
      g->return_token_ids = true;
    } else if (!render_chat(w, j, mrl__json_get(root, "messages"), add_gen,
                            g->tools.n ? &g->tools : NULL, &g->prompt, &g->n_prompt)) {
      return false;
    }
  } else {
    int64_t top = -1;
    if (!get_int(w, j, root, "logprobs", 0, MAX_TOP, &top)) return false;
    g->logprobs = top >= 0;
    g->top_logprobs = top > 0 ? (int)top : 0;
    v = mrl__json_get(root, "suffix");
    if (!is_null(v)) return BAD("suffix", "'suffix' is not supported by moonrl serve");
    v = mrl__json_get(root, "prompt");
    if (!v) return BAD("prompt", "'prompt' is required");
    if (v->type == MRL_JSON_STRING) {
      if (!encode(w, j, "prompt", v->string, v->length, &g->prompt, &g->n_prompt)) return false;
    } else if (v->type == MRL_JSON_ARRAY && v->length == 1 &&
               v->items[0].type != MRL_JSON_NUMBER) {
      const mrl_json *one = &v->items[0];
      if (one->type == MRL_JSON_STRING) {
        if (!encode(w, j, "prompt", one->string, one->length, &g->prompt, &g->n_prompt))
          return false;
      } else if (!get_ids(w, j, one, "prompt", &g->prompt, &g->n_prompt, false)) {
        return false;
      }
    } else if (v->type == MRL_JSON_ARRAY && (v->length == 0 || v->items[0].type == MRL_JSON_NUMBER)) {
      if (!get_ids(w, j, v, "prompt", &g->prompt, &g->n_prompt, false)) return false;
    } else {
      return BAD("prompt", "'prompt' must be a string or an array of token ids (one prompt)");
    }
  }
  const char *prompt_field = g->tito                         ? "token_ids"
                             : j->kind == JOB_CHAT_TOKENS ? "tokens"
                             : g->chat                    ? "messages"
                                                          : "prompt";
  if (g->n_prompt == 0) return BAD(prompt_field, "the prompt has no tokens");
  if (g->n_prompt >= s->ctx)
    return BAD(prompt_field,
               "the prompt has %d tokens; this model's context is %d", g->n_prompt, s->ctx);

  if (!ignore_eos) default_stops(w, g);
  v = mrl__json_get(sp, "stop_token_ids");
  if (!is_null(v)) {
    int32_t *ids;
    int n;
    if (!get_ids(w, j, v, "stop_token_ids", &ids, &n, true)) return false;
    if (n > MAX_STOPS) {
      free(ids);
      return BAD("stop_token_ids", "at most %d stop_token_ids", MAX_STOPS);
    }
    memcpy(g->stop_ids + g->n_stop_ids, ids, (size_t)n * sizeof *ids);
    g->n_stop_ids += n;
    free(ids);
  }
  v = mrl__json_get(sp, "stop");
  if (!is_null(v)) {
    const mrl_json *list = v;
    size_t n = 1;
    if (v->type == MRL_JSON_ARRAY) n = v->length;
    else if (v->type != MRL_JSON_STRING) return BAD("stop", "'stop' must be a string or an array of strings");
    if (n > MAX_STOPS) return BAD("stop", "at most %d stop strings", MAX_STOPS);
    for (size_t i = 0; i < n; i++) {
      const mrl_json *x = v->type == MRL_JSON_ARRAY ? &list->items[i] : v;
      if (x->type != MRL_JSON_STRING || x->length == 0)
        return BAD("stop", "'stop' entries must be non-empty strings");
      g->stops[g->n_stops] = malloc(x->length + 1);
      if (!g->stops[g->n_stops]) return BAD("stop", "out of memory");
      memcpy(g->stops[g->n_stops], x->string, x->length + 1);
      g->stop_lens[g->n_stops++] = x->length;
      if (x->length > g->max_stop_len) g->max_stop_len = x->length;
    }
  }
  /* chat without a limit: up to the context; any request stops at the context */
  if (g->max_tokens < 0 || g->max_tokens > s->ctx - g->n_prompt) g->max_tokens = s->ctx - g->n_prompt;
  g->tokens = malloc((size_t)g->max_tokens * sizeof *g->tokens);
  g->lps = malloc((size_t)g->max_tokens * sizeof *g->lps);
  if (!g->tokens || !g->lps) return BAD(NULL, "out of memory");
  return true;
}

/* ---- responses ---- */

static void usage_json(srv_buf *b, const gen *g) {
  mrl__sb_printf(b, "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", g->n_prompt,
            g->n_tokens, g->n_prompt + g->n_tokens);
}

static void ids_json(srv_buf *b, const int32_t *ids, int n) {
  mrl__sb_add(b, "[", 1);
  for (int i = 0; i < n; i++) mrl__sb_printf(b, i ? ",%d" : "%d", ids[i]);
  mrl__sb_add(b, "]", 1);
}

/* The logprobs object of the entries gathered in g->lp (then emptied). */
static void logprobs_json(srv_buf *b, gen *g) {
  if (!g->logprobs) {
    mrl__sb_str(b, "null");
    return;
  }
  if (g->chat || g->tito) {
    mrl__sb_str(b, "{\"content\":[");
    mrl__sb_add(b, g->lp[0].p ? g->lp[0].p : "", g->lp[0].len);
    mrl__sb_str(b, "],\"refusal\":null}");
  } else {
    static const char *const names[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int i = 0; i < 4; i++) {
      mrl__sb_printf(b, "%s\"%s\":[", i ? "," : "{", names[i]);
      mrl__sb_add(b, g->lp[i].p ? g->lp[i].p : "", g->lp[i].len);
      mrl__sb_str(b, "]");
    }
    mrl__sb_str(b, "}");
  }
  for (int i = 0; i < 4; i++) mrl__sb_free(&g->lp[i]);
  g->lp_count = 0;
}

/* The head of a completion object or chunk: id, object, created, model. */
static void head_json(srv_buf *b, const gen *g, const char *object, const char *model) {
  mrl__sb_str(b, "{\"id\":");
  mrl__sb_json_str(b, g->id, strlen(g->id));
  mrl__sb_printf(b, ",\"object\":\"%s\",\"created\":%lld,\"model\":", object, g->created);
  mrl__sb_json_str(b, model, strlen(model));
}

static void full_reply(worker *w, gen *g) {
  srv_buf b = {0};
  if (g->tito) { /* vLLM's generate reply: no text, no usage */
    mrl__sb_str(&b, "{\"request_id\":");
    mrl__sb_json_str(&b, g->id, strlen(g->id));
    mrl__sb_str(&b, ",\"choices\":[{\"index\":0,\"token_ids\":");
    ids_json(&b, g->tokens, g->n_tokens);
    mrl__sb_str(&b, ",\"logprobs\":");
    logprobs_json(&b, g);
    mrl__sb_printf(&b, ",\"finish_reason\":\"%s\"}],\"prompt_logprobs\":null}", g->finish);
    reply(w->s, g->job, 200, &b);
    return;
  }
  head_json(&b, g, g->chat ? "chat.completion" : "text_completion", w->s->model_name);
  mrl__sb_str(&b, ",\"choices\":[{\"index\":0,");
  if (g->chat) {
    srv_buf content = {0}, calls = {0};
    int nc = g->use_tools ? mrl__tools_parse(&g->tools, w->s->e, g->text.p, g->text.len, g->id,
                                             false, &content, &calls)
                          : 0;
    mrl__sb_str(&b, "\"message\":{\"role\":\"assistant\",\"content\":");
    if (nc && !content.len) mrl__sb_str(&b, "null");
    else if (nc) mrl__sb_json_str(&b, content.p, content.len);
    else mrl__sb_json_str(&b, g->text.p ? g->text.p : "", g->text.len);
    mrl__sb_str(&b, ",\"refusal\":null");
    if (nc) {
      mrl__sb_str(&b, ",\"tool_calls\":");
      mrl__sb_add(&b, calls.p, calls.len);
      g->finish = "tool_calls";
    }
    mrl__sb_str(&b, "},");
    mrl__sb_free(&content);
    mrl__sb_free(&calls);
  } else {
    mrl__sb_str(&b, "\"text\":");
    mrl__sb_json_str(&b, g->text.p ? g->text.p : "", g->text.len);
    mrl__sb_str(&b, ",");
  }
  mrl__sb_str(&b, "\"logprobs\":");
  logprobs_json(&b, g);
  mrl__sb_printf(&b, ",\"finish_reason\":\"%s\"", g->finish);
  if (g->return_token_ids) {
    mrl__sb_str(&b, ",\"token_ids\":");
    ids_json(&b, g->tokens, g->n_tokens);
    mrl__sb_str(&b, ",\"prompt_token_ids\":");
    ids_json(&b, g->prompt, g->n_prompt);
  }
  mrl__sb_str(&b, "}],\"usage\":");
  usage_json(&b, g);
  mrl__sb_str(&b, "}");
  reply(w->s, g->job, 200, &b);
}

/* Bytes of text that may be streamed now: not the tail a stop string could still claim, nor an
 * unfinished UTF-8 sequence at the end. */
static size_t streamable(const gen *g, bool final) {
  size_t n = g->text.len;
  if (final) return n;
  if (g->use_tools) return g->emitted; /* the text may turn out to be calls: kept to the end */
  if (g->max_stop_len > 1) n = n > g->max_stop_len - 1 ? n - (g->max_stop_len - 1) : 0;
  const unsigned char *t = (const unsigned char *)g->text.p;
  for (size_t back = 1; back <= 3 && back <= n; back++) {
    unsigned char c = t[n - back];
    if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back && c >= 0xC2 && c <= 0xF4) n -= back; /* could still complete */
    break;
  }
  return n < g->emitted ? g->emitted : n;
}

/* One SSE chunk with the text released so far, the gathered logprobs, and finish (or NULL). */
static void stream_chunk(worker *w, gen *g, const char *finish, bool first) {
  srv_buf b = {0};
  size_t upto = streamable(g, finish != NULL);
  mrl__sb_str(&b, "data: ");
  head_json(&b, g, g->chat ? "chat.completion.chunk" : "text_completion", w->s->model_name);
  mrl__sb_str(&b, ",\"choices\":[{\"index\":0,");
  if (g->chat) {
    srv_buf content = {0}, calls = {0};
    int nc = finish && g->use_tools ? mrl__tools_parse(&g->tools, w->s->e, g->text.p, g->text.len,
                                                       g->id, true, &content, &calls)
                                    : 0;
    mrl__sb_str(&b, "\"delta\":{");
    if (first) mrl__sb_str(&b, "\"role\":\"assistant\",");
    mrl__sb_str(&b, "\"content\":");
    if (nc && !content.len) mrl__sb_str(&b, "null");
    else if (nc) mrl__sb_json_str(&b, content.p, content.len);
    else mrl__sb_json_str(&b, g->text.p ? g->text.p + g->emitted : "", upto - g->emitted);
    if (nc) {
      mrl__sb_str(&b, ",\"tool_calls\":");
      mrl__sb_add(&b, calls.p, calls.len);
      finish = g->finish = "tool_calls";
    }
    mrl__sb_str(&b, "},");
    mrl__sb_free(&content);
    mrl__sb_free(&calls);
  } else {
    mrl__sb_str(&b, "\"text\":");
    mrl__sb_json_str(&b, g->text.p ? g->text.p + g->emitted : "", upto - g->emitted);
    mrl__sb_str(&b, ",");
  }
  g->emitted = upto;
  mrl__sb_str(&b, "\"logprobs\":");
  logprobs_json(&b, g);
  if (finish)
    mrl__sb_printf(&b, ",\"finish_reason\":\"%s\"", finish);
  else
    mrl__sb_str(&b, ",\"finish_reason\":null");
  if (finish && g->return_token_ids) {
    mrl__sb_str(&b, ",\"token_ids\":");
    ids_json(&b, g->tokens, g->n_tokens);
  }
  mrl__sb_str(&b, "}]");
  if (g->include_usage) mrl__sb_str(&b, ",\"usage\":null");
  mrl__sb_str(&b, "}\n\n");
  if (finish && g->include_usage) {
    mrl__sb_str(&b, "data: ");
    head_json(&b, g, g->chat ? "chat.completion.chunk" : "text_completion", w->s->model_name);
    mrl__sb_str(&b, ",\"choices\":[],\"usage\":");
    usage_json(&b, g);
    mrl__sb_str(&b, "}\n\n");
  }
  if (finish) mrl__sb_str(&b, "data: [DONE]\n\n");
  mrl_server *s = w->s;
  pthread_mutex_lock(&s->mu);
  mrl__sb_add(&g->job->out, b.p ? b.p : "", b.len);
  if (b.failed) g->job->out.failed = true;
  if (finish) {
    mrl__serve_finish(g->job, 200);
  } else {
    pthread_cond_broadcast(&g->job->cond);
  }
  pthread_mutex_unlock(&s->mu);
  mrl__sb_free(&b);
}

/* A token's name in logprobs: its text, or "token_id:N" with return_tokens_as_token_ids. */
static void token_name(srv_buf *b, const gen *g, int32_t id, const char *txt, size_t len) {
  if (g->as_ids)
    mrl__sb_printf(b, "\"token_id:%d\"", (int)id);
  else
    mrl__sb_json_str(b, txt, len);
}

/* Gathers the logprobs entry of a token sampled after logits `logits` (vocab floats). */
static void add_logprob(worker *w, gen *g, int32_t tok, float lp, const float *logits,
                        const uint8_t *mask, size_t offset) {
  size_t len;
  const char *txt = token_text(w, tok, &len);
  if (!txt) txt = "", len = 0;
  int top[MAX_TOP];
  float topv[MAX_TOP];
  int k = g->top_logprobs;
  if (k > 0) {
    /* the k most likely tokens under the distribution the sampled logprob is measured in (over
     * the allowed tokens when constrained) */
    float temp = g->sampling.temperature > 0 ? g->sampling.temperature : 1.0f;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < w->s->vocab; i++)
      if ((!mask || mask[i]) && logits[i] / temp > mx) mx = logits[i] / temp;
    for (int i = 0; i < w->s->vocab; i++)
      if (!mask || mask[i]) sum += exp(logits[i] / temp - mx);
    double lse = mx + log(sum);
    int n = 0;
    for (int i = 0; i < w->s->vocab; i++) {
      if (mask && !mask[i]) continue;
      float v = (float)(logits[i] / temp - lse);
      if (n < k || v > topv[n - 1]) {
        int p = n < k ? n++ : n - 1;
        while (p > 0 && topv[p - 1] < v) {
          topv[p] = topv[p - 1];
          top[p] = top[p - 1];
          p--;
        }
        topv[p] = v;
        top[p] = i;
      }
    }
    k = n;
  }
  const char *sep = g->lp_count ? "," : "";
  if (g->chat || g->tito) {
    srv_buf *b = &g->lp[0];
    mrl__sb_printf(b, "%s{\"token\":", sep);
    token_name(b, g, tok, txt, len);
    mrl__sb_str(b, ",\"logprob\":");
    mrl__sb_json_float(b, lp);
    mrl__sb_str(b, ",\"bytes\":");
    json_bytes(b, txt, len);
    mrl__sb_str(b, ",\"top_logprobs\":[");
    for (int i = 0; i < k; i++) {
      size_t tl;
      const char *tt = token_text(w, top[i], &tl);
      if (!tt) tt = "", tl = 0;
      mrl__sb_str(b, i ? ",{\"token\":" : "{\"token\":");
      token_name(b, g, top[i], tt, tl);
      mrl__sb_str(b, ",\"logprob\":");
      mrl__sb_json_float(b, topv[i]);
      mrl__sb_str(b, ",\"bytes\":");
      json_bytes(b, tt, tl);
      mrl__sb_str(b, "}");
    }
    mrl__sb_str(b, "]}");
  } else {
    txt = token_text(w, tok, &len);
    if (!txt) txt = "", len = 0;
    mrl__sb_str(&g->lp[0], sep);
    token_name(&g->lp[0], g, tok, txt, len);
    mrl__sb_str(&g->lp[1], sep);
    mrl__sb_json_float(&g->lp[1], lp);
    mrl__sb_str(&g->lp[2], sep);
    if (k == 0) {
      mrl__sb_str(&g->lp[2], "null");
    } else {
      mrl__sb_str(&g->lp[2], "{");
      for (int i = 0; i < k; i++) {
        size_t tl;
        const char *tt = token_text(w, top[i], &tl);
        if (!tt) tt = "", tl = 0;
        if (i) mrl__sb_str(&g->lp[2], ",");
        token_name(&g->lp[2], g, top[i], tt, tl);
        mrl__sb_str(&g->lp[2], ":");
        mrl__sb_json_float(&g->lp[2], topv[i]);
      }
      mrl__sb_str(&g->lp[2], "}");
    }
    mrl__sb_printf(&g->lp[3], "%s%zu", sep, offset);
  }
  g->lp_count++;
}

/* ---- the decode loop ---- */

/* Counts g as finished in /health (running, requests), once: before its last reply goes out, so
 * that a client which has its answer and then asks /health sees it counted. */
static void count_finished(worker *w, gen *g) {
  if (g->counted) return;
  g->counted = true;
  pthread_mutex_lock(&w->s->mu);
  w->s->running--;
  w->s->requests++;
  pthread_mutex_unlock(&w->s->mu);
}

static void release_slot(worker *w, gen *g) {
  w->slots[g->slot] = NULL;
  w->active--;
  count_finished(w, g);
  gen_free(g);
}

/* Puts a parsed generation into a free slot and reads its prompt. */
static void admit(worker *w, gen *g) {
  mrl_server *s = w->s;
  int slot = 0;
  while (w->slots[slot]) slot++;
  if (mrl_kv_cache_reset(w->cache, slot, g->seed) != MRL_OK ||
      mrl_kv_cache_append(w->cache, 1, &slot, g->prompt, &g->n_prompt) != MRL_OK) {
    fail_job(s, g->job, 500, "server_error", NULL, "internal_error", "%s",
             mrl_engine_last_error(s->e));
    gen_free(g);
    return;
  }
  g->slot = slot;
  w->slots[slot] = g;
  w->active++;
  if (!g->id[0])
    snprintf(g->id, sizeof g->id, "%s-%llu", g->chat ? "chatcmpl" : g->tito ? "gen" : "cmpl",
             (unsigned long long)w->next_id++);
  g->created = (long long)time(NULL);
  pthread_mutex_lock(&s->mu);
  s->running++;
  if (g->stream) {
    g->job->status = 200;
    g->job->streaming = true;
    pthread_cond_broadcast(&g->job->cond);
  }
  pthread_mutex_unlock(&s->mu);
  if (g->stream) stream_chunk(w, g, NULL, true);
}

/* Records token tok for g; returns the finish reason, or NULL when g goes on. */
static const char *take_token(worker *w, gen *g, int32_t tok, float lp) {
  const float *logits = g->top_logprobs ? mrl_kv_cache_logits(w->cache, g->slot) : NULL;
  size_t offset = g->text.len;
  g->tokens[g->n_tokens] = tok;
  g->lps[g->n_tokens] = lp;
  g->n_tokens++;
  if (g->logprobs) add_logprob(w, g, tok, lp, logits, g->constrained ? g->mask : NULL, offset);
  for (int i = 0; i < g->n_stop_ids && !g->constrained; i++)
    if (tok == g->stop_ids[i]) return "stop";
  size_t len;
  const char *txt = token_text(w, tok, &len);
  if (txt) mrl__sb_add(&g->text, txt, len);
  if (g->constrained && txt) { /* the mask let only tokens through that the call can take */
    mrl__tc_feed(&g->tc, &g->tools, txt, len);
    if (mrl__tc_done(&g->tc)) return "stop";
  }
  for (int i = 0; i < g->n_stops; i++) {
    size_t from = offset + 1 > g->stop_lens[i] ? offset + 1 - g->stop_lens[i] : 0;
    for (size_t p = from; p + g->stop_lens[i] <= g->text.len; p++) {
      if (!memcmp(g->text.p + p, g->stops[i], g->stop_lens[i])) {
        g->text.len = p;
        g->text.p[p] = '\0';
        return "stop";
      }
    }
  }
  if (g->n_tokens >= g->max_tokens || g->n_prompt + g->n_tokens >= w->s->ctx) return "length";
  return NULL;
}

/* Every token's bytes, once (for the masks of forced calls). */
static bool vocab_bytes(worker *w) {
  if (w->vocab_off) return true;
  int V = w->s->vocab;
  size_t *off = malloc(((size_t)V + 1) * sizeof *off);
  srv_buf all = {0};
  for (int v = 0; off && v < V; v++) {
    size_t len;
    const char *txt = token_text(w, v, &len);
    off[v] = all.len;
    if (txt) mrl__sb_add(&all, txt, len);
  }
  if (!off || all.failed) {
    free(off);
    mrl__sb_free(&all);
    return false;
  }
  off[V] = all.len;
  w->vocab_off = off;
  w->vocab_bytes = all.p;
  return true;
}

/* g->mask: the tokens whose bytes keep g's forced call well-formed (never an end-of-turn token:
 * the call ends the generation itself). */
static bool tool_mask(worker *w, gen *g) {
  int V = w->s->vocab;
  if (!vocab_bytes(w) || (!g->mask && !(g->mask = malloc((size_t)V)))) {
    mrl__fail(w->s->e, MRL_ERR_NOMEM, "moonrl serve", "out of memory");
    return false;
  }
  for (int v = 0; v < V; v++) {
    size_t n = w->vocab_off[v + 1] - w->vocab_off[v];
    tc_state t = g->tc;
    g->mask[v] = n && mrl__tc_feed(&t, &g->tools, w->vocab_bytes + w->vocab_off[v], n);
  }
  for (int i = 0; i < g->n_stop_ids; i++)
    if (g->stop_ids[i] >= 0 && g->stop_ids[i] < V) g->mask[g->stop_ids[i]] = 0;
  return true;
}

static void decode_step(worker *w) {
  mrl_server *s = w->s;
  int n = 0;
  int slots[w->s->max_batch], tokens[w->s->max_batch];
  int32_t sampled[w->s->max_batch];
  float lps[w->s->max_batch];
  /* drop the streams whose clients went away */
  for (int i = 0; i < s->max_batch; i++) {
    gen *g = w->slots[i];
    if (!g) continue;
    pthread_mutex_lock(&s->mu);
    bool gone = g->job->cancelled;
    if (gone) mrl__serve_finish(g->job, 499);
    pthread_mutex_unlock(&s->mu);
    if (gone) release_slot(w, g);
  }
  /* sample, one call per group of equal sampling settings */
  bool grouped[w->s->max_batch];
  memset(grouped, 0, sizeof grouped);
  for (int i = 0; i < s->max_batch; i++) { /* forced tool calls: one at a time, masked */
    gen *g = w->slots[i];
    if (!g || !g->constrained) continue;
    grouped[i] = true;
    if (!tool_mask(w, g) ||
        mrl_kv_cache_sample_masked(w->cache, i, &g->sampling, g->mask, &sampled[n], &lps[n]) !=
            MRL_OK) {
      fail_job(s, g->job, 500, "server_error", NULL, "internal_error",
               "the forced tool call cannot go on: %s", mrl_engine_last_error(s->e));
      release_slot(w, g);
      continue;
    }
    slots[n++] = i;
  }
  for (int i = 0; i < s->max_batch; i++) {
    if (!w->slots[i] || grouped[i]) continue;
    int group[w->s->max_batch], gn = 0;
    for (int k = i; k < s->max_batch; k++) {
      if (!w->slots[k] || grouped[k]) continue;
      if (memcmp(&w->slots[k]->sampling, &w->slots[i]->sampling, sizeof(mrl_sampling))) continue;
      grouped[k] = true;
      group[gn++] = k;
    }
    int32_t out[w->s->max_batch];
    float outlp[w->s->max_batch];
    if (mrl_kv_cache_sample(w->cache, gn, group, &w->slots[i]->sampling, out, outlp) != MRL_OK) {
      for (int k = 0; k < gn; k++) {
        gen *g = w->slots[group[k]];
        fail_job(s, g->job, 500, "server_error", NULL, "internal_error", "%s",
                 mrl_engine_last_error(s->e));
        release_slot(w, g);
      }
      continue;
    }
    for (int k = 0; k < gn; k++) {
      slots[n] = group[k];
      sampled[n] = out[k];
      lps[n] = outlp[k];
      n++;
    }
  }
  if (n == 0) return;
  pthread_mutex_lock(&s->mu);
  s->steps++;
  if (n > s->max_batch_seen) s->max_batch_seen = n;
  pthread_mutex_unlock(&s->mu);
  int go = 0;
  int go_slots[w->s->max_batch];
  int32_t go_tokens[w->s->max_batch];
  for (int i = 0; i < n; i++) {
    gen *g = w->slots[slots[i]];
    const char *finish = take_token(w, g, sampled[i], lps[i]);
    if (finish) {
      g->finish = finish;
      count_finished(w, g);
      if (g->stream)
        stream_chunk(w, g, finish, false);
      else
        full_reply(w, g);
      release_slot(w, g);
    } else {
      if (g->stream) stream_chunk(w, g, NULL, false);
      go_slots[go] = slots[i];
      go_tokens[go] = sampled[i];
      tokens[go] = 1;
      go++;
    }
  }
  mrl_status rc = MRL_OK;
  if (go && s->batch_invariant) { /* one row at a time: the same floats whatever else runs */
    for (int i = 0; i < go && rc == MRL_OK; i++)
      rc = mrl_kv_cache_append(w->cache, 1, &go_slots[i], &go_tokens[i], &tokens[i]);
  } else if (go) {
    rc = mrl_kv_cache_append(w->cache, go, go_slots, go_tokens, tokens);
  }
  if (rc != MRL_OK) {
    for (int i = 0; i < go; i++) {
      gen *g = w->slots[go_slots[i]];
      fail_job(s, g->job, 500, "server_error", NULL, "internal_error", "%s",
               mrl_engine_last_error(s->e));
      release_slot(w, g);
    }
  }
}

/* ---- the other jobs ---- */

static void tokenize(worker *w, srv_job *j, const mrl_json *root) {
  static const char *const keys[] = {"model", "prompt", "messages", "add_special_tokens",
                                     "add_generation_prompt", NULL};
  if (!only_keys(w, j, root, keys) || !check_model(w, j, root)) return;
  bool add_gen = true, special = true;
  if (!get_bool(w, j, root, "add_generation_prompt", &add_gen) ||
      !get_bool(w, j, root, "add_special_tokens", &special))
    return;
  int32_t *ids = NULL;
  int n = 0;
  const mrl_json *prompt = mrl__json_get(root, "prompt");
  if (mrl__json_get(root, "messages")) {
    if (!render_chat(w, j, mrl__json_get(root, "messages"), add_gen, NULL, &ids, &n)) return;
  } else if (prompt && prompt->type == MRL_JSON_STRING) {
    if (!encode(w, j, "prompt", prompt->string, prompt->length, &ids, &n)) return;
  } else {
    BAD("prompt", "'prompt' (a string) or 'messages' is required");
    return;
  }
  srv_buf b = {0};
  mrl__sb_printf(&b, "{\"count\":%d,\"max_model_len\":%d,\"tokens\":", n, w->s->ctx);
  ids_json(&b, ids, n);
  mrl__sb_str(&b, ",\"token_strs\":null}");
  free(ids);
  reply(w->s, j, 200, &b);
}

static void detokenize(worker *w, srv_job *j, const mrl_json *root) {
  static const char *const keys[] = {"model", "tokens", NULL};
  if (!only_keys(w, j, root, keys) || !check_model(w, j, root)) return;
  const mrl_json *v = mrl__json_get(root, "tokens");
  if (!v) {
    BAD("tokens", "'tokens' is required");
    return;
  }
  int32_t *ids;
  int n;
  if (!get_ids(w, j, v, "tokens", &ids, &n, true)) return;
  size_t len = 0;
  char *text = NULL;
  mrl_status st = mrl_tokenizer_decode(w->s->t, ids, (size_t)n, NULL, 0, &len);
  if (st == MRL_OK) {
    text = malloc(len + 1);
    st = text ? mrl_tokenizer_decode(w->s->t, ids, (size_t)n, text, len + 1, &len) : MRL_ERR_NOMEM;
  }
  free(ids);
  if (st != MRL_OK) {
    free(text);
    BAD("tokens", "cannot decode: %s", mrl_engine_last_error(w->s->e));
    return;
  }
  srv_buf b = {0};
  mrl__sb_str(&b, "{\"prompt\":");
  mrl__sb_json_str(&b, text, len);
  mrl__sb_str(&b, "}");
  free(text);
  reply(w->s, j, 200, &b);
}

/* New weights: a moonrl checkpoint file (its path or its bytes) loads into the model in place; a
 * Hugging Face model directory replaces the model when its configuration is the same. */
static void load_weights(worker *w, srv_job *j, const mrl_json *root) {
  mrl_server *s = w->s;
  char tmp[] = "/tmp/moonrl-serve-weights-XXXXXX";
  const char *path = NULL;
  bool is_tmp = false;
  if (j->raw) {
    int fd = mkstemp(tmp);
    bool ok = fd >= 0;
    for (size_t off = 0; ok && off < j->body_len;) {
      ssize_t k = write(fd, j->body + off, j->body_len - off);
      if (k <= 0) ok = false;
      else off += (size_t)k;
    }
    if (fd >= 0) close(fd);
    if (!ok) {
      if (fd >= 0) unlink(tmp);
      fail_job(s, j, 500, "server_error", NULL, "internal_error",
               "cannot write the weights to a temporary file");
      return;
    }
    path = tmp;
    is_tmp = true;
  } else {
    static const char *const keys[] = {"path", NULL};
    if (!only_keys(w, j, root, keys)) return;
    const mrl_json *v = mrl__json_get(root, "path");
    if (!v || v->type != MRL_JSON_STRING || v->length == 0) {
      BAD("path", "'path' (a checkpoint file or a model directory on this machine) is required");
      return;
    }
    path = v->string;
  }
  pthread_mutex_lock(&s->mu);
  s->loading = true;
  pthread_mutex_unlock(&s->mu);
  struct stat st;
  mrl_status rc;
  char msg[MRL_ERRMSG_CAP] = "";
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    mrl_model *m = NULL;
    rc = mrl_model_load(s->e, path, &m);
    if (rc == MRL_OK) {
      mrl_model_config a, b;
      mrl_model_config_get(m, &a);
      mrl_model_config_get(s->m, &b);
      if (memcmp(&a, &b, sizeof a)) {
        mrl_model_free(m);
        rc = MRL_ERR_SHAPE;
        snprintf(msg, sizeof msg, "the model in %s has another configuration than the served one",
                 path);
      } else {
        mrl_kv_cache *c = NULL;
        rc = mrl_kv_cache_new(m, s->max_batch, s->ctx, &c);
        if (rc == MRL_OK) {
          mrl_kv_cache_free(w->cache);
          mrl_model_free(s->m);
          s->m = m;
          w->cache = c;
        } else {
          mrl_model_free(m);
        }
      }
    }
  } else {
    rc = mrl_model_load_checkpoint(s->m, path, NULL, NULL);
  }
  if (rc != MRL_OK && !msg[0]) snprintf(msg, sizeof msg, "%s", mrl_engine_last_error(s->e));
  if (is_tmp) unlink(tmp);
  pthread_mutex_lock(&s->mu);
  s->loading = false;
  if (rc == MRL_OK) s->policy_version++;
  long long version = (long long)s->policy_version;
  pthread_mutex_unlock(&s->mu);
  if (rc != MRL_OK) {
    fail_job(s, j, 400, "invalid_request_error", j->raw ? NULL : "path", "invalid_weights",
             "cannot load the weights: %s", msg);
    return;
  }
  srv_buf b = {0};
  mrl__sb_printf(&b, "{\"status\":\"ok\",\"policy_version\":%lld}", version);
  reply(s, j, 200, &b);
}

/* One job: parsed, validated, answered or (a generation, when run) admitted to a slot. */
/* A job's reply is complete: its status set and the connection thread woken (s->mu held).
 * mrl__serve_finish does this and drops the engine side's reference. */
static void mark_done(srv_job *j, int status) {
  j->status = status;
  j->done = true;
  pthread_cond_broadcast(&j->cond);
}

static void handle(worker *w, srv_job *j, bool run) {
  mrl_server *s = w->s;
  if (j->kind == JOB_LOAD_WEIGHTS && j->raw) {
    load_weights(w, j, NULL);
    return;
  }
  mrl_json_doc *doc = NULL;
  if (mrl__json_parse(s->e, "request", "the body", j->body, j->body_len, &doc) != MRL_OK) {
    fail_job(s, j, 400, "invalid_request_error", NULL, "invalid_json",
             "the body is not valid JSON: %s", mrl_engine_last_error(s->e));
    return;
  }
  const mrl_json *root = mrl__json_root(doc);
  if (root->type != MRL_JSON_OBJECT) {
    fail_job(s, j, 400, "invalid_request_error", NULL, "invalid_json",
             "the body must be a JSON object");
  } else if (j->kind == JOB_TOKENIZE) {
    tokenize(w, j, root);
  } else if (j->kind == JOB_DETOKENIZE) {
    detokenize(w, j, root);
  } else if (j->kind == JOB_LOAD_WEIGHTS) {
    load_weights(w, j, root);
  } else {
    gen *g = calloc(1, sizeof *g);
    if (!g) {
      fail_job(s, j, 500, "server_error", NULL, "internal_error", "out of memory");
    } else {
      g->job = j;
      /* A reference of this call's own: a request that fails its checks is finished inside
       * parse_gen, which drops the engine side's reference, and the connection thread may then
       * free the job before j->done is read below. */
      pthread_mutex_lock(&s->mu);
      j->refs++;
      pthread_mutex_unlock(&s->mu);
      bool admitted = parse_gen(w, j, root, g) && run;
      if (admitted) admit(w, g);
      pthread_mutex_lock(&s->mu);
      if (!admitted && !j->done) { /* valid, not run: as far as the checker goes */
        mark_done(j, 200);
        j->refs--; /* the engine side's reference, which finishing drops; ours goes below */
      }
      mrl__serve_release(j);
      pthread_mutex_unlock(&s->mu);
      if (!admitted) gen_free(g);
    }
  }
  mrl__json_free(doc);
}

int mrl__serve_check_request(mrl_server *s, int kind, const char *body, size_t len,
                             srv_buf *reply) {
  if (kind == JOB_LOAD_WEIGHTS) return -1;
  srv_job *j = calloc(1, sizeof *j);
  worker w = {.s = s};
  if (!j || !(j->body = malloc(len + 1))) {
    free(j);
    return -1;
  }
  memcpy(j->body, body, len);
  j->body[len] = '\0';
  j->body_len = len;
  j->kind = kind;
  j->refs = 2; /* the engine side's, dropped when the reply is complete, and ours */
  pthread_cond_init(&j->cond, NULL);
  handle(&w, j, false);
  pthread_mutex_lock(&s->mu);
  int status = j->done ? j->status : -1;
  *reply = j->out;
  memset(&j->out, 0, sizeof j->out);
  if (!j->done) j->refs--; /* (handle always finishes a job; this keeps the count right) */
  mrl__serve_release(j);
  pthread_mutex_unlock(&s->mu);
  free(w.scratch);
  free(w.vocab_bytes);
  free(w.vocab_off);
  return status;
}

/* ---- the thread ---- */

void mrl__serve_finish(srv_job *j, int status) {
  if (j->done) return;
  mark_done(j, status);
  mrl__serve_release(j);
}

void mrl__serve_release(srv_job *j) {
  if (--j->refs > 0) return;
  mrl__sb_free(&j->out);
  free(j->body);
  pthread_cond_destroy(&j->cond);
  free(j);
}

static bool is_gen(const srv_job *j) {
  return j->kind == JOB_COMPLETION || j->kind == JOB_CHAT || j->kind == JOB_CHAT_TOKENS ||
         j->kind == JOB_GENERATE;
}

void *mrl__serve_worker(void *arg) {
  mrl_server *s = arg;
  worker w = {.s = s};
  w.slots = calloc((size_t)s->max_batch, sizeof *w.slots);
  bool ok = w.slots && mrl_kv_cache_new(s->m, s->max_batch, s->ctx, &w.cache) == MRL_OK;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (ok && !s->stopping && (s->paused || !s->head) && w.active == 0)
      pthread_cond_wait(&s->wake, &s->mu);
    if (!ok || s->stopping) break;
    /* take what can start now: generations while slots are free (counting those taken), other
     * jobs at once, new weights only between generations */
    srv_job *taken = NULL, **end = &taken;
    int free_slots = s->max_batch - w.active;
    while (!s->paused && s->head) {
      srv_job *j = s->head;
      if (is_gen(j) && free_slots == 0) break;
      if (j->kind == JOB_LOAD_WEIGHTS && (w.active > 0 || taken)) break;
      s->head = j->next;
      if (!s->head) s->tail = NULL;
      s->queued--;
      j->next = NULL;
      *end = j;
      end = &j->next;
      if (is_gen(j)) free_slots--;
      if (j->kind == JOB_LOAD_WEIGHTS) break;
    }
    pthread_mutex_unlock(&s->mu);
    while (taken) {
      srv_job *j = taken;
      taken = j->next;
      handle(&w, j, true);
    }
    if (w.active) decode_step(&w);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  /* shutting down (or no cache): running generations end with an error, queued jobs get 503 */
  for (int i = 0; w.slots && i < s->max_batch; i++) {
    gen *g = w.slots[i];
    if (!g) continue;
    if (g->stream) {
      pthread_mutex_lock(&s->mu);
      mrl__sb_str(&g->job->out, "data: ");
      mrl__sb_error(&g->job->out, "the server is shutting down", "server_error", NULL,
               "service_unavailable");
      mrl__sb_str(&g->job->out, "\n\ndata: [DONE]\n\n");
      mrl__serve_finish(g->job, 200);
      pthread_mutex_unlock(&s->mu);
    } else {
      fail_job(s, g->job, 503, "server_error", NULL, "service_unavailable",
               "the server is shutting down");
    }
    release_slot(&w, g);
  }
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  while (s->head) {
    srv_job *j = s->head;
    s->head = j->next;
    s->queued--;
    mrl__sb_free(&j->out);
    mrl__sb_error(&j->out, ok ? "the server is shutting down" : "the engine thread could not start",
             "server_error", NULL, "service_unavailable");
    mrl__serve_finish(j, 503);
  }
  s->tail = NULL;
  pthread_mutex_unlock(&s->mu);
  mrl_kv_cache_free(w.cache);
  free(w.slots);
  free(w.scratch);
  free(w.vocab_bytes);
  free(w.vocab_off);
  return NULL;
}
