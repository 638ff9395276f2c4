/* tokenizer_bpe.c - the byte-level BPE model: the vocabulary and merge hash tables, the merge
 * loop over one pre-tokenized piece (a heap of candidate merges, with the naive loop kept as its
 * test oracle), and the cache of encoded pieces. */
#include "tokenizer_internal.h"

#include <string.h>

enum {
  CACHE_SLOTS = 1 << 15,
  CACHE_MAX_ENTRIES = CACHE_SLOTS / 2,
  CACHE_KEY_BYTES = 1 << 19,
  CACHE_IDS = 1 << 17,
  CACHE_MAX_PIECE = 128 /* longer pieces are rare and rarely repeat */
};

uint64_t mrl__tok_hash(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, s, 8);
    h = (h ^ v) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    s += 8;
    n -= 8;
  }
  uint64_t v = 0;
  memcpy(&v, s, n);
  h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

/* Slot count (a power of two) for `count` keys at a load of at most 2/3. */
static size_t table_size(size_t count) {
  size_t n = 16;
  while (n < count + count / 2) n *= 2;
  return n;
}

/* ---- vocabulary ---- */

/* Printable bytes spell themselves; the others (controls, space, DEL, NBSP, soft hyphen) take
 * the code points from U+0100 on, in byte order. */
static bool byte_is_printable(unsigned b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

uint32_t mrl__byte_to_unicode(unsigned b) {
  if (byte_is_printable(b)) return b;
  uint32_t n = 0;
  for (unsigned x = 0; x < b; x++) n += !byte_is_printable(x);
  return 0x100 + n;
}

static const char *spelling(const mrl_tokenizer *t, int32_t id, size_t *len) {
  *len = t->entries[id].spell_len;
  return t->pool + t->entries[id].spell_off;
}

int32_t mrl__spell_lookup(const mrl_tokenizer *t, const char *s, size_t n) {
  if (!t->vocab.slots) return -1;
  for (size_t i = mrl__tok_hash(s, n) & t->vocab.mask;; i = (i + 1) & t->vocab.mask) {
    int32_t id = t->vocab.slots[i];
    if (id < 0) return -1;
    size_t len;
    const char *sp = spelling(t, id, &len);
    if (len == n && memcmp(sp, s, n) == 0) return id;
  }
}

mrl_status mrl__spell_map_build(mrl_tokenizer *t, const char *fn, const char *what) {
  mrl_engine *e = t->engine;
  size_t count = 0;
  for (int32_t id = 0; id < t->vocab_size; id++) count += (t->entries[id].flags & MRL_TOK_IN_VOCAB) != 0;
  size_t size = table_size(count);
  if (size > SIZE_MAX / sizeof(int32_t) || !(t->vocab.slots = mrl__alloc(e, size * sizeof(int32_t))))
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory for the vocabulary table");
  memset(t->vocab.slots, 0xFF, size * sizeof(int32_t));
  t->vocab.mask = size - 1;
  for (int32_t id = 0; id < t->vocab_size; id++) {
    if (!(t->entries[id].flags & MRL_TOK_IN_VOCAB)) continue;
    size_t n;
    const char *s = spelling(t, id, &n);
    size_t i = mrl__tok_hash(s, n) & t->vocab.mask;
    for (; t->vocab.slots[i] >= 0; i = (i + 1) & t->vocab.mask) {
      size_t m;
      const char *other = spelling(t, t->vocab.slots[i], &m);
      if (m == n && memcmp(other, s, n) == 0)
        return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: model.vocab: \"%.*s\" has two ids, %d and %d",
                         what, (int)(n > 100 ? 100 : n), s, t->vocab.slots[i], id);
    }
    t->vocab.slots[i] = id;
  }
  return MRL_OK;
}

/* ---- merges ---- */

static inline uint64_t merge_key(int32_t left, int32_t right) {
  return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

static inline size_t merge_home(uint64_t key, size_t mask) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return (size_t)(h ^ (h >> 31)) & mask;
}

