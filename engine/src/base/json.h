/* json.h - a strict JSON (RFC 8259) reader for the engine's file formats: safetensors headers,
 * config.json, tokenizer.json. Internal; not installed. The whole document lives in one arena,
 * freed at once. */
#ifndef MRL_JSON_H
#define MRL_JSON_H

#include "internal.h"

typedef enum {
  MRL_JSON_NULL,
  MRL_JSON_FALSE,
  MRL_JSON_TRUE,
  MRL_JSON_NUMBER,
  MRL_JSON_STRING,
  MRL_JSON_ARRAY,
  MRL_JSON_OBJECT
} mrl_json_type;

typedef struct mrl_json mrl_json;
struct mrl_json {
  mrl_json_type type;
  double number;     /* MRL_JSON_NUMBER */
  int64_t integer;   /* the number, when is_integer: written without fraction or exponent and
                        within int64 (exact, unlike the double beyond 2^53) */
  bool is_integer;
  const char *string; /* MRL_JSON_STRING (UTF-8, NUL-terminated; may also contain NULs) */
  size_t length;      /* string length in bytes; item count of arrays and objects */
  mrl_json *items;    /* array items or object values, `length` of them */
  const char **keys;  /* object keys (NUL-terminated), parallel to items */
  size_t *key_lengths;
};

typedef struct mrl_json_doc mrl_json_doc;

/* Parses text[0..len). Nesting deeper than 512 levels is refused. On failure returns
 * MRL_ERR_INVALID (or MRL_ERR_NOMEM) with "fn: what: line L, column C" in the engine's message,
 * where `what` names the document (e.g. "tokenizer.json"). *doc: free with mrl__json_free. */
mrl_status mrl__json_parse(mrl_engine *e, const char *fn, const char *what, const char *text,
                           size_t len, mrl_json_doc **doc);
const mrl_json *mrl__json_root(const mrl_json_doc *doc);
void mrl__json_free(mrl_json_doc *doc);

/* The value of key in an object (the last one if repeated), or NULL (also for non-objects). */
const mrl_json *mrl__json_get(const mrl_json *obj, const char *key);

#endif /* MRL_JSON_H */
