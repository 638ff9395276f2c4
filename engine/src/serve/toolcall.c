/* toolcall.c - tool calls in moonrl serve (see toolcall.h): tools read from a request, described
 * to the model, rendered back from earlier turns, parsed out of generated text, and the automaton
 * that constrains a forced call. Formats as moonrl.parse reads them:
 *   hermes: <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
 *   line:   CALL NAME arg1 "arg two" ...   (one line; arguments by the schema's property order) */
#include "toolcall.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dup_n(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p) {
    memcpy(p, s, n);
    p[n] = '\0';
  }
  return p;
}

static bool is_name_byte(unsigned char c) { return isalnum(c) || c == '_' || c == '-'; }

/* ---- a compact JSON writer for parsed values ---- */

static void json_number(srv_buf *b, const mrl_json *v) {
  if (v->is_integer) {
    mrl__sb_printf(b, "%lld", (long long)v->integer);
    return;
  }
  char s[40];
  for (int digits = 15; digits <= 17; digits++) { /* the shortest that reads back exactly */
    snprintf(s, sizeof s, "%.*g", digits, v->number);
    if (strtod(s, NULL) == v->number) break;
  }
  mrl__sb_str(b, s);
}

void mrl__sb_json_value(srv_buf *b, const mrl_json *v) {
  switch (v->type) {
  case MRL_JSON_NULL: mrl__sb_str(b, "null"); break;
  case MRL_JSON_TRUE: mrl__sb_str(b, "true"); break;
  case MRL_JSON_FALSE: mrl__sb_str(b, "false"); break;
  case MRL_JSON_NUMBER: json_number(b, v); break;
  case MRL_JSON_STRING: mrl__sb_json_str(b, v->string, v->length); break;
  case MRL_JSON_ARRAY:
    mrl__sb_str(b, "[");
    for (size_t i = 0; i < v->length; i++) {
      if (i) mrl__sb_str(b, ",");
      mrl__sb_json_value(b, &v->items[i]);
    }
    mrl__sb_str(b, "]");
    break;
  case MRL_JSON_OBJECT:
    mrl__sb_str(b, "{");
    for (size_t i = 0; i < v->length; i++) {
      if (i) mrl__sb_str(b, ",");
      mrl__sb_json_str(b, v->keys[i], v->key_lengths[i]);
      mrl__sb_str(b, ":");
      mrl__sb_json_value(b, &v->items[i]);
    }
    mrl__sb_str(b, "}");
    break;
  }
}

/* ---- reading tools and tool_choice ---- */

void mrl__tools_free(srv_tools *ts) {
  for (int i = 0; i < ts->n; i++) {
    srv_tool *t = &ts->tools[i];
    free(t->name);
    free(t->schema);
    for (int k = 0; k < t->n_params; k++) free(t->params[k]);
    free(t->params);
    free(t->param_types);
  }
  free(ts->tools);
  memset(ts, 0, sizeof *ts);
}

static bool only(const mrl_json *obj, const char *const *keys, const char **unknown) {
  for (size_t i = 0; i < obj->length; i++) {
    bool known = false;
    for (int k = 0; keys[k] && !known; k++) known = !strcmp(obj->keys[i], keys[k]);
    if (!known) {
      *unknown = obj->keys[i];
      return false;
    }
  }
  return true;
}

#define FAIL(...) (snprintf(err, cap, __VA_ARGS__), false)

