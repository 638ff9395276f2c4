/* lua_json.c - rl.json, a JSON codec for Lua over the engine's strict reader (json.h):
 *
 *   rl.json.decode(text) -> value, or nil, message ("bad number at line 1, column 7") for
 *     malformed text; raises only when text is not a string or memory runs out. Objects become
 *     tables, arrays become sequences (1-based) marked as arrays (see below), numbers written
 *     without fraction or exponent that fit in 64 bits become integers and all others floats,
 *     strings keep their bytes (NULs included) and null becomes rl.json.null. nil always means
 *     failure: decode("null") returns rl.json.null.
 *   rl.json.encode(value [, {indent = n}]) -> text (compact, or pretty with n spaces when n > 0).
 *     A table whose keys are exactly 1..n (n >= 1) is an array; so is a table marked as one,
 *     even empty. Any other table is an object with its keys sorted bytewise, so equal values
 *     give equal text; numeric keys are written as strings. nil and rl.json.null are null.
 *     Raises "json.encode: <path>: <why>", e.g. "json.encode: value.a[3]: cannot encode a
 *     function", for functions, threads, userdata, NaN and infinities, keys that are neither
 *     strings nor numbers, a number key and a string key written alike, cycles, nesting deeper
 *     than 200 and marked arrays whose keys are not 1..n.
 *   rl.json.array([t]) -> t (a new table without t): marks t as an array, so that an empty one
 *     is written [] and not {}. The mark is a shared metatable with __jsontype = "array"; any
 *     metatable with that field marks its tables the same way.
 *   rl.json.null: a light userdata, equal only to itself, standing for JSON null (it is truthy).
 *
 * Numbers: integers are written as integers (2^53 + 1 and math.mininteger round-trip exactly);
 * a float is written with the shortest of %.14g..%.17g that reads back as the same double, and
 * with ".0" added when that text would read back as an integer, so decode(encode(x)) == x and
 * keeps math.type: 2.0 -> "2.0", -0.0 -> "-0.0" (the sign survives), 1e300 -> "1e+300".
 * Strings: " \ and control characters are escaped (\n \r \t \b \f, others \u00XX) and valid UTF-8
 * is written as it is. The output is always valid UTF-8, whatever the bytes: each byte b of a
 * string that is not part of a valid UTF-8 sequence (a policy's broken bytes) is written as the
 * private-use code point U+10FE00 + b (b in 0x80..0xFF, so U+10FE80..U+10FEFF, the bytes
 * F4 8F BA/BB xx), and so is each byte of a genuine U+10FE80..U+10FEFF, which keeps the mapping
 * reversible. Strict readers (Python's json, jq, serde, Go) accept the file; decode turns those
 * code points back into the bytes, so decode(encode(s)) == s for every byte string. Lone
 * surrogate escapes (\udcXX, Python's surrogateescape) were not used: some readers reject them
 * or replace them with U+FFFD, and a Python str holding them cannot be printed or re-encoded.
 * decode also reads raw bytes that are not UTF-8 as they are. */
#include "json.h"
#include "lua_internal.h"
#include "utf8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DOC_MT "moonrl.json.doc"       /* a parsed document awaiting conversion */
#define BUFFER_MT "moonrl.json.buffer" /* encode's growing output */
#define ARRAY_MT "moonrl.json.array"   /* the array mark */

enum { MAX_ENCODE_DEPTH = 200 };

/* Bytes that are not UTF-8 travel as U+10FE00 + byte (see the top): F4 8F BA|BB 80..BF. */
enum { RAW_BYTE_BASE = 0x10FE00, RAW_BYTE_FIRST = 0x10FE80, RAW_BYTE_LAST = 0x10FEFF };

static char json_null; /* its address is rl.json.null */

/* ---- shared ---- */

