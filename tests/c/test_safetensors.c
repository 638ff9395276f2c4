/* test_safetensors.c - unit tests of the safetensors reader and writer: every malformed header the
 * reader must refuse (crafted byte by byte), F16/BF16/F32 conversions against independent
 * references, the reference implementation's own serialization fixtures, round trips, and the
 * atomic writer (target untouched and no temporary file left on failure). */
#include "support.h"
#include "tensor_internal.h"
#include "safetensors.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- setup ---- */

static uint64_t lcg_state = 7;

static uint32_t data_u32(void) {
  lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(lcg_state >> 32);
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static void finish(mrl_engine *e) {
  CHECKF(mrl_engine_memory_used(e) == 0, "%zu bytes still held", mrl_engine_memory_used(e));
  mrl_engine_free(e);
}

/* A file image: 8-byte little-endian length, the header, then data_len bytes (0, 1, 2, ...).
 * Headers are written with ' for " to stay readable. declared: the length field (-1: the real
 * header length). */
typedef struct {
  unsigned char *p;
  size_t n;
} bytes;

static bytes image(long long declared, const char *header, size_t data_len) {
  size_t h = strlen(header);
  bytes b = {malloc(8 + h + data_len + 1), 8 + h + data_len};
  uint64_t len = declared < 0 ? (uint64_t)h : (uint64_t)declared;
  for (int i = 0; i < 8; i++) b.p[i] = (unsigned char)(len >> (8 * i));
  for (size_t i = 0; i < h; i++) b.p[8 + i] = header[i] == '\'' ? '"' : (unsigned char)header[i];
  for (size_t i = 0; i < data_len; i++) b.p[8 + h + i] = (unsigned char)i;
  return b;
}

static mrl_status parse(mrl_engine *e, bytes b, mrl_safetensors **f) {
  return mrl__safetensors_parse(e, "parse", "t.safetensors", b.p, b.n, f);
}

/* The header (with declared length) must be refused with this status and message part. */
#define REFUSES(e, declared, header, data_len, want, needle)                                       \
  do {                                                                                             \
    bytes b_ = image(declared, header, data_len);                                                  \
    mrl_safetensors *f_ = NULL;                                                                    \
    CHECK_FAILS(e, want, needle, parse(e, b_, &f_));                                               \
    CHECK(f_ == NULL);                                                                             \
    free(b_.p);                                                                                    \
  } while (0)

#define REFUSES_HEADER(e, header, data_len, needle)                                                \
  REFUSES(e, -1, header, data_len, MRL_ERR_INVALID, needle)






static mrl_tensor *tensor_of(mrl_engine *e, int rank, const int64_t *shape, const float *v,
                             size_t n) {
  mrl_tensor *t = NULL;
  MUST(mrl_tensor_from_data(e, rank, shape, v, n, &t));
  return t;
}

/* ---- refusals ---- */

static void test_refuses_bad_lengths(void) {
  mrl_engine *e = new_engine();
  mrl_safetensors *f = NULL;
  unsigned char seven[7] = {0};
  CHECK_FAILS(e, MRL_ERR_INVALID, "shorter than the 8-byte header length",
              mrl__safetensors_parse(e, "parse", "t", seven, 7, &f));
  CHECK_FAILS(e, MRL_ERR_INVALID, "shorter than the 8-byte header length",
              mrl__safetensors_parse(e, "parse", "t", seven, 0, &f));
  REFUSES(e, 100, "{}", 10, MRL_ERR_INVALID, "header length 100 goes beyond the end of the file");
  REFUSES(e, 100000001, "{}", 0, MRL_ERR_INVALID, "header length 100000001 is absurd");
  REFUSES(e, (long long)0x7FFFFFFFFFFFFFFFLL, "{}", 0, MRL_ERR_INVALID, "is absurd");
  /* one byte more than the file holds */
  REFUSES(e, 3, "{}", 0, MRL_ERR_INVALID, "goes beyond the end");
  CHECK(f == NULL);
  finish(e);
}

static void test_refuses_bad_json(void) {
  mrl_engine *e = new_engine();
  REFUSES_HEADER(e, "", 0, "header is not valid JSON");
  REFUSES_HEADER(e, "{'a':", 0, "header is not valid JSON");
  REFUSES_HEADER(e, "{} x", 0, "header is not valid JSON");
  REFUSES_HEADER(e, "{'a\xff':{}}", 0, "header is not valid UTF-8");
  REFUSES_HEADER(e, "{'\xed\xa0\x80':{}}", 0, "not valid UTF-8"); /* an encoded surrogate */
  REFUSES_HEADER(e, "[1, 2]", 0, "header is not a JSON object");
  REFUSES_HEADER(e, "'text'", 0, "header is not a JSON object");
  finish(e);
}

static void test_refuses_bad_entries(void) {
  mrl_engine *e = new_engine();
  REFUSES_HEADER(e, "{'w':5}", 0, "tensor \"w\": entry is not an object");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1]}}", 4,
                 "tensor \"w\": missing field \"data_offsets\"");
  REFUSES_HEADER(e, "{'w':{'shape':[1],'data_offsets':[0,4]}}", 4,
                 "tensor \"w\": missing field \"dtype\"");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','data_offsets':[0,4]}}", 4,
                 "tensor \"w\": missing field \"shape\"");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[0,4],'extra':1}}", 4,
                 "tensor \"w\": unexpected field \"extra\"");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 4,
                 "tensor \"w\": field \"dtype\" appears twice");
  REFUSES_HEADER(e, "{'w':{'dtype':'F12','shape':[1],'data_offsets':[0,4]}}", 4,
                 "tensor \"w\": unknown dtype \"F12\"");
  REFUSES_HEADER(e, "{'w':{'dtype':'f32','shape':[1],'data_offsets':[0,4]}}", 4,
                 "unknown dtype \"f32\"");
  REFUSES_HEADER(e, "{'w':{'dtype':4,'shape':[1],'data_offsets':[0,4]}}", 4,
                 "tensor \"w\": dtype is not a string");
  REFUSES_HEADER(e, "{'a\\u0000b':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 4,
                 "contains a NUL");
  REFUSES_HEADER(e, "{'a\\ud800':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 4,
                 "tensor name \"a\xed\xa0\x80\" is not valid UTF-8");
  finish(e);
}

