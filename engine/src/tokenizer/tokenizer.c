/* tokenizer.c - the tokenizer API (moonrl.h): the byte tokenizer, loading byte-level BPE from a
 * Hugging Face tokenizer.json, the encoding pipeline (added tokens, NFC, split, BPE), decoding,
 * token lookups and the chat templates. */
#include "json.h"
#include "file.h"
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_JSON_FILE = 256 << 20 /* Qwen3's tokenizer.json is 11 MB */, SHOWN = 80 };

static const char *const BYTE_SPECIALS[8] = {"<|bos|>",  "<|eos|>",       "<|pad|>",
                                              "<|system|>", "<|user|>", "<|assistant|>",
                                              "<|tool|>", "<|end|>"};

/* ---- lifetime ---- */

static mrl_tokenizer *tokenizer_alloc(mrl_engine *e) {
  mrl_tokenizer *t = mrl__alloc(e, sizeof *t);
  if (!t) return NULL;
  memset(t, 0, sizeof *t);
  t->engine = e;
  mrl__engine_retain(e);
  return t;
}

void mrl_tokenizer_free(mrl_tokenizer *t) {
  if (!t) return;
  mrl_engine *e = t->engine;
  mrl__bpe_free(t);
  mrl__free(e, t->entries, (size_t)t->vocab_size * sizeof *t->entries);
  mrl__free(e, t->pool, t->pool_cap);
  mrl__free(e, t->raw_added.ids, t->raw_added.n * sizeof(int32_t));
  mrl__free(e, t->norm_added.ids, t->norm_added.n * sizeof(int32_t));
  mrl__free(e, t->out.v, t->out.cap * sizeof *t->out.v);
  mrl__free(e, t->norm.v, t->norm.cap);
  mrl__free(e, t->spell.v, t->spell.cap);
  mrl__free(e, t->chat.v, t->chat.cap);
  mrl__free(e, t->nfc_scratch.cps, t->nfc_scratch.cps_cap * sizeof(uint32_t));
  mrl__free(e, t, sizeof *t);
  mrl__engine_release(e);
}

int32_t mrl_tokenizer_vocab_size(const mrl_tokenizer *t) { return t ? t->vocab_size : -1; }

/* ---- building blocks shared by both kinds ---- */

/* Copies s[0..n) and a NUL into the pool; returns its offset. The pool was sized beforehand. */
static uint32_t pool_put(mrl_tokenizer *t, const char *s, size_t n) {
  uint32_t off = (uint32_t)t->pool_used;
  memcpy(t->pool + off, s, n);
  t->pool[off + n] = '\0';
  t->pool_used += n + 1;
  return off;
}

static mrl_status alloc_tables(mrl_tokenizer *t, const char *fn, int32_t vocab_size,
                               size_t pool_bytes) {
  mrl_engine *e = t->engine;
  t->entries = mrl__alloc(e, (size_t)vocab_size * sizeof *t->entries);
  if (!t->entries) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory for %d tokens", vocab_size);
  memset(t->entries, 0, (size_t)vocab_size * sizeof *t->entries);
  t->vocab_size = vocab_size;
  if (pool_bytes > UINT32_MAX)
    return mrl__fail(e, MRL_ERR_OVERFLOW, fn, "the token texts exceed 4 GiB");
  t->pool = mrl__alloc(e, pool_bytes);
  if (!t->pool) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory for the token texts");
  t->pool_cap = pool_bytes;
  return MRL_OK;
}

typedef struct {
  uint32_t first, len;
  int32_t id;
} added_key;

static int added_key_cmp(const void *pa, const void *pb) {
  const added_key *a = pa, *b = pb;
  if (a->first != b->first) return a->first < b->first ? -1 : 1;
  if (a->len != b->len) return a->len > b->len ? -1 : 1; /* longest first */
  return (a->id > b->id) - (a->id < b->id);
}

/* Builds the matcher of the added tokens whose "normalized" flag equals `want`. */
static mrl_status build_added_set(mrl_tokenizer *t, const char *fn, mrl_added_set *set,
                                  const bool *normalized, bool want) {
  mrl_engine *e = t->engine;
  size_t n = 0;
  for (int32_t id = 0; id < t->vocab_size; id++)
    n += (t->entries[id].flags & MRL_TOK_ADDED) && normalized[id] == want;
  memset(set->start, 0, sizeof set->start);
  if (n == 0) return MRL_OK;
  added_key *keys = mrl__alloc(e, n * sizeof *keys);
  set->ids = mrl__alloc(e, n * sizeof *set->ids);
  if (!keys || !set->ids) {
    mrl__free(e, keys, n * sizeof *keys);
    mrl__free(e, set->ids, n * sizeof *set->ids);
    set->ids = NULL;
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory for the added tokens");
  }
  set->n = n;
  size_t k = 0;
  for (int32_t id = 0; id < t->vocab_size; id++) {
    const mrl_tok_entry *en = &t->entries[id];
    if (!(en->flags & MRL_TOK_ADDED) || normalized[id] != want) continue;
    keys[k++] = (added_key){(unsigned char)t->pool[en->spell_off], en->spell_len, id};
  }
  qsort(keys, n, sizeof *keys, added_key_cmp);
  for (size_t i = 0; i < n; i++) {
    set->ids[i] = keys[i].id;
    set->start[keys[i].first + 1]++;
  }
  for (int b = 0; b < 256; b++) set->start[b + 1] += set->start[b];
  for (int b = 0; b < 256; b++) {
    uint32_t lo = set->start[b], hi = set->start[b + 1];
    if (lo == hi) continue;
    const mrl_tok_entry *first = &t->entries[set->ids[lo]];
    uint32_t common = first->spell_len;
    for (uint32_t k = lo + 1; k < hi; k++) {
      const mrl_tok_entry *en = &t->entries[set->ids[k]];
      uint32_t c = 0;
      while (c < common && c < en->spell_len &&
             t->pool[first->spell_off + c] == t->pool[en->spell_off + c])
        c++;
      common = c;
    }
    set->prefix[b] = common > UINT16_MAX ? UINT16_MAX : (uint16_t)common;
  }
  mrl__free(e, keys, n * sizeof *keys);
  return MRL_OK;
}

