/* fuzz_request.c - libFuzzer target: any bytes as the body of a `moonrl serve` request, through
 * the server's own parser and validator (mrl__serve_check_request: the JSON reader, every field
 * check, messages through the chat template, tools, tool_choice and earlier tool calls, stops and
 * sampling options), as the engine thread runs it, without generating. The first byte picks the
 * endpoint (its low 3 bits: completions, chat, chat with prompt ids, generate, tokenize,
 * detokenize; 6 and 7 are chat again) and the tool-call format (bit 3: line, else hermes); the
 * rest is the body. Besides sanitizer reports it stops (abort) on a broken promise:
 *   - the status is 200, 400 or 404;
 *   - every other reply is an OpenAI error object {"error": {"message": a non-empty string,
 *     "type": a string, "param": a string or null, "code": a string or null}};
 *   - a 200 from tokenize or detokenize is a JSON object; a 200 generation has no body yet;
 *   - the same body checked again gives the same status and the same bytes (no state carries
 *     over from one request to the next).
 * tests/c/test_fuzz_request_corpus.c compiles this file and replays the seed corpus
 * (tests/fuzz/request_corpus) through the same entry point in the normal test run. */
#include "../../engine/src/serve/serve_internal.h"
#include "json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* the kinds the first byte selects (enum srv_kind) */
static const int kinds[8] = {JOB_COMPLETION, JOB_CHAT,     JOB_CHAT_TOKENS, JOB_GENERATE,
                             JOB_TOKENIZE,   JOB_DETOKENIZE, JOB_CHAT,      JOB_CHAT};

static mrl_server *server(void) {
  static mrl_server s;
  static bool ready;
  if (ready) return &s;
  if (mrl_engine_new(&s.e) != MRL_OK || mrl_tokenizer_bytes(s.e, &s.t) != MRL_OK) abort();
  static char name[] = "moonrl";
  s.model_name = name;
  s.ctx = 1024;
  s.vocab = mrl_tokenizer_vocab_size(s.t);
  s.max_batch = 2;
  pthread_mutex_init(&s.mu, NULL);
  ready = true;
  return &s;
}

static bool is_string_or_null(const mrl_json *v) {
  return v && (v->type == MRL_JSON_STRING || v->type == MRL_JSON_NULL);
}

/* The error object of a non-200 reply, as the OpenAI API shapes it. */
static void check_error(mrl_engine *e, const srv_buf *reply) {
  mrl_json_doc *doc = NULL;
  if (!reply->p || mrl__json_parse(e, "fuzz", "reply", reply->p, reply->len, &doc) != MRL_OK)
    abort();
  const mrl_json *err = mrl__json_get(mrl__json_root(doc), "error");
  const mrl_json *msg = mrl__json_get(err, "message"), *type = mrl__json_get(err, "type");
  if (!err || err->type != MRL_JSON_OBJECT || !msg || msg->type != MRL_JSON_STRING ||
      msg->length == 0 || !type || type->type != MRL_JSON_STRING ||
      !is_string_or_null(mrl__json_get(err, "param")) ||
      !is_string_or_null(mrl__json_get(err, "code")))
    abort();
  mrl__json_free(doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  mrl_server *s = server();
  int kind = kinds[data[0] & 7];
  s->tool_format = data[0] & 8 ? 1 : 0; /* TOOL_FORMAT_LINE, TOOL_FORMAT_HERMES */
  const char *body = (const char *)data + 1;
  size_t len = size - 1;
  srv_buf reply = {0}, again = {0};
  int status = mrl__serve_check_request(s, kind, body, len, &reply);
  if (status != 200 && status != 400 && status != 404) abort();
  if (status != 200) {
    check_error(s->e, &reply);
  } else if (kind == JOB_TOKENIZE || kind == JOB_DETOKENIZE) {
    mrl_json_doc *doc = NULL;
    if (!reply.p || mrl__json_parse(s->e, "fuzz", "reply", reply.p, reply.len, &doc) != MRL_OK ||
        mrl__json_root(doc)->type != MRL_JSON_OBJECT)
      abort();
    mrl__json_free(doc);
  } else if (reply.len != 0) {
    abort();
  }
  if (mrl__serve_check_request(s, kind, body, len, &again) != status || again.len != reply.len ||
      (reply.len && memcmp(again.p, reply.p, reply.len)))
    abort();
  mrl__sb_free(&reply);
  mrl__sb_free(&again);
  return 0;
}
