/* tokenizer_text.c - text handling for the tokenizers: NFC normalization, and the pre-tokenizer split patterns of GPT-2, Llama-3 and Qwen2/Qwen3
 * written as hand-made matchers instead of a regex engine. */
#include "tokenizer_internal.h"
#include "unicode_tables.h"

#include <string.h>

/* ---- growable arrays ---- */

bool mrl__tok_reserve(mrl_engine *e, void **p, size_t *cap, size_t need, size_t elem,
                      size_t keep) {
  if (need <= *cap) return true;
  size_t want = *cap < 64 ? 64 : *cap;
  while (want < need) {
    if (want > SIZE_MAX / 2) return false;
    want *= 2;
  }
  if (want > SIZE_MAX / elem) return false;
  void *q = mrl__alloc(e, want * elem);
  if (!q) return false;
  if (keep) memcpy(q, *p, keep * elem);
  mrl__free(e, *p, *cap * elem);
  *p = q;
  *cap = want;
  return true;
}



/* ---- NFC ---- */

enum {
  HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
  HANGUL_LCOUNT = 19, HANGUL_VCOUNT = 21, HANGUL_TCOUNT = 28,
  HANGUL_NCOUNT = HANGUL_VCOUNT * HANGUL_TCOUNT, HANGUL_SCOUNT = HANGUL_LCOUNT * HANGUL_NCOUNT,
  /* below it every character is a starter that NFC keeps and nothing composes with (checked by
   * the table generator), so the quick check skips it without a table lookup */
  FIRST_NONTRIVIAL = 0x300
};

static unsigned ccc_of(uint32_t cp) { return mrl__uni_props(cp) & 0xFF; }

bool mrl__nfc_quick_check(const char *text, size_t len) {
  const unsigned char *s = (const unsigned char *)text;
  unsigned last_cc = 0;
  for (size_t i = 0; i < len;) {
    if (s[i] < 0x80) {
      last_cc = 0;
      i++;
      continue;
    }
    uint32_t cp;
    i += mrl__utf8_decode(s + i, len - i, &cp);
    if (cp == MRL_UTF8_INVALID || cp < FIRST_NONTRIVIAL) {
      last_cc = 0;
      continue;
    }
    unsigned p = mrl__uni_props(cp), cc = p & 0xFF;
    if (p & (MRL_UNI_NFC_NO | MRL_UNI_NFC_MAYBE)) return false;
    if (cc && last_cc > cc) return false;
    last_cc = cc;
  }
  return true;
}

static const mrl_uni_decomp *find_decomp(uint32_t cp) {
  size_t lo = 0, hi = mrl__uni_decomp_count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (mrl__uni_decomp[mid].cp < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < mrl__uni_decomp_count && mrl__uni_decomp[lo].cp == cp ? &mrl__uni_decomp[lo] : NULL;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= HANGUL_L && a < HANGUL_L + HANGUL_LCOUNT && b >= HANGUL_V &&
      b < HANGUL_V + HANGUL_VCOUNT)
    return HANGUL_S + ((a - HANGUL_L) * HANGUL_VCOUNT + (b - HANGUL_V)) * HANGUL_TCOUNT;
  if (a >= HANGUL_S && a < HANGUL_S + HANGUL_SCOUNT && (a - HANGUL_S) % HANGUL_TCOUNT == 0 &&
      b > HANGUL_T && b < HANGUL_T + HANGUL_TCOUNT)
    return a + (b - HANGUL_T);
  if (!(mrl__uni_props(b) & MRL_UNI_NFC_MAYBE)) return 0;
  size_t lo = 0, hi = mrl__uni_comp_count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const mrl_uni_comp *c = &mrl__uni_comp[mid];
    if (c->first < a || (c->first == a && c->second < b))
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < mrl__uni_comp_count && mrl__uni_comp[lo].first == a && mrl__uni_comp[lo].second == b)
    return mrl__uni_comp[lo].composite;
  return 0;
}

/* Canonical ordering: each run of non-starters is sorted stably by combining class. A counting
 * sort keeps this linear even for adversarially long runs of marks. */
static void canonical_order(uint32_t *c, uint32_t *tmp, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (ccc_of(c[i]) == 0) {
      i++;
      continue;
    }
    size_t a = i;
    while (i < n && ccc_of(c[i]) != 0) i++;
    if (i - a < 2) continue;
    size_t count[257] = {0};
    for (size_t k = a; k < i; k++) count[ccc_of(c[k]) + 1]++;
    for (int k = 0; k < 256; k++) count[k + 1] += count[k];
    for (size_t k = a; k < i; k++) tmp[count[ccc_of(c[k])]++] = c[k];
    memcpy(c + a, tmp, (i - a) * sizeof *c);
  }
}