static bool read_tool(srv_tool *t, const mrl_json *v, size_t i, char *err, size_t cap) {
  static const char *const tool_keys[] = {"type", "function", NULL};
  static const char *const fn_keys[] = {"name", "description", "parameters", "strict", NULL};
  const char *unknown;
  if (v->type != MRL_JSON_OBJECT) return FAIL("tools[%zu] must be an object", i);
  if (!only(v, tool_keys, &unknown)) return FAIL("tools[%zu]: unknown field '%s'", i, unknown);
  const mrl_json *type = mrl__json_get(v, "type"), *fn = mrl__json_get(v, "function");
  if (!type || type->type != MRL_JSON_STRING || strcmp(type->string, "function"))
    return FAIL("tools[%zu].type must be \"function\"", i);
  if (!fn || fn->type != MRL_JSON_OBJECT) return FAIL("tools[%zu].function must be an object", i);
  if (!only(fn, fn_keys, &unknown))
    return FAIL("tools[%zu].function: unknown field '%s'", i, unknown);
  const mrl_json *name = mrl__json_get(fn, "name"), *desc = mrl__json_get(fn, "description"),
                 *params = mrl__json_get(fn, "parameters"), *strict = mrl__json_get(fn, "strict");
  bool name_ok = name && name->type == MRL_JSON_STRING && name->length >= 1 &&
                 name->length <= TOOL_NAME_MAX;
  for (size_t k = 0; name_ok && k < name->length; k++)
    name_ok = is_name_byte((unsigned char)name->string[k]);
  if (!name_ok) return FAIL("tools[%zu].function.name must match [A-Za-z0-9_-]{1,64}", i);
  if (desc && desc->type != MRL_JSON_STRING && desc->type != MRL_JSON_NULL)
    return FAIL("tools[%zu].function.description must be a string", i);
  if (strict && strict->type != MRL_JSON_TRUE && strict->type != MRL_JSON_FALSE &&
      strict->type != MRL_JSON_NULL)
    return FAIL("tools[%zu].function.strict must be a boolean", i);
  if (params && params->type != MRL_JSON_OBJECT && params->type != MRL_JSON_NULL)
    return FAIL("tools[%zu].function.parameters must be a JSON Schema object", i);
  const mrl_json *props = params ? mrl__json_get(params, "properties") : NULL;
  if (props && props->type != MRL_JSON_OBJECT)
    return FAIL("tools[%zu].function.parameters.properties must be an object", i);
  t->name = dup_n(name->string, name->length);
  srv_buf schema = {0};
  mrl__sb_str(&schema, "{\"name\":");
  mrl__sb_json_str(&schema, name->string, name->length);
  if (desc && desc->type == MRL_JSON_STRING) {
    mrl__sb_str(&schema, ",\"description\":");
    mrl__sb_json_str(&schema, desc->string, desc->length);
  }
  if (params && params->type == MRL_JSON_OBJECT) {
    mrl__sb_str(&schema, ",\"parameters\":");
    mrl__sb_json_value(&schema, params);
  }
  mrl__sb_str(&schema, "}");
  t->schema = schema.p;
  int n = props ? (int)props->length : 0;
  t->params = calloc((size_t)(n ? n : 1), sizeof *t->params);
  t->param_types = calloc((size_t)n + 1, 1);
  if (!t->name || !t->schema || schema.failed || !t->params || !t->param_types)
    return FAIL("out of memory");
  for (int k = 0; k < n; k++) {
    t->params[k] = dup_n(props->keys[k], props->key_lengths[k]);
    if (!t->params[k]) return FAIL("out of memory");
    t->n_params = k + 1;
    const mrl_json *ty = mrl__json_get(&props->items[k], "type");
    const char *s = ty && ty->type == MRL_JSON_STRING ? ty->string : "";
    t->param_types[k] = !strcmp(s, "string")    ? 's'
                        : !strcmp(s, "integer") ? 'i'
                        : !strcmp(s, "number")  ? 'n'
                        : !strcmp(s, "boolean") ? 'b'
                                                : '?';
  }
  return true;
}

