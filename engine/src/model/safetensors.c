/* safetensors.c - the safetensors file format: validating reader (mapped files or memory), float
 * conversions from F32/F16/BF16, and the atomic F32/BF16 writer. Built for untrusted files: the
 * whole header is checked before a handle exists, every byte range is proven inside the data, and
 * nothing past the validation reads memory it has not bounded. */
#include "safetensors.h"

#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every dtype of the reference implementation with a whole number of bytes per element. The first
 * three are the readable ones, in mrl_dtype order. */
static const struct {
  const char *name;
  int size;
} dtypes[] = {
    {"F32", 4},  {"F16", 2},  {"BF16", 2}, {"F64", 8},     {"I64", 8},     {"U64", 8},
    {"I32", 4},  {"U32", 4},  {"I16", 2},  {"U16", 2},     {"I8", 1},      {"U8", 1},
    {"BOOL", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
};
enum { READABLE_DTYPES = 3, NAME_SHOWN = 200 };

struct mrl_safetensors {
  mrl_engine *engine;
  const unsigned char *data; /* the bytes after the header */
  uint64_t data_size;
  void *map;                 /* the mapping to unmap at close (NULL when parsed from memory) */
  size_t map_size;
  mrl_json_doc *doc;         /* names and metadata strings point into it */
  int64_t count;
  mrl_safetensors_entry *entries;   /* file order */
  mrl_safetensors_entry **by_name;  /* sorted by name, for lookup */
  size_t nmeta;
  const char **meta_keys, **meta_values;
};

/* ---- conversions ---- */

static uint16_t load_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t load_u32(const unsigned char *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t load_u64(const unsigned char *p) {
  return (uint64_t)load_u32(p) | ((uint64_t)load_u32(p + 4) << 32);
}

static float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

float mrl__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_to_f32(sign | 0x7F800000u | (mant << 13)); /* inf, NaN payload */
  if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  /* zero or subnormal: mant * 2^-24, exact in float32 */
  float v = ldexpf((float)mant, -24);
  return sign ? -v : v;
}

float mrl__bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

uint16_t mrl__f32_to_bf16(float x) {
  uint32_t u = f32_to_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest, ties to the even result */
  return (uint16_t)(u >> 16);
}

/* ---- validation ---- */

/* Length of the valid UTF-8 prefix of s[0..n) (n when all of it is valid). */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return n;
}

static void free_handle(mrl_safetensors *f) {
  mrl_engine *e = f->engine;
  mrl__free(e, f->entries, sizeof *f->entries * (size_t)f->count);
  mrl__free(e, f->by_name, sizeof *f->by_name * (size_t)f->count);
  mrl__free(e, f->meta_keys, sizeof *f->meta_keys * f->nmeta);
  mrl__free(e, f->meta_values, sizeof *f->meta_values * f->nmeta);
  mrl__json_free(f->doc);
  if (f->map) munmap(f->map, f->map_size);
  mrl__free(e, f, sizeof *f);
  mrl__engine_release(e);
}

static int by_name_cmp(const void *a, const void *b) {
  return strcmp((*(mrl_safetensors_entry *const *)a)->name,
                (*(mrl_safetensors_entry *const *)b)->name);
}