static void test_refuses_bad_shapes(void) {
  mrl_engine *e = new_engine();
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':4,'data_offsets':[0,16]}}", 16,
                 "tensor \"w\": shape is not a list");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[-1],'data_offsets':[0,0]}}", 0,
                 "tensor \"w\": shape entry 0 is not a non-negative integer");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1,1.5],'data_offsets':[0,4]}}", 4,
                 "shape entry 1 is not a non-negative integer");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1e2],'data_offsets':[0,400]}}", 400,
                 "shape entry 0 is not a non-negative integer");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':['2'],'data_offsets':[0,8]}}", 8,
                 "shape entry 0 is not a non-negative integer");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[99999999999999999999],'data_offsets':[0,4]}}",
                 4, "shape entry 0 is not a non-negative integer");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1,1,1,1,1,1,1,1,1],'data_offsets':[0,4]}}", 4,
                 "tensor \"w\": shape has rank 9, more than 8");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[4294967296,4294967296],'data_offsets':[0,0]}}",
                 0, "tensor \"w\": the element count of its shape overflows");
  /* 2^61 elements fit in int64, their 2^63 bytes do not */
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[2305843009213693952],'data_offsets':[0,0]}}", 0,
                 "overflows");
  /* a zero dimension makes the tensor empty, but the other sizes must still fit */
  REFUSES_HEADER(e,
                 "{'w':{'dtype':'F32','shape':[0,4294967296,4294967296],'data_offsets':[0,0]}}",
                 0, "overflows");
  finish(e);
}

static void test_refuses_bad_offsets(void) {
  mrl_engine *e = new_engine();
  const char *msg = "tensor \"w\": data_offsets is not a list of two non-negative integers";
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1],'data_offsets':4}}", 4, msg);
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[4]}}", 4, msg);
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[0,4,8]}}", 8, msg);
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[-4,0]}}", 4, msg);
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[0,4.0]}}", 4, msg);
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[0,'4']}}", 4, msg);
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[1],'data_offsets':[8,4]}}", 8,
                 "tensor \"w\": data_offsets end 4 is before begin 8");
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 4,
                 "tensor \"w\": data_offsets end 8 is beyond the data (4 bytes)");
  REFUSES_HEADER(e,
                 "{'w':{'dtype':'F32','shape':[1],'data_offsets':[0,18446744073709551615]}}", 4,
                 msg); /* beyond int64: not an integer the reader accepts */
  REFUSES_HEADER(e, "{'w':{'dtype':'F32','shape':[2],'data_offsets':[0,4]}}", 4,
                 "tensor \"w\": data_offsets span 4 bytes, but F32 of shape (2) needs 8");
  REFUSES_HEADER(e, "{'w':{'dtype':'BF16','shape':[2,3],'data_offsets':[0,24]}}", 24,
                 "span 24 bytes, but BF16 of shape (2x3) needs 12");
  finish(e);
}

static void test_refuses_duplicates_and_overlaps(void) {
  mrl_engine *e = new_engine();
  REFUSES_HEADER(e,
                 "{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
                 "'a':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}",
                 8, "tensor \"a\" appears twice");
  REFUSES_HEADER(e,
                 "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
                 "'b':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}",
                 8, "tensor \"b\" (bytes 4..8) overlaps tensor \"a\" (bytes 0..8)");
  REFUSES_HEADER(e,
                 "{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
                 "'b':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}",
                 4, "overlaps");
  /* an empty tensor inside another one's bytes: the reference refuses it too */
  REFUSES_HEADER(e,
                 "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
                 "'z':{'dtype':'F32','shape':[0],'data_offsets':[4,4]}}",
                 8, "tensor \"z\" (bytes 4..4) overlaps");
  REFUSES_HEADER(e, "{'a':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}", 8,
                 "bytes 0..4 of the data belong to no tensor (before tensor \"a\")");
  REFUSES_HEADER(e, "{'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 12,
                 "the last 8 bytes of the data belong to no tensor");
  REFUSES_HEADER(e, "{}", 1, "the last 1 bytes of the data belong to no tensor");
  finish(e);
}