bool mrl__tools_read(srv_tools *ts, int format, const mrl_json *tools, const mrl_json *choice,
                     bool parallel, char *err, size_t cap, const char **param) {
  memset(ts, 0, sizeof *ts);
  ts->format = format;
  ts->parallel = parallel;
  *param = "tools";
  if (tools->type != MRL_JSON_ARRAY || tools->length == 0 || tools->length > 128)
    return FAIL("'tools' must be an array of 1 to 128 function tools");
  ts->tools = calloc(tools->length, sizeof *ts->tools);
  if (!ts->tools) return FAIL("out of memory");
  for (size_t i = 0; i < tools->length; i++) {
    ts->n = (int)i + 1;
    if (!read_tool(&ts->tools[i], &tools->items[i], i, err, cap)) return false;
    for (size_t k = 0; k < i; k++)
      if (!strcmp(ts->tools[k].name, ts->tools[i].name))
        return FAIL("tools[%zu]: the name '%s' is used twice", i, ts->tools[i].name);
  }
  *param = "tool_choice";
  ts->choice = TOOL_CHOICE_AUTO;
  if (!choice || choice->type == MRL_JSON_NULL) return true;
  if (choice->type == MRL_JSON_STRING) {
    if (!strcmp(choice->string, "none")) ts->choice = TOOL_CHOICE_NONE;
    else if (!strcmp(choice->string, "auto")) ts->choice = TOOL_CHOICE_AUTO;
    else if (!strcmp(choice->string, "required")) ts->choice = TOOL_CHOICE_REQUIRED;
    else return FAIL("'tool_choice' must be \"none\", \"auto\", \"required\" or a function");
    return true;
  }
  const mrl_json *type = mrl__json_get(choice, "type"), *fn = mrl__json_get(choice, "function");
  const mrl_json *name = fn ? mrl__json_get(fn, "name") : NULL;
  if (choice->type != MRL_JSON_OBJECT || !type || type->type != MRL_JSON_STRING ||
      strcmp(type->string, "function") || !name || name->type != MRL_JSON_STRING)
    return FAIL("'tool_choice' must be a string or {\"type\": \"function\", \"function\": "
                "{\"name\": ...}}");
  for (int i = 0; i < ts->n; i++)
    if (!strcmp(ts->tools[i].name, name->string)) {
      ts->choice = TOOL_CHOICE_FUNCTION;
      ts->forced = i;
      return true;
    }
  return FAIL("'tool_choice' names the function '%s', which is not in 'tools'", name->string);
}

/* ---- prompt text ---- */

void mrl__tools_prompt(const srv_tools *ts, srv_buf *out) {
  if (ts->format == TOOL_FORMAT_HERMES) {
    mrl__sb_str(out, "Tools you can call, as JSON Schema function signatures:\n<tools>\n");
    for (int i = 0; i < ts->n; i++) {
      mrl__sb_str(out, ts->tools[i].schema);
      mrl__sb_str(out, "\n");
    }
    mrl__sb_str(out, "</tools>\nTo call a tool, answer with one block per call:\n<tool_call>\n"
                     "{\"name\": \"<tool name>\", \"arguments\": {<arguments as JSON>}}\n"
                     "</tool_call>");
    return;
  }
  mrl__sb_str(out, "Tools you can call:\n");
  for (int i = 0; i < ts->n; i++) {
    const srv_tool *t = &ts->tools[i];
    mrl__sb_printf(out, "- %s", t->name);
    for (int k = 0; k < t->n_params; k++) mrl__sb_printf(out, " <%s>", t->params[k]);
    mrl__sb_str(out, ": ");
    mrl__sb_str(out, t->schema);
    mrl__sb_str(out, "\n");
  }
  mrl__sb_str(out, "To call a tool, write one line: CALL <tool name> <arguments in order>");
}

/* ---- earlier turns: assistant calls and tool results ---- */

/* A line-format argument: bare when it has no blank or quote, else quoted with \" and \\. */
static void line_arg(srv_buf *out, const char *s, size_t n) {
  bool bare = n > 0;
  for (size_t i = 0; i < n && bare; i++) bare = !strchr(" \t\r\n\"\\", s[i]);
  if (bare) {
    mrl__sb_add(out, s, n);
    return;
  }
  mrl__sb_str(out, "\"");
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\n' || s[i] == '\r') {
      mrl__sb_str(out, " ");
      continue;
    }
    if (s[i] == '"' || s[i] == '\\') mrl__sb_str(out, "\\");
    mrl__sb_add(out, s + i, 1);
  }
  mrl__sb_str(out, "\"");
}