/* The first added token of `set` in text[from..len): its position and id; false when none.
 * Special tokens count only when `special`. */
static bool added_find(const mrl_tokenizer *t, const mrl_added_set *set, const char *text,
                       size_t len, size_t from, bool special, size_t *at, int32_t *id) {
  if (!set->n) return false;
  const unsigned char *u = (const unsigned char *)text;
  for (size_t i = from; i < len; i++) {
    uint32_t lo = set->start[u[i]], hi = set->start[u[i] + 1];
    if (lo == hi) continue;
    /* text that does not even start like the bucket's tokens (a "<div" against "<|...|>") is
     * passed over with one comparison */
    const mrl_tok_entry *first = &t->entries[set->ids[lo]];
    if (set->prefix[u[i]] > len - i ||
        memcmp(t->pool + first->spell_off, text + i, set->prefix[u[i]]) != 0)
      continue;
    for (uint32_t k = lo; k < hi; k++) {
      const mrl_tok_entry *en = &t->entries[set->ids[k]];
      if (!special && (en->flags & MRL_TOK_SPECIAL)) continue;
      if (en->spell_len <= len - i && memcmp(t->pool + en->spell_off, text + i, en->spell_len) == 0) {
        *at = i;
        *id = set->ids[k];
        return true;
      }
    }
  }
  return false;
}

/* The added token spelled s[0..n) in `set`, or -1. */
static int32_t added_lookup(const mrl_tokenizer *t, const mrl_added_set *set, const char *s,
                            size_t n) {
  if (!set->n || n == 0) return -1;
  unsigned char b = (unsigned char)s[0];
  for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
    const mrl_tok_entry *en = &t->entries[set->ids[k]];
    if (en->spell_len == n && memcmp(t->pool + en->spell_off, s, n) == 0) return set->ids[k];
  }
  return -1;
}

/* ---- the byte tokenizer ---- */

mrl_status mrl_tokenizer_bytes(mrl_engine *e, mrl_tokenizer **out) {
  const char *fn = "mrl_tokenizer_bytes";
  if (!e) return MRL_ERR_NULL;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  mrl_tokenizer *t = tokenizer_alloc(e);
  if (!t) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  t->is_bytes = true;
  size_t pool = 256 * 2;
  for (int i = 0; i < 8; i++) pool += strlen(BYTE_SPECIALS[i]) + 1;
  bool normalized[MRL_BYTE_VOCAB] = {false};
  mrl_status st = alloc_tables(t, fn, MRL_BYTE_VOCAB, pool);
  for (int b = 0; !st && b < 256; b++) {
    char c = (char)b;
    uint32_t off = pool_put(t, &c, 1);
    t->entries[b] = (mrl_tok_entry){off, 1, off, 1, MRL_TOK_IN_VOCAB};
    t->byte_id[b] = b;
  }
  for (int i = 0; !st && i < 8; i++) {
    uint32_t len = (uint32_t)strlen(BYTE_SPECIALS[i]);
    uint32_t off = pool_put(t, BYTE_SPECIALS[i], len);
    t->entries[256 + i] = (mrl_tok_entry){off, len, off, len, MRL_TOK_ADDED | MRL_TOK_SPECIAL};
  }
  if (!st) st = mrl__spell_map_build(t, fn, "byte tokenizer");
  if (!st) st = build_added_set(t, fn, &t->raw_added, normalized, false);
  if (st) {
    mrl_tokenizer_free(t);
    return st;
  }
  *out = t;
  return MRL_OK;
}

/* ---- loading tokenizer.json ---- */

typedef struct {
  mrl_engine *e;
  const char *fn, *what; /* the public function and the document's name, for messages */
} loader;