static void test_refuses_bad_metadata(void) {
  mrl_engine *e = new_engine();
  REFUSES_HEADER(e, "{'__metadata__':{'format':1}}", 0,
                 "__metadata__ value of \"format\" is not a string");
  REFUSES_HEADER(e, "{'__metadata__':{'a':'x','b':null}}", 0,
                 "__metadata__ value of \"b\" is not a string");
  REFUSES_HEADER(e, "{'__metadata__':['a']}", 0, "__metadata__ is not an object");
  REFUSES_HEADER(e, "{'__metadata__':{},'__metadata__':{}}", 0, "__metadata__ appears twice");
  REFUSES_HEADER(e, "{'__metadata__':{'k':'1','k':'2'}}", 0,
                 "__metadata__ key \"k\" appears twice");
  REFUSES_HEADER(e, "{'__metadata__':{'k':'a\\u0000b'}}", 0, "contains a NUL");
  finish(e);
}

/* Each refusal arrives the same way through the file API (mapped file). */
static void test_refuses_files(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  char path[256];
  snprintf(path, sizeof path, "%s/bad.safetensors", dir);
  bytes b = image(-1, "{'w':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 4);
  write_bytes(path, b.p, b.n);
  free(b.p);
  mrl_safetensors *f = NULL;
  CHECK_FAILS(e, MRL_ERR_INVALID, "bad.safetensors: tensor \"w\": data_offsets end 8 is beyond",
              mrl_safetensors_open(e, path, &f));
  write_bytes(path, "abc", 3);
  CHECK_FAILS(e, MRL_ERR_INVALID, "shorter than the 8-byte", mrl_safetensors_open(e, path, &f));
  write_bytes(path, "", 0);
  CHECK_FAILS(e, MRL_ERR_INVALID, "shorter than the 8-byte", mrl_safetensors_open(e, path, &f));
  CHECK_FAILS(e, MRL_ERR_IO, "not a regular file", mrl_safetensors_open(e, dir, &f));
  snprintf(path, sizeof path, "%s/fifo.safetensors", dir);
  CHECK(mkfifo(path, 0600) == 0);
  CHECK_FAILS(e, MRL_ERR_IO, "fifo.safetensors: not a regular file",
              mrl_safetensors_open(e, path, &f)); /* and it does not wait for a writer */
  snprintf(path, sizeof path, "%s/missing.safetensors", dir);
  CHECK_FAILS(e, MRL_ERR_IO, "missing.safetensors: cannot open", mrl_safetensors_open(e, path, &f));
  CHECK_FAILS(e, MRL_ERR_NULL, "path is NULL", mrl_safetensors_open(e, NULL, &f));
  CHECK(mrl_safetensors_open(NULL, path, &f) == MRL_ERR_NULL);
  CHECK(f == NULL);
  remove_tree(dir);
  finish(e);
}

/* ---- valid files ---- */

static void test_reads_valid_file(void) {
  mrl_engine *e = new_engine();
  /* tensors listed out of offset order, an empty one, a scalar, metadata and other dtypes */
  bytes b = image(-1,
                  "{'b':{'dtype':'F32','shape':[2],'data_offsets':[4,12]},"
                  "'__metadata__':{'format':'pt','note':'caf\xc3\xa9'},"
                  "'s':{'dtype':'F32','shape':[],'data_offsets':[0,4]},"
                  "'e':{'dtype':'BF16','shape':[3,0],'data_offsets':[12,12]},"
                  "'i':{'dtype':'I64','shape':[1],'data_offsets':[12,20]}}   ",
                  20);
  /* data: s = 1.5, b = {-2, 0.25}, i = 7 */
  float s = 1.5f, bv[2] = {-2.0f, 0.25f};
  memcpy(b.p + b.n - 20, &s, 4);
  memcpy(b.p + b.n - 16, bv, 8);
  memset(b.p + b.n - 8, 0, 8);
  b.p[b.n - 8] = 7;
  mrl_safetensors *f = NULL;
  MUST(parse(e, b, &f));
  CHECK(mrl_safetensors_count(f) == 4);
  CHECK(strcmp(mrl_safetensors_name(f, 0), "b") == 0);
  CHECK(strcmp(mrl_safetensors_name(f, 1), "s") == 0);
  CHECK(strcmp(mrl_safetensors_name(f, 3), "i") == 0);
  CHECK(mrl_safetensors_name(f, 4) == NULL && mrl_safetensors_name(f, -1) == NULL);
  CHECK(strcmp(mrl_safetensors_metadata(f, "format"), "pt") == 0);
  CHECK(strcmp(mrl_safetensors_metadata(f, "note"), "caf\xc3\xa9") == 0);
  CHECK(mrl_safetensors_metadata(f, "missing") == NULL);

  mrl_dtype dt = MRL_DTYPE_F16;
  int rank = -1;
  int64_t shape[MRL_MAX_RANK] = {0};
  MUST(mrl_safetensors_info(f, "e", &dt, &rank, shape));
  CHECK(dt == MRL_DTYPE_BF16 && rank == 2 && shape[0] == 3 && shape[1] == 0);
  MUST(mrl_safetensors_info(f, "s", &dt, &rank, shape));
  CHECK(dt == MRL_DTYPE_F32 && rank == 0);

  mrl_tensor *t = NULL;
  MUST(mrl_safetensors_read(f, "s", &t));
  CHECK(mrl_tensor_rank(t) == 0 && mrl_tensor_data(t)[0] == 1.5f);
  mrl_tensor_free(t);
  t = NULL;
  MUST(mrl_safetensors_read(f, "b", &t));
  CHECK(mrl_tensor_numel(t) == 2 && mrl_tensor_data(t)[0] == -2.0f &&
        mrl_tensor_data(t)[1] == 0.25f);
  mrl_tensor_free(t);
  t = NULL;
  MUST(mrl_safetensors_read(f, "e", &t));
  CHECK(mrl_tensor_numel(t) == 0 && mrl_tensor_rank(t) == 2);
  mrl_tensor_free(t);

  /* listed, but not readable as float32 */
  t = NULL;
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "tensor \"i\" has dtype I64; only F32, F16 and BF16",
              mrl_safetensors_read(f, "i", &t));
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "dtype I64", mrl_safetensors_info(f, "i", &dt, &rank, shape));
  CHECK_FAILS(e, MRL_ERR_INVALID, "no tensor named \"nope\"", mrl_safetensors_read(f, "nope", &t));
  CHECK_FAILS(e, MRL_ERR_NULL, "name is NULL", mrl_safetensors_read(f, NULL, &t));
  CHECK_FAILS(e, MRL_ERR_NULL, "out is NULL", mrl_safetensors_read(f, "s", NULL));
  CHECK(t == NULL);
  mrl_safetensors_close(f);
  free(b.p);

  CHECK(mrl_safetensors_count(NULL) == -1);
  CHECK(mrl_safetensors_name(NULL, 0) == NULL);
  CHECK(mrl_safetensors_metadata(NULL, "k") == NULL);
  mrl_safetensors_close(NULL);

  /* every dtype of the reference implementation is listed */
  static const char *const others[] = {"F64", "I64", "U64", "I32", "U32", "I16", "U16",
                                       "I8",  "U8",  "BOOL", "F8_E5M2", "F8_E4M3", "F8_E8M0"};
  static const int sizes[] = {8, 8, 8, 4, 4, 2, 2, 1, 1, 1, 1, 1, 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    char header[128];
    snprintf(header, sizeof header, "{'x':{'dtype':'%s','shape':[2],'data_offsets':[0,%d]}}",
             others[i], 2 * sizes[i]);
    bytes o = image(-1, header, (size_t)(2 * sizes[i]));
    f = NULL;
    CHECKF(parse(e, o, &f) == MRL_OK, "dtype %s: %s", others[i], mrl_engine_last_error(e));
    const mrl_safetensors_entry *en = mrl__safetensors_entry(f, 0);
    CHECK(en && strcmp(en->dtype, others[i]) == 0 && !en->readable);
    mrl_safetensors_close(f);
    free(o.p);
  }
  finish(e);
}