bool mrl__tools_render_calls(int format, const mrl_json *calls, mrl_engine *e, srv_buf *out,
                             char *err, size_t cap) {
  if (calls->type != MRL_JSON_ARRAY) return FAIL("tool_calls must be an array");
  for (size_t i = 0; i < calls->length; i++) {
    const mrl_json *c = &calls->items[i];
    const mrl_json *fn = mrl__json_get(c, "function");
    const mrl_json *name = fn ? mrl__json_get(fn, "name") : NULL;
    const mrl_json *args = fn ? mrl__json_get(fn, "arguments") : NULL;
    if (c->type != MRL_JSON_OBJECT || !fn || fn->type != MRL_JSON_OBJECT || !name ||
        name->type != MRL_JSON_STRING || !args || args->type != MRL_JSON_STRING)
      return FAIL("tool_calls[%zu] must be {\"type\": \"function\", \"function\": {\"name\": "
                  "string, \"arguments\": string}}",
                  i);
    mrl_json_doc *doc = NULL;
    if (mrl__json_parse(e, "tool_calls", "arguments", args->string, args->length, &doc) !=
            MRL_OK ||
        mrl__json_root(doc)->type != MRL_JSON_OBJECT) {
      mrl__json_free(doc);
      return FAIL("tool_calls[%zu].function.arguments must be a JSON object in a string", i);
    }
    const mrl_json *a = mrl__json_root(doc);
    if (out->len) mrl__sb_str(out, "\n");
    if (format == TOOL_FORMAT_HERMES) {
      mrl__sb_str(out, "<tool_call>\n{\"name\": ");
      mrl__sb_json_str(out, name->string, name->length);
      mrl__sb_str(out, ", \"arguments\": ");
      mrl__sb_json_value(out, a);
      mrl__sb_str(out, "}\n</tool_call>");
    } else {
      mrl__sb_str(out, "CALL ");
      mrl__sb_add(out, name->string, name->length);
      for (size_t k = 0; k < a->length; k++) {
        mrl__sb_str(out, " ");
        const mrl_json *x = &a->items[k];
        if (x->type == MRL_JSON_STRING) {
          line_arg(out, x->string, x->length);
        } else {
          srv_buf one = {0};
          mrl__sb_json_value(&one, x);
          line_arg(out, one.p ? one.p : "", one.len);
          mrl__sb_free(&one);
        }
      }
    }
    mrl__json_free(doc);
  }
  return true;
}

void mrl__tools_render_result(int format, const char *content, size_t len, srv_buf *out) {
  if (format == TOOL_FORMAT_HERMES) mrl__sb_str(out, "<tool_response>\n");
  mrl__sb_add(out, content, len);
  if (format == TOOL_FORMAT_HERMES) mrl__sb_str(out, "\n</tool_response>");
}

/* ---- reading calls out of generated text ---- */

static int find_tool(const srv_tools *ts, const char *name, size_t n) {
  for (int i = 0; i < ts->n; i++)
    if (strlen(ts->tools[i].name) == n && !memcmp(ts->tools[i].name, name, n)) return i;
  return -1;
}

static const char *find(const char *hay, size_t n, const char *needle) {
  size_t k = strlen(needle);
  for (size_t i = 0; i + k <= n; i++)
    if (!memcmp(hay + i, needle, k)) return hay + i;
  return NULL;
}

static void call_json(srv_buf *calls, int index, bool with_index, const char *id,
                      const char *name, const srv_buf *args) {
  mrl__sb_str(calls, index ? ",{" : "{");
  if (with_index) mrl__sb_printf(calls, "\"index\":%d,", index);
  mrl__sb_printf(calls, "\"id\":\"call_%s_%d\",\"type\":\"function\",\"function\":{\"name\":", id,
                 index);
  mrl__sb_json_str(calls, name, strlen(name));
  mrl__sb_str(calls, ",\"arguments\":");
  mrl__sb_json_str(calls, args->p ? args->p : "{}", args->p ? args->len : 2);
  mrl__sb_str(calls, "}}");
}

static void add_trimmed(srv_buf *b, const char *s, size_t n) {
  while (n && isspace((unsigned char)*s)) s++, n--;
  while (n && isspace((unsigned char)s[n - 1])) n--;
  if (!n) return;
  if (b->len) mrl__sb_str(b, "\n");
  mrl__sb_add(b, s, n);
}