static int by_offset_cmp(const void *a, const void *b) {
  const mrl_safetensors_entry *x = *(mrl_safetensors_entry *const *)a;
  const mrl_safetensors_entry *y = *(mrl_safetensors_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

static bool is_nonneg_integer(const mrl_json *v) {
  return v->type == MRL_JSON_NUMBER && v->is_integer && v->integer >= 0;
}

/* Fills one entry from its header value; the name is already set. */
static mrl_status parse_entry(mrl_engine *e, const char *fn, const char *what,
                              const mrl_json *v, uint64_t data_size, mrl_safetensors_entry *t) {
#define BAD(...) mrl__fail(e, MRL_ERR_INVALID, fn, __VA_ARGS__)
  const char *nm = t->name;
  if (v->type != MRL_JSON_OBJECT)
    return BAD("%s: tensor \"%.*s\": entry is not an object", what, NAME_SHOWN, nm);
  static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
  const mrl_json *field[3] = {NULL, NULL, NULL};
  for (size_t i = 0; i < v->length; i++) {
    int k = 0;
    while (k < 3 && !(v->key_lengths[i] == strlen(fields[k]) && strcmp(v->keys[i], fields[k]) == 0))
      k++;
    if (k == 3)
      return BAD("%s: tensor \"%.*s\": unexpected field \"%.*s\"", what, NAME_SHOWN, nm,
                 NAME_SHOWN, v->keys[i]);
    if (field[k])
      return BAD("%s: tensor \"%.*s\": field \"%s\" appears twice", what, NAME_SHOWN, nm,
                 fields[k]);
    field[k] = &v->items[i];
  }
  for (int k = 0; k < 3; k++)
    if (!field[k])
      return BAD("%s: tensor \"%.*s\": missing field \"%s\"", what, NAME_SHOWN, nm, fields[k]);

  const mrl_json *dt = field[0], *shape = field[1], *offs = field[2];
  if (dt->type != MRL_JSON_STRING)
    return BAD("%s: tensor \"%.*s\": dtype is not a string", what, NAME_SHOWN, nm);
  size_t d = 0, ndtypes = sizeof dtypes / sizeof dtypes[0];
  while (d < ndtypes &&
         !(strlen(dtypes[d].name) == dt->length && strcmp(dt->string, dtypes[d].name) == 0))
    d++;
  if (d == ndtypes)
    return BAD("%s: tensor \"%.*s\": unknown dtype \"%.*s\"", what, NAME_SHOWN, nm, NAME_SHOWN,
               dt->string);
  t->dtype = dtypes[d].name;
  t->dtype_size = dtypes[d].size;
  t->readable = d < READABLE_DTYPES;
  t->mrl_dtype = t->readable ? (mrl_dtype)d : MRL_DTYPE_F32;

  if (shape->type != MRL_JSON_ARRAY)
    return BAD("%s: tensor \"%.*s\": shape is not a list", what, NAME_SHOWN, nm);
  if (shape->length > MRL_MAX_RANK)
    return BAD("%s: tensor \"%.*s\": shape has rank %zu, more than %d", what, NAME_SHOWN, nm,
               shape->length, MRL_MAX_RANK);
  t->rank = (int)shape->length;
  for (int i = 0; i < t->rank; i++) {
    if (!is_nonneg_integer(&shape->items[i]))
      return BAD("%s: tensor \"%.*s\": shape entry %d is not a non-negative integer", what,
                 NAME_SHOWN, nm, i);
    t->shape[i] = shape->items[i].integer;
  }
  /* the product of the non-zero sizes must fit, as for every tensor of the engine */
  if (!mrl__numel(t->rank, t->shape, &t->numel) || t->numel > INT64_MAX / t->dtype_size)
    return BAD("%s: tensor \"%.*s\": the element count of its shape overflows", what, NAME_SHOWN,
               nm);

  if (offs->type != MRL_JSON_ARRAY || offs->length != 2 || !is_nonneg_integer(&offs->items[0]) ||
      !is_nonneg_integer(&offs->items[1]))
    return BAD("%s: tensor \"%.*s\": data_offsets is not a list of two non-negative integers",
               what, NAME_SHOWN, nm);
  t->begin = (uint64_t)offs->items[0].integer;
  t->end = (uint64_t)offs->items[1].integer;
  if (t->end < t->begin)
    return BAD("%s: tensor \"%.*s\": data_offsets end %llu is before begin %llu", what,
               NAME_SHOWN, nm, (unsigned long long)t->end, (unsigned long long)t->begin);
  if (t->end > data_size)
    return BAD("%s: tensor \"%.*s\": data_offsets end %llu is beyond the data (%llu bytes)", what,
               NAME_SHOWN, nm, (unsigned long long)t->end, (unsigned long long)data_size);
  uint64_t want = (uint64_t)t->numel * (uint64_t)t->dtype_size;
  if (t->end - t->begin != want) {
    char s[MRL_MAX_RANK * 24];
    mrl__shape_str(s, sizeof s, t->rank, t->shape);
    return BAD("%s: tensor \"%.*s\": data_offsets span %llu bytes, but %s of shape %s needs %llu",
               what, NAME_SHOWN, nm, (unsigned long long)(t->end - t->begin), t->dtype, s,
               (unsigned long long)want);
  }
  return MRL_OK;
#undef BAD
}

static mrl_status parse_metadata(mrl_engine *e, const char *fn, const char *what,
                                 const mrl_json *v, mrl_safetensors *f) {
  if (v->type == MRL_JSON_NULL) return MRL_OK;
  if (v->type != MRL_JSON_OBJECT)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: __metadata__ is not an object", what);
  if (v->length == 0) return MRL_OK;
  f->meta_keys = mrl__alloc(e, sizeof *f->meta_keys * v->length);
  f->meta_values = mrl__alloc(e, sizeof *f->meta_values * v->length);
  if (!f->meta_keys || !f->meta_values) {
    mrl__free(e, f->meta_keys, sizeof *f->meta_keys * v->length);
    mrl__free(e, f->meta_values, sizeof *f->meta_values * v->length);
    f->meta_keys = f->meta_values = NULL;
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "%s: out of memory", what);
  }
  f->nmeta = v->length;
  for (size_t i = 0; i < v->length; i++) {
    const char *k = v->keys[i];
    if (v->items[i].type != MRL_JSON_STRING)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: __metadata__ value of \"%.*s\" is not a string",
                       what, NAME_SHOWN, k);
    if (strlen(k) != v->key_lengths[i] || strlen(v->items[i].string) != v->items[i].length)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: __metadata__ entry \"%.*s\" contains a NUL",
                       what, NAME_SHOWN, k);
    for (size_t j = 0; j < i; j++)
      if (strcmp(f->meta_keys[j], k) == 0)
        return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: __metadata__ key \"%.*s\" appears twice",
                         what, NAME_SHOWN, k);
    f->meta_keys[i] = k;
    f->meta_values[i] = v->items[i].string;
  }
  return MRL_OK;
}