/* ---- conversions ---- */

static void test_f16_special_values(void) {
  mrl_engine *e = new_engine();
  static const uint16_t h[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00,
                               0xC000, 0x7BFF, 0x7C00, 0xFC00, 0x3555, 0x0200};
  const double want[] = {0.0, -0.0, ldexp(1, -24), -ldexp(1, -24), 1023 * ldexp(1, -24),
                         ldexp(1, -14), 1.0, -2.0, 65504.0, INFINITY, -INFINITY,
                         ldexp(1 + 341.0 / 1024, -2), ldexp(1, -15)};
  enum { N = sizeof h / sizeof h[0] };
  /* through a file, as a model loader meets them; NaNs last */
  char header[128];
  snprintf(header, sizeof header, "{'h':{'dtype':'F16','shape':[%d],'data_offsets':[0,%d]}}",
           N + 2, 2 * (N + 2));
  bytes b = image(-1, header, 2 * (N + 2));
  unsigned char *d = b.p + b.n - 2 * (N + 2);
  for (int i = 0; i < N; i++)
    d[2 * i] = (unsigned char)h[i], d[2 * i + 1] = (unsigned char)(h[i] >> 8);
  d[2 * N] = 0x00, d[2 * N + 1] = 0x7E;     /* quiet NaN */
  d[2 * N + 2] = 0x01, d[2 * N + 3] = 0xFD; /* negative signalling NaN, payload 0x101 */
  mrl_safetensors *f = NULL;
  MUST(parse(e, b, &f));
  mrl_tensor *t = NULL;
  MUST(mrl_safetensors_read(f, "h", &t));
  const float *v = mrl_tensor_data(t);
  for (int i = 0; i < N; i++) {
    CHECKF((double)v[i] == want[i] && !signbit(v[i]) == !signbit(want[i]),
           "f16 0x%04x -> %a, want %a", h[i], (double)v[i], want[i]);
  }
  CHECK(isnan(v[N]) && !signbit(v[N]));
  CHECK(isnan(v[N + 1]) && signbit(v[N + 1]));
  CHECK(f32_bits(v[N + 1]) == 0xFFA02000u); /* payload kept in the top mantissa bits */
  mrl_tensor_free(t);
  mrl_safetensors_close(f);
  free(b.p);
  /* every finite half against the textbook formula */
  int bad = 0;
  for (uint32_t x = 0; x < 0x10000; x++) {
    int exp = (x >> 10) & 0x1F, mant = x & 0x3FF;
    if (exp == 0x1F) continue;
    double ref = exp ? ldexp(1.0 + mant / 1024.0, exp - 15) : ldexp(mant, -24);
    if (x & 0x8000) ref = -ref;
    float got = mrl__f16_to_f32((uint16_t)x);
    if ((double)got != ref || !signbit(got) != !signbit(ref)) bad++;
  }
  CHECKF(bad == 0, "%d half values converted wrongly", bad);
  finish(e);
}