static mrl_status load_fail(const loader *ld, mrl_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static mrl_status load_fail(const loader *ld, mrl_status st, const char *fmt, ...) {
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  return mrl__fail(ld->e, st, ld->fn, "%s: %s", ld->what, detail);
}

static bool is_string(const mrl_json *v) { return v && v->type == MRL_JSON_STRING; }
static bool is_null(const mrl_json *v) { return !v || v->type == MRL_JSON_NULL; }

static bool string_is(const mrl_json *v, const char *s) {
  return is_string(v) && v->length == strlen(s) && memcmp(v->string, s, v->length) == 0;
}

/* A boolean field: *out gets it (default when absent or null); false for another type. */
static bool get_bool(const mrl_json *obj, const char *key, bool dflt, bool *out) {
  const mrl_json *v = mrl__json_get(obj, key);
  if (is_null(v)) {
    *out = dflt;
    return true;
  }
  if (v->type != MRL_JSON_TRUE && v->type != MRL_JSON_FALSE) return false;
  *out = v->type == MRL_JSON_TRUE;
  return true;
}

static const char *type_name(const mrl_json *obj) {
  const mrl_json *ty = mrl__json_get(obj, "type");
  return is_string(ty) ? ty->string : "(no type)";
}

static mrl_status check_normalizer(const loader *ld, const mrl_json *n, bool *nfc) {
  *nfc = false;
  if (is_null(n)) return MRL_OK;
  if (n->type != MRL_JSON_OBJECT) return load_fail(ld, MRL_ERR_INVALID, "normalizer: an object expected");
  if (string_is(mrl__json_get(n, "type"), "NFC")) {
    *nfc = true;
    return MRL_OK;
  }
  if (string_is(mrl__json_get(n, "type"), "Sequence")) {
    const mrl_json *list = mrl__json_get(n, "normalizers");
    if (!list || list->type != MRL_JSON_ARRAY)
      return load_fail(ld, MRL_ERR_INVALID, "normalizer: a Sequence needs a \"normalizers\" array");
    for (size_t i = 0; i < list->length; i++) {
      if (!string_is(mrl__json_get(&list->items[i], "type"), "NFC"))
        return load_fail(ld, MRL_ERR_UNSUPPORTED,
                         "normalizer type \"%.*s\" is not supported (only NFC or none)", SHOWN,
                         type_name(&list->items[i]));
      *nfc = true;
    }
    return MRL_OK;
  }
  return load_fail(ld, MRL_ERR_UNSUPPORTED,
                   "normalizer type \"%.*s\" is not supported (only NFC or none)", SHOWN,
                   type_name(n));
}

/* A ByteLevel pre-tokenizer; *use_regex gets its use_regex flag. */
static mrl_status check_byte_level(const loader *ld, const mrl_json *p, bool *use_regex) {
  bool prefix;
  if (!get_bool(p, "add_prefix_space", false, &prefix) || !get_bool(p, "use_regex", true, use_regex))
    return load_fail(ld, MRL_ERR_INVALID, "pre_tokenizer ByteLevel: a flag is not a boolean");
  if (prefix)
    return load_fail(ld, MRL_ERR_UNSUPPORTED,
                     "pre_tokenizer ByteLevel with add_prefix_space is not supported");
  return MRL_OK;
}

static mrl_status check_split(const loader *ld, const mrl_json *p, mrl_split_pattern *pattern) {
  const mrl_json *pat = mrl__json_get(p, "pattern");
  const mrl_json *regex = mrl__json_get(pat, "Regex");
  bool invert;
  if (!is_string(regex))
    return load_fail(ld, MRL_ERR_UNSUPPORTED,
                     "pre_tokenizer Split: only {\"Regex\": ...} patterns are supported");
  int known = mrl__split_pattern_of(regex->string, regex->length);
  if (known < 0)
    return load_fail(ld, MRL_ERR_UNSUPPORTED,
                     "pre_tokenizer Split: the pattern \"%.*s\" is not one of GPT-2's, "
                     "Llama-3's or Qwen2's", SHOWN, regex->string);
  if (!string_is(mrl__json_get(p, "behavior"), "Isolated") || !get_bool(p, "invert", false, &invert) ||
      invert)
    return load_fail(ld, MRL_ERR_UNSUPPORTED,
                     "pre_tokenizer Split: only behavior \"Isolated\" without invert is supported");
  *pattern = (mrl_split_pattern)known;
  return MRL_OK;
}

/* Accepted: Sequence[Split(known regex), ByteLevel(use_regex false)], or ByteLevel alone (its
 * regex is GPT-2's unless use_regex is false). */
static mrl_status check_pre_tokenizer(const loader *ld, const mrl_json *p,
                                      mrl_split_pattern *pattern) {
  bool use_regex;
  mrl_status st;
  if (is_null(p) || p->type != MRL_JSON_OBJECT)
    return load_fail(ld, MRL_ERR_UNSUPPORTED, "byte-level BPE needs a ByteLevel pre_tokenizer");
  if (string_is(mrl__json_get(p, "type"), "ByteLevel")) {
    if ((st = check_byte_level(ld, p, &use_regex))) return st;
    *pattern = use_regex ? MRL_SPLIT_GPT2 : MRL_SPLIT_NONE;
    return MRL_OK;
  }
  const mrl_json *list = mrl__json_get(p, "pretokenizers");
  if (string_is(mrl__json_get(p, "type"), "Sequence") && list && list->type == MRL_JSON_ARRAY &&
      list->length == 2 && string_is(mrl__json_get(&list->items[0], "type"), "Split") &&
      string_is(mrl__json_get(&list->items[1], "type"), "ByteLevel")) {
    if ((st = check_split(ld, &list->items[0], pattern)) ||
        (st = check_byte_level(ld, &list->items[1], &use_regex)))
      return st;
    if (use_regex)
      return load_fail(ld, MRL_ERR_UNSUPPORTED,
                       "pre_tokenizer: a Split followed by ByteLevel with use_regex is not supported");
    return MRL_OK;
  }
  return load_fail(ld, MRL_ERR_UNSUPPORTED,
                   "pre_tokenizer \"%.*s\" is not supported (only Split + ByteLevel, or ByteLevel)",
                   SHOWN, type_name(p));
}

static mrl_status check_model(const loader *ld, const mrl_json *m, bool *ignore_merges) {
  if (!m || m->type != MRL_JSON_OBJECT) return load_fail(ld, MRL_ERR_INVALID, "no \"model\" object");
  if (!string_is(mrl__json_get(m, "type"), "BPE"))
    return load_fail(ld, MRL_ERR_UNSUPPORTED,
                     "model type \"%.*s\" is not supported (only byte-level BPE)", SHOWN,
                     type_name(m));
  bool byte_fallback;
  if (!get_bool(m, "byte_fallback", false, &byte_fallback) ||
      !get_bool(m, "ignore_merges", false, ignore_merges))
    return load_fail(ld, MRL_ERR_INVALID, "model: a flag is not a boolean");
  if (byte_fallback)
    return load_fail(ld, MRL_ERR_UNSUPPORTED, "model: byte_fallback (SentencePiece-style BPE) is "
                     "not supported");
  const mrl_json *dropout = mrl__json_get(m, "dropout");
  if (!is_null(dropout) && !(dropout->type == MRL_JSON_NUMBER && dropout->number == 0))
    return load_fail(ld, MRL_ERR_UNSUPPORTED, "model: BPE dropout is not supported");
  static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const mrl_json *v = mrl__json_get(m, affixes[i]);
    if (!is_null(v) && !(is_string(v) && v->length == 0))
      return load_fail(ld, MRL_ERR_UNSUPPORTED, "model: %s is not supported", affixes[i]);
  }
  return MRL_OK;
}

