/* safetensors.h - safetensors internals shared with model_io.c, the tests and the fuzzer: parsing
 * a file held in memory, reading one tensor into caller memory,.
 * Not installed. */
#ifndef MRL_SAFETENSORS_H
#define MRL_SAFETENSORS_H

#include "file.h"
#include "tensor_internal.h"

#include <stdio.h>

/* Headers longer than this are refused, as the reference implementation does. */
enum { MRL_SAFETENSORS_MAX_HEADER = 100000000 };

/* One tensor of an opened file, as its header describes it. */
typedef struct mrl_safetensors_entry {
  const char *name;      /* NUL-terminated; never contains a NUL */
  const char *dtype;     /* as written in the file: "F32", "BF16", "I64", ... (static string) */
  int dtype_size;        /* bytes per element */
  bool readable;         /* F32, F16 or BF16: can be converted to float32 */
  mrl_dtype mrl_dtype;   /* when readable */
  int rank;
  int64_t shape[MRL_MAX_RANK];
  int64_t numel;
  uint64_t begin, end;   /* byte range within the data that follows the header */
} mrl_safetensors_entry;

/* Parses and validates a whole safetensors file held in buf[0..size): every check happens here,
 * so a handle that exists can be read without further validation. buf is borrowed and must stay
 * valid and unchanged until mrl_safetensors_close. `what` names the file in messages ("fn: what:
 * problem"). *out: caller owns, mrl_safetensors_close. */
mrl_status mrl__safetensors_parse(mrl_engine *e, const char *fn, const char *what, const void *buf,
                                  size_t size, mrl_safetensors **out);

/* mrl_safetensors_open with messages attributed to fn. */
mrl_status mrl__safetensors_open(mrl_engine *e, const char *fn, const char *path,
                                 mrl_safetensors **out);

/* mrl_safetensors_write with messages attributed to fn. */
mrl_status mrl__safetensors_write(mrl_engine *e, const char *fn, const char *path, int64_t count,
                                  const char *const *names, mrl_tensor *const *tensors,
                                  mrl_dtype dtype, int64_t metadata_count,
                                  const char *const *metadata_keys,
                                  const char *const *metadata_values);

/* Tensor i in file order (NULL when out of range), and the index of a named tensor (-1 if none). */
const mrl_safetensors_entry *mrl__safetensors_entry(const mrl_safetensors *f, int64_t i);
int64_t mrl__safetensors_find(const mrl_safetensors *f, const char *name);

/* Converts tensor i to float32 into dst (numel floats, any alignment). F32 is copied bit for bit.
 * Fails with MRL_ERR_UNSUPPORTED when the dtype is not readable. */
mrl_status mrl__safetensors_read_into(const mrl_safetensors *f, const char *fn, int64_t i,
                                      float *dst);

/* Conversions (exposed for the tests): F16 and BF16 to float32 exactly (subnormals, infinities
 * and NaN payloads kept); float32 to BF16 rounding to nearest, ties to even, NaN staying NaN. */
float mrl__f16_to_f32(uint16_t h);
float mrl__bf16_to_f32(uint16_t h);
uint16_t mrl__f32_to_bf16(float x);

#endif /* MRL_SAFETENSORS_H */