/* Independent reference for float32 -> bfloat16: the two neighbouring bfloat16 values compared
 * in double arithmetic, ties to the even mantissa. */
static uint16_t bf16_reference(float x) {
  uint32_t u = f32_bits(x), sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
  uint32_t lo_bits = mag & 0x7FFF0000u;
  double a = fabs((double)x), lo = (double)bits_f32(lo_bits);
  double hi = lo_bits == 0x7F7F0000u ? ldexp(1.0, 128) : (double)bits_f32(lo_bits + 0x10000u);
  uint32_t pick;
  if (a - lo < hi - a)
    pick = lo_bits;
  else if (a - lo > hi - a)
    pick = lo_bits + 0x10000u;
  else
    pick = (lo_bits >> 16) & 1 ? lo_bits + 0x10000u : lo_bits;
  return (uint16_t)((sign | pick) >> 16);
}

static void test_bf16_rounding(void) {
  static const uint32_t edges[] = {
      0x00000000u, 0x80000000u, 0x3F800000u, 0x3F808000u, /* tie: stays even */
      0x3F818000u,                                        /* tie: rounds up to even */
      0x3F808001u, 0x3F807FFFu, 0x7F7FFFFFu,              /* largest float: overflows */
      0x7F7F7FFFu, 0x7F7F8000u,                           /* tie at the top: to infinity */
      0x00000001u, 0x00008000u, 0x00018000u, 0x007FFFFFu, /* subnormals */
      0x7F800000u, 0xFF800000u, 0xC0490FDBu};
  int bad = 0;
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
    float x = bits_f32(edges[i]);
    if (mrl__f32_to_bf16(x) != bf16_reference(x)) {
      bad++;
      check_note("0x%08x -> 0x%04x, want 0x%04x", edges[i], mrl__f32_to_bf16(x),
                 bf16_reference(x));
    }
  }
  for (int i = 0; i < 1000000; i++) {
    float x = bits_f32(data_u32());
    if (isnan(x)) continue;
    if (mrl__f32_to_bf16(x) != bf16_reference(x)) bad++;
  }
  CHECKF(bad == 0, "%d values rounded wrongly", bad);
  /* NaN stays NaN (even one whose payload lives only in the low bits), keeping its sign */
  CHECK(isnan(mrl__bf16_to_f32(mrl__f32_to_bf16(bits_f32(0x7F800001u)))));
  CHECK(isnan(mrl__bf16_to_f32(mrl__f32_to_bf16(bits_f32(0xFFC00000u)))));
  CHECK(signbit(mrl__bf16_to_f32(mrl__f32_to_bf16(bits_f32(0xFFC00000u)))));
  /* BF16 widening is exact: the bits move up */
  CHECK(f32_bits(mrl__bf16_to_f32(0x3F80)) == 0x3F800000u);
  CHECK(f32_bits(mrl__bf16_to_f32(0x8001)) == 0x80010000u);
}

/* ---- writing ---- */