/* Writes x into buf (room for 32) as described at the top; returns the length. */
static size_t format_float(char *buf, double x) {
  int n = 0;
  for (int prec = 14; prec <= 17; prec++) {
    n = snprintf(buf, 32, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  if (strspn(buf, "-0123456789") == (size_t)n) {
    memcpy(buf + n, ".0", 3);
    n += 2;
  }
  return (size_t)n;
}

/* ---- decode ---- */

typedef struct {
  mrl_json_doc *doc; /* NULL once freed */
} doc_box;

static int doc_box_free(lua_State *L) {
  doc_box *b = luaL_checkudata(L, 1, DOC_MT);
  mrl__json_free(b->doc);
  b->doc = NULL;
  return 0;
}

/* Pushes s[0..n) as a Lua string, each U+10FE80..U+10FEFF turned back into the byte it stands
 * for. */
static void push_string(lua_State *L, const char *s, size_t n) {
  if (!memchr(s, 0xF4, n)) {
    lua_pushlstring(L, s, n);
    return;
  }
  luaL_Buffer buf;
  char *out = luaL_buffinitsize(L, &buf, n);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const unsigned char *u = (const unsigned char *)s + i;
    if (u[0] == 0xF4 && n - i >= 4 && u[1] == 0x8F && (u[2] == 0xBA || u[2] == 0xBB) &&
        (u[3] & 0xC0) == 0x80) {
      out[k++] = (char)((u[2] == 0xBA ? 0x80 : 0xC0) | (u[3] & 0x3F));
      i += 3;
    } else {
      out[k++] = s[i];
    }
  }
  luaL_pushresultsize(&buf, k);
}

/* Pushes v as a Lua value; array_mt is the stack index of the array mark. */
static void push_value(lua_State *L, const mrl_json *v, int array_mt) {
  luaL_checkstack(L, 4, "json.decode: nested too deeply");
  switch (v->type) {
  case MRL_JSON_NULL: lua_pushlightuserdata(L, &json_null); break;
  case MRL_JSON_FALSE: lua_pushboolean(L, 0); break;
  case MRL_JSON_TRUE: lua_pushboolean(L, 1); break;
  case MRL_JSON_NUMBER:
    if (v->is_integer)
      lua_pushinteger(L, (lua_Integer)v->integer);
    else
      lua_pushnumber(L, (lua_Number)v->number);
    break;
  case MRL_JSON_STRING: push_string(L, v->string, v->length); break;
  case MRL_JSON_ARRAY:
    lua_createtable(L, v->length > INT32_MAX ? INT32_MAX : (int)v->length, 0);
    for (size_t i = 0; i < v->length; i++) {
      push_value(L, &v->items[i], array_mt);
      lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    lua_pushvalue(L, array_mt);
    lua_setmetatable(L, -2);
    break;
  case MRL_JSON_OBJECT:
    lua_createtable(L, 0, v->length > INT32_MAX ? INT32_MAX : (int)v->length);
    for (size_t i = 0; i < v->length; i++) { /* in order: a repeated key keeps its last value */
      push_string(L, v->keys[i], v->key_lengths[i]);
      push_value(L, &v->items[i], array_mt);
      lua_rawset(L, -3);
    }
    break;
  }
}

static int l_decode(lua_State *L) {
  static const char fn[] = "json.decode", what[] = "text";
  if (lua_type(L, 1) != LUA_TSTRING) return luaL_typeerror(L, 1, "string");
  size_t len;
  const char *text = lua_tolstring(L, 1, &len);
  mrl_engine *e = mrl__lua_engine(L);
  lua_settop(L, 1);
  luaL_getmetatable(L, ARRAY_MT); /* 2 */
  /* 3: the document lives in a box closed on return or error, so a raise cannot leak it */
  doc_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->doc = NULL;
  luaL_setmetatable(L, DOC_MT);
  lua_toclose(L, 3);
  mrl_status st = mrl__json_parse(e, fn, what, text, len, &b->doc);
  if (st == MRL_ERR_INVALID) {
    /* malformed text is an expected failure: nil and "what at line L, column C" */
    const char *msg = mrl_engine_last_error(e);
    size_t skip = strlen(fn) + strlen(what) + 4; /* "fn: what: " */
    lua_pushnil(L);
    lua_pushstring(L, strlen(msg) > skip ? msg + skip : msg);
    mrl_engine_clear_error(e);
    return 2;
  }
  if (st) return mrl__lua_raise(L, e, st, 0);
  push_value(L, mrl__json_root(b->doc), 2);
  return 1;
}

/* ---- encode ---- */

typedef struct {
  char *data; /* from the state's allocator; NULL until the first write and once freed */
  size_t len, cap;
  lua_Alloc alloc;
  void *alloc_ud;
} json_buffer;

static int buffer_free(lua_State *L) {
  json_buffer *b = luaL_checkudata(L, 1, BUFFER_MT);
  if (b->data) b->alloc(b->alloc_ud, b->data, b->cap, 0);
  b->data = NULL;
  b->len = b->cap = 0;
  return 0;
}

/* One step of the path from the value to the one being written: an array index, or the stack
 * index of an object's key (key != 0). */
typedef struct {
  lua_Integer index;
  int key;
} path_step;

typedef struct {
  lua_State *L;
  json_buffer *out;
  int indent;   /* spaces per level; 0: compact */
  int visiting; /* stack index of the set of tables being written (the cycle check) */
  path_step path[MAX_ENCODE_DEPTH + 1];
} encoder;

static void reserve(encoder *enc, size_t extra) {
  json_buffer *b = enc->out;
  if (b->cap - b->len >= extra) return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->len < extra) {
    if (cap > SIZE_MAX / 2) luaL_error(enc->L, "json.encode: not enough memory");
    cap *= 2;
  }
  char *p = b->alloc(b->alloc_ud, b->data, b->data ? b->cap : 0, cap);
  if (!p) luaL_error(enc->L, "json.encode: not enough memory");
  b->data = p;
  b->cap = cap;
}

static void put(encoder *enc, const char *s, size_t n) {
  if (n == 0) return; /* data may still be NULL */
  reserve(enc, n);
  memcpy(enc->out->data + enc->out->len, s, n);
  enc->out->len += n;
}

static void put_char(encoder *enc, char c) { put(enc, &c, 1); }

/* A line break and the indentation of `level` when pretty printing. */
static void put_newline(encoder *enc, int level) {
  if (!enc->indent) return;
  size_t n = (size_t)enc->indent * (size_t)level;
  reserve(enc, n + 1);
  json_buffer *b = enc->out;
  b->data[b->len++] = '\n';
  memset(b->data + b->len, ' ', n);
  b->len += n;
}

/* Writes the len bytes at s as U+10FE00 + byte each (see the top). */
static void put_raw_bytes(encoder *enc, const char *s, size_t len) {
  for (size_t j = 0; j < len; j++) {
    char utf8[4];
    put(enc, utf8, mrl__utf8_encode(utf8, RAW_BYTE_BASE + (unsigned char)s[j]));
  }
}

static void put_string(encoder *enc, const char *s, size_t n) {
  put_char(enc, '"');
  size_t run = 0; /* bytes before s[i] not yet written, that need no escape */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x80) {
      uint32_t cp;
      size_t len = mrl__utf8_decode((const unsigned char *)s + i, n - i, &cp);
      if (cp != MRL_UTF8_INVALID && (cp < RAW_BYTE_FIRST || cp > RAW_BYTE_LAST)) {
        run += len; /* valid UTF-8: as it is */
        i += len - 1;
        continue;
      }
      put(enc, s + i - run, run);
      run = 0;
      put_raw_bytes(enc, s + i, len);
      i += len - 1;
      continue;
    }
    if (c >= 0x20 && c != '"' && c != '\\') {
      run++;
      continue;
    }
    put(enc, s + i - run, run);
    run = 0;
    char esc[8];
    switch (c) {
    case '"': put(enc, "\\\"", 2); break;
    case '\\': put(enc, "\\\\", 2); break;
    case '\n': put(enc, "\\n", 2); break;
    case '\r': put(enc, "\\r", 2); break;
    case '\t': put(enc, "\\t", 2); break;
    case '\b': put(enc, "\\b", 2); break;
    case '\f': put(enc, "\\f", 2); break;
    default:
      snprintf(esc, sizeof esc, "\\u%04x", c);
      put(enc, esc, 6);
    }
  }
  put(enc, s + n - run, run);
  put_char(enc, '"');
}

