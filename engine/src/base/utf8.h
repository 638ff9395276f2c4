/* utf8.h - UTF-8 helpers of the base layer (tokenizer, JSON, text similarity). Not installed. */
#ifndef MRL_UTF8_H
#define MRL_UTF8_H

#include <stddef.h>
#include <stdint.h>

#define MRL_UTF8_INVALID 0xFFFFFFFFu

/* Decodes the sequence at s[0..n) (n >= 1) into *cp and returns its length. A sequence that is
 * not valid UTF-8 gives *cp = MRL_UTF8_INVALID and the length of its maximal subpart (at least 1
 * byte), as Unicode (and WHATWG's TextDecoder) count them for replacement characters. */
size_t mrl__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Writes code point cp (< 0x110000) as UTF-8 into dst (room for 4 bytes); returns the length. */
size_t mrl__utf8_encode(char *dst, uint32_t cp);

#endif /* MRL_UTF8_H */