/* Canonical composition in place (the algorithm of UAX #15); returns the new length. */
static size_t compose(uint32_t *c, size_t n) {
  if (n == 0) return 0;
  size_t starter = 0, out = 1;
  unsigned last_cc = ccc_of(c[0]);
  if (last_cc != 0) last_cc = 256; /* no starter yet: nothing may compose */
  for (size_t i = 1; i < n; i++) {
    uint32_t ch = c[i];
    unsigned cc = ccc_of(ch);
    uint32_t comp = last_cc == 256 ? 0 : compose_pair(c[starter], ch);
    if (comp && (last_cc < cc || last_cc == 0)) {
      c[starter] = comp;
      continue;
    }
    if (cc == 0) starter = out;
    last_cc = cc;
    c[out++] = ch;
  }
  return out;
}

/* Normalizes the decomposed code points in s->cps[0..n) and appends them to out as UTF-8. */
static mrl_status flush_cps(mrl_engine *e, mrl_nfc_scratch *s, size_t n, mrl_tok_text *out) {
  canonical_order(s->cps, s->cps + n, n);
  n = compose(s->cps, n);
  if (!mrl__tok_reserve(e, (void **)&out->v, &out->cap, out->n + 4 * n, 1, out->n))
    return MRL_ERR_NOMEM;
  for (size_t i = 0; i < n; i++) out->n += mrl__utf8_encode(out->v + out->n, s->cps[i]);
  return MRL_OK;
}

mrl_status mrl__nfc_append(mrl_engine *e, mrl_nfc_scratch *s, const char *text, size_t len,
                           mrl_tok_text *out) {
  const unsigned char *u = (const unsigned char *)text;
  size_t n = 0; /* decomposed code points waiting in s->cps */
  for (size_t i = 0; i < len;) {
    uint32_t cp;
    size_t k = mrl__utf8_decode(u + i, len - i, &cp);
    if (cp == MRL_UTF8_INVALID) {
      mrl_status st = flush_cps(e, s, n, out);
      if (st) return st;
      n = 0;
      if (!mrl__tok_reserve(e, (void **)&out->v, &out->cap, out->n + k, 1, out->n))
        return MRL_ERR_NOMEM;
      memcpy(out->v + out->n, u + i, k);
      out->n += k;
      i += k;
      continue;
    }
    i += k;
    /* room for this character's decomposition (at most 4 code points), and as much again
     * behind the code points for canonical_order's scratch */
    if (!mrl__tok_reserve(e, (void **)&s->cps, &s->cps_cap, 2 * (n + 8), sizeof *s->cps, n))
      return MRL_ERR_NOMEM;
    if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_SCOUNT) {
      uint32_t si = cp - HANGUL_S;
      s->cps[n++] = HANGUL_L + si / HANGUL_NCOUNT;
      s->cps[n++] = HANGUL_V + (si % HANGUL_NCOUNT) / HANGUL_TCOUNT;
      if (si % HANGUL_TCOUNT) s->cps[n++] = HANGUL_T + si % HANGUL_TCOUNT;
    } else if (mrl__uni_props(cp) & MRL_UNI_DECOMPOSES) {
      const mrl_uni_decomp *d = find_decomp(cp);
      for (unsigned j = 0; j < d->length; j++) s->cps[n++] = mrl__uni_decomp_data[d->offset + j];
    } else {
      s->cps[n++] = cp;
    }
  }
  return flush_cps(e, s, n, out);
}

/* ---- split patterns ---- */

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char LLAMA3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

int mrl__split_pattern_of(const char *regex, size_t len) {
  static const struct {
    const char *text;
    mrl_split_pattern pattern;
  } known[] = {{GPT2_REGEX, MRL_SPLIT_GPT2},
               {LLAMA3_REGEX, MRL_SPLIT_LLAMA3},
               {QWEN2_REGEX, MRL_SPLIT_QWEN2}};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strlen(known[i].text) == len && memcmp(known[i].text, regex, len) == 0)
      return (int)known[i].pattern;
  return -1;
}

enum { C_L = 1, C_N = 2, C_S = 4, C_NL = 8 /* \r or \n (also C_S) */ };

/* Class of the character at s[0..n) (n >= 1); *len gets its length in bytes. */
static inline unsigned char_class(const unsigned char *s, size_t n, size_t *len) {
  unsigned c = s[0];
  if (c < 0x80) {
    *len = 1;
    if ((unsigned)((c | 0x20) - 'a') < 26) return C_L;
    if ((unsigned)(c - '0') < 10) return C_N;
    if (c == '\n' || c == '\r') return C_S | C_NL;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return C_S;
    return 0;
  }
  uint32_t cp;
  *len = mrl__utf8_decode(s, n, &cp);
  if (cp == MRL_UTF8_INVALID) return 0;
  unsigned p = mrl__uni_props(cp);
  return (p & MRL_UNI_LETTER ? C_L : 0) | (p & MRL_UNI_NUMBER ? C_N : 0) |
         (p & MRL_UNI_SPACE ? C_S : 0);
}

