/* lua_tokenizer.c - the Lua tokenizer class (`moonrl.tokenizer`): rl.tokenizer.bytes(),
 * rl.tokenizer.load(path), and the methods encode, decode, vocab_size, token_id, token, chat and
 * free. Token ids are 0-based, as in Hugging Face files (not Lua's 1-based indices). */
#include "lua_internal.h"

#include <string.h>

#define TOKENIZER_MT "moonrl.tokenizer"

typedef struct {
  mrl_tokenizer *t; /* NULL once freed */
} tokenizer_box;

static mrl_tokenizer *check_tokenizer(lua_State *L) {
  tokenizer_box *b = luaL_testudata(L, 1, TOKENIZER_MT);
  if (!b)
    luaL_argerror(L, 1, lua_pushfstring(L, "tokenizer expected, got %s", luaL_typename(L, 1)));
  if (!b->t) luaL_argerror(L, 1, "the tokenizer is freed");
  return b->t;
}

mrl_tokenizer *mrl__lua_test_tokenizer(lua_State *L, int idx) {
  tokenizer_box *b = luaL_testudata(L, idx, TOKENIZER_MT);
  return b ? b->t : NULL;
}

/* A new empty box on the stack: the tokenizer goes into it as soon as it exists, so an error
 * raised afterwards cannot leak it. */
static tokenizer_box *new_box(lua_State *L) {
  tokenizer_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->t = NULL;
  luaL_setmetatable(L, TOKENIZER_MT);
  return b;
}

/* Tells the collector about the memory a new tokenizer holds outside Lua. */
static void charge_gc(lua_State *L, size_t before, size_t after) {
  size_t kb = after > before ? (after - before) / 1024 : 0;
  if (kb) lua_gc(L, LUA_GCSTEP, kb > INT32_MAX ? INT32_MAX : (int)kb);
}

/* Checks that the options table at idx (if any) has only the listed string keys. */
static void check_options(lua_State *L, int idx, const char *const *allowed, const char *list) {
  if (lua_isnoneornil(L, idx)) return;
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    bool known = false;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (int i = 0; allowed[i] && !known; i++) known = strcmp(lua_tostring(L, -1), allowed[i]) == 0;
    if (!known) {
      const char *key = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, -1);
      luaL_argerror(L, idx, lua_pushfstring(L, "options: unknown field '%s' (expected %s)", key, list));
    }
  }
}

/* Field `key` of the options at idx as a boolean (dflt when the table or the field is absent). */
static bool bool_option(lua_State *L, int idx, const char *key, bool dflt) {
  if (lua_isnoneornil(L, idx)) return dflt;
  int ty = lua_getfield(L, idx, key);
  bool v = ty == LUA_TNIL ? dflt : lua_toboolean(L, -1);
  if (ty != LUA_TNIL && ty != LUA_TBOOLEAN)
    luaL_argerror(L, idx, lua_pushfstring(L, "options.%s: boolean expected, got %s", key,
                                          luaL_typename(L, -1)));
  lua_pop(L, 1);
  return v;
}

