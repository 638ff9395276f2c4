/* unicode_tables.h - the Unicode properties the tokenizers need: letter, number and white-space
 * classes, canonical combining classes, NFC quick-check flags, canonical decompositions and
 * compositions. The data is generated into unicode_tables.c by scripts/gen_unicode_tables.py
 * from Python's unicodedata. Internal; not installed. */
#ifndef MRL_UNICODE_TABLES_H
#define MRL_UNICODE_TABLES_H

#include <stddef.h>
#include <stdint.h>

/* Property word of a code point: the low 8 bits are the canonical combining class. */
enum {
  MRL_UNI_LETTER = 1 << 8,     /* general category L* (\p{L}) */
  MRL_UNI_NUMBER = 1 << 9,     /* general category N* (\p{N}) */
  MRL_UNI_SPACE = 1 << 10,     /* White_Space (\s of Oniguruma and Rust's regex) */
  MRL_UNI_NFC_NO = 1 << 11,    /* never occurs in NFC text */
  MRL_UNI_NFC_MAYBE = 1 << 12, /* may compose with what precedes it */
  MRL_UNI_DECOMPOSES = 1 << 13 /* has an entry in mrl__uni_decomp */
};
enum { MRL_UNI_BLOCK_SHIFT = 7 };

extern const uint16_t mrl__uni_stage1[];
extern const uint16_t mrl__uni_stage2[];

static inline unsigned mrl__uni_props(uint32_t cp) {
  if (cp >= 0x110000) return 0;
  unsigned block = mrl__uni_stage1[cp >> MRL_UNI_BLOCK_SHIFT];
  return mrl__uni_stage2[(block << MRL_UNI_BLOCK_SHIFT) | (cp & ((1u << MRL_UNI_BLOCK_SHIFT) - 1))];
}

/* Full canonical decomposition (NFD) of cp: mrl__uni_decomp_data[offset .. offset + length).
 * Sorted by cp. Hangul syllables are decomposed by arithmetic instead. */
typedef struct {
  uint32_t cp;
  uint16_t offset;
  uint8_t length;
} mrl_uni_decomp;
extern const mrl_uni_decomp mrl__uni_decomp[];
extern const size_t mrl__uni_decomp_count;
extern const uint32_t mrl__uni_decomp_data[];

/* Primary composites: first + second -> composite, sorted by (first, second). Hangul excluded. */
typedef struct {
  uint32_t first, second, composite;
} mrl_uni_comp;
extern const mrl_uni_comp mrl__uni_comp[];
extern const size_t mrl__uni_comp_count;

#endif /* MRL_UNICODE_TABLES_H */