/* The data must be exactly tiled by the tensors in offset order: no overlap, no hole, nothing
 * after the last one (the reference's rule; it keeps a file from carrying hidden bytes). */
static mrl_status check_tiling(mrl_engine *e, const char *fn, const char *what,
                               mrl_safetensors *f) {
  mrl_safetensors_entry **order = NULL;
  if (f->count > 0) {
    order = mrl__alloc(e, sizeof *order * (size_t)f->count);
    if (!order) return mrl__fail(e, MRL_ERR_NOMEM, fn, "%s: out of memory", what);
    for (int64_t i = 0; i < f->count; i++) order[i] = &f->entries[i];
    qsort(order, (size_t)f->count, sizeof *order, by_offset_cmp);
  }
  mrl_status st = MRL_OK;
  uint64_t pos = 0;
  const mrl_safetensors_entry *prev = NULL;
  for (int64_t i = 0; i < f->count && !st; i++) {
    const mrl_safetensors_entry *t = order[i];
    if (t->begin < pos)
      st = mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: tensor \"%.*s\" (bytes %llu..%llu) overlaps tensor \"%.*s\" (bytes "
                     "%llu..%llu)",
                     what, NAME_SHOWN, t->name, (unsigned long long)t->begin,
                     (unsigned long long)t->end, NAME_SHOWN, prev->name,
                     (unsigned long long)prev->begin, (unsigned long long)prev->end);
    else if (t->begin > pos)
      st = mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: bytes %llu..%llu of the data belong to no tensor (before tensor "
                     "\"%.*s\")",
                     what, (unsigned long long)pos, (unsigned long long)t->begin, NAME_SHOWN,
                     t->name);
    pos = t->end;
    prev = t;
  }
  if (!st && pos != f->data_size)
    st = mrl__fail(e, MRL_ERR_INVALID, fn,
                   "%s: the last %llu bytes of the data belong to no tensor", what,
                   (unsigned long long)(f->data_size - pos));
  mrl__free(e, order, sizeof *order * (size_t)f->count);
  return st;
}