/* Pushes ids[0..n) as a Lua array of integers. */
static void push_ids(lua_State *L, const int32_t *ids, size_t n) {
  lua_createtable(L, n > INT32_MAX ? INT32_MAX : (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushinteger(L, ids[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

/* rl.tokenizer.bytes() -> the byte tokenizer (ids 0..255 bytes, 256..263 special tokens). */
static int l_bytes(lua_State *L) {
  mrl_engine *e = mrl__lua_engine(L);
  size_t before = mrl_engine_memory_used(e);
  tokenizer_box *b = new_box(L);
  mrl_status st = mrl_tokenizer_bytes(e, &b->t);
  if (st) return mrl__lua_raise(L, e, st, 0);
  charge_gc(L, before, mrl_engine_memory_used(e));
  return 1;
}

/* rl.tokenizer.load(path) -> tokenizer, or nil and a message when the file is missing,
 * malformed or uses features moonrl does not implement. */
static int l_load(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  mrl_engine *e = mrl__lua_engine(L);
  size_t before = mrl_engine_memory_used(e);
  tokenizer_box *b = new_box(L);
  mrl_status st = mrl_tokenizer_load(e, path, &b->t);
  if (st == MRL_ERR_NOMEM) return mrl__lua_raise(L, e, st, 0);
  if (st) {
    const char *msg = mrl_engine_last_error(e);
    const char *colon = strstr(msg, ": ");
    lua_pushnil(L);
    lua_pushstring(L, strncmp(msg, "mrl_", 4) == 0 && colon ? colon + 2 : msg);
    mrl_engine_clear_error(e);
    return 2;
  }
  charge_gc(L, before, mrl_engine_memory_used(e));
  return 1;
}

/* tok:encode(text [, {special = true}]) -> ids. Without special = true, text spelling a special
 * token is encoded as plain text. */
static int m_encode(lua_State *L) {
  static const char *const keys[] = {"special", NULL};
  mrl_tokenizer *t = check_tokenizer(L);
  size_t len;
  const char *text = luaL_checklstring(L, 2, &len);
  check_options(L, 3, keys, "special");
  int flags = bool_option(L, 3, "special", false) ? MRL_ENCODE_SPECIAL : 0;
  /* every token covers at least one byte unless NFC lengthens the text: one retry at most */
  size_t cap = len + 1, count = 0;
  for (int attempt = 0;; attempt++) {
    int32_t *ids = lua_newuserdatauv(L, cap * sizeof *ids, 0);
    mrl_status st = mrl_tokenizer_encode(t, text, len, flags, ids, cap, &count);
    if (st) return mrl__lua_raise(L, mrl__lua_engine(L), st, 0);
    if (count <= cap || attempt) {
      push_ids(L, ids, count);
      return 1;
    }
    lua_pop(L, 1);
    cap = count;
  }
}

/* tok:decode(ids) -> the exact bytes the ids stand for. */
static int m_decode(lua_State *L) {
  mrl_tokenizer *t = check_tokenizer(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_Integer n = luaL_len(L, 2);
  int32_t *ids = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *ids, 0);
  for (lua_Integer i = 0; i < n; i++) {
    lua_geti(L, 2, i + 1);
    int isnum;
    lua_Integer id = lua_tointegerx(L, -1, &isnum);
    if (!isnum || lua_type(L, -1) != LUA_TNUMBER)
      return luaL_argerror(L, 2, lua_pushfstring(L, "ids[%I]: integer expected, got %s", i + 1,
                                                 luaL_typename(L, -1)));
    if (id < 0 || id > INT32_MAX || !mrl_tokenizer_token(t, (int32_t)id, NULL))
      return luaL_argerror(L, 2, lua_pushfstring(L, "ids[%I] = %I is not a token id (vocabulary "
                                                 "size %d)", i + 1, id,
                                                 (int)mrl_tokenizer_vocab_size(t)));
    lua_pop(L, 1);
    ids[i] = (int32_t)id;
  }
  size_t len = 0;
  mrl_status st = mrl_tokenizer_decode(t, ids, (size_t)n, NULL, 0, &len);
  if (st) return mrl__lua_raise(L, mrl__lua_engine(L), st, 2);
  luaL_Buffer buf;
  char *p = luaL_buffinitsize(L, &buf, len + 1);
  mrl_tokenizer_decode(t, ids, (size_t)n, p, len + 1, &len);
  luaL_pushresultsize(&buf, len);
  return 1;
}

/* tok:vocab_size() -> largest id + 1. */
static int m_vocab_size(lua_State *L) {
  lua_pushinteger(L, mrl_tokenizer_vocab_size(check_tokenizer(L)));
  return 1;
}

/* tok:token_id(text) -> the id of the token spelled text, or nil. */
static int m_token_id(lua_State *L) {
  mrl_tokenizer *t = check_tokenizer(L);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  int32_t id = mrl_tokenizer_token_id(t, s, len);
  if (id < 0)
    lua_pushnil(L);
  else
    lua_pushinteger(L, id);
  return 1;
}

/* tok:token(id) -> the token as the vocabulary spells it, or nil for an id without a token. */
static int m_token(lua_State *L) {
  mrl_tokenizer *t = check_tokenizer(L);
  lua_Integer id = luaL_checkinteger(L, 2);
  size_t len;
  const char *s = id >= 0 && id <= INT32_MAX ? mrl_tokenizer_token(t, (int32_t)id, &len) : NULL;
  if (s)
    lua_pushlstring(L, s, len);
  else
    lua_pushnil(L);
  return 1;
}

/* tok:chat(messages [, {template = "roles"|"chatml"|"llama3", add_generation_prompt = true}])
 * -> ids. messages: {{role = "user", content = "..."}, ...}. Without a template, the one that
 * fits the tokenizer (roles for the byte tokenizer, chatml when it has <|im_start|>, llama3
 * when it has <|start_header_id|>). */
static int m_chat(lua_State *L) {
  static const char *const keys[] = {"template", "add_generation_prompt", NULL};
  static const char *const names[] = {"auto", "roles", "chatml", "llama3", NULL};
  mrl_tokenizer *t = check_tokenizer(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  check_options(L, 3, keys, "template, add_generation_prompt");
  int tmpl = MRL_CHAT_AUTO;
  if (!lua_isnoneornil(L, 3)) {
    lua_getfield(L, 3, "template");
    if (!lua_isnil(L, -1)) {
      tmpl = -1;
      for (int i = 0; lua_type(L, -1) == LUA_TSTRING && names[i]; i++)
        if (strcmp(lua_tostring(L, -1), names[i]) == 0) tmpl = i;
      if (tmpl < 0)
        return luaL_argerror(L, 3, "options.template: expected \"roles\", \"chatml\" or \"llama3\"");
    }
    lua_pop(L, 1);
  }
  bool gen = bool_option(L, 3, "add_generation_prompt", false);
  lua_Integer n = luaL_len(L, 2);
  mrl_chat_message *msgs = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *msgs, 0);
  size_t cap = 16;
  for (lua_Integer i = 0; i < n; i++) {
    if (lua_geti(L, 2, i + 1) != LUA_TTABLE)
      return luaL_argerror(L, 2, lua_pushfstring(L, "messages[%I]: table expected, got %s", i + 1,
                                                 luaL_typename(L, -1)));
    static const char *const fields[] = {"role", "content"};
    size_t lens[2];
    const char *strs[2];
    for (int f = 0; f < 2; f++) {
      if (lua_getfield(L, -1 - f, fields[f]) != LUA_TSTRING)
        return luaL_argerror(L, 2, lua_pushfstring(L, "messages[%I].%s: string expected, got %s",
                                                   i + 1, fields[f], luaL_typename(L, -1)));
      strs[f] = lua_tolstring(L, -1, &lens[f]);
    }
    lua_pop(L, 3); /* the strings stay alive: the messages table holds them */
    if (lens[0] == 0 || strlen(strs[0]) != lens[0])
      return luaL_argerror(L, 2, lua_pushfstring(L, "messages[%I].role: %s", i + 1,
                                                 lens[0] ? "contains a NUL" : "empty"));
    msgs[i] = (mrl_chat_message){strs[0], strs[1], lens[1]};
    cap += lens[0] + lens[1] + 8;
  }
  size_t count = 0;
  for (int attempt = 0;; attempt++) {
    int32_t *ids = lua_newuserdatauv(L, cap * sizeof *ids, 0);
    mrl_status st = mrl_tokenizer_chat(t, (mrl_chat_template)tmpl, msgs, (size_t)n, gen, ids,
                                       cap, &count);
    if (st) return mrl__lua_raise(L, mrl__lua_engine(L), st, st == MRL_ERR_INVALID ? 2 : 0);
    if (count <= cap || attempt) {
      push_ids(L, ids, count);
      return 1;
    }
    lua_pop(L, 1);
    cap = count;
  }
}

/* tok:free() (also __gc and __close): releases the tokenizer now; later calls raise. */
static int m_free(lua_State *L) {
  tokenizer_box *b = luaL_checkudata(L, 1, TOKENIZER_MT);
  mrl_tokenizer_free(b->t);
  b->t = NULL;
  return 0;
}

static int mm_tostring(lua_State *L) {
  tokenizer_box *b = luaL_checkudata(L, 1, TOKENIZER_MT);
  if (b->t)
    lua_pushfstring(L, "moonrl.tokenizer (vocabulary size %d)", (int)mrl_tokenizer_vocab_size(b->t));
  else
    lua_pushliteral(L, "moonrl.tokenizer (freed)");
  return 1;
}

static const luaL_Reg tokenizer_methods[] = {
    {"encode", m_encode},       {"decode", m_decode}, {"vocab_size", m_vocab_size},
    {"token_id", m_token_id},   {"token", m_token},   {"chat", m_chat},
    {"free", m_free},           {NULL, NULL}};

static const luaL_Reg tokenizer_meta[] = {
    {"__gc", m_free}, {"__close", m_free}, {"__tostring", mm_tostring}, {NULL, NULL}};

static const luaL_Reg tokenizer_funcs[] = {{"bytes", l_bytes}, {"load", l_load}, {NULL, NULL}};

void mrl__lua_open_tokenizer(lua_State *L) {
  luaL_newmetatable(L, TOKENIZER_MT);
  luaL_setfuncs(L, tokenizer_meta, 0);
  luaL_newlib(L, tokenizer_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, tokenizer_funcs);
  lua_setfield(L, -2, "tokenizer");
}