static mrl_status check_decoder(const loader *ld, const mrl_json *d) {
  if (!is_null(d) && d->type == MRL_JSON_OBJECT && string_is(mrl__json_get(d, "type"), "ByteLevel"))
    return MRL_OK;
  return load_fail(ld, MRL_ERR_UNSUPPORTED,
                   "decoder \"%.*s\" is not supported (only ByteLevel)", SHOWN,
                   is_null(d) ? "null" : type_name(d));
}

/* An id field: an integer in 0..MRL_TOK_MAX_ID - 1. */
static bool get_id(const mrl_json *v, int32_t *id) {
  if (!v || v->type != MRL_JSON_NUMBER || !v->is_integer || v->integer < 0 ||
      v->integer >= MRL_TOK_MAX_ID)
    return false;
  *id = (int32_t)v->integer;
  return true;
}

/* Checks each added token; *max_id covers their ids and *bytes their texts. */
static mrl_status check_added(const loader *ld, const mrl_json *added, int32_t *max_id,
                              size_t *bytes) {
  if (is_null(added)) return MRL_OK;
  if (added->type != MRL_JSON_ARRAY)
    return load_fail(ld, MRL_ERR_INVALID, "added_tokens: an array expected");
  for (size_t i = 0; i < added->length; i++) {
    const mrl_json *a = &added->items[i];
    const mrl_json *content = mrl__json_get(a, "content");
    int32_t id;
    bool flag, special, normalized;
    if (!get_id(mrl__json_get(a, "id"), &id))
      return load_fail(ld, MRL_ERR_INVALID, "added_tokens[%zu]: \"id\" must be an integer in "
                       "0..%d", i, MRL_TOK_MAX_ID - 1);
    if (!is_string(content) || content->length == 0)
      return load_fail(ld, MRL_ERR_INVALID, "added_tokens[%zu]: \"content\" must be a non-empty "
                       "string", i);
    if (!get_bool(a, "special", false, &special) || !get_bool(a, "normalized", !special, &normalized))
      return load_fail(ld, MRL_ERR_INVALID, "added_tokens[%zu]: a flag is not a boolean", i);
    static const char *const unsupported[] = {"lstrip", "rstrip", "single_word"};
    for (int k = 0; k < 3; k++) {
      if (!get_bool(a, unsupported[k], false, &flag))
        return load_fail(ld, MRL_ERR_INVALID, "added_tokens[%zu]: a flag is not a boolean", i);
      if (flag)
        return load_fail(ld, MRL_ERR_UNSUPPORTED, "added_tokens[%zu] (\"%.*s\"): %s is not "
                         "supported", i, SHOWN, content->string, unsupported[k]);
    }
    if (id > *max_id) *max_id = id;
    *bytes += content->length + 1;
  }
  return MRL_OK;
}

/* The bytes a vocabulary spelling stands for: each character mapped back through the
 * byte-level alphabet, or the spelling's own bytes when a character is not in it (what Hugging
 * Face's ByteLevel decoder does). Writes into dst (room for n bytes); returns the length. */
static size_t spelling_bytes(const int16_t *unicode_to_byte, const char *s, size_t n, char *dst) {
  size_t out = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += mrl__utf8_decode((const unsigned char *)s + i, n - i, &cp);
    if (cp >= 0x144 || unicode_to_byte[cp] < 0) {
      memcpy(dst, s, n);
      return n;
    }
    dst[out++] = (char)unicode_to_byte[cp];
  }
  return out;
}

static mrl_status fill_vocab(const loader *ld, mrl_tokenizer *t, const mrl_json *vocab) {
  int16_t unicode_to_byte[0x144];
  memset(unicode_to_byte, 0xFF, sizeof unicode_to_byte);
  for (unsigned b = 0; b < 256; b++) unicode_to_byte[mrl__byte_to_unicode(b)] = (int16_t)b;
  for (size_t i = 0; i < vocab->length; i++) {
    int32_t id = 0;
    get_id(&vocab->items[i], &id); /* checked before */
    mrl_tok_entry *en = &t->entries[id];
    if (en->flags)
      return load_fail(ld, MRL_ERR_INVALID, "model.vocab: id %d is given to \"%.*s\" and to "
                       "\"%.*s\"", id, SHOWN, t->pool + en->spell_off, SHOWN, vocab->keys[i]);
    size_t n = vocab->key_lengths[i];
    en->spell_off = pool_put(t, vocab->keys[i], n);
    en->spell_len = (uint32_t)n;
    char *dst = t->pool + t->pool_used;
    size_t m = spelling_bytes(unicode_to_byte, vocab->keys[i], n, dst);
    dst[m] = '\0';
    en->bytes_off = (uint32_t)t->pool_used;
    en->bytes_len = (uint32_t)m;
    t->pool_used += m + 1;
    en->flags = MRL_TOK_IN_VOCAB;
  }
  return MRL_OK;
}

/* The single-byte tokens every byte-level vocabulary has. */
static mrl_status find_byte_tokens(const loader *ld, mrl_tokenizer *t) {
  for (unsigned b = 0; b < 256; b++) {
    char spell[2];
    uint32_t cp = mrl__byte_to_unicode(b);
    size_t n = cp < 0x80 ? 1 : 2; /* every code point of the alphabet is below U+0800 */
    if (n == 1) {
      spell[0] = (char)cp;
    } else {
      spell[0] = (char)(0xC0 | (cp >> 6));
      spell[1] = (char)(0x80 | (cp & 0x3F));
    }
    t->byte_id[b] = mrl__spell_lookup(t, spell, n);
    if (t->byte_id[b] < 0)
      return load_fail(ld, MRL_ERR_UNSUPPORTED, "model.vocab lacks the token of byte 0x%02X "
                       "(\"%.*s\"), which byte-level BPE needs", b, (int)n, spell);
  }
  return MRL_OK;
}