/* End of the run of characters whose class has a bit of `any` (want true) or none (want false),
 * starting at pos. */
static size_t run_end(const unsigned char *s, size_t len, size_t pos, unsigned any, bool want) {
  while (pos < len) {
    size_t k;
    if (((char_class(s + pos, len - pos, &k) & any) != 0) != want) break;
    pos += k;
  }
  return pos;
}

/* 's 't 're 've 'm 'll 'd at s[0] == '\'' (ASCII case folded when fold): its length, or 0. */
static size_t contraction(const unsigned char *s, size_t n, bool fold) {
  if (n < 2) return 0;
  unsigned a = s[1], b = n > 2 ? s[2] : 0;
  if (fold) {
    if (a >= 'A' && a <= 'Z') a += 32;
    if (b >= 'A' && b <= 'Z') b += 32;
  }
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

/* The white-space alternatives at pos (a white-space character): with_newlines adds
 * \s*[\r\n]+ (up to the run's last newline) before \s+(?!\S) | \s+. */
static size_t space_piece(const unsigned char *s, size_t len, size_t pos, bool with_newlines) {
  size_t end = pos, last_start = pos, newline_end = 0;
  while (end < len) {
    size_t k;
    unsigned c = char_class(s + end, len - end, &k);
    if (!(c & C_S)) break;
    if (c & C_NL) newline_end = end + 1;
    last_start = end;
    end += k;
  }
  if (with_newlines && newline_end) return newline_end - pos;
  if (end == len) return end - pos;              /* \s+(?!\S) up to the end of the text */
  if (last_start > pos) return last_start - pos; /* ... leaving one space for the next word */
  return end - pos;                              /* \s+: one white-space character */
}

static size_t split_gpt2(const unsigned char *s, size_t len, size_t pos) {
  if (s[pos] == '\'') {
    size_t k = contraction(s + pos, len - pos, false);
    if (k) return k;
  }
  size_t q = pos + (s[pos] == ' '), k;
  if (q < len) {
    unsigned c = char_class(s + q, len - q, &k);
    if (c & C_L) return run_end(s, len, q + k, C_L, true) - pos;
    if (c & C_N) return run_end(s, len, q + k, C_N, true) - pos;
    if (!(c & C_S)) return run_end(s, len, q + k, C_S | C_L | C_N, false) - pos;
  }
  return space_piece(s, len, pos, false);
}

/* Llama-3 (max_digits 3) and Qwen2 (max_digits 1). */
static size_t split_gpt4(const unsigned char *s, size_t len, size_t pos, int max_digits) {
  if (s[pos] == '\'') {
    size_t k = contraction(s + pos, len - pos, true);
    if (k) return k;
  }
  size_t n0, k;
  unsigned c0 = char_class(s + pos, len - pos, &n0);
  /* [^\r\n\p{L}\p{N}]?\p{L}+ */
  size_t q = (c0 & (C_L | C_N | C_NL)) ? pos : pos + n0;
  if (q < len && (char_class(s + q, len - q, &k) & C_L))
    return run_end(s, len, q + k, C_L, true) - pos;
  /* \p{N}{1,max_digits} */
  if (c0 & C_N) {
    q = pos + n0;
    for (int d = 1; d < max_digits && q < len && (char_class(s + q, len - q, &k) & C_N); d++)
      q += k;
    return q - pos;
  }
  /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
  q = pos + (s[pos] == ' ');
  if (q < len && !(char_class(s + q, len - q, &k) & (C_S | C_L | C_N))) {
    q = run_end(s, len, q + k, C_S | C_L | C_N, false);
    while (q < len && (s[q] == '\r' || s[q] == '\n')) q++;
    return q - pos;
  }
  return space_piece(s, len, pos, true);
}

size_t mrl__split_next(mrl_split_pattern pattern, const char *text, size_t len, size_t pos) {
  const unsigned char *s = (const unsigned char *)text;
  switch (pattern) {
  case MRL_SPLIT_GPT2: return split_gpt2(s, len, pos);
  case MRL_SPLIT_LLAMA3: return split_gpt4(s, len, pos, 3);
  case MRL_SPLIT_QWEN2: return split_gpt4(s, len, pos, 1);
  case MRL_SPLIT_NONE: break;
  }
  return len - pos;
}