static mrl_status parse_header(mrl_engine *e, const char *fn, const char *what,
                               const unsigned char *b, size_t size, mrl_safetensors *f) {
  if (size < 8)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: the file is shorter than the 8-byte header length (%zu bytes)", what,
                     size);
  uint64_t n = load_u64(b);
  if (n > MRL_SAFETENSORS_MAX_HEADER)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: header length %llu is absurd (the limit is %d bytes)", what,
                     (unsigned long long)n, MRL_SAFETENSORS_MAX_HEADER);
  if (n > size - 8)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: header length %llu goes beyond the end of the file (%zu bytes)", what,
                     (unsigned long long)n, size);
  const unsigned char *header = b + 8;
  size_t valid = utf8_valid_prefix(header, (size_t)n);
  if (valid != n)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: header is not valid UTF-8 (at byte %zu)", what,
                     valid);
  f->data = header + n;
  f->data_size = size - 8 - n;

  char doc_what[NAME_SHOWN + 64];
  snprintf(doc_what, sizeof doc_what, "%.*s: header is not valid JSON", NAME_SHOWN, what);
  mrl_status st = mrl__json_parse(e, fn, doc_what, (const char *)header, (size_t)n, &f->doc);
  if (st) return st;
  const mrl_json *root = mrl__json_root(f->doc);
  if (root->type != MRL_JSON_OBJECT)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: header is not a JSON object", what);

  const mrl_json *meta = NULL;
  for (size_t i = 0; i < root->length; i++) {
    if (strcmp(root->keys[i], "__metadata__") != 0 || root->key_lengths[i] != 12) continue;
    if (meta) return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: __metadata__ appears twice", what);
    meta = &root->items[i];
  }
  f->count = (int64_t)root->length - (meta != NULL);
  if (meta && (st = parse_metadata(e, fn, what, meta, f))) return st;
  if (f->count == 0) return check_tiling(e, fn, what, f);

  f->entries = mrl__alloc(e, sizeof *f->entries * (size_t)f->count);
  f->by_name = mrl__alloc(e, sizeof *f->by_name * (size_t)f->count);
  if (!f->entries || !f->by_name) return mrl__fail(e, MRL_ERR_NOMEM, fn, "%s: out of memory", what);
  memset(f->entries, 0, sizeof *f->entries * (size_t)f->count);
  int64_t k = 0;
  for (size_t i = 0; i < root->length; i++) {
    if (&root->items[i] == meta) continue;
    mrl_safetensors_entry *t = &f->entries[k];
    t->name = root->keys[i];
    if (strlen(t->name) != root->key_lengths[i])
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: tensor name \"%.*s\" contains a NUL", what,
                       NAME_SHOWN, t->name);
    /* escapes are decoded after the raw check: "\ud800" alone would make a lone surrogate */
    if (utf8_valid_prefix((const unsigned char *)t->name, root->key_lengths[i]) !=
        root->key_lengths[i])
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: tensor name \"%.*s\" is not valid UTF-8",
                       what, NAME_SHOWN, t->name);
    if ((st = parse_entry(e, fn, what, &root->items[i], f->data_size, t))) return st;
    f->by_name[k] = t;
    k++;
  }
  qsort(f->by_name, (size_t)f->count, sizeof *f->by_name, by_name_cmp);
  for (int64_t i = 1; i < f->count; i++)
    if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s: tensor \"%.*s\" appears twice", what,
                       NAME_SHOWN, f->by_name[i]->name);
  return check_tiling(e, fn, what, f);
}

/* free_handle releases a half-parsed handle too: every array is NULL or sized by its count. */
static mrl_status parse_into_handle(mrl_engine *e, const char *fn, const char *what,
                                    const void *buf, size_t size, void *map,
                                    mrl_safetensors **out) {
  mrl_safetensors *f = mrl__alloc(e, sizeof *f);
  if (!f) {
    if (map) munmap(map, size);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "%s: out of memory", what);
  }
  memset(f, 0, sizeof *f);
  f->engine = e;
  f->map = map;
  f->map_size = size;
  mrl__engine_retain(e);
  mrl_status st = parse_header(e, fn, what, buf, size, f);
  if (st) {
    free_handle(f);
    return st;
  }
  *out = f;
  return MRL_OK;
}