static int parse_hermes(const srv_tools *ts, mrl_engine *e, const char *text, size_t len,
                        const char *id, bool with_index, srv_buf *content, srv_buf *calls) {
  static const char open[] = "<tool_call>", close[] = "</tool_call>";
  srv_buf outside = {0}, list = {0};
  int found = 0;
  bool ok = true;
  const char *p = text, *end = text + len;
  while (ok) {
    const char *o = find(p, (size_t)(end - p), open);
    if (!o) break;
    const char *body = o + sizeof open - 1;
    const char *c = find(body, (size_t)(end - body), close);
    if (!c) {
      ok = false;
      break;
    }
    add_trimmed(&outside, p, (size_t)(o - p));
    mrl_json_doc *doc = NULL;
    const mrl_json *root = NULL, *name = NULL, *args = NULL;
    if (mrl__json_parse(e, "tool call", "tool call", body, (size_t)(c - body), &doc) == MRL_OK) {
      root = mrl__json_root(doc);
      name = mrl__json_get(root, "name");
      args = mrl__json_get(root, "arguments");
    }
    int tool = name && name->type == MRL_JSON_STRING ? find_tool(ts, name->string, name->length)
                                                     : -1;
    srv_buf a = {0};
    if (tool >= 0 && args && args->type == MRL_JSON_OBJECT) {
      mrl__sb_json_value(&a, args);
    } else if (tool >= 0 && (!args || args->type == MRL_JSON_NULL)) {
      mrl__sb_str(&a, "{}");
    } else if (tool >= 0 && args->type == MRL_JSON_STRING) { /* arguments given as a string */
      mrl_json_doc *inner = NULL;
      if (mrl__json_parse(e, "tool call", "arguments", args->string, args->length, &inner) ==
              MRL_OK &&
          mrl__json_root(inner)->type == MRL_JSON_OBJECT)
        mrl__sb_json_value(&a, mrl__json_root(inner));
      else
        tool = -1;
      mrl__json_free(inner);
    } else {
      tool = -1;
    }
    if (tool < 0) ok = false;
    else if (found == 0 || ts->parallel)
      call_json(&list, found++, with_index, id, ts->tools[tool].name, &a);
    mrl__sb_free(&a);
    mrl__json_free(doc);
    p = c + sizeof close - 1;
  }
  if (ok && found) {
    add_trimmed(&outside, p, (size_t)(end - p));
    mrl__sb_add(content, outside.p ? outside.p : "", outside.len);
    mrl__sb_str(calls, "[");
    mrl__sb_add(calls, list.p ? list.p : "", list.len);
    mrl__sb_str(calls, "]");
  }
  mrl__sb_free(&outside);
  mrl__sb_free(&list);
  return ok ? found : 0;
}

/* The next line-format argument from *p (blanks skipped first) into out: 1 when there was one,
 * 0 at the line's end, -1 for a broken one (an unterminated quote, a quote inside a bare word). */
static int next_arg(const char **p, const char *end, srv_buf *out, bool *quoted) {
  while (*p < end && (**p == ' ' || **p == '\t')) (*p)++;
  if (*p >= end) return 0;
  *quoted = **p == '"';
  if (!*quoted) {
    const char *s = *p;
    while (*p < end && **p != ' ' && **p != '\t' && **p != '"') (*p)++;
    mrl__sb_add(out, s, (size_t)(*p - s));
    return *p < end && **p == '"' ? -1 : 1;
  }
  (*p)++;
  while (*p < end && **p != '"') {
    if (**p == '\\' && *p + 1 < end && ((*p)[1] == '"' || (*p)[1] == '\\')) (*p)++;
    mrl__sb_add(out, *p, 1);
    (*p)++;
  }
  if (*p >= end) return -1;
  (*p)++;
  return 1;
}

/* A line-format argument as JSON for a parameter of type ty: numbers and booleans as such when
 * they read as one, else a string. */