/* The exact files of the reference implementation's serialization tests. */
static void test_matches_reference_bytes(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  char path[256];
  snprintf(path, sizeof path, "%s/ref.safetensors", dir);
  static const unsigned char want1[] = {
      64,  0,   0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,  34,  58,
      123, 34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,  44,  34,  115, 104,
      97,  112, 101, 34,  58,  91,  49,  44,  50,  44,  51,  93,  44,  34,  100, 97,  116, 97,
      95,  111, 102, 102, 115, 101, 116, 115, 34,  58,  91,  48,  44,  50,  52,  93,  125, 125,
      0,   0,   0,   0,   0,   0,   128, 63,  0,   0,   0,   64,  0,   0,   64,  64,  0,   0,
      128, 64,  0,   0,   160, 64};
  const float v[6] = {0, 1, 2, 3, 4, 5};
  mrl_tensor *t = tensor_of(e, SHAPE(1, 2, 3), v, 6);
  const char *names[1] = {"attn.0"};
  MUST(mrl_safetensors_write(e, path, 1, names, &t, MRL_DTYPE_F32, 0, NULL, NULL));
  size_t n;
  unsigned char *got = read_bytes(path, &n);
  CHECK(n == sizeof want1 && memcmp(got, want1, n) == 0);
  free(got);
  mrl_tensor_free(t);

  static const unsigned char want_empty[] = {8,   0,   0,  0,  0,  0,  0,  0,
                                             123, 125, 32, 32, 32, 32, 32, 32};
  MUST(mrl_safetensors_write(e, path, 0, NULL, NULL, MRL_DTYPE_F32, 0, NULL, NULL));
  got = read_bytes(path, &n);
  CHECK(n == sizeof want_empty && memcmp(got, want_empty, n) == 0);
  free(got);

  static const unsigned char want_meta[] = {
      40, 0,   0,   0,   0,   0,   0,   0,   123, 34,  95,  95,  109, 101, 116, 97, 100,
      97, 116, 97,  95,  95,  34,  58,  123, 34,  102, 114, 97,  109, 101, 119, 111, 114,
      107, 34, 58,  34,  112, 116, 34,  125, 125, 32,  32,  32,  32,  32};
  const char *keys[1] = {"framework"}, *values[1] = {"pt"};
  MUST(mrl_safetensors_write(e, path, 0, NULL, NULL, MRL_DTYPE_F32, 1, keys, values));
  got = read_bytes(path, &n);
  CHECK(n == sizeof want_meta && memcmp(got, want_meta, n) == 0);
  free(got);
  CHECK(count_entries(dir) == 1); /* no temporary file left */
  remove_tree(dir);
  finish(e);
}

static void test_round_trip_f32(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  char path[256];
  snprintf(path, sizeof path, "%s/rt.safetensors", dir);
  enum { N = 3 * 5 };
  float a[N];
  for (int i = 0; i < N; i++) a[i] = bits_f32(data_u32());
  a[0] = bits_f32(0x7FA00001u); /* NaN with a payload */
  a[1] = -0.0f;
  a[2] = INFINITY;
  a[3] = bits_f32(0x00000001u);
  mrl_tensor *ta = tensor_of(e, SHAPE(3, 5), a, N);
  mrl_tensor *tt = NULL; /* a transposed (non-contiguous) view is written in its own order */
  MUST(mrl_tensor_transpose(ta, 0, 1, &tt));
  mrl_tensor *scalar = NULL, *empty = NULL;
  MUST(mrl_tensor_scalar(e, 42.0f, &scalar));
  MUST(mrl_tensor_new(e, SHAPE(0, 4), &empty));
  const char *names[4] = {"a", "a.T \"quoted\"\n", "s", "empty"};
  mrl_tensor *ts[4] = {ta, tt, scalar, empty};
  const char *keys[2] = {"k\\ey", "v"}, *values[2] = {"line1\nline2 \x01", "caf\xc3\xa9"};
  MUST(mrl_safetensors_write(e, path, 4, names, ts, MRL_DTYPE_F32, 2, keys, values));
  size_t n;
  unsigned char *raw = read_bytes(path, &n);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)raw[i] << (8 * i);
  CHECK(hlen % 8 == 0 && (raw[8 + hlen - 1] == ' ' || raw[8 + hlen - 1] == '}'));
  free(raw);

  mrl_safetensors *f = NULL;
  MUST(mrl_safetensors_open(e, path, &f));
  CHECK(mrl_safetensors_count(f) == 4);
  for (int i = 0; i < 4; i++) CHECK(strcmp(mrl_safetensors_name(f, i), names[i]) == 0);
  CHECK(strcmp(mrl_safetensors_metadata(f, "k\\ey"), values[0]) == 0);
  CHECK(strcmp(mrl_safetensors_metadata(f, "v"), values[1]) == 0);
  mrl_tensor *r = NULL;
  MUST(mrl_safetensors_read(f, "a", &r));
  CHECK(memcmp(mrl_tensor_data(r), a, sizeof a) == 0);
  mrl_tensor_free(r);
  r = NULL;
  MUST(mrl_safetensors_read(f, names[1], &r));
  CHECK(mrl_tensor_shape(r)[0] == 5 && mrl_tensor_shape(r)[1] == 3);
  int bad = 0;
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 3; j++)
      if (f32_bits(mrl_tensor_data(r)[i * 3 + j]) != f32_bits(a[j * 5 + i])) bad++;
  CHECK(bad == 0);
  mrl_tensor_free(r);
  r = NULL;
  MUST(mrl_safetensors_read(f, "s", &r));
  CHECK(mrl_tensor_rank(r) == 0 && mrl_tensor_data(r)[0] == 42.0f);
  mrl_tensor_free(r);
  mrl_safetensors_close(f);
  mrl_tensor_free(ta);
  mrl_tensor_free(tt);
  mrl_tensor_free(scalar);
  mrl_tensor_free(empty);
  CHECK(count_entries(dir) == 1);
  remove_tree(dir);
  finish(e);
}