mrl_status mrl__safetensors_parse(mrl_engine *e, const char *fn, const char *what, const void *buf,
                                  size_t size, mrl_safetensors **out) {
  if (!e) return MRL_ERR_NULL;
  if ((!buf && size) || !out)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", out ? "buf" : "out");
  return parse_into_handle(e, fn, what, buf ? buf : "", size, NULL, out);
}

mrl_status mrl__safetensors_open(mrl_engine *e, const char *fn, const char *path,
                                 mrl_safetensors **out) {
  /* O_NONBLOCK: a FIFO is refused below instead of waiting for a writer */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return mrl__fail(e, MRL_ERR_IO, fn, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int err = errno;
    close(fd);
    return mrl__fail(e, MRL_ERR_IO, fn, "%s: cannot stat: %s", path, strerror(err));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return mrl__fail(e, MRL_ERR_IO, fn, "%s: not a regular file", path);
  }
  size_t size = (size_t)sb.st_size;
  if (size < 8) {
    close(fd);
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "%s: the file is shorter than the 8-byte header length (%zu bytes)", path,
                     size);
  }
  /* as with every mapped reader, the reference's included, a file truncated by another process
   * while mapped faults on access; moonrl never writes a file in place, it renames new ones */
  void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  close(fd); /* the mapping keeps the file */
  if (map == MAP_FAILED)
    return mrl__fail(e, MRL_ERR_IO, fn, "%s: cannot map: %s", path, strerror(err));
  return parse_into_handle(e, fn, path, map, size, map, out);
}

/* ---- public reader ---- */

mrl_status mrl_safetensors_open(mrl_engine *e, const char *path, mrl_safetensors **out) {
  const char *fn = "mrl_safetensors_open";
  if (!e) return MRL_ERR_NULL;
  if (!path || !out) return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", path ? "out" : "path");
  return mrl__safetensors_open(e, fn, path, out);
}

void mrl_safetensors_close(mrl_safetensors *f) {
  if (f) free_handle(f);
}

int64_t mrl_safetensors_count(const mrl_safetensors *f) { return f ? f->count : -1; }

const char *mrl_safetensors_name(const mrl_safetensors *f, int64_t i) {
  const mrl_safetensors_entry *t = mrl__safetensors_entry(f, i);
  return t ? t->name : NULL;
}

const mrl_safetensors_entry *mrl__safetensors_entry(const mrl_safetensors *f, int64_t i) {
  return f && i >= 0 && i < f->count ? &f->entries[i] : NULL;
}

int64_t mrl__safetensors_find(const mrl_safetensors *f, const char *name) {
  int64_t lo = 0, hi = f->count;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    int c = strcmp(f->by_name[mid]->name, name);
    if (c == 0) return f->by_name[mid] - f->entries;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}

/* The named entry, or a failure naming what is wrong. */
static mrl_status lookup(const mrl_safetensors *f, const char *fn, const char *name,
                         const mrl_safetensors_entry **out) {
  if (!name) return mrl__fail(f->engine, MRL_ERR_NULL, fn, "name is NULL");
  int64_t i = mrl__safetensors_find(f, name);
  if (i < 0)
    return mrl__fail(f->engine, MRL_ERR_INVALID, fn, "no tensor named \"%.*s\"", NAME_SHOWN, name);
  const mrl_safetensors_entry *t = &f->entries[i];
  if (!t->readable)
    return mrl__fail(f->engine, MRL_ERR_UNSUPPORTED, fn,
                     "tensor \"%.*s\" has dtype %s; only F32, F16 and BF16 can be read",
                     NAME_SHOWN, name, t->dtype);
  *out = t;
  return MRL_OK;
}

mrl_status mrl_safetensors_info(const mrl_safetensors *f, const char *name, mrl_dtype *dtype,
                                int *rank, int64_t *shape) {
  if (!f) return MRL_ERR_NULL;
  const mrl_safetensors_entry *t;
  mrl_status st = lookup(f, "mrl_safetensors_info", name, &t);
  if (st) return st;
  if (dtype) *dtype = t->mrl_dtype;
  if (rank) *rank = t->rank;
  if (shape) memcpy(shape, t->shape, sizeof *shape * (size_t)t->rank);
  return MRL_OK;
}