static void arg_json(srv_buf *a, char ty, const srv_buf *v, bool quoted) {
  const char *s = v->p ? v->p : "";
  char *end = NULL;
  if (!quoted && v->len && (ty == 'i' || ty == 'n')) {
    double x = strtod(s, &end);
    if (end == s + v->len && isfinite(x) && (ty == 'n' || (x == floor(x) && fabs(x) < 9e15))) {
      mrl__sb_add(a, s, v->len);
      return;
    }
  }
  if (!quoted && ty == 'b' && (!strcmp(s, "true") || !strcmp(s, "false"))) {
    mrl__sb_str(a, s);
    return;
  }
  mrl__sb_json_str(a, s, v->len);
}

static int parse_line(const srv_tools *ts, const char *text, size_t len, const char *id,
                      bool with_index, srv_buf *content, srv_buf *calls) {
  const char *line = text, *end = text + len;
  while (line < end) { /* the first line that starts with CALL */
    const char *eol = memchr(line, '\n', (size_t)(end - line));
    const char *stop = eol ? eol : end;
    if (stop - line >= 5 && !memcmp(line, "CALL ", 5)) {
      const char *p = line + 5, *ne = p;
      while (ne < stop && is_name_byte((unsigned char)*ne)) ne++;
      int tool = find_tool(ts, p, (size_t)(ne - p));
      if (tool < 0 || (ne < stop && *ne != ' ' && *ne != '\t' && *ne != '\r')) return 0;
      const srv_tool *t = &ts->tools[tool];
      const char *q = ne;
      const char *qe = stop > q && stop[-1] == '\r' ? stop - 1 : stop;
      srv_buf a = {0};
      mrl__sb_str(&a, "{");
      int n = 0, got;
      bool ok = true, quoted = false;
      do {
        srv_buf v = {0};
        got = next_arg(&q, qe, &v, &quoted);
        if (got < 0 || (got > 0 && n >= t->n_params)) ok = false; /* broken, or one too many */
        if (ok && got > 0) {
          if (n) mrl__sb_str(&a, ",");
          mrl__sb_json_str(&a, t->params[n], strlen(t->params[n]));
          mrl__sb_str(&a, ":");
          arg_json(&a, t->param_types[n], &v, quoted);
          n++;
        }
        mrl__sb_free(&v);
      } while (ok && got > 0);
      mrl__sb_str(&a, "}");
      if (ok) {
        add_trimmed(content, text, (size_t)(line - text));
        if (eol) add_trimmed(content, eol + 1, (size_t)(end - eol - 1));
        mrl__sb_str(calls, "[");
        call_json(calls, 0, with_index, id, t->name, &a);
        mrl__sb_str(calls, "]");
      }
      mrl__sb_free(&a);
      return ok ? 1 : 0;
    }
    line = eol ? eol + 1 : end;
  }
  return 0;
}

int mrl__tools_parse(const srv_tools *ts, mrl_engine *e, const char *text, size_t len,
                     const char *id, bool with_index, srv_buf *content, srv_buf *calls) {
  if (!text) return 0;
  return ts->format == TOOL_FORMAT_HERMES
             ? parse_hermes(ts, e, text, len, id, with_index, content, calls)
             : parse_line(ts, text, len, id, with_index, content, calls);
}

/* ---- the constraint of a forced call ---- */

enum { PH_OPEN, PH_NAME, PH_MID, PH_ARGS, PH_EMPTY_ARGS, PH_CLOSE, PH_LINE_ARGS, PH_DONE };
enum {
  JS_VALUE, JS_OBJ_FIRST, JS_OBJ_KEY, JS_COLON, JS_AFTER, JS_ARR_FIRST, JS_STR, JS_STR_ESC,
  JS_STR_HEX, JS_LIT, JS_MINUS, JS_ZERO, JS_INT, JS_DOT, JS_FRAC, JS_E, JS_ESIGN, JS_EXP
};

static const char HERMES_OPEN[] = "<tool_call>\n{\"name\": \"";
static const char HERMES_MID[] = "\", \"arguments\": ";
static const char HERMES_CLOSE[] = "}\n</tool_call>";
static const char LINE_OPEN[] = "CALL ";