static mrl_status fill_added(const loader *ld, mrl_tokenizer *t, const mrl_json *added,
                             bool *normalized) {
  if (is_null(added)) return MRL_OK;
  for (size_t i = 0; i < added->length; i++) {
    const mrl_json *a = &added->items[i];
    const mrl_json *content = mrl__json_get(a, "content");
    int32_t id = 0;
    bool special = false;
    get_id(mrl__json_get(a, "id"), &id); /* checked before */
    get_bool(a, "special", false, &special);
    get_bool(a, "normalized", !special, &normalized[id]);
    mrl_tok_entry *en = &t->entries[id];
    if (en->flags & MRL_TOK_ADDED)
      return load_fail(ld, MRL_ERR_INVALID, "added_tokens[%zu]: id %d is already the added "
                       "token \"%.*s\"", i, id, SHOWN, t->pool + en->spell_off);
    /* the same text as the vocabulary's token at this id (GPT-2's <|endoftext|>) stays a
     * vocabulary token too; a different text replaces it */
    bool same = (en->flags & MRL_TOK_IN_VOCAB) && en->spell_len == content->length &&
                memcmp(t->pool + en->spell_off, content->string, content->length) == 0;
    uint32_t off = pool_put(t, content->string, content->length);
    en->spell_off = en->bytes_off = off;
    en->spell_len = en->bytes_len = (uint32_t)content->length;
    en->flags = (uint8_t)(MRL_TOK_ADDED | (special ? MRL_TOK_SPECIAL : 0) |
                          (same ? MRL_TOK_IN_VOCAB : 0));
  }
  return MRL_OK;
}

/* A merge "a b" or ["a", "b"]: the two texts. */
static bool merge_parts(const mrl_json *m, const char **a, size_t *na, const char **b,
                        size_t *nb) {
  if (is_string(m)) {
    const char *sp = memchr(m->string, ' ', m->length);
    if (!sp || sp == m->string || memchr(sp + 1, ' ', m->length - (size_t)(sp + 1 - m->string)) ||
        sp + 1 == m->string + m->length)
      return false;
    *a = m->string;
    *na = (size_t)(sp - m->string);
    *b = sp + 1;
    *nb = m->length - *na - 1;
    return true;
  }
  if (m->type == MRL_JSON_ARRAY && m->length == 2 && is_string(&m->items[0]) &&
      is_string(&m->items[1]) && m->items[0].length && m->items[1].length) {
    *a = m->items[0].string;
    *na = m->items[0].length;
    *b = m->items[1].string;
    *nb = m->items[1].length;
    return true;
  }
  return false;
}