static bool is_identifier(const char *s, size_t n) {
  if (n == 0 || !(s[0] == '_' || (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
    return false;
  for (size_t i = 1; i < n; i++)
    if (!(s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
          (s[i] >= '0' && s[i] <= '9')))
      return false;
  return true;
}

/* Appends one path step in Lua syntax: [3], .name, ["a key"] (long keys shortened), [1.5]. */
static void add_path_step(luaL_Buffer *buf, lua_State *L, const path_step *step) {
  if (!step->key) {
    lua_pushfstring(L, "[%I]", (LUAI_UACINT)step->index);
    luaL_addvalue(buf);
    return;
  }
  if (lua_type(L, step->key) == LUA_TNUMBER) {
    char num[40];
    if (lua_isinteger(L, step->key))
      snprintf(num, sizeof num, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, step->key));
    else
      format_float(num, (double)lua_tonumber(L, step->key));
    luaL_addchar(buf, '[');
    luaL_addstring(buf, num);
    luaL_addchar(buf, ']');
    return;
  }
  size_t n;
  const char *s = lua_tolstring(L, step->key, &n);
  if (is_identifier(s, n)) {
    luaL_addchar(buf, '.');
    luaL_addlstring(buf, s, n);
    return;
  }
  luaL_addstring(buf, "[\"");
  for (size_t i = 0; i < n && i < 40; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') luaL_addchar(buf, '\\');
    if (c < 0x20) {
      lua_pushfstring(L, "\\%d", (int)c);
      luaL_addvalue(buf);
    } else {
      luaL_addchar(buf, (char)c);
    }
  }
  luaL_addstring(buf, n > 40 ? "...\"]" : "\"]");
}

/* Raises "json.encode: value<path of depth steps>: <message>". */
static int encode_error(encoder *enc, int depth, const char *fmt, ...) {
  lua_State *L = enc->L;
  luaL_checkstack(L, 4, NULL);
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  int msg = lua_gettop(L);
  luaL_Buffer buf;
  luaL_buffinit(L, &buf);
  luaL_addstring(&buf, "json.encode: value");
  for (int i = 0; i < depth; i++) add_path_step(&buf, L, &enc->path[i]);
  luaL_addstring(&buf, ": ");
  lua_pushvalue(L, msg);
  luaL_addvalue(&buf);
  luaL_pushresult(&buf);
  return lua_error(L);
}

/* The name to write for the key at the top of the stack, pushed as a string; raises for keys
 * that cannot be names (the path is the table's, `depth` steps long). */
static void push_key_name(encoder *enc, int depth) {
  lua_State *L = enc->L;
  int type = lua_type(L, -1);
  if (type == LUA_TSTRING) {
    lua_pushvalue(L, -1);
  } else if (type == LUA_TNUMBER && lua_isinteger(L, -1)) {
    lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, -1));
  } else if (type == LUA_TNUMBER) {
    double x = (double)lua_tonumber(L, -1);
    if (!isfinite(x)) encode_error(enc, depth, "cannot encode the key %s", x > 0 ? "inf" : "-inf");
    char num[40];
    size_t n = format_float(num, x);
    lua_pushlstring(L, num, n);
  } else {
    encode_error(enc, depth, "cannot encode a key of type %s", luaL_typename(L, -1));
  }
}

