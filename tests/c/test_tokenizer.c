/* test_tokenizer.c - unit tests of the tokenizers: the byte tokenizer, the hand-made
 * tests/tokenizer/tiny.json (merges in both formats, added and special tokens, NFC, ignore_merges,
 * the GPT-2 pre-tokenizer), the chat templates with exact ids, the output-buffer conventions,
 * every refused or malformed tokenizer.json (message, status, no memory kept), loading under
 * memory limits, and the internals against references: UTF-8 maximal subparts, the split
 * patterns, NFC, the heap-based BPE merge against the naive loop, the word cache, and linear time
 * on long inputs. */
#include "support.h"
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static char *tiny_text; /* tests/tokenizer/tiny.json, read once */
static size_t tiny_len;

static const char *tiny_path(void) {
  static char path[4096];
  const char *root = getenv("MOONRL_ROOT");
  snprintf(path, sizeof path, "%s/tests/tokenizer/tiny.json", root ? root : ".");
  return path;
}

static const char *tiny(void) {
  if (tiny_text) return tiny_text;
  FILE *f = fopen(tiny_path(), "rb");
  if (!f) {
    printf("Bail out! cannot open %s (run from the repository root or set MOONRL_ROOT)\n",
           tiny_path());
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  tiny_len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  tiny_text = malloc(tiny_len + 1);
  if (!tiny_text || fread(tiny_text, 1, tiny_len, f) != tiny_len) {
    printf("Bail out! cannot read %s\n", tiny_path());
    exit(1);
  }
  tiny_text[tiny_len] = '\0';
  fclose(f);
  return tiny_text;
}

/* A malloc'd copy of tiny.json with the first occurrence of `from` replaced by `to` (which must
 * occur). */
static char *tiny_with(const char *from, const char *to) {
  const char *t = tiny();
  const char *at = strstr(t, from);
  if (!at) {
    printf("Bail out! tiny.json lacks \"%s\"\n", from);
    exit(1);
  }
  size_t head = (size_t)(at - t), nf = strlen(from), nt = strlen(to);
  char *out = malloc(tiny_len - nf + nt + 1);
  memcpy(out, t, head);
  memcpy(out + head, to, nt);
  strcpy(out + head + nt, at + nf);
  return out;
}

static mrl_tokenizer *load_text(mrl_engine *e, const char *json) {
  mrl_tokenizer *t = NULL;
  MUST(mrl_tokenizer_load_json(e, json, strlen(json), &t));
  return t;
}

enum { CAP = 1 << 16 };
static int32_t ids_buf[CAP];

/* Encodes s (len bytes) and checks the ids equal want[0..n). */
static void check_encode_n(mrl_tokenizer *t, const char *s, size_t len, int flags,
                           const int32_t *want, size_t n, int line) {
  size_t count = 0;
  mrl_status st = mrl_tokenizer_encode(t, s, len, flags, ids_buf, CAP, &count);
  CHECKF(st == MRL_OK, "line %d: encode failed: %s", line, mrl_engine_last_error(t->engine));
  bool same = count == n && memcmp(ids_buf, want, n * sizeof *want) == 0;
  if (!same) {
    char got[512] = "";
    for (size_t i = 0; i < count && strlen(got) < 480; i++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", ids_buf[i]);
    CHECKF(false, "line %d: encoding \"%.*s\" gave %zu ids: %s", line, (int)len, s, count, got);
  }
}
#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / 4
#define CHECK_ENCODE(t, s, flags, ...) \
  check_encode_n((t), (s), strlen(s), (flags), IDS(__VA_ARGS__), __LINE__)

/* decode(encode(s)) must give back exactly `want` (s itself when want is NULL). */
static void check_round_trip(mrl_tokenizer *t, const char *s, size_t len, int flags,
                             const char *want, size_t want_len, int line) {
  static char text[4 * CAP];
  size_t count = 0, n = 0;
  if (!want) {
    want = s;
    want_len = len;
  }
  mrl_status st = mrl_tokenizer_encode(t, s, len, flags, ids_buf, CAP, &count);
  CHECKF(st == MRL_OK && count <= CAP, "line %d: encode failed", line);
  st = mrl_tokenizer_decode(t, ids_buf, count, text, sizeof text, &n);
  CHECKF(st == MRL_OK && n == want_len && memcmp(text, want, n) == 0,
         "line %d: round trip of %zu bytes gave %zu bytes", line, len, n);
}

/* ---- the byte tokenizer ---- */

static void test_bytes_vocabulary(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = NULL;
  MUST(mrl_tokenizer_bytes(e, &t));
  CHECK(mrl_tokenizer_vocab_size(t) == MRL_BYTE_VOCAB);
  for (int b = 0; b < 256; b++) {
    size_t len = 9;
    const char *s = mrl_tokenizer_token(t, b, &len);
    char c = (char)b;
    CHECKF(s && len == 1 && s[0] == c && s[1] == '\0', "token %d", b);
    CHECKF(mrl_tokenizer_token_id(t, &c, 1) == b, "token_id of byte %d", b);
  }
  static const char *const names[] = {"<|bos|>",    "<|eos|>",  "<|pad|>",       "<|system|>",
                                      "<|user|>",   "<|assistant|>", "<|tool|>", "<|end|>"};
  for (int i = 0; i < 8; i++) {
    CHECK(strcmp(mrl_tokenizer_token(t, MRL_TOKEN_BOS + i, NULL), names[i]) == 0);
    CHECK(mrl_tokenizer_token_id(t, names[i], strlen(names[i])) == MRL_TOKEN_BOS + i);
  }
  CHECK(MRL_TOKEN_END == 263 && MRL_TOKEN_ASSISTANT == 261);
  CHECK(mrl_tokenizer_token(t, 264, NULL) == NULL && mrl_tokenizer_token(t, -1, NULL) == NULL);
  CHECK(mrl_tokenizer_token_id(t, "ab", 2) == -1 && mrl_tokenizer_token_id(t, "", 0) == -1);
  mrl_model_config cfg;
  mrl_model_config_default(&cfg);
  CHECKF(cfg.vocab == MRL_BYTE_VOCAB, "default model vocabulary %d", cfg.vocab);
  mrl_tokenizer_free(t);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static void test_bytes_encode_decode(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = NULL;
  MUST(mrl_tokenizer_bytes(e, &t));
  char all[256];
  for (int b = 0; b < 256; b++) all[b] = (char)b;
  size_t count = 0;
  MUST(mrl_tokenizer_encode(t, all, 256, MRL_ENCODE_SPECIAL, ids_buf, CAP, &count));
  CHECK(count == 256);
  for (int b = 0; b < 256; b++) CHECKF(ids_buf[b] == b, "byte %d", b);
  check_round_trip(t, all, 256, 0, NULL, 0, __LINE__);
  CHECK_ENCODE(t, "a<|user|>b", MRL_ENCODE_SPECIAL, 'a', MRL_TOKEN_USER, 'b');
  CHECK_ENCODE(t, "a<|user|>b", 0, 'a', '<', '|', 'u', 's', 'e', 'r', '|', '>', 'b');
  CHECK_ENCODE(t, "<|end|><|end|", MRL_ENCODE_SPECIAL, MRL_TOKEN_END, '<', '|', 'e', 'n', 'd', '|');
  count = 7;
  MUST(mrl_tokenizer_encode(t, NULL, 0, 0, NULL, 0, &count));
  CHECK(count == 0);
  mrl_tokenizer_free(t);
  mrl_engine_free(e);
}

/* snprintf-style outputs: the full size is reported, only cap entries are written. */
static void test_output_buffers(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = NULL;
  MUST(mrl_tokenizer_bytes(e, &t));
  int32_t ids[4] = {-7, -7, -7, -7};
  size_t count = 0;
  MUST(mrl_tokenizer_encode(t, "hello", 5, 0, ids, 3, &count));
  CHECK(count == 5 && ids[0] == 'h' && ids[2] == 'l' && ids[3] == -7);
  MUST(mrl_tokenizer_encode(t, "hello", 5, 0, NULL, 0, &count));
  CHECK(count == 5);
  const int32_t hi[] = {'h', 'i', MRL_TOKEN_END};
  char buf[8];
  memset(buf, 'x', sizeof buf);
  size_t len = 0;
  MUST(mrl_tokenizer_decode(t, hi, 3, buf, 4, &len));
  CHECK(len == 9 && memcmp(buf, "hi<", 3) == 0 && buf[3] == '\0' && buf[4] == 'x');
  MUST(mrl_tokenizer_decode(t, hi, 3, NULL, 0, &len));
  CHECK(len == 9);
  const int32_t nul[] = {'a', 0, 'b'};
  MUST(mrl_tokenizer_decode(t, nul, 3, buf, sizeof buf, &len));
  CHECK(len == 3 && memcmp(buf, "a\0b", 4) == 0);
  mrl_tokenizer_free(t);
  mrl_engine_free(e);
}

static void test_errors_of_calls(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = NULL;
  MUST(mrl_tokenizer_bytes(e, &t));
  size_t count = 0, len = 0;
  int32_t ids[2];
  const int32_t bad[] = {'a', 264};
  CHECK(mrl_tokenizer_bytes(NULL, &t) == MRL_ERR_NULL);
  CHECK_FAILS(e, MRL_ERR_NULL, "out is NULL", mrl_tokenizer_bytes(e, NULL));
  CHECK(mrl_tokenizer_encode(NULL, "a", 1, 0, ids, 2, &count) == MRL_ERR_NULL);
  CHECK_FAILS(e, MRL_ERR_NULL, "text is NULL", mrl_tokenizer_encode(t, NULL, 1, 0, ids, 2, &count));
  CHECK_FAILS(e, MRL_ERR_NULL, "ids is NULL", mrl_tokenizer_encode(t, "a", 1, 0, NULL, 2, &count));
  CHECK_FAILS(e, MRL_ERR_NULL, "count is NULL", mrl_tokenizer_encode(t, "a", 1, 0, ids, 2, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "unknown flags 0x4", mrl_tokenizer_encode(t, "a", 1, 4, ids, 2, &count));
  CHECK_FAILS(e, MRL_ERR_RANGE, "ids[1] = 264 is not a token id of this tokenizer (vocabulary size 264)",
              mrl_tokenizer_decode(t, bad, 2, NULL, 0, &len));
  CHECK_FAILS(e, MRL_ERR_NULL, "ids is NULL", mrl_tokenizer_decode(t, NULL, 1, NULL, 0, &len));
  CHECK_FAILS(e, MRL_ERR_NULL, "buf is NULL", mrl_tokenizer_decode(t, bad, 1, NULL, 3, &len));
  CHECK_FAILS(e, MRL_ERR_NULL, "len is NULL", mrl_tokenizer_decode(t, bad, 1, NULL, 0, NULL));
  CHECK(count == 0 && len == 0); /* failures leave outputs alone */
  CHECK(mrl_tokenizer_vocab_size(NULL) == -1);
  CHECK(mrl_tokenizer_token(NULL, 1, NULL) == NULL && mrl_tokenizer_token_id(NULL, "a", 1) == -1);
  mrl_tokenizer_free(NULL);
  mrl_tokenizer_free(t);
  mrl_engine_free(e);
}

/* ---- chat templates ---- */

static void check_chat(mrl_tokenizer *t, mrl_chat_template tmpl, const mrl_chat_message *m,
                       size_t n, int gen, const int32_t *want, size_t want_n, int line) {
  size_t count = 0;
  mrl_status st = mrl_tokenizer_chat(t, tmpl, m, n, gen, ids_buf, CAP, &count);
  CHECKF(st == MRL_OK, "line %d: chat failed (%d)", line, st);
  bool same = count == want_n && memcmp(ids_buf, want, want_n * sizeof *want) == 0;
  CHECKF(same, "line %d: chat gave %zu ids, want %zu", line, count, want_n);
}
#define CHECK_CHAT(t, tmpl, m, n, gen, ...) \
  check_chat((t), (tmpl), (m), (n), (gen), IDS(__VA_ARGS__), __LINE__)
#define MSG(role, text) {role, text, sizeof text - 1}

static void test_chat_roles(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = NULL;
  MUST(mrl_tokenizer_bytes(e, &t));
  const mrl_chat_message m[] = {MSG("system", "Be"), MSG("user", "hi"), MSG("assistant", "ok"),
                                MSG("tool", "<|end|>")};
  CHECK_CHAT(t, MRL_CHAT_ROLES, m, 2, 1, MRL_TOKEN_SYSTEM, 'B', 'e', MRL_TOKEN_END, MRL_TOKEN_USER,
             'h', 'i', MRL_TOKEN_END, MRL_TOKEN_ASSISTANT);
  CHECK_CHAT(t, MRL_CHAT_AUTO, m + 2, 2, 0, MRL_TOKEN_ASSISTANT, 'o', 'k', MRL_TOKEN_END,
             MRL_TOKEN_TOOL, '<', '|', 'e', 'n', 'd', '|', '>', MRL_TOKEN_END);
  CHECK_CHAT(t, MRL_CHAT_ROLES, NULL, 0, 1, MRL_TOKEN_ASSISTANT);
  size_t count = 0;
  MUST(mrl_tokenizer_chat(t, MRL_CHAT_ROLES, NULL, 0, 0, NULL, 0, &count));
  CHECK(count == 0);
  const mrl_chat_message bot[] = {MSG("bot", "x")}, empty[] = {MSG("", "x")};
  const mrl_chat_message null_role[] = {{NULL, "x", 1}}, null_content[] = {{"user", NULL, 1}};
  CHECK_FAILS(e, MRL_ERR_INVALID, "role \"bot\" is not one of system, user, assistant, tool",
              mrl_tokenizer_chat(t, MRL_CHAT_ROLES, bot, 1, 0, ids_buf, CAP, &count));
  CHECK_FAILS(e, MRL_ERR_INVALID, "messages[0].role is empty",
              mrl_tokenizer_chat(t, MRL_CHAT_ROLES, empty, 1, 0, ids_buf, CAP, &count));
  CHECK_FAILS(e, MRL_ERR_NULL, "messages[0].role is NULL",
              mrl_tokenizer_chat(t, MRL_CHAT_ROLES, null_role, 1, 0, ids_buf, CAP, &count));
  CHECK_FAILS(e, MRL_ERR_NULL, "messages[0].content is NULL",
              mrl_tokenizer_chat(t, MRL_CHAT_ROLES, null_content, 1, 0, ids_buf, CAP, &count));
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "the chatml template needs the token <|im_start|>",
              mrl_tokenizer_chat(t, MRL_CHAT_CHATML, m, 1, 0, ids_buf, CAP, &count));
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "the llama3 template needs the token <|begin_of_text|>",
              mrl_tokenizer_chat(t, MRL_CHAT_LLAMA3, m, 1, 0, ids_buf, CAP, &count));
  CHECK_FAILS(e, MRL_ERR_INVALID, "unknown chat template 9",
              mrl_tokenizer_chat(t, (mrl_chat_template)9, m, 1, 0, ids_buf, CAP, &count));
  CHECK_FAILS(e, MRL_ERR_NULL, "messages is NULL",
              mrl_tokenizer_chat(t, MRL_CHAT_ROLES, NULL, 1, 0, ids_buf, CAP, &count));
  CHECK_FAILS(e, MRL_ERR_NULL, "total is NULL",
              mrl_tokenizer_chat(t, MRL_CHAT_ROLES, m, 1, 0, ids_buf, CAP, NULL));
  CHECK(count == 0);
  mrl_tokenizer_free(t);
  mrl_engine_free(e);
}

static void test_chat_chatml_llama3(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = load_text(e, tiny());
  const mrl_chat_message m[] = {MSG("system", "the"), MSG("user", "hello")};
  /* <|im_start|>system\nthe<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n */
  CHECK_CHAT(t, MRL_CHAT_AUTO, m, 2, 1, 267, 's', 'y', 's', 't', 'e', 'm', '\n', 't', 256, 268, '\n',
             267, 'u', 's', 'e', 'r', '\n', 261, 268, '\n', 267, 'a', 's', 's', 'i', 's', 't', 'a',
             'n', 't', '\n');
  /* <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|> */
  CHECK_CHAT(t, MRL_CHAT_LLAMA3, m + 1, 1, 0, 269, 270, 'u', 's', 'e', 'r', 271, '\n', '\n', 261, 272);
  CHECK_CHAT(t, MRL_CHAT_LLAMA3, NULL, 0, 1, 269, 270, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't',
             271, '\n', '\n');
  /* message text stays plain: <|im_end|> inside content is not the marker */
  const mrl_chat_message inj[] = {MSG("user", "<|im_end|>")};
  size_t count = 0;
  MUST(mrl_tokenizer_chat(t, MRL_CHAT_CHATML, inj, 1, 0, ids_buf, CAP, &count));
  int markers = 0;
  for (size_t i = 0; i < count; i++) markers += ids_buf[i] == 268;
  CHECK(markers == 1);
  mrl_tokenizer_free(t);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

/* ---- tiny.json ---- */

static void test_tiny_merges_both_formats(void) {
  mrl_engine *e = new_engine();
  char *legacy = tiny_with("[\"h\", \"e\"],\n      [\"l\", \"l\"],\n      [\"Ġ\", \"t\"],\n"
                           "      [\"Ġt\", \"he\"],\n      [\"ll\", \"o\"],\n      [\"he\", \"llo\"],\n"
                           "      [\"Ġ\", \"hello\"],\n      [\"Ã\", \"©\"]",
                           "\"h e\", \"l l\", \"Ġ t\", \"Ġt he\", \"ll o\", \"he llo\", \"Ġ hello\", \"Ã ©\"");
  mrl_tokenizer *from_file = NULL;
  MUST(mrl_tokenizer_load(e, tiny_path(), &from_file));
  mrl_tokenizer *ts[2] = {from_file, load_text(e, legacy)};
  for (int i = 0; i < 2; i++) {
    mrl_tokenizer *t = ts[i];
    CHECK(mrl_tokenizer_vocab_size(t) == 273);
    CHECK_ENCODE(t, "hello", 0, 261);
    CHECK_ENCODE(t, " the hello", 0, 259, 262);
    CHECK_ENCODE(t, "hell", 0, 256, 257);
    CHECK_ENCODE(t, "café", 0, 'c', 'a', 'f', 263);
    CHECK_ENCODE(t, " world", 0, 32, 'w', 'o', 'r', 'l', 'd');
    CHECK_ENCODE(t, "\xff", 0, 255);
    CHECK(mrl_tokenizer_token_id(t, "Ġhello", strlen("Ġhello")) == 262);
    size_t len = 0;
    CHECK(strcmp(mrl_tokenizer_token(t, 262, &len), "Ġhello") == 0 && len == 7);
    const int32_t the[] = {259};
    char buf[8];
    MUST(mrl_tokenizer_decode(t, the, 1, buf, sizeof buf, &len));
    CHECK(len == 4 && strcmp(buf, " the") == 0);
    mrl_tokenizer_free(t);
  }
  free(legacy);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static void test_tiny_added_tokens(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = load_text(e, tiny());
  CHECK_ENCODE(t, "x <|end|>y", MRL_ENCODE_SPECIAL, 'x', ' ', 264, 'y');
  CHECK_ENCODE(t, "x <|end|>y", 0, 'x', ' ', '<', '|', 'e', 'n', 'd', '|', '>', 'y');
  CHECK_ENCODE(t, "<tool>x", 0, 265, 'x');
  CHECK_ENCODE(t, "<tool>x", MRL_ENCODE_SPECIAL, 265, 'x');
  /* "é!" is normalized: found after NFC, in plain mode too */
  CHECK_ENCODE(t, "e\xcc\x81!", 0, 266);
  CHECK_ENCODE(t, "cafe\xcc\x81", 0, 'c', 'a', 'f', 263);
  /* leftmost-longest: <|end|> inside a longer unknown text, and adjacent tokens */
  CHECK_ENCODE(t, "<|end|><|end|><tool>", MRL_ENCODE_SPECIAL, 264, 264, 265);
  CHECK(mrl_tokenizer_token_id(t, "<tool>", 6) == 265);
  CHECK(mrl_tokenizer_token_id(t, "é!", strlen("é!")) == 266);
  check_round_trip(t, "x <|end|>y<tool>", 16, MRL_ENCODE_SPECIAL, NULL, 0, __LINE__);
  check_round_trip(t, "e\xcc\x81!", 4, 0, "\xc3\xa9!", 3, __LINE__);
  mrl_tokenizer_free(t);
  mrl_engine_free(e);
}

static void test_tiny_ignore_merges_and_gpt2(void) {
  mrl_engine *e = new_engine();
  char *a = tiny_with("\"ignore_merges\": false", "\"ignore_merges\": true");
  char *b = NULL;
  {
    const char *at = strstr(a, "\"Ã©\": 263");
    size_t head = (size_t)(at - a);
    const char *add = "\"Ã©\": 263, \"Ġworld\": 273";
    b = malloc(strlen(a) + strlen(add) + 1);
    memcpy(b, a, head);
    strcpy(b + head, add);
    strcat(b, at + strlen("\"Ã©\": 263"));
  }
  mrl_tokenizer *t = load_text(e, b);
  CHECK_ENCODE(t, " world", 0, 273);
  CHECK_ENCODE(t, " worlds", 0, 32, 'w', 'o', 'r', 'l', 'd', 's');
  CHECK_ENCODE(t, " the hello", 0, 259, 262);
  mrl_tokenizer_free(t);
  free(a);
  free(b);
  /* ByteLevel alone with its regex: GPT-2's split */
  const char *split_start = strstr(tiny(), "\"pre_tokenizer\"");
  const char *split_end = strstr(tiny(), "\"post_processor\"");
  char *gpt2 = malloc(tiny_len + 200);
  size_t head = (size_t)(split_start - tiny());
  memcpy(gpt2, tiny(), head);
  strcpy(gpt2 + head, "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                      "\"trim_offsets\": true, \"use_regex\": true},\n  ");
  strcat(gpt2, split_end);
  t = load_text(e, gpt2);
  CHECK_ENCODE(t, " the hello", 0, 259, 262);
  CHECK(t->split == MRL_SPLIT_GPT2);
  mrl_tokenizer_free(t);
  free(gpt2);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

/* ---- refused and malformed files ---- */

typedef struct {
  const char *from, *to; /* a change to tiny.json (from NULL: `to` is the whole text) */
  mrl_status status;
  const char *needle;
} bad_case;

static void test_load_errors(void) {
  mrl_engine *e = new_engine();
  static const bad_case cases[] = {
      {NULL, "", MRL_ERR_INVALID, "tokenizer.json: "},
      {NULL, "[1, 2]", MRL_ERR_INVALID, "the top level is not an object"},
      {NULL, "{\"version\": \"1.0\"}", MRL_ERR_INVALID, "no \"model\" object"},
      {NULL, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}", MRL_ERR_INVALID, "line 1"},
      {"\"type\": \"BPE\"", "\"type\": \"Unigram\"", MRL_ERR_UNSUPPORTED,
       "model type \"Unigram\" is not supported (only byte-level BPE)"},
      {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", MRL_ERR_UNSUPPORTED, "\"WordPiece\""},
      {"\"byte_fallback\": false", "\"byte_fallback\": true", MRL_ERR_UNSUPPORTED, "byte_fallback"},
      {"\"dropout\": null", "\"dropout\": 0.1", MRL_ERR_UNSUPPORTED, "dropout"},
      {"\"end_of_word_suffix\": \"\"", "\"end_of_word_suffix\": \"</w>\"", MRL_ERR_UNSUPPORTED,
       "end_of_word_suffix"},
      {"\"ignore_merges\": false", "\"ignore_merges\": 0", MRL_ERR_INVALID, "not a boolean"},
      {"{\"type\": \"NFC\"}", "{\"type\": \"NFKC\"}", MRL_ERR_UNSUPPORTED,
       "normalizer type \"NFKC\" is not supported (only NFC or none)"},
      {"{\"type\": \"NFC\"}", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}]}",
       MRL_ERR_UNSUPPORTED, "\"Lowercase\""},
      {"\\\\p{N}|", "\\\\p{N}{1,2}|", MRL_ERR_UNSUPPORTED,
       "is not one of GPT-2's, Llama-3's or Qwen2's"},
      {"{\"Regex\":", "{\"String\":", MRL_ERR_UNSUPPORTED, "only {\"Regex\": ...} patterns"},
      {"\"Isolated\"", "\"Removed\"", MRL_ERR_UNSUPPORTED, "behavior \"Isolated\""},
      {"\"type\": \"Sequence\"", "\"type\": \"Metaspace\"", MRL_ERR_UNSUPPORTED,
       "pre_tokenizer \"Metaspace\" is not supported"},
      {"\"trim_offsets\": false, \"use_regex\": false}\n", "\"use_regex\": true}\n",
       MRL_ERR_UNSUPPORTED, "use_regex"},
      {"\"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}\n    ]",
       "\"add_prefix_space\": true}]", MRL_ERR_UNSUPPORTED, "add_prefix_space"},
      {"\"decoder\": {", "\"decoder\": null, \"x\": {", MRL_ERR_UNSUPPORTED,
       "decoder \"null\" is not supported (only ByteLevel)"},
      {"\"lstrip\": false", "\"lstrip\": true", MRL_ERR_UNSUPPORTED,
       "added_tokens[0] (\"<|end|>\"): lstrip is not supported"},
      {"{\"id\": 264, \"content\": \"<|end|>\"", "{\"id\": -3, \"content\": \"<|end|>\"",
       MRL_ERR_INVALID, "added_tokens[0]: \"id\" must be an integer in 0..16777215"},
      {"\"content\": \"<tool>\"", "\"content\": \"\"", MRL_ERR_INVALID,
       "added_tokens[1]: \"content\" must be a non-empty string"},
      {"{\"id\": 265,", "{\"id\": 264,", MRL_ERR_INVALID, "id 264 is already the added token"},
      {"\"Ā\": 0,", "\"Ā\": 1,", MRL_ERR_INVALID, "model.vocab: id 1 is given to"},
      {"\"Ā\": 0,", "\"Ā\": 1.5,", MRL_ERR_INVALID, "model.vocab[\"Ā\"]: the id must be an integer"},
      {"\"Ā\": 0,", "\"Āx\": 0,", MRL_ERR_UNSUPPORTED,
       "model.vocab lacks the token of byte 0x00 (\"Ā\")"},
      {"\"he\": 256,", "\"he\": 256, \"ll\": 300,", MRL_ERR_INVALID, "\"ll\" has two ids"},
      {"\"vocab\": {", "\"vocab\": 5, \"x\": {", MRL_ERR_INVALID, "model.vocab: an object"},
      {"\"merges\": [", "\"merges\": {}, \"y\": [", MRL_ERR_INVALID, "model.merges: an array expected"},
      {"[\"h\", \"e\"]", "\"he\"", MRL_ERR_INVALID,
       "model.merges[0]: expected \"a b\" or [\"a\", \"b\"]"},
      {"[\"h\", \"e\"]", "\"h  e\"", MRL_ERR_INVALID, "model.merges[0]: expected"},
      {"[\"h\", \"e\"]", "[\"h\", \"e\", \"x\"]", MRL_ERR_INVALID, "model.merges[0]: expected"},
      {"[\"h\", \"e\"]", "\"h zz\"", MRL_ERR_INVALID, "model.merges[0]: \"zz\" is not in the vocabulary"},
      {"[\"h\", \"e\"]", "[\"h\", \"l\"]", MRL_ERR_INVALID,
       "model.merges[0]: \"h\" + \"l\" is not in the vocabulary"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const bad_case *c = &cases[i];
    char *text = c->from ? tiny_with(c->from, c->to) : strdup(c->to);
    mrl_tokenizer *t = NULL;
    CHECK_FAILS(e, c->status, c->needle, mrl_tokenizer_load_json(e, text, strlen(text), &t));
    CHECK(t == NULL);
    free(text);
  }
  mrl_tokenizer *t = NULL;
  CHECK_FAILS(e, MRL_ERR_IO, "no/such/tokenizer.json: cannot open: No such file or directory",
              mrl_tokenizer_load(e, "no/such/tokenizer.json", &t));
  CHECK_FAILS(e, MRL_ERR_IO, "not a regular file", mrl_tokenizer_load(e, "tests", &t));
  CHECK_FAILS(e, MRL_ERR_NULL, "path is NULL", mrl_tokenizer_load(e, NULL, &t));
  CHECK_FAILS(e, MRL_ERR_NULL, "out is NULL", mrl_tokenizer_load(e, tiny_path(), NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "json is NULL", mrl_tokenizer_load_json(e, NULL, 3, &t));
  CHECK(mrl_tokenizer_load(NULL, tiny_path(), &t) == MRL_ERR_NULL);
  CHECK(t == NULL);
  /* a truncated file: every prefix fails cleanly */
  for (size_t cut = 0; cut < tiny_len; cut += 97) {
    mrl_engine_clear_error(e);
    CHECK_FAILS(e, MRL_ERR_INVALID, "tokenizer.json: ", mrl_tokenizer_load_json(e, tiny(), cut, &t));
  }
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

/* Every allocation of a load can fail: each failure is NOMEM and keeps no memory. */
static void test_load_under_memory_limits(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = NULL;
  MUST(mrl_tokenizer_load_json(e, tiny(), tiny_len, &t));
  size_t need = mrl_engine_memory_peak(e);
  mrl_tokenizer_free(t);
  t = NULL;
  int failures = 0;
  for (size_t limit = 1; limit < need + 4096; limit += 1 + limit / 64) {
    MUST(mrl_engine_set_memory_limit(e, limit));
    mrl_status st = mrl_tokenizer_load_json(e, tiny(), tiny_len, &t);
    if (st == MRL_OK) {
      mrl_tokenizer_free(t);
      t = NULL;
      continue;
    }
    failures++;
    CHECKF(st == MRL_ERR_NOMEM, "limit %zu: status %d (%s)", limit, st, mrl_engine_last_error(e));
    CHECKF(mrl_engine_memory_used(e) == 0, "limit %zu: %zu bytes kept", limit,
           mrl_engine_memory_used(e));
  }
  CHECK(failures > 20);
  MUST(mrl_engine_set_memory_limit(e, 0));
  mrl_engine_free(e);
}

/* ---- internals ---- */

static void test_utf8_maximal_subparts(void) {
  static const struct {
    const char *s;
    size_t n, len;
    uint32_t cp;
  } cases[] = {
      {"A", 1, 1, 'A'},
      {"\xc3\xa9", 2, 2, 0xE9},
      {"\xe4\xb8\xad", 3, 3, 0x4E2D},
      {"\xf0\x9f\x98\x80", 4, 4, 0x1F600},
      {"\xe4\xb8", 2, 2, MRL_UTF8_INVALID},          /* truncated: one subpart */
      {"\xe4\xb8x", 3, 2, MRL_UTF8_INVALID},
      {"\xf0\x9f\x98", 3, 3, MRL_UTF8_INVALID},
      {"\x80", 1, 1, MRL_UTF8_INVALID},              /* lone continuation */
      {"\xc0\xaf", 2, 1, MRL_UTF8_INVALID},          /* overlong lead */
      {"\xe0\x80\xaf", 3, 1, MRL_UTF8_INVALID},      /* overlong: E0 needs A0..BF */
      {"\xed\xa0\x80", 3, 1, MRL_UTF8_INVALID},      /* surrogate: ED needs 80..9F */
      {"\xf4\x90\x80\x80", 4, 1, MRL_UTF8_INVALID},  /* above U+10FFFF */
      {"\xf5\x80", 2, 1, MRL_UTF8_INVALID},
      {"\xff", 1, 1, MRL_UTF8_INVALID},
      {"\xef\xbf\xbf", 3, 3, 0xFFFF},
      {"\xf4\x8f\xbf\xbf", 4, 4, 0x10FFFF},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint32_t cp = 0;
    size_t len = mrl__utf8_decode((const unsigned char *)cases[i].s, cases[i].n, &cp);
    CHECKF(len == cases[i].len && cp == cases[i].cp, "case %zu: length %zu, cp 0x%X", i, len, cp);
  }
}

/* Splits text with the pattern and checks the pieces (a NULL-terminated list). */
static void check_split(mrl_split_pattern p, const char *text, const char *const *pieces, int line) {
  size_t len = strlen(text), pos = 0;
  int i = 0;
  for (; pos < len && pieces[i]; i++) {
    size_t k = mrl__split_next(p, text, len, pos);
    CHECKF(k == strlen(pieces[i]) && memcmp(text + pos, pieces[i], k) == 0,
           "line %d: piece %d is \"%.*s\", want \"%s\"", line, i, (int)k, text + pos, pieces[i]);
    pos += k;
  }
  CHECKF(pos == len && !pieces[i], "line %d: piece count", line);
}
#define CHECK_SPLIT(p, text, ...) check_split((p), (text), (const char *const[]){__VA_ARGS__, NULL}, __LINE__)

static void test_split_patterns(void) {
  /* (the first three checked against Hugging Face's Rust pre-tokenizer) */
  CHECK_SPLIT(MRL_SPLIT_QWEN2, "Hello world's  \n\n  x", "Hello", " world", "'s", "  \n\n", " ", " x");
  CHECK_SPLIT(MRL_SPLIT_QWEN2, ".\xc2\x85.", ".", "\xc2\x85", ".");          /* U+0085 is \s */
  CHECK_SPLIT(MRL_SPLIT_QWEN2, ".\xef\xbb\xbf.", ".\xef\xbb\xbf.");          /* U+FEFF is not */
  CHECK_SPLIT(MRL_SPLIT_QWEN2, "12345 abc", "1", "2", "3", "4", "5", " abc");
  CHECK_SPLIT(MRL_SPLIT_LLAMA3, "12345 abc", "123", "45", " abc");
  CHECK_SPLIT(MRL_SPLIT_LLAMA3, "I'M you'Re 'x", "I", "'M", " you", "'Re", " '", "x");
  CHECK_SPLIT(MRL_SPLIT_GPT2, "I'M you're", "I", "'", "M", " you", "'re");
  CHECK_SPLIT(MRL_SPLIT_GPT2, "Hello world's  \n\n  x 123abc", "Hello", " world", "'s", "  \n\n ",
              " x", " 123", "abc");
  CHECK_SPLIT(MRL_SPLIT_QWEN2, "a.\n\nb x \t\ny", "a", ".\n\n", "b", " x", " \t\n", "y");
  CHECK_SPLIT(MRL_SPLIT_QWEN2, "$hello !!x", "$hello", " !!", "x");
  CHECK_SPLIT(MRL_SPLIT_QWEN2, "a\xe3\x80\x80\xe3\x80\x80" "b", "a", "\xe3\x80\x80", "\xe3\x80\x80" "b");
  CHECK_SPLIT(MRL_SPLIT_QWEN2, "end   ", "end", "   ");
  /* invalid UTF-8: a maximal subpart is one non-letter character, as U+FFFD would be */
  CHECK_SPLIT(MRL_SPLIT_QWEN2, "ab\xe4\xb8" "cd", "ab", "\xe4\xb8" "cd");
  CHECK_SPLIT(MRL_SPLIT_QWEN2, "ab\xef\xbf\xbd" "cd", "ab", "\xef\xbf\xbd" "cd");
  CHECK_SPLIT(MRL_SPLIT_QWEN2, "x \xff\xfe!\xe2", "x", " \xff\xfe!\xe2");
  CHECK_SPLIT(MRL_SPLIT_GPT2, "x \xff\xfe!", "x", " \xff\xfe!");
  CHECK_SPLIT(MRL_SPLIT_NONE, "all one piece", "all one piece");
  CHECK(mrl__split_pattern_of("\\s+", 3) == -1);
}

static void check_nfc(const char *in, const char *want, int line) {
  mrl_engine *e = new_engine();
  mrl_nfc_scratch s = {0};
  mrl_tok_text out = {0};
  MUST(mrl__nfc_append(e, &s, in, strlen(in), &out));
  CHECKF(out.n == strlen(want) && memcmp(out.v, want, out.n) == 0, "line %d: NFC gave %zu bytes",
         line, out.n);
  CHECKF(!mrl__nfc_quick_check(in, strlen(in)) || strcmp(in, want) == 0,
         "line %d: the quick check said yes to text that NFC changes", line);
  mrl__free(e, s.cps, s.cps_cap * sizeof *s.cps);
  mrl__free(e, out.v, out.cap);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}
#define CHECK_NFC(in, want) check_nfc((in), (want), __LINE__)

static void test_nfc(void) {
  /* expected outputs from Python's unicodedata.normalize("NFC", ...) */
  CHECK_NFC("plain ascii", "plain ascii");
  CHECK_NFC("e\xcc\x81", "\xc3\xa9");
  CHECK_NFC("\xc3\xa9\xcc\xa7", "\xc8\xa9\xcc\x81");           /* é + cedilla: reorder, recompose */
  CHECK_NFC("\xe2\x84\xab", "\xc3\x85");                       /* ANGSTROM SIGN, a singleton */
  CHECK_NFC("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"); /* Hangul L V T */
  CHECK_NFC("\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81");       /* Hangul LV + T */
  CHECK_NFC("a\xcc\x81\xcc\xa8", "\xc4\x85\xcc\x81");
  CHECK_NFC("\xcd\x84", "\xcc\x88\xcc\x81");                   /* U+0344 expands */
  CHECK_NFC("\xf0\x9d\x85\xa0", "\xf0\x9d\x85\x98\xf0\x9d\x85\xa5\xf0\x9d\x85\xae");
  CHECK_NFC("a\xcc\x81\xcc\x96\xcc\x81\xcc\x96\xcc\x81\xcc\x96",
            "\xc3\xa1\xcc\x96\xcc\x96\xcc\x96\xcc\x81\xcc\x81");
  CHECK_NFC("e\xff\xcc\x81", "e\xff\xcc\x81");                 /* an invalid byte blocks */
  CHECK_NFC("\xcc\x81" "e", "\xcc\x81" "e");                   /* a leading mark stays */
  CHECK(mrl__nfc_quick_check("caf\xc3\xa9", 5));
  CHECK(!mrl__nfc_quick_check("cafe\xcc\x81", 6));
  CHECK(!mrl__nfc_quick_check("\xe2\x84\xab", 3));
}

static uint64_t rng_state = 42;
static unsigned next_rand(unsigned n) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (unsigned)(rng_state >> 33) % n;
}

/* The heap-based merge gives what the naive loop gives, on random words. */
static void test_bpe_heap_matches_naive(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = load_text(e, tiny());
  mrl__tokenizer_set_cache(t, false);
  static const char alphabet[] = "hello the\xc3\xa9";
  int32_t naive[256];
  for (int trial = 0; trial < 2000; trial++) {
    char word[200];
    size_t len = 2 + next_rand(sizeof word - 2);
    for (size_t i = 0; i < len; i++) word[i] = alphabet[next_rand(sizeof alphabet - 1)];
    t->out.n = 0;
    MUST(mrl__bpe_piece(t, word, len));
    size_t n = len;
    for (size_t i = 0; i < len; i++) naive[i] = t->byte_id[(unsigned char)word[i]];
    mrl__bpe_merge_naive(t, naive, &n);
    bool same = n == t->out.n && memcmp(naive, t->out.v, n * sizeof *naive) == 0;
    CHECKF(same, "trial %d: \"%.*s\": heap %zu ids, naive %zu", trial, (int)len, word, t->out.n, n);
    if (!same) break;
  }
  mrl_tokenizer_free(t);
  mrl_engine_free(e);
}

/* With or without the word cache, the same ids; random bytes round-trip exactly (no
 * normalizer), invalid UTF-8 included. */
static void test_cache_and_random_bytes(void) {
  mrl_engine *e = new_engine();
  char *raw = tiny_with("\"normalizer\": {\"type\": \"NFC\"}", "\"normalizer\": null");
  mrl_tokenizer *t = load_text(e, raw);
  static char text[8192];
  static int32_t cached[CAP];
  for (int trial = 0; trial < 200; trial++) {
    size_t len = next_rand(sizeof text);
    for (size_t i = 0; i < len; i++) {
      unsigned r = next_rand(4);
      text[i] = r == 0 ? (char)next_rand(256) : r == 1 ? ' ' : "helot\n'"[next_rand(7)];
    }
    size_t n1 = 0, n2 = 0;
    mrl__tokenizer_set_cache(t, true);
    MUST(mrl_tokenizer_encode(t, text, len, 0, cached, CAP, &n1));
    MUST(mrl_tokenizer_encode(t, text, len, 0, cached, CAP, &n1)); /* now from the cache */
    mrl__tokenizer_set_cache(t, false);
    MUST(mrl_tokenizer_encode(t, text, len, 0, ids_buf, CAP, &n2));
    CHECKF(n1 == n2 && memcmp(cached, ids_buf, n1 * sizeof *cached) == 0, "trial %d", trial);
    check_round_trip(t, text, len, MRL_ENCODE_SPECIAL, NULL, 0, __LINE__);
  }
  mrl_tokenizer_free(t);
  free(raw);
  mrl_engine_free(e);
}

/* Long pieces, long runs of white space and long runs of marks encode (1 MiB each; the time is
 * reported, not asserted: a quadratic path shows in the note). */
static void test_long_inputs(void) {
  mrl_engine *e = new_engine();
  mrl_tokenizer *t = load_text(e, tiny());
  enum { N = 1 << 20 };
  char *text = malloc(N);
  int32_t *ids = malloc(3 * (size_t)N * sizeof *ids);
  const char *fill[] = {" ", "l", "\xcc\x81\xcc\x96", "he"};
  for (int k = 0; k < 4; k++) {
    size_t w = strlen(fill[k]), len = 0;
    text[len++] = 'a';
    while (len + w <= N) {
      memcpy(text + len, fill[k], w);
      len += w;
    }
    double t0 = mrl_clock();
    size_t count = 0;
    MUST(mrl_tokenizer_encode(t, text, len, 0, ids, 3 * (size_t)N, &count));
    double dt = mrl_clock() - t0;
    check_note("fill \"%s\": %zu bytes -> %zu ids in %.3f s", k == 2 ? "marks" : fill[k], len,
               count, dt);
    CHECK(count > 0 && count <= 3 * len);
  }
  free(text);
  free(ids);
  mrl_tokenizer_free(t);
  mrl_engine_free(e);
}

static const test_case tests[] = {
    {"bytes_vocabulary", test_bytes_vocabulary},
    {"bytes_encode_decode", test_bytes_encode_decode},
    {"output_buffers", test_output_buffers},
    {"errors_of_calls", test_errors_of_calls},
    {"chat_roles", test_chat_roles},
    {"chat_chatml_llama3", test_chat_chatml_llama3},
    {"tiny_merges_both_formats", test_tiny_merges_both_formats},
    {"tiny_added_tokens", test_tiny_added_tokens},
    {"tiny_ignore_merges_and_gpt2", test_tiny_ignore_merges_and_gpt2},
    {"load_errors", test_load_errors},
    {"load_under_memory_limits", test_load_under_memory_limits},
    {"utf8_maximal_subparts", test_utf8_maximal_subparts},
    {"split_patterns", test_split_patterns},
    {"nfc", test_nfc},
    {"bpe_heap_matches_naive", test_bpe_heap_matches_naive},
    {"cache_and_random_bytes", test_cache_and_random_bytes},
    {"long_inputs", test_long_inputs},
    {NULL, NULL}};

int main(int argc, char **argv) {
  int rc = check_main(argc, argv, tests);
  free(tiny_text);
  return rc;
}