mrl_status mrl__safetensors_read_into(const mrl_safetensors *f, const char *fn, int64_t i,
                                      float *dst) {
  const mrl_safetensors_entry *t = &f->entries[i];
  if (!t->readable)
    return mrl__fail(f->engine, MRL_ERR_UNSUPPORTED, fn,
                     "tensor \"%.*s\" has dtype %s; only F32, F16 and BF16 can be read",
                     NAME_SHOWN, t->name, t->dtype);
  const unsigned char *p = f->data + t->begin;
  switch (t->mrl_dtype) {
  case MRL_DTYPE_F32:
    for (int64_t k = 0; k < t->numel; k++) dst[k] = bits_to_f32(load_u32(p + 4 * k));
    break;
  case MRL_DTYPE_F16:
    for (int64_t k = 0; k < t->numel; k++) dst[k] = mrl__f16_to_f32(load_u16(p + 2 * k));
    break;
  case MRL_DTYPE_BF16:
    for (int64_t k = 0; k < t->numel; k++) dst[k] = mrl__bf16_to_f32(load_u16(p + 2 * k));
    break;
  }
  return MRL_OK;
}

mrl_status mrl_safetensors_read(mrl_safetensors *f, const char *name, mrl_tensor **out) {
  const char *fn = "mrl_safetensors_read";
  if (!f) return MRL_ERR_NULL;
  if (!out) return mrl__fail(f->engine, MRL_ERR_NULL, fn, "out is NULL");
  const mrl_safetensors_entry *t;
  mrl_status st = lookup(f, fn, name, &t);
  if (st) return st;
  mrl_tensor *r;
  if ((st = mrl__tensor_alloc(f->engine, fn, t->rank, t->shape, &r))) return st;
  mrl__safetensors_read_into(f, fn, t - f->entries, r->data); /* readable: cannot fail */
  *out = r;
  return MRL_OK;
}

const char *mrl_safetensors_metadata(const mrl_safetensors *f, const char *key) {
  if (!f || !key) return NULL;
  for (size_t i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
  return NULL;
}

/* ---- writer ---- */

/* A growing text buffer for the header; `failed` records an allocation failure. */
typedef struct {
  mrl_engine *e;
  char *s;
  size_t n, cap;
  bool failed;
} text;

static void text_add(text *t, const char *s, size_t len) {
  if (t->failed) return;
  if (t->cap - t->n < len + 1) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap - t->n < len + 1) cap *= 2;
    char *s2 = mrl__alloc(t->e, cap);
    if (!s2) {
      t->failed = true;
      return;
    }
    if (t->n) memcpy(s2, t->s, t->n);
    mrl__free(t->e, t->s, t->cap);
    t->s = s2;
    t->cap = cap;
  }
  memcpy(t->s + t->n, s, len);
  t->n += len;
  t->s[t->n] = '\0';
}

static void text_str(text *t, const char *s) { text_add(t, s, strlen(s)); }

/* A JSON string literal, escaped as serde_json (the reference's serializer) does. */
static void text_json_string(text *t, const char *s) {
  text_add(t, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[8];
    switch (*p) {
    case '"': text_add(t, "\\\"", 2); break;
    case '\\': text_add(t, "\\\\", 2); break;
    case '\b': text_add(t, "\\b", 2); break;
    case '\f': text_add(t, "\\f", 2); break;
    case '\n': text_add(t, "\\n", 2); break;
    case '\r': text_add(t, "\\r", 2); break;
    case '\t': text_add(t, "\\t", 2); break;
    default:
      if (*p < 0x20) {
        snprintf(esc, sizeof esc, "\\u%04x", *p);
        text_str(t, esc);
      } else {
        text_add(t, (const char *)p, 1);
      }
    }
  }
  text_add(t, "\"", 1);
}

