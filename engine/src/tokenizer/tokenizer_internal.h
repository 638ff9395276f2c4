/* tokenizer_internal.h - definitions shared by the tokenizer's source files: the tokenizer
 * struct, NFC helpers and the pre-tokenizer split patterns (tokenizer_text.c), and the
 * byte-level BPE model with its merge table and word cache (tokenizer_bpe.c). Internal; not
 * installed. */
#ifndef MRL_TOKENIZER_INTERNAL_H
#define MRL_TOKENIZER_INTERNAL_H

#include "internal.h"
#include "utf8.h"

/* Ids are below this bound, so an id pair packs into 64 bits and tables stay reasonable. */
enum { MRL_TOK_MAX_ID = 1 << 24 };

/* ---- growable arrays (engine-accounted) ---- */

/* Makes room for `need` elements of `elem` bytes in *p (capacity *cap, in elements), keeping the
 * first `keep` elements. Returns false when out of memory (then *p and *cap are unchanged). */
bool mrl__tok_reserve(mrl_engine *e, void **p, size_t *cap, size_t need, size_t elem, size_t keep);

typedef struct {
  int32_t *v;
  size_t n, cap;
} mrl_tok_ids;

typedef struct {
  char *v;
  size_t n, cap;
} mrl_tok_text;

/* ---- NFC (tokenizer_text.c) ---- */

typedef struct {
  uint32_t *cps; /* code points being normalized */
  size_t cps_cap;
} mrl_nfc_scratch;

/* True when text[0..len) is certainly in NFC already (the Unicode quick check answers YES). */
bool mrl__nfc_quick_check(const char *text, size_t len);
/* Appends the NFC form of text[0..len) to out. Bytes that are not valid UTF-8 are copied as they
 * are and block composition across them. Fails only when out of memory. */
mrl_status mrl__nfc_append(mrl_engine *e, mrl_nfc_scratch *s, const char *text, size_t len,
                           mrl_tok_text *out);

/* ---- pre-tokenizer split patterns (tokenizer_text.c) ----
 * Hand-written matchers for the exact regular expressions below, with the semantics of a
 * backtracking regex engine (leftmost alternative wins). \p{L}, \p{N} and \s come from the
 * Unicode tables; a maximal invalid UTF-8 subpart counts as one character of none of them. */
typedef enum {
  MRL_SPLIT_NONE,   /* the whole text is one piece (ByteLevel without its regex) */
  MRL_SPLIT_GPT2,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
  MRL_SPLIT_LLAMA3, /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                       ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
  MRL_SPLIT_QWEN2   /* the Llama-3 pattern with \p{N} (one digit at a time) for \p{N}{1,3} */
} mrl_split_pattern;

/* The pattern whose tokenizer.json spelling is regex[0..len), or -1 if it is not one of ours. */
int mrl__split_pattern_of(const char *regex, size_t len);
/* Length of the piece that starts at text[pos] (pos < len); at least 1. */
size_t mrl__split_next(mrl_split_pattern pattern, const char *text, size_t len, size_t pos);

/* ---- the tokenizer ---- */

enum {
  MRL_TOK_IN_VOCAB = 1, /* a token of the model's vocabulary */
  MRL_TOK_ADDED = 2,    /* an added token (matched in the text before splitting) */
  MRL_TOK_SPECIAL = 4   /* an added token marked special */
};

typedef struct {
  uint32_t spell_off, spell_len; /* the token as written in the vocabulary, in the pool */
  uint32_t bytes_off, bytes_len; /* the bytes it decodes to, in the pool */
  uint8_t flags;                 /* MRL_TOK_*; 0 for an id without a token */
} mrl_tok_entry;

/* Added tokens to find in text: sorted by first byte, then longest first, so the first match at
 * a position is the leftmost-longest one (as Hugging Face's Aho-Corasick matcher finds). */
typedef struct {
  int32_t *ids;
  size_t n;
  uint32_t start[257];  /* ids[start[b] .. start[b + 1]) begin with byte b */
  uint16_t prefix[256]; /* how many leading bytes all the tokens beginning with b share */
} mrl_added_set;

/* Vocabulary spelling -> id: open addressing over ids (-1 = empty). */
typedef struct {
  int32_t *slots;
  size_t mask;
} mrl_spell_map;