static void encode_value(encoder *enc, int idx, int depth);

static void encode_array(encoder *enc, int idx, int depth, lua_Integer n) {
  lua_State *L = enc->L;
  put_char(enc, '[');
  for (lua_Integer i = 1; i <= n; i++) {
    if (i > 1) put_char(enc, ',');
    put_newline(enc, depth + 1);
    lua_rawgeti(L, idx, i);
    enc->path[depth] = (path_step){.index = i, .key = 0};
    encode_value(enc, lua_gettop(L), depth + 1);
    lua_pop(L, 1);
  }
  if (n > 0) put_newline(enc, depth);
  put_char(enc, ']');
}

typedef struct {
  const char *s;
  size_t len;
} name_ref;

static int compare_names(const void *pa, const void *pb) {
  const name_ref *a = pa, *b = pb;
  int c = memcmp(a->s, b->s, a->len < b->len ? a->len : b->len);
  if (c) return c;
  return (a->len > b->len) - (a->len < b->len);
}

/* An object of n keys, written in the order of their names. */
static void encode_object(encoder *enc, int idx, int depth, lua_Integer n) {
  lua_State *L = enc->L;
  lua_createtable(L, n > INT32_MAX ? INT32_MAX : (int)n, 0); /* names in table order */
  int names = lua_gettop(L);
  lua_createtable(L, 0, n > INT32_MAX ? INT32_MAX : (int)n); /* name -> the key itself */
  int keys = lua_gettop(L);
  lua_Integer count = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    push_key_name(enc, depth);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, keys) != LUA_TNIL)
      encode_error(enc, depth, "two keys (a number and a string) are both written \"%s\"",
                   lua_tostring(L, -2));
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_rawseti(L, names, ++count);
    lua_pushvalue(L, -2);
    lua_rawset(L, keys);
  }
  /* the strings stay anchored in `names`, which stays on the stack */
  name_ref *sorted = lua_newuserdatauv(L, (size_t)count * sizeof *sorted, 0);
  for (lua_Integer i = 0; i < count; i++) {
    lua_rawgeti(L, names, i + 1);
    sorted[i].s = lua_tolstring(L, -1, &sorted[i].len);
    lua_pop(L, 1);
  }
  qsort(sorted, (size_t)count, sizeof *sorted, compare_names);
  put_char(enc, '{');
  for (lua_Integer i = 0; i < count; i++) {
    if (i > 0) put_char(enc, ',');
    put_newline(enc, depth + 1);
    put_string(enc, sorted[i].s, sorted[i].len);
    put(enc, ": ", enc->indent ? 2 : 1);
    lua_pushlstring(L, sorted[i].s, sorted[i].len);
    lua_rawget(L, keys);
    int key = lua_gettop(L);
    lua_pushvalue(L, key);
    lua_rawget(L, idx);
    enc->path[depth] = (path_step){.index = 0, .key = key};
    encode_value(enc, lua_gettop(L), depth + 1);
    lua_pop(L, 2);
  }
  if (count > 0) put_newline(enc, depth);
  put_char(enc, '}');
  lua_pop(L, 3);
}