static mrl_status fill_merges(const loader *ld, mrl_tokenizer *t, const mrl_json *merges) {
  if (merges->length > INT32_MAX)
    return load_fail(ld, MRL_ERR_INVALID, "model.merges: too many merges");
  mrl_status st = mrl__merges_init(t, ld->fn, merges->length);
  if (st) return st;
  mrl_tok_text *buf = &t->spell; /* scratch for a + b */
  for (size_t i = 0; i < merges->length; i++) {
    const char *a, *b;
    size_t na, nb;
    if (!merge_parts(&merges->items[i], &a, &na, &b, &nb))
      return load_fail(ld, MRL_ERR_INVALID, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", i);
    int32_t ia = mrl__spell_lookup(t, a, na), ib = mrl__spell_lookup(t, b, nb);
    if (ia < 0 || ib < 0)
      return load_fail(ld, MRL_ERR_INVALID, "model.merges[%zu]: \"%.*s\" is not in the vocabulary",
                       i, (int)(ia < 0 ? (na > SHOWN ? SHOWN : na) : (nb > SHOWN ? SHOWN : nb)),
                       ia < 0 ? a : b);
    if (!mrl__tok_reserve(t->engine, (void **)&buf->v, &buf->cap, na + nb, 1, 0))
      return mrl__fail(t->engine, MRL_ERR_NOMEM, ld->fn, "out of memory");
    memcpy(buf->v, a, na);
    memcpy(buf->v + na, b, nb);
    int32_t id = mrl__spell_lookup(t, buf->v, na + nb);
    if (id < 0)
      return load_fail(ld, MRL_ERR_INVALID, "model.merges[%zu]: \"%.*s\" + \"%.*s\" is not in "
                       "the vocabulary", i, (int)(na > SHOWN ? SHOWN : na), a,
                       (int)(nb > SHOWN ? SHOWN : nb), b);
    mrl__merges_put(t, ia, ib, (int32_t)i, id);
  }
  return MRL_OK;
}

static mrl_status load_document(const loader *ld, const mrl_json *root, mrl_tokenizer *t) {
  mrl_status st;
  if (root->type != MRL_JSON_OBJECT)
    return load_fail(ld, MRL_ERR_INVALID, "the top level is not an object");
  const mrl_json *model = mrl__json_get(root, "model");
  const mrl_json *added = mrl__json_get(root, "added_tokens");
  if ((st = check_model(ld, model, &t->ignore_merges)) ||
      (st = check_normalizer(ld, mrl__json_get(root, "normalizer"), &t->nfc)) ||
      (st = check_pre_tokenizer(ld, mrl__json_get(root, "pre_tokenizer"), &t->split)) ||
      (st = check_decoder(ld, mrl__json_get(root, "decoder"))))
    return st;
  const mrl_json *vocab = mrl__json_get(model, "vocab");
  const mrl_json *merges = mrl__json_get(model, "merges");
  if (!vocab || vocab->type != MRL_JSON_OBJECT)
    return load_fail(ld, MRL_ERR_INVALID, "model.vocab: an object of token -> id expected");
  if (!merges || merges->type != MRL_JSON_ARRAY)
    return load_fail(ld, MRL_ERR_INVALID, "model.merges: an array expected");
  int32_t max_id = -1;
  size_t pool = 0;
  for (size_t i = 0; i < vocab->length; i++) {
    int32_t id;
    if (!get_id(&vocab->items[i], &id))
      return load_fail(ld, MRL_ERR_INVALID, "model.vocab[\"%.*s\"]: the id must be an integer "
                       "in 0..%d", SHOWN, vocab->keys[i], MRL_TOK_MAX_ID - 1);
    if (vocab->key_lengths[i] == 0)
      return load_fail(ld, MRL_ERR_INVALID, "model.vocab: a token is the empty string");
    if (id > max_id) max_id = id;
    pool += 2 * (vocab->key_lengths[i] + 1);
  }
  if ((st = check_added(ld, added, &max_id, &pool))) return st;
  if (max_id < 0) return load_fail(ld, MRL_ERR_INVALID, "model.vocab is empty");
  if ((st = alloc_tables(t, ld->fn, max_id + 1, pool))) return st;
  bool *normalized = mrl__alloc(ld->e, (size_t)t->vocab_size);
  if (!normalized) return mrl__fail(ld->e, MRL_ERR_NOMEM, ld->fn, "out of memory");
  memset(normalized, 0, (size_t)t->vocab_size);
  if (!(st = fill_vocab(ld, t, vocab)) && !(st = mrl__spell_map_build(t, ld->fn, ld->what)) &&
      !(st = find_byte_tokens(ld, t)) &&
      !(st = fill_added(ld, t, added, normalized)) &&
      !(st = build_added_set(t, ld->fn, &t->raw_added, normalized, false)) &&
      !(st = build_added_set(t, ld->fn, &t->norm_added, normalized, true)))
    st = fill_merges(ld, t, merges);
  mrl__free(ld->e, normalized, (size_t)t->vocab_size);
  if (!st && mrl__bpe_cache_init(t))
    st = mrl__fail(ld->e, MRL_ERR_NOMEM, ld->fn, "out of memory for the word cache");
  return st;
}

static mrl_status load_text(mrl_engine *e, const char *fn, const char *what, const char *json,
                            size_t len, mrl_tokenizer **out) {
  mrl_json_doc *doc = NULL;
  mrl_status st = mrl__json_parse(e, fn, what, json, len, &doc);
  if (st) return st;
  mrl_tokenizer *t = tokenizer_alloc(e);
  if (!t) {
    mrl__json_free(doc);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  }
  loader ld = {e, fn, what};
  st = load_document(&ld, mrl__json_root(doc), t);
  mrl__json_free(doc);
  if (st) {
    mrl_tokenizer_free(t);
    return st;
  }
  *out = t;
  return MRL_OK;
}

mrl_status mrl_tokenizer_load_json(mrl_engine *e, const char *json, size_t len,
                                   mrl_tokenizer **out) {
  const char *fn = "mrl_tokenizer_load_json";
  if (!e) return MRL_ERR_NULL;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  if (!json && len) return mrl__fail(e, MRL_ERR_NULL, fn, "json is NULL");
  return load_text(e, fn, "tokenizer.json", json, len, out);
}

mrl_status mrl_tokenizer_load(mrl_engine *e, const char *path, mrl_tokenizer **out) {
  const char *fn = "mrl_tokenizer_load";
  if (!e) return MRL_ERR_NULL;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  if (!path) return mrl__fail(e, MRL_ERR_NULL, fn, "path is NULL");
  char *text = NULL;
  size_t size = 0;
  mrl_status st = mrl__read_file(e, fn, path, MAX_JSON_FILE, &text, &size);
  if (st) return st;
  st = load_text(e, fn, path, text, size, out);
  mrl__free(e, text, size + 1);
  return st;
}

/* ---- encoding ---- */

static bool push_id(mrl_tokenizer *t, int32_t id) {
  mrl_tok_ids *o = &t->out;
  if (!mrl__tok_reserve(t->engine, (void **)&o->v, &o->cap, o->n + 1, sizeof *o->v, o->n))
    return false;
  o->v[o->n++] = id;
  return true;
}

/* Pre-tokenizes normalized text and runs the model on each piece. */
static mrl_status encode_pieces(mrl_tokenizer *t, const char *s, size_t n) {
  if (t->is_bytes) {
    mrl_tok_ids *o = &t->out;
    if (!mrl__tok_reserve(t->engine, (void **)&o->v, &o->cap, o->n + n, sizeof *o->v, o->n))
      return MRL_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) o->v[o->n++] = (unsigned char)s[i];
    return MRL_OK;
  }
  for (size_t pos = 0; pos < n;) {
    size_t k = mrl__split_next(t->split, s, n, pos);
    mrl_status st = mrl__bpe_piece(t, s + pos, k);
    if (st) return st;
    pos += k;
  }
  return MRL_OK;
}

/* Text between raw added tokens: normalize, then split on the normalized added tokens. */
static mrl_status encode_segment(mrl_tokenizer *t, const char *s, size_t n, bool special) {
  if (n == 0) return MRL_OK;
  if (t->nfc && !mrl__nfc_quick_check(s, n)) {
    t->norm.n = 0;
    mrl_status st = mrl__nfc_append(t->engine, &t->nfc_scratch, s, n, &t->norm);
    if (st) return st;
    s = t->norm.v;
    n = t->norm.n;
  }
  size_t from = 0, at;
  int32_t id;
  while (added_find(t, &t->norm_added, s, n, from, special, &at, &id)) {
    mrl_status st = encode_pieces(t, s + from, at - from);
    if (st) return st;
    if (!push_id(t, id)) return MRL_ERR_NOMEM;
    from = at + t->entries[id].spell_len;
  }
  return encode_pieces(t, s + from, n - from);
}

/* Appends the ids of text[0..len) to t->out. */
static mrl_status encode_append(mrl_tokenizer *t, const char *text, size_t len, bool special) {
  if (len == 0) return MRL_OK; /* text may then be NULL (an empty message), and NULL + 0 is UB */
  size_t from = 0, at;
  int32_t id;
  while (added_find(t, &t->raw_added, text, len, from, special, &at, &id)) {
    mrl_status st = encode_segment(t, text + from, at - from, special);
    if (st) return st;
    if (!push_id(t, id)) return MRL_ERR_NOMEM;
    from = at + t->entries[id].spell_len;
  }
  return encode_segment(t, text + from, len - from, special);
}