void mrl__tc_start(tc_state *st, const srv_tools *ts) {
  memset(st, 0, sizeof *st);
  st->phase = PH_OPEN;
  st->tool = ts->choice == TOOL_CHOICE_FUNCTION ? ts->forced : -1;
}

bool mrl__tc_done(const tc_state *st) { return st->phase == PH_DONE; }

static bool is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* One byte of the JSON arguments object; *complete when its closing brace was read. */
static bool json_byte(tc_state *st, unsigned char c, bool *complete) {
  bool ws = is_ws(c);
  bool was_ws = st->ws;
  st->ws = false;
  switch (st->js) {
  case JS_STR:
    if (c == '"') st->js = st->key ? JS_COLON : JS_AFTER;
    else if (c == '\\') st->js = JS_STR_ESC;
    else if (c < 0x20) return false;
    return true;
  case JS_STR_ESC:
    if (c == 'u') {
      st->js = JS_STR_HEX;
      st->aux = 4;
    } else if (strchr("\"\\/bfnrt", c) && c) {
      st->js = JS_STR;
    } else {
      return false;
    }
    return true;
  case JS_STR_HEX:
    if (!isxdigit(c)) return false;
    if (--st->aux == 0) st->js = JS_STR;
    return true;
  case JS_LIT: {
    const char *word = st->lit_word == 't' ? "true" : st->lit_word == 'f' ? "false" : "null";
    if (c != (unsigned char)word[st->aux]) return false;
    if (word[++st->aux] == '\0') st->js = JS_AFTER;
    return true;
  }
  case JS_MINUS:
    if (c == '0') st->js = JS_ZERO;
    else if (c >= '1' && c <= '9') st->js = JS_INT;
    else return false;
    return true;
  case JS_ZERO:
  case JS_INT:
  case JS_FRAC:
  case JS_EXP:
    if (c >= '0' && c <= '9' && st->js != JS_ZERO) return true;
    if (c == '.' && (st->js == JS_ZERO || st->js == JS_INT)) {
      st->js = JS_DOT;
      return true;
    }
    if ((c == 'e' || c == 'E') && st->js != JS_EXP) {
      st->js = JS_E;
      return true;
    }
    st->js = JS_AFTER; /* the number ended: the byte belongs to what follows */
    st->ws = was_ws;
    return json_byte(st, c, complete);
  case JS_DOT:
    if (c < '0' || c > '9') return false;
    st->js = JS_FRAC;
    return true;
  case JS_E:
    if (c == '+' || c == '-') st->js = JS_ESIGN;
    else if (c >= '0' && c <= '9') st->js = JS_EXP;
    else return false;
    return true;
  case JS_ESIGN:
    if (c < '0' || c > '9') return false;
    st->js = JS_EXP;
    return true;
  default:
    break;
  }
  /* between tokens: at most one blank in a row, none before the opening brace */
  if (ws) {
    if (was_ws || st->depth == 0) return false;
    st->ws = true;
    return true;
  }
  switch (st->js) {
  case JS_OBJ_FIRST:
  case JS_OBJ_KEY:
    if (c == '"') {
      st->js = JS_STR;
      st->key = true;
      return true;
    }
    if (c == '}' && st->js == JS_OBJ_FIRST) goto close;
    return false;
  case JS_COLON:
    if (c != ':') return false;
    st->js = JS_VALUE;
    return true;
  case JS_AFTER:
    if (c == ',') {
      st->js = st->stack[st->depth - 1] == '{' ? JS_OBJ_KEY : JS_VALUE;
      return true;
    }
    if ((c == '}' && st->stack[st->depth - 1] == '{') ||
        (c == ']' && st->stack[st->depth - 1] == '['))
      goto close;
    return false;
  case JS_ARR_FIRST:
    if (c == ']') goto close;
    __attribute__((fallthrough)); /* else a value */
  case JS_VALUE:
    if (st->depth == 0 && c != '{') return false; /* the arguments are an object */
    if (c == '{' || c == '[') {
      if (st->depth >= TOOL_JSON_DEPTH) return false;
      st->stack[st->depth++] = c;
      st->js = c == '{' ? JS_OBJ_FIRST : JS_ARR_FIRST;
      return true;
    }
    st->key = false;
    if (c == '"') st->js = JS_STR;
    else if (c == 't' || c == 'f' || c == 'n') st->js = JS_LIT, st->lit_word = (char)c, st->aux = 1;
    else if (c == '-') st->js = JS_MINUS;
    else if (c == '0') st->js = JS_ZERO;
    else if (c >= '1' && c <= '9') st->js = JS_INT;
    else return false;
    return true;
  default:
    return false;
  }
close:
  st->depth--;
  st->js = JS_AFTER;
  if (st->depth == 0) *complete = true;
  return true;
}