/* (left id, right id) -> (rank, merged id). */
typedef struct {
  uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
  int32_t rank, id;
} mrl_merge_slot;

typedef struct {
  uint64_t hash;
  uint32_t key_off, ids_off;
  uint16_t key_len, n_ids; /* key_len 0 = empty */
} mrl_cache_slot;

/* Encoded pieces (raw bytes -> ids), cleared whole when full. Allocated on first use. */
typedef struct {
  mrl_cache_slot *slots;
  char *keys;
  int32_t *ids;
  size_t count, keys_used, ids_used;
  bool enabled;
} mrl_word_cache;

/* Scratch of one BPE merge: a linked list of symbols and a heap of candidate merges. */
typedef struct {
  int32_t rank, pos, left, right;
} mrl_bpe_cand;

typedef struct {
  int32_t *block; /* sym, prev and next, one piece's length each */
  size_t block_cap;
  int32_t *sym, *prev, *next;
  mrl_bpe_cand *heap;
  size_t heap_n, heap_cap;
} mrl_bpe_scratch;

struct mrl_tokenizer {
  mrl_engine *engine;
  bool is_bytes;             /* the byte tokenizer: ids 0..255 are the bytes */
  bool nfc;                  /* the normalizer is NFC (else none) */
  bool ignore_merges;        /* a piece that is a whole vocabulary token is that token */
  mrl_split_pattern split;
  int32_t vocab_size;        /* largest id + 1 */
  mrl_tok_entry *entries;    /* vocab_size of them */
  char *pool;
  size_t pool_cap, pool_used;
  mrl_spell_map vocab;       /* model vocabulary only (not added tokens) */
  mrl_added_set raw_added;   /* added tokens matched before normalization */
  mrl_added_set norm_added;  /* added tokens matched after it ("normalized": true) */
  int32_t byte_id[256];      /* the token of each single byte */
  mrl_merge_slot *merges;
  size_t merges_mask;
  mrl_word_cache cache;
  /* scratch reused across calls */
  mrl_tok_ids out;
  mrl_tok_text norm, spell, chat;
  mrl_nfc_scratch nfc_scratch;
  mrl_bpe_scratch bpe;
};

/* ---- BPE (tokenizer_bpe.c) ---- */

uint64_t mrl__tok_hash(const void *p, size_t n);
/* The vocabulary id spelled s[0..n), or -1. */
int32_t mrl__spell_lookup(const mrl_tokenizer *t, const char *s, size_t n);
/* Builds the vocabulary table; a spelling with two ids fails ("what" names the document). */
mrl_status mrl__spell_map_build(mrl_tokenizer *t, const char *fn, const char *what);
/* Allocates the merge table for `count` merges. */
mrl_status mrl__merges_init(mrl_tokenizer *t, const char *fn, size_t count);
/* Records that left + right merge into `id` with priority `rank` (a later rank for the same
 * pair replaces the earlier one, as Hugging Face's loader does). */
void mrl__merges_put(mrl_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t id);
/* Appends the ids of one piece (raw bytes, as cut by the pre-tokenizer) to t->out. */
mrl_status mrl__bpe_piece(mrl_tokenizer *t, const char *piece, size_t len);
/* The reference merge loop (repeatedly merge the lowest-ranked adjacent pair, leftmost first),
 * on ids[0..*n) in place: the oracle the heap-based merge is tested against. */
void mrl__bpe_merge_naive(const mrl_tokenizer *t, int32_t *ids, size_t *n);
/* Turns the word cache off or on (for tests and benchmarks), emptying it. */
void mrl__tokenizer_set_cache(mrl_tokenizer *t, bool enabled);
/* Allocates the word cache (BPE tokenizers only). */
mrl_status mrl__bpe_cache_init(mrl_tokenizer *t);
/* Frees the BPE tables, the cache and the merge scratch. */
void mrl__bpe_free(mrl_tokenizer *t);
/* The code point that byte-level BPE spells byte b with (GPT-2's bytes_to_unicode). */
uint32_t mrl__byte_to_unicode(unsigned b);

#endif /* MRL_TOKENIZER_INTERNAL_H */