static void test_round_trip_bf16(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  char path[256];
  snprintf(path, sizeof path, "%s/bf.safetensors", dir);
  enum { N = 4096 };
  float *a = malloc(sizeof(float) * N);
  for (int i = 0; i < N; i++) {
    float x = bits_f32(data_u32());
    a[i] = isnan(x) ? 1.0f : x;
  }
  a[0] = bits_f32(0x3F808000u); /* a tie */
  a[1] = NAN;
  mrl_tensor *t = tensor_of(e, SHAPE(64, 64), a, N);
  const char *names[1] = {"w"};
  MUST(mrl_safetensors_write(e, path, 1, names, &t, MRL_DTYPE_BF16, 0, NULL, NULL));
  mrl_safetensors *f = NULL;
  MUST(mrl_safetensors_open(e, path, &f));
  mrl_dtype dt;
  MUST(mrl_safetensors_info(f, "w", &dt, NULL, NULL));
  CHECK(dt == MRL_DTYPE_BF16);
  mrl_tensor *r = NULL;
  MUST(mrl_safetensors_read(f, "w", &r));
  int bad = 0;
  for (int i = 2; i < N; i++)
    if (f32_bits(mrl_tensor_data(r)[i]) != (uint32_t)bf16_reference(a[i]) << 16) bad++;
  CHECKF(bad == 0, "%d values differ from the reference rounding", bad);
  CHECK(f32_bits(mrl_tensor_data(r)[0]) == 0x3F800000u);
  CHECK(isnan(mrl_tensor_data(r)[1]));
  mrl_tensor_free(r);
  mrl_safetensors_close(f);
  mrl_tensor_free(t);
  free(a);
  remove_tree(dir);
  finish(e);
}