/* Hands t->out to the caller with the snprintf-style convention. */
static void deliver(const mrl_tokenizer *t, int32_t *ids, size_t cap, size_t *count) {
  size_t n = t->out.n < cap ? t->out.n : cap;
  if (n) memcpy(ids, t->out.v, n * sizeof *ids);
  *count = t->out.n;
}

static mrl_status encode_failed(mrl_tokenizer *t, const char *fn, mrl_status st) {
  t->out.n = 0;
  if (st == MRL_ERR_OVERFLOW) return mrl__fail(t->engine, st, fn, "a piece of text is too long");
  return mrl__fail(t->engine, st, fn, "out of memory");
}

mrl_status mrl_tokenizer_encode(mrl_tokenizer *t, const char *text, size_t len, int flags,
                                int32_t *ids, size_t cap, size_t *count) {
  const char *fn = "mrl_tokenizer_encode";
  if (!t) return MRL_ERR_NULL;
  if (!text && len) return mrl__fail(t->engine, MRL_ERR_NULL, fn, "text is NULL");
  if (!ids && cap) return mrl__fail(t->engine, MRL_ERR_NULL, fn, "ids is NULL");
  if (!count) return mrl__fail(t->engine, MRL_ERR_NULL, fn, "count is NULL");
  if (flags & ~MRL_ENCODE_SPECIAL)
    return mrl__fail(t->engine, MRL_ERR_INVALID, fn, "unknown flags 0x%x", (unsigned)flags);
  t->out.n = 0;
  mrl_status st = encode_append(t, text, len, flags & MRL_ENCODE_SPECIAL);
  if (st) return encode_failed(t, fn, st);
  deliver(t, ids, cap, count);
  return MRL_OK;
}

/* ---- decoding and lookups ---- */

static bool has_token(const mrl_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->vocab_size && t->entries[id].flags;
}

mrl_status mrl_tokenizer_decode(mrl_tokenizer *t, const int32_t *ids, size_t count, char *buf,
                                size_t cap, size_t *len) {
  const char *fn = "mrl_tokenizer_decode";
  if (!t) return MRL_ERR_NULL;
  if (!ids && count) return mrl__fail(t->engine, MRL_ERR_NULL, fn, "ids is NULL");
  if (!buf && cap) return mrl__fail(t->engine, MRL_ERR_NULL, fn, "buf is NULL");
  if (!len) return mrl__fail(t->engine, MRL_ERR_NULL, fn, "len is NULL");
  size_t total = 0;
  for (size_t i = 0; i < count; i++) {
    if (!has_token(t, ids[i]))
      return mrl__fail(t->engine, MRL_ERR_RANGE, fn, "ids[%zu] = %d is not a token id of this "
                       "tokenizer (vocabulary size %d)", i, ids[i], t->vocab_size);
    total += t->entries[ids[i]].bytes_len;
  }
  if (cap) {
    size_t room = cap - 1, n = 0;
    for (size_t i = 0; i < count && n < room; i++) {
      const mrl_tok_entry *en = &t->entries[ids[i]];
      size_t k = en->bytes_len < room - n ? en->bytes_len : room - n;
      memcpy(buf + n, t->pool + en->bytes_off, k);
      n += k;
    }
    buf[n] = '\0';
  }
  *len = total;
  return MRL_OK;
}

const char *mrl_tokenizer_token(const mrl_tokenizer *t, int32_t id, size_t *len) {
  if (!t || !has_token(t, id)) return NULL;
  if (len) *len = t->entries[id].spell_len;
  return t->pool + t->entries[id].spell_off;
}

int32_t mrl_tokenizer_token_id(const mrl_tokenizer *t, const char *token, size_t len) {
  if (!t || (!token && len)) return -1;
  int32_t id = added_lookup(t, &t->raw_added, token, len);
  if (id < 0) id = added_lookup(t, &t->norm_added, token, len);
  if (id < 0 && len) id = mrl__spell_lookup(t, token, len);
  return id;
}

/* ---- chat templates ---- */

typedef struct {
  mrl_tokenizer *t;
  const char *fn;
} chat_writer;

/* Encodes the text gathered in t->chat as plain text and empties it. */
static mrl_status chat_flush(chat_writer *w) {
  mrl_tokenizer *t = w->t;
  mrl_status st = encode_append(t, t->chat.v, t->chat.n, false);
  t->chat.n = 0;
  return st;
}

static mrl_status chat_text(chat_writer *w, const char *s, size_t n) {
  mrl_tok_text *c = &w->t->chat;
  if (!mrl__tok_reserve(w->t->engine, (void **)&c->v, &c->cap, c->n + n, 1, c->n))
    return MRL_ERR_NOMEM;
  if (n) memcpy(c->v + c->n, s, n);
  c->n += n;
  return MRL_OK;
}

static mrl_status chat_token(chat_writer *w, int32_t id) {
  mrl_status st = chat_flush(w);
  if (st) return st;
  return push_id(w->t, id) ? MRL_OK : MRL_ERR_NOMEM;
}

static mrl_status chat_str(chat_writer *w, const char *s) { return chat_text(w, s, strlen(s)); }

/* The ids of the markers a template needs; fails naming the first one the tokenizer lacks. */
static mrl_status chat_markers(mrl_tokenizer *t, const char *fn, const char *tmpl,
                               const char *const *names, int n, int32_t *ids) {
  for (int i = 0; i < n; i++) {
    ids[i] = mrl_tokenizer_token_id(t, names[i], strlen(names[i]));
    if (ids[i] < 0)
      return mrl__fail(t->engine, MRL_ERR_UNSUPPORTED, fn, "the %s template needs the token %s, "
                       "which this tokenizer lacks", tmpl, names[i]);
  }
  return MRL_OK;
}