static int cmp_strings(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks that a list of strings has no NULL, no invalid UTF-8 and no repeats; `kind` names them. */
static mrl_status check_names(mrl_engine *e, const char *fn, const char *kind, int64_t n,
                              const char *const *names) {
  for (int64_t i = 0; i < n; i++) {
    if (!names[i]) return mrl__fail(e, MRL_ERR_NULL, fn, "%s %lld is NULL", kind, (long long)i);
    size_t len = strlen(names[i]);
    if (utf8_valid_prefix((const unsigned char *)names[i], len) != len)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "%s \"%.*s\" is not valid UTF-8", kind, NAME_SHOWN,
                       names[i]);
  }
  if (n < 2) return MRL_OK;
  const char **sorted = mrl__alloc(e, sizeof *sorted * (size_t)n);
  if (!sorted) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  memcpy(sorted, names, sizeof *sorted * (size_t)n);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_strings);
  mrl_status st = MRL_OK;
  for (int64_t i = 1; i < n && !st; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0)
      st = mrl__fail(e, MRL_ERR_INVALID, fn, "%s \"%.*s\" appears twice", kind, NAME_SHOWN,
                     sorted[i]);
  mrl__free(e, sorted, sizeof *sorted * (size_t)n);
  return st;
}

/* The header as the reference writes it: compact JSON, __metadata__ first, tensors in the given
 * order at consecutive offsets, padded with spaces to a multiple of 8 bytes. */
static mrl_status build_header(mrl_engine *e, const char *fn, text *h, int64_t count,
                               const char *const *names, mrl_tensor *const *tensors,
                               int elem_size, const char *dtype, int64_t metadata_count,
                               const char *const *keys, const char *const *values) {
  text_str(h, "{");
  if (metadata_count > 0) {
    text_str(h, "\"__metadata__\":{");
    for (int64_t i = 0; i < metadata_count; i++) {
      if (i) text_str(h, ",");
      text_json_string(h, keys[i]);
      text_str(h, ":");
      text_json_string(h, values[i]);
    }
    text_str(h, "}");
  }
  uint64_t offset = 0;
  for (int64_t i = 0; i < count; i++) {
    const mrl_tensor *t = tensors[i];
    if (metadata_count > 0 || i) text_str(h, ",");
    text_json_string(h, names[i]);
    text_str(h, ":{\"dtype\":\"");
    text_str(h, dtype);
    text_str(h, "\",\"shape\":[");
    char num[48];
    for (int d = 0; d < t->rank; d++) {
      snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)t->shape[d]);
      text_str(h, num);
    }
    uint64_t end = offset + (uint64_t)t->numel * (uint64_t)elem_size;
    snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
             (unsigned long long)end);
    text_str(h, num);
    offset = end;
  }
  text_str(h, "}");
  while (h->n % 8) text_str(h, " ");
  if (h->failed) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory for the header");
  if (h->n > MRL_SAFETENSORS_MAX_HEADER)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "the header would be %zu bytes, over the limit of %d",
                     h->n, MRL_SAFETENSORS_MAX_HEADER);
  return MRL_OK;
}

enum { CHUNK_FLOATS = 16384 };

/* Writes one tensor's elements, little-endian, converting through a bounded scratch buffer. */
static mrl_status write_tensor(mrl_engine *e, const char *fn, FILE *fp, mrl_tensor *t,
                               mrl_dtype dtype, unsigned char *scratch) {
  mrl_tensor *dense = NULL;
  const float *src = t->data;
  if (!mrl__is_contiguous(t)) {
    mrl_status st = mrl__tensor_alloc(e, fn, t->rank, t->shape, &dense);
    if (st) return st;
    mrl_tensor_copy(dense, t); /* same shape: cannot fail */
    src = dense->data;
  }
  for (int64_t k = 0; k < t->numel; k += CHUNK_FLOATS) {
    int64_t n = t->numel - k < CHUNK_FLOATS ? t->numel - k : CHUNK_FLOATS;
    size_t bytes = 0;
    for (int64_t j = 0; j < n; j++) {
      uint32_t u = dtype == MRL_DTYPE_F32 ? f32_to_bits(src[k + j]) : mrl__f32_to_bf16(src[k + j]);
      int width = dtype == MRL_DTYPE_F32 ? 4 : 2;
      for (int b = 0; b < width; b++) scratch[bytes++] = (unsigned char)(u >> (8 * b));
    }
    if (fwrite(scratch, 1, bytes, fp) != bytes) break; /* mrl__atomic_commit reports it */
  }
  mrl_tensor_free(dense);
  return MRL_OK;
}

