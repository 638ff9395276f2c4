/* utf8.c - UTF-8 decoding that reports invalid sequences the way Unicode counts them, and
 * encoding of one code point. */
#include "utf8.h"

size_t mrl__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  /* the ranges of Unicode's table of well-formed sequences: the second byte's range depends on
   * the lead byte (no overlongs, no surrogates, nothing above U+10FFFF) */
  size_t need;
  uint32_t v;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
    v = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    v = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    v = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *cp = MRL_UTF8_INVALID;
    return 1;
  }
  size_t i = 1;
  for (; i <= need && i < n; i++) {
    unsigned b = s[i];
    if (b < lo || b > hi) break;
    v = (v << 6) | (b & 0x3F);
    lo = 0x80;
    hi = 0xBF;
  }
  if (i <= need) {
    *cp = MRL_UTF8_INVALID;
    return i;
  }
  *cp = v;
  return need + 1;
}

size_t mrl__utf8_encode(char *dst, uint32_t cp) {
  if (cp < 0x80) {
    dst[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    dst[0] = (char)(0xC0 | (cp >> 6));
    dst[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    dst[0] = (char)(0xE0 | (cp >> 12));
    dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  dst[0] = (char)(0xF0 | (cp >> 18));
  dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  dst[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}