mrl_status mrl__merges_init(mrl_tokenizer *t, const char *fn, size_t count) {
  size_t size = table_size(count);
  if (size > SIZE_MAX / sizeof(mrl_merge_slot) ||
      !(t->merges = mrl__alloc(t->engine, size * sizeof(mrl_merge_slot))))
    return mrl__fail(t->engine, MRL_ERR_NOMEM, fn, "out of memory for %zu merges", count);
  for (size_t i = 0; i < size; i++) t->merges[i].key = UINT64_MAX;
  t->merges_mask = size - 1;
  return MRL_OK;
}

void mrl__merges_put(mrl_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t id) {
  uint64_t key = merge_key(left, right);
  size_t i = merge_home(key, t->merges_mask);
  while (t->merges[i].key != UINT64_MAX && t->merges[i].key != key) i = (i + 1) & t->merges_mask;
  t->merges[i] = (mrl_merge_slot){key, rank, id};
}

static inline const mrl_merge_slot *merge_find(const mrl_tokenizer *t, int32_t left,
                                               int32_t right) {
  if (!t->merges) return NULL;
  uint64_t key = merge_key(left, right);
  for (size_t i = merge_home(key, t->merges_mask);; i = (i + 1) & t->merges_mask) {
    if (t->merges[i].key == key) return &t->merges[i];
    if (t->merges[i].key == UINT64_MAX) return NULL;
  }
}

void mrl__bpe_merge_naive(const mrl_tokenizer *t, int32_t *ids, size_t *n) {
  for (;;) {
    const mrl_merge_slot *best = NULL;
    size_t at = 0;
    for (size_t i = 0; i + 1 < *n; i++) {
      const mrl_merge_slot *m = merge_find(t, ids[i], ids[i + 1]);
      if (m && (!best || m->rank < best->rank)) {
        best = m;
        at = i;
      }
    }
    if (!best) return;
    ids[at] = best->id;
    memmove(ids + at + 1, ids + at + 2, (*n - at - 2) * sizeof *ids);
    (*n)--;
  }
}

/* ---- the heap-based merge ---- */

static inline bool cand_less(const mrl_bpe_cand *a, const mrl_bpe_cand *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(mrl_bpe_scratch *s, mrl_bpe_cand c) {
  size_t i = s->heap_n++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!cand_less(&c, &s->heap[parent])) break;
    s->heap[i] = s->heap[parent];
    i = parent;
  }
  s->heap[i] = c;
}

static mrl_bpe_cand heap_pop(mrl_bpe_scratch *s) {
  mrl_bpe_cand top = s->heap[0], last = s->heap[--s->heap_n];
  size_t i = 0, n = s->heap_n;
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && cand_less(&s->heap[child + 1], &s->heap[child])) child++;
    if (!cand_less(&s->heap[child], &last)) break;
    s->heap[i] = s->heap[child];
    i = child;
  }
  if (n) s->heap[i] = last;
  return top;
}

static void push_pair(const mrl_tokenizer *t, mrl_bpe_scratch *s, int32_t left_pos) {
  int32_t right_pos = s->next[left_pos];
  const mrl_merge_slot *m = merge_find(t, s->sym[left_pos], s->sym[right_pos]);
  if (m) heap_push(s, (mrl_bpe_cand){m->rank, left_pos, s->sym[left_pos], s->sym[right_pos]});
}

/* Merges the symbols s->sym[0..n) (a linked list through prev/next) the way the naive loop
 * does, in O(n log n): candidates are popped lowest rank first, leftmost first among equals,
 * and a candidate whose symbols changed since it was pushed is skipped. */