static int role_index(const char *role) {
  static const char *const roles[] = {"system", "user", "assistant", "tool"};
  for (int i = 0; i < 4; i++)
    if (strcmp(role, roles[i]) == 0) return i;
  return -1;
}

static mrl_status chat_roles(chat_writer *w, const mrl_chat_message *m, size_t count, bool gen) {
  static const char *const names[] = {"<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"};
  int32_t id[5] = {0};
  mrl_status st = chat_markers(w->t, w->fn, "roles", names, 5, id);
  for (size_t i = 0; !st && i < count; i++) {
    int r = role_index(m[i].role);
    if (r < 0)
      return mrl__fail(w->t->engine, MRL_ERR_INVALID, w->fn, "role \"%.*s\" is not one of "
                       "system, user, assistant, tool (roles template)", SHOWN, m[i].role);
    if (!(st = chat_token(w, id[r])) && !(st = chat_text(w, m[i].content, m[i].content_len)))
      st = chat_token(w, id[4]);
  }
  if (!st && gen) st = chat_token(w, id[2]);
  return st ? st : chat_flush(w);
}

static mrl_status chat_chatml(chat_writer *w, const mrl_chat_message *m, size_t count, bool gen) {
  static const char *const names[] = {"<|im_start|>", "<|im_end|>"};
  int32_t id[2] = {0};
  mrl_status st = chat_markers(w->t, w->fn, "chatml", names, 2, id);
  for (size_t i = 0; !st && i < count; i++) {
    if (!(st = chat_token(w, id[0])) && !(st = chat_str(w, m[i].role)) && !(st = chat_str(w, "\n")) &&
        !(st = chat_text(w, m[i].content, m[i].content_len)) && !(st = chat_token(w, id[1])))
      st = chat_str(w, "\n");
  }
  if (!st && gen && !(st = chat_token(w, id[0]))) st = chat_str(w, "assistant\n");
  return st ? st : chat_flush(w);
}

static mrl_status chat_llama3(chat_writer *w, const mrl_chat_message *m, size_t count, bool gen) {
  static const char *const names[] = {"<|begin_of_text|>", "<|start_header_id|>",
                                      "<|end_header_id|>", "<|eot_id|>"};
  int32_t id[4] = {0};
  mrl_status st = chat_markers(w->t, w->fn, "llama3", names, 4, id);
  if (!st) st = chat_token(w, id[0]);
  for (size_t i = 0; !st && i < count; i++) {
    if (!(st = chat_token(w, id[1])) && !(st = chat_str(w, m[i].role)) &&
        !(st = chat_token(w, id[2])) && !(st = chat_str(w, "\n\n")) &&
        !(st = chat_text(w, m[i].content, m[i].content_len)))
      st = chat_token(w, id[3]);
  }
  if (!st && gen && !(st = chat_token(w, id[1])) && !(st = chat_str(w, "assistant")) &&
      !(st = chat_token(w, id[2])))
    st = chat_str(w, "\n\n");
  return st ? st : chat_flush(w);
}

static mrl_status chat_auto(mrl_tokenizer *t, const char *fn, mrl_chat_template *tmpl) {
  if (*tmpl != MRL_CHAT_AUTO) return MRL_OK;
  if (t->is_bytes)
    *tmpl = MRL_CHAT_ROLES;
  else if (mrl_tokenizer_token_id(t, "<|im_start|>", 12) >= 0)
    *tmpl = MRL_CHAT_CHATML;
  else if (mrl_tokenizer_token_id(t, "<|start_header_id|>", 19) >= 0)
    *tmpl = MRL_CHAT_LLAMA3;
  else
    return mrl__fail(t->engine, MRL_ERR_UNSUPPORTED, fn, "no chat template fits this tokenizer "
                     "(it has neither <|im_start|> nor <|start_header_id|>); name one");
  return MRL_OK;
}

mrl_status mrl_tokenizer_chat(mrl_tokenizer *t, mrl_chat_template tmpl,
                              const mrl_chat_message *messages, size_t count,
                              int add_generation_prompt, int32_t *ids, size_t cap,
                              size_t *total) {
  const char *fn = "mrl_tokenizer_chat";
  if (!t) return MRL_ERR_NULL;
  mrl_engine *e = t->engine;
  if (!messages && count) return mrl__fail(e, MRL_ERR_NULL, fn, "messages is NULL");
  if (!ids && cap) return mrl__fail(e, MRL_ERR_NULL, fn, "ids is NULL");
  if (!total) return mrl__fail(e, MRL_ERR_NULL, fn, "total is NULL");
  for (size_t i = 0; i < count; i++) {
    if (!messages[i].role) return mrl__fail(e, MRL_ERR_NULL, fn, "messages[%zu].role is NULL", i);
    if (!messages[i].role[0])
      return mrl__fail(e, MRL_ERR_INVALID, fn, "messages[%zu].role is empty", i);
    if (!messages[i].content && messages[i].content_len)
      return mrl__fail(e, MRL_ERR_NULL, fn, "messages[%zu].content is NULL", i);
  }
  if (tmpl < MRL_CHAT_AUTO || tmpl > MRL_CHAT_LLAMA3)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "unknown chat template %d", (int)tmpl);
  mrl_status st = chat_auto(t, fn, &tmpl);
  if (st) return st;
  chat_writer w = {t, fn};
  t->out.n = 0;
  t->chat.n = 0;
  bool gen = add_generation_prompt != 0;
  if (tmpl == MRL_CHAT_ROLES)
    st = chat_roles(&w, messages, count, gen);
  else if (tmpl == MRL_CHAT_CHATML)
    st = chat_chatml(&w, messages, count, gen);
  else
    st = chat_llama3(&w, messages, count, gen);
  if (st) {
    t->chat.n = 0;
    /* a failed template check already wrote its message */
    if (st == MRL_ERR_NOMEM || st == MRL_ERR_OVERFLOW) return encode_failed(t, fn, st);
    t->out.n = 0;
    return st;
  }
  deliver(t, ids, cap, total);
  return MRL_OK;
}