static void encode_table(encoder *enc, int idx, int depth) {
  lua_State *L = enc->L;
  if (depth >= MAX_ENCODE_DEPTH)
    encode_error(enc, depth, "nested deeper than %d levels", MAX_ENCODE_DEPTH);
  luaL_checkstack(L, 12, "json.encode: nested too deeply");
  lua_pushvalue(L, idx);
  if (lua_rawget(L, enc->visiting) != LUA_TNIL)
    encode_error(enc, depth, "cannot encode a cycle (the table contains itself)");
  lua_pop(L, 1);
  lua_pushvalue(L, idx);
  lua_pushboolean(L, 1);
  lua_rawset(L, enc->visiting);

  bool marked = false;
  if (luaL_getmetafield(L, idx, "__jsontype") != LUA_TNIL) {
    marked = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "array") == 0;
    lua_pop(L, 1);
  }
  /* keys exactly 1..n: n keys, every one an integer in 1..n */
  lua_Integer count = 0, max = 0;
  bool positive_integers = true;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    count++;
    if (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 1) {
      if (lua_tointeger(L, -1) > max) max = lua_tointeger(L, -1);
    } else {
      positive_integers = false;
    }
  }
  bool sequence = positive_integers && count == max;
  if (marked && !sequence)
    encode_error(enc, depth, "cannot encode a table marked as an array whose keys are not 1..n");
  if (sequence && (count > 0 || marked))
    encode_array(enc, idx, depth, count);
  else
    encode_object(enc, idx, depth, count);

  lua_pushvalue(L, idx);
  lua_pushnil(L);
  lua_rawset(L, enc->visiting);
}