/* Can name (name_len bytes so far, then c) still become one of the allowed tools' names? */
static bool name_byte(tc_state *st, const srv_tools *ts, unsigned char c) {
  if (!is_name_byte(c) || st->name_len >= TOOL_NAME_MAX) return false;
  st->name[st->name_len++] = (char)c;
  for (int i = 0; i < ts->n; i++) {
    if (st->tool >= 0 && i != st->tool) continue;
    if (strlen(ts->tools[i].name) >= st->name_len &&
        !memcmp(ts->tools[i].name, st->name, st->name_len))
      return true;
  }
  return false;
}

static bool name_complete(tc_state *st, const srv_tools *ts) {
  int i = find_tool(ts, st->name, st->name_len);
  if (i < 0 || (st->tool >= 0 && i != st->tool)) return false;
  st->tool = i;
  return true;
}

static bool tc_byte(tc_state *st, const srv_tools *ts, unsigned char c) {
  bool hermes = ts->format == TOOL_FORMAT_HERMES;
  const char *lit;
  switch (st->phase) {
  case PH_OPEN:
    lit = hermes ? HERMES_OPEN : LINE_OPEN;
    if (c != (unsigned char)lit[st->lit]) return false;
    if (lit[++st->lit] == '\0') st->phase = PH_NAME, st->lit = 0;
    return true;
  case PH_NAME:
    if (hermes && c == '"') {
      if (!name_complete(st, ts)) return false;
      st->phase = PH_MID;
      st->lit = 1; /* the quote is the literal's first byte */
      return true;
    }
    if (!hermes && (c == ' ' || c == '\n')) {
      if (!name_complete(st, ts)) return false;
      if (c == ' ' && ts->tools[st->tool].n_params == 0) return false; /* no arguments to come */
      st->phase = c == '\n' ? PH_DONE : PH_LINE_ARGS;
      return true;
    }
    return name_byte(st, ts, c);
  case PH_MID:
    if (c != (unsigned char)HERMES_MID[st->lit]) return false;
    if (HERMES_MID[++st->lit] == '\0') {
      st->lit = 0;
      st->phase = ts->tools[st->tool].n_params ? PH_ARGS : PH_EMPTY_ARGS;
    }
    return true;
  case PH_EMPTY_ARGS: /* a tool without parameters: {} */
    if (c != (unsigned char)"{}"[st->lit]) return false;
    if (++st->lit == 2) st->phase = PH_CLOSE, st->lit = 0;
    return true;
  case PH_ARGS: {
    bool complete = false;
    if (!json_byte(st, c, &complete)) return false;
    if (complete) st->phase = PH_CLOSE, st->lit = 0;
    return true;
  }
  case PH_CLOSE:
    if (c != (unsigned char)HERMES_CLOSE[st->lit]) return false;
    if (HERMES_CLOSE[++st->lit] == '\0') st->phase = PH_DONE;
    return true;
  case PH_LINE_ARGS:
    if (c == '\n') st->phase = PH_DONE;
    else if (c < 0x20 && c != '\t') return false;
    return true;
  default:
    return false;
  }
}

bool mrl__tc_feed(tc_state *st, const srv_tools *ts, const char *bytes, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!tc_byte(st, ts, (unsigned char)bytes[i])) return false;
  return true;
}