mrl_status mrl_safetensors_write(mrl_engine *e, const char *path, int64_t count,
                                 const char *const *names, mrl_tensor *const *tensors,
                                 mrl_dtype dtype, int64_t metadata_count,
                                 const char *const *metadata_keys,
                                 const char *const *metadata_values) {
  if (!e) return MRL_ERR_NULL;
  return mrl__safetensors_write(e, "mrl_safetensors_write", path, count, names, tensors, dtype,
                                metadata_count, metadata_keys, metadata_values);
}

mrl_status mrl__safetensors_write(mrl_engine *e, const char *fn, const char *path, int64_t count,
                                  const char *const *names, mrl_tensor *const *tensors,
                                  mrl_dtype dtype, int64_t metadata_count,
                                  const char *const *metadata_keys,
                                  const char *const *metadata_values) {
  if (!path) return mrl__fail(e, MRL_ERR_NULL, fn, "path is NULL");
  if (count < 0 || metadata_count < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "%s is negative",
                     count < 0 ? "count" : "metadata_count");
  if (count > 0 && (!names || !tensors))
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL", names ? "tensors" : "names");
  if (metadata_count > 0 && (!metadata_keys || !metadata_values))
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL",
                     metadata_keys ? "metadata_values" : "metadata_keys");
  if (dtype != MRL_DTYPE_F32 && dtype != MRL_DTYPE_BF16)
    return mrl__fail(e, dtype == MRL_DTYPE_F16 ? MRL_ERR_UNSUPPORTED : MRL_ERR_INVALID, fn,
                     "dtype %d: only F32 and BF16 can be written", (int)dtype);
  mrl_status st;
  if ((st = check_names(e, fn, "tensor name", count, names))) return st;
  if ((st = check_names(e, fn, "metadata key", metadata_count, metadata_keys))) return st;
  for (int64_t i = 0; i < count; i++) {
    if (!tensors[i])
      return mrl__fail(e, MRL_ERR_NULL, fn, "tensor \"%.*s\" is NULL", NAME_SHOWN, names[i]);
    if (strcmp(names[i], "__metadata__") == 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "\"__metadata__\" cannot name a tensor");
  }
  for (int64_t i = 0; i < metadata_count; i++) {
    if (!metadata_values[i])
      return mrl__fail(e, MRL_ERR_NULL, fn, "metadata value of \"%.*s\" is NULL", NAME_SHOWN,
                       metadata_keys[i]);
    size_t len = strlen(metadata_values[i]);
    if (utf8_valid_prefix((const unsigned char *)metadata_values[i], len) != len)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "metadata value of \"%.*s\" is not valid UTF-8",
                       NAME_SHOWN, metadata_keys[i]);
  }

  int elem = dtype == MRL_DTYPE_F32 ? 4 : 2;
  text h = {.e = e};
  st = build_header(e, fn, &h, count, names, tensors, elem, dtype == MRL_DTYPE_F32 ? "F32" : "BF16",
                    metadata_count, metadata_keys, metadata_values);
  unsigned char *scratch = st ? NULL : mrl__alloc(e, (size_t)CHUNK_FLOATS * 4);
  if (!st && !scratch) st = mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  mrl_atomic_file af;
  if (!st) st = mrl__atomic_begin(e, fn, path, &af);
  if (!st) {
    unsigned char len[8];
    for (int b = 0; b < 8; b++) len[b] = (unsigned char)((uint64_t)h.n >> (8 * b));
    fwrite(len, 1, 8, af.fp);
    fwrite(h.s, 1, h.n, af.fp);
    for (int64_t i = 0; i < count && !st; i++)
      st = write_tensor(e, fn, af.fp, tensors[i], dtype, scratch);
    if (st)
      mrl__atomic_abort(&af);
    else
      st = mrl__atomic_commit(&af);
  }
  mrl__free(e, scratch, (size_t)CHUNK_FLOATS * 4);
  mrl__free(e, h.s, h.cap);
  return st;
}