static void merge_heap(const mrl_tokenizer *t, mrl_bpe_scratch *s, size_t n) {
  s->heap_n = 0;
  for (size_t i = 0; i < n; i++) {
    s->prev[i] = (int32_t)i - 1;
    s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < n; i++) push_pair(t, s, (int32_t)i);
  while (s->heap_n) {
    mrl_bpe_cand c = heap_pop(s);
    int32_t right = s->next[c.pos];
    if (s->sym[c.pos] != c.left || right < 0 || s->sym[right] != c.right) continue;
    s->sym[c.pos] = merge_find(t, c.left, c.right)->id;
    s->sym[right] = -1;
    s->next[c.pos] = s->next[right];
    if (s->next[right] >= 0) s->prev[s->next[right]] = c.pos;
    if (s->prev[c.pos] >= 0) push_pair(t, s, s->prev[c.pos]);
    if (s->next[c.pos] >= 0) push_pair(t, s, c.pos);
  }
}

/* ---- the word cache ---- */

static void cache_clear(mrl_word_cache *c) {
  memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
  c->count = c->keys_used = c->ids_used = 0;
}

mrl_status mrl__bpe_cache_init(mrl_tokenizer *t) {
  mrl_word_cache *c = &t->cache;
  c->slots = mrl__alloc(t->engine, CACHE_SLOTS * sizeof *c->slots);
  c->keys = mrl__alloc(t->engine, CACHE_KEY_BYTES);
  c->ids = mrl__alloc(t->engine, CACHE_IDS * sizeof *c->ids);
  if (!c->slots || !c->keys || !c->ids) return MRL_ERR_NOMEM;
  cache_clear(c);
  c->enabled = true;
  return MRL_OK;
}

static void cache_free(mrl_tokenizer *t) {
  mrl_word_cache *c = &t->cache;
  mrl__free(t->engine, c->slots, CACHE_SLOTS * sizeof *c->slots);
  mrl__free(t->engine, c->keys, CACHE_KEY_BYTES);
  mrl__free(t->engine, c->ids, CACHE_IDS * sizeof *c->ids);
  memset(c, 0, sizeof *c);
}

void mrl__tokenizer_set_cache(mrl_tokenizer *t, bool enabled) {
  if (!t->cache.slots) return;
  t->cache.enabled = enabled;
  cache_clear(&t->cache);
}

static const mrl_cache_slot *cache_find(const mrl_word_cache *c, uint64_t h, const char *piece,
                                        size_t len) {
  for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
    const mrl_cache_slot *s = &c->slots[i];
    if (!s->key_len) return NULL;
    if (s->hash == h && s->key_len == len && memcmp(c->keys + s->key_off, piece, len) == 0)
      return s;
  }
}

static void cache_put(mrl_word_cache *c, uint64_t h, const char *piece, size_t len,
                      const int32_t *ids, size_t n) {
  if (c->count == CACHE_MAX_ENTRIES || c->keys_used + len > CACHE_KEY_BYTES ||
      c->ids_used + n > CACHE_IDS)
    cache_clear(c);
  size_t i = h & (CACHE_SLOTS - 1);
  while (c->slots[i].key_len) i = (i + 1) & (CACHE_SLOTS - 1);
  c->slots[i] = (mrl_cache_slot){h, (uint32_t)c->keys_used, (uint32_t)c->ids_used,
                                 (uint16_t)len, (uint16_t)n};
  memcpy(c->keys + c->keys_used, piece, len);
  memcpy(c->ids + c->ids_used, ids, n * sizeof *ids);
  c->keys_used += len;
  c->ids_used += n;
  c->count++;
}

/* ---- one piece ---- */

static bool push_ids(mrl_tokenizer *t, const int32_t *ids, size_t n) {
  mrl_tok_ids *o = &t->out;
  if (!mrl__tok_reserve(t->engine, (void **)&o->v, &o->cap, o->n + n, sizeof *o->v, o->n))
    return false;
  memcpy(o->v + o->n, ids, n * sizeof *ids);
  o->n += n;
  return true;
}