static void encode_value(encoder *enc, int idx, int depth) {
  lua_State *L = enc->L;
  switch (lua_type(L, idx)) {
  case LUA_TNIL: put(enc, "null", 4); return;
  case LUA_TBOOLEAN:
    if (lua_toboolean(L, idx))
      put(enc, "true", 4);
    else
      put(enc, "false", 5);
    return;
  case LUA_TNUMBER: {
    char num[40];
    if (lua_isinteger(L, idx)) {
      int n = snprintf(num, sizeof num, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, idx));
      put(enc, num, (size_t)n);
      return;
    }
    double x = (double)lua_tonumber(L, idx);
    if (isnan(x)) encode_error(enc, depth, "cannot encode NaN");
    if (isinf(x)) encode_error(enc, depth, "cannot encode %s", x > 0 ? "inf" : "-inf");
    put(enc, num, format_float(num, x));
    return;
  }
  case LUA_TSTRING: {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n);
    put_string(enc, s, n);
    return;
  }
  case LUA_TTABLE: encode_table(enc, idx, depth); return;
  case LUA_TLIGHTUSERDATA:
    if (lua_touserdata(L, idx) == &json_null) {
      put(enc, "null", 4);
      return;
    }
    break;
  default: break;
  }
  const char *name = luaL_typename(L, idx);
  if (luaL_getmetafield(L, idx, "__name") == LUA_TSTRING) name = lua_tostring(L, -1);
  encode_error(enc, depth, "cannot encode a %s", name);
}

/* The options at idx (nil or {indent = n}); returns the indent. */
static int check_encode_options(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx)) return 0;
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING || strcmp(lua_tostring(L, -1), "indent") != 0)
      luaL_argerror(L, idx, lua_pushfstring(L, "options: unknown field '%s' (expected indent)",
                                            luaL_tolstring(L, -1, NULL)));
  }
  lua_Integer indent = 0;
  if (lua_getfield(L, idx, "indent") != LUA_TNIL) {
    int is_int;
    indent = lua_tointegerx(L, -1, &is_int);
    if (lua_type(L, -1) != LUA_TNUMBER || !is_int || indent < 0 || indent > 64)
      luaL_argerror(L, idx, "options.indent: an integer in 0..64 expected");
  }
  lua_pop(L, 1);
  return (int)indent;
}

static int l_encode(lua_State *L) {
  luaL_checkany(L, 1);
  int indent = check_encode_options(L, 2);
  lua_settop(L, 2);
  lua_newtable(L); /* 3: tables being written */
  /* 4: the output, freed when encode returns or raises */
  json_buffer *b = lua_newuserdatauv(L, sizeof *b, 0);
  memset(b, 0, sizeof *b);
  b->alloc = lua_getallocf(L, &b->alloc_ud);
  luaL_setmetatable(L, BUFFER_MT);
  lua_toclose(L, 4);
  encoder enc = {.L = L, .out = b, .indent = indent, .visiting = 3};
  encode_value(&enc, 1, 0);
  lua_pushlstring(L, b->data ? b->data : "", b->len);
  return 1;
}

/* rl.json.array([t]) -> t, marked as an array (a new empty table without t). */
static int l_array(lua_State *L) {
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_newtable(L);
  }
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  luaL_getmetatable(L, ARRAY_MT);
  if (lua_getmetatable(L, 1) && !lua_rawequal(L, -1, -2))
    return luaL_argerror(L, 1, "the table has a metatable already (set its field __jsontype = "
                               "\"array\" instead)");
  lua_settop(L, 2);
  lua_setmetatable(L, 1);
  return 1;
}

static const luaL_Reg json_funcs[] = {
    {"decode", l_decode}, {"encode", l_encode}, {"array", l_array}, {NULL, NULL}};

void mrl__lua_open_json(lua_State *L) {
  luaL_newmetatable(L, DOC_MT);
  lua_pushcfunction(L, doc_box_free);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, doc_box_free);
  lua_setfield(L, -2, "__close");
  lua_pop(L, 1);
  luaL_newmetatable(L, BUFFER_MT);
  lua_pushcfunction(L, buffer_free);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, buffer_free);
  lua_setfield(L, -2, "__close");
  lua_pop(L, 1);
  luaL_newmetatable(L, ARRAY_MT);
  lua_pushliteral(L, "array");
  lua_setfield(L, -2, "__jsontype");
  lua_pop(L, 1);
  luaL_newlib(L, json_funcs);
  lua_pushlightuserdata(L, &json_null);
  lua_setfield(L, -2, "null");
  lua_setfield(L, -2, "json");
}