static void test_write_refusals(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  char path[256];
  snprintf(path, sizeof path, "%s/w.safetensors", dir);
  const float v[2] = {1, 2};
  mrl_tensor *t = tensor_of(e, SHAPE(2), v, 2);
  mrl_tensor *two[2] = {t, t};
  const char *dup[2] = {"x", "x"}, *meta_name[1] = {"__metadata__"}, *bad_utf8[1] = {"a\xff"};
  const char *ok_name[1] = {"x"};
  mrl_tensor *null_t[1] = {NULL};
  CHECK_FAILS(e, MRL_ERR_INVALID, "tensor name \"x\" appears twice",
              mrl_safetensors_write(e, path, 2, dup, two, MRL_DTYPE_F32, 0, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "\"__metadata__\" cannot name a tensor",
              mrl_safetensors_write(e, path, 1, meta_name, two, MRL_DTYPE_F32, 0, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "not valid UTF-8",
              mrl_safetensors_write(e, path, 1, bad_utf8, two, MRL_DTYPE_F32, 0, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_NULL, "tensor \"x\" is NULL",
              mrl_safetensors_write(e, path, 1, ok_name, null_t, MRL_DTYPE_F32, 0, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_UNSUPPORTED, "only F32 and BF16 can be written",
              mrl_safetensors_write(e, path, 1, ok_name, two, MRL_DTYPE_F16, 0, NULL, NULL));
  CHECK_FAILS(e, MRL_ERR_INVALID, "count is negative",
              mrl_safetensors_write(e, path, -1, ok_name, two, MRL_DTYPE_F32, 0, NULL, NULL));
  const char *keys[2] = {"k", "k"}, *values[2] = {"a", "b"}, *null_v[1] = {NULL};
  CHECK_FAILS(e, MRL_ERR_INVALID, "metadata key \"k\" appears twice",
              mrl_safetensors_write(e, path, 1, ok_name, two, MRL_DTYPE_F32, 2, keys, values));
  CHECK_FAILS(e, MRL_ERR_NULL, "metadata value of \"k\" is NULL",
              mrl_safetensors_write(e, path, 1, ok_name, two, MRL_DTYPE_F32, 1, keys, null_v));
  CHECK_FAILS(e, MRL_ERR_NULL, "names is NULL",
              mrl_safetensors_write(e, path, 1, NULL, two, MRL_DTYPE_F32, 0, NULL, NULL));
  CHECK(mrl_safetensors_write(NULL, path, 1, ok_name, two, MRL_DTYPE_F32, 0, NULL, NULL) ==
        MRL_ERR_NULL);
  CHECK(count_entries(dir) == 0);
  mrl_tensor_free(t);
  remove_tree(dir);
  finish(e);
}

/* A failed write leaves the target as it was and no temporary file. */
static void test_atomic_write(void) {
  mrl_engine *e = new_engine();
  const char *dir = temp_dir();
  char path[256], bad[300];
  snprintf(path, sizeof path, "%s/target.safetensors", dir);
  write_bytes(path, "previous", 8);
  static float v[100 * 100];
  for (int i = 0; i < 100 * 100; i++) v[i] = (float)i;
  mrl_tensor *t = tensor_of(e, SHAPE(100, 100), v, 100 * 100), *tt = NULL;
  MUST(mrl_tensor_transpose(t, 0, 1, &tt));
  const char *names[2] = {"a", "b"};
  mrl_tensor *ts[2] = {t, tt};

  /* the second tensor fails mid-write: the writer's 64 KiB buffer and small allocations fit
   * under the limit, the 40 KB contiguous copy of the transposed view does not */
  MUST(mrl_engine_set_memory_limit(e, mrl_engine_memory_used(e) + 65536 + 4096));
  CHECK_FAILS(e, MRL_ERR_NOMEM, "cannot allocate",
              mrl_safetensors_write(e, path, 2, names, ts, MRL_DTYPE_F32, 0, NULL, NULL));
  MUST(mrl_engine_set_memory_limit(e, 0));
  size_t n;
  unsigned char *got = read_bytes(path, &n);
  CHECK(n == 8 && memcmp(got, "previous", 8) == 0);
  free(got);
  CHECK(count_entries(dir) == 1);

  /* a directory that does not exist, and a "directory" that is a file */
  snprintf(bad, sizeof bad, "%s/missing/x.safetensors", dir);
  CHECK_FAILS(e, MRL_ERR_IO, "cannot create a temporary file beside it",
              mrl_safetensors_write(e, bad, 2, names, ts, MRL_DTYPE_F32, 0, NULL, NULL));
  snprintf(bad, sizeof bad, "%s/x.safetensors", path);
  CHECK_FAILS(e, MRL_ERR_IO, "cannot create a temporary file",
              mrl_safetensors_write(e, bad, 2, names, ts, MRL_DTYPE_F32, 0, NULL, NULL));
  /* a directory without write permission; root writes anywhere, so a root run tries it from a
   * child process that gave up root */
  chmod(dir, 0555);
  if (geteuid() != 0) {
    CHECK_FAILS(e, MRL_ERR_IO, "cannot create a temporary file",
                mrl_safetensors_write(e, path, 2, names, ts, MRL_DTYPE_F32, 0, NULL, NULL));
  } else {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
      mrl_status st = mrl_safetensors_write(e, path, 2, names, ts, MRL_DTYPE_F32, 0, NULL, NULL);
      _exit(st == MRL_ERR_IO && strstr(mrl_engine_last_error(e), "cannot create a temporary")
                ? 0
                : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
      check_note("cannot drop root: the read-only directory case is skipped");
    else
      CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
             "writing into a read-only directory did not fail as expected (status %d)", status);
  }
  chmod(dir, 0700);
  /* the target is a directory: the rename fails after the temporary file was written */
  char sub[300];
  snprintf(sub, sizeof sub, "%s/subdir", dir);
  mkdir(sub, 0700);
  char inner[320];
  snprintf(inner, sizeof inner, "%s/keep", sub);
  write_bytes(inner, "x", 1);
  CHECK_FAILS(e, MRL_ERR_IO, "rename failed",
              mrl_safetensors_write(e, sub, 2, names, ts, MRL_DTYPE_F32, 0, NULL, NULL));
  CHECK(count_entries(dir) == 2 && count_entries(sub) == 1);
  got = read_bytes(path, &n);
  CHECK(n == 8 && memcmp(got, "previous", 8) == 0);
  free(got);

  /* and a successful write replaces it */
  MUST(mrl_safetensors_write(e, path, 2, names, ts, MRL_DTYPE_F32, 0, NULL, NULL));
  mrl_safetensors *f = NULL;
  MUST(mrl_safetensors_open(e, path, &f));
  CHECK(mrl_safetensors_count(f) == 2);
  mrl_safetensors_close(f);
  CHECK(count_entries(dir) == 2);
  mrl_tensor_free(tt);
  mrl_tensor_free(t);
  remove_tree(dir);
  finish(e);
}

static const test_case tests[] = {
    {"refuses bad lengths", test_refuses_bad_lengths},
    {"refuses bad JSON", test_refuses_bad_json},
    {"refuses bad entries", test_refuses_bad_entries},
    {"refuses bad shapes", test_refuses_bad_shapes},
    {"refuses bad data_offsets", test_refuses_bad_offsets},
    {"refuses duplicates, overlaps and holes", test_refuses_duplicates_and_overlaps},
    {"refuses bad metadata", test_refuses_bad_metadata},
    {"refuses bad files", test_refuses_files},
    {"reads a valid file", test_reads_valid_file},
    {"F16 special values", test_f16_special_values},
    {"BF16 rounding", test_bf16_rounding},
    {"writes the reference's bytes", test_matches_reference_bytes},
    {"F32 round trip", test_round_trip_f32},
    {"BF16 round trip", test_round_trip_bf16},
    {"write refusals", test_write_refusals},
    {"atomic write", test_atomic_write},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