/* The vocabulary token spelled like the whole piece, for ignore_merges; -1 if none. */
static int32_t whole_piece_token(mrl_tokenizer *t, const unsigned char *piece, size_t len,
                                 mrl_status *st) {
  mrl_tok_text *sp = &t->spell;
  *st = MRL_OK;
  if (!mrl__tok_reserve(t->engine, (void **)&sp->v, &sp->cap, 2 * len, 1, 0)) {
    *st = MRL_ERR_NOMEM;
    return -1;
  }
  sp->n = 0;
  for (size_t i = 0; i < len; i++) {
    /* the spelling of byte b is the spelling of the single-byte token byte_id[b] */
    const mrl_tok_entry *b = &t->entries[t->byte_id[piece[i]]];
    memcpy(sp->v + sp->n, t->pool + b->spell_off, b->spell_len);
    sp->n += b->spell_len;
  }
  return mrl__spell_lookup(t, sp->v, sp->n);
}

mrl_status mrl__bpe_piece(mrl_tokenizer *t, const char *piece, size_t len) {
  mrl_engine *e = t->engine;
  const unsigned char *u = (const unsigned char *)piece;
  if (len == 1) return push_ids(t, &t->byte_id[u[0]], 1) ? MRL_OK : MRL_ERR_NOMEM;
  bool cacheable = t->cache.enabled && len <= CACHE_MAX_PIECE;
  uint64_t h = 0;
  if (cacheable) {
    h = mrl__tok_hash(piece, len);
    const mrl_cache_slot *hit = cache_find(&t->cache, h, piece, len);
    if (hit) return push_ids(t, t->cache.ids + hit->ids_off, hit->n_ids) ? MRL_OK : MRL_ERR_NOMEM;
  }
  if (t->ignore_merges) {
    mrl_status st;
    int32_t id = whole_piece_token(t, u, len, &st);
    if (st) return st;
    if (id >= 0) {
      if (cacheable) cache_put(&t->cache, h, piece, len, &id, 1);
      return push_ids(t, &id, 1) ? MRL_OK : MRL_ERR_NOMEM;
    }
  }
  mrl_bpe_scratch *s = &t->bpe;
  if (len > (size_t)INT32_MAX / 3) return MRL_ERR_OVERFLOW;
  if (!mrl__tok_reserve(e, (void **)&s->block, &s->block_cap, 3 * len, sizeof *s->block, 0) ||
      !mrl__tok_reserve(e, (void **)&s->heap, &s->heap_cap, 3 * len, sizeof *s->heap, 0))
    return MRL_ERR_NOMEM;
  s->sym = s->block;
  s->prev = s->block + len;
  s->next = s->block + 2 * len;
  for (size_t i = 0; i < len; i++) s->sym[i] = t->byte_id[u[i]];
  merge_heap(t, s, len);
  /* compact the surviving symbols to the front of sym */
  size_t n = 0;
  for (int32_t i = 0; i >= 0; i = s->next[i]) s->sym[n++] = s->sym[i];
  if (cacheable && n <= UINT16_MAX) cache_put(&t->cache, h, piece, len, s->sym, n);
  return push_ids(t, s->sym, n) ? MRL_OK : MRL_ERR_NOMEM;
}

void mrl__bpe_free(mrl_tokenizer *t) {
  mrl_engine *e = t->engine;
  mrl_bpe_scratch *s = &t->bpe;
  mrl__free(e, s->block, s->block_cap * sizeof *s->block);
  mrl__free(e, s->heap, s->heap_cap * sizeof *s->heap);
  if (t->merges) mrl__free(e, t->merges, (t->merges_mask + 1) * sizeof *t->merges);
  if (t->vocab.slots) mrl__free(e, t->vocab.slots, (t->vocab.mask + 1) * sizeof(int32_t));
  if (t->cache.slots || t->cache.keys || t->cache.ids) cache_free(t);
}
