/* lua_http.c - the low-level Lua face of the HTTP client (`core.http`), under the facade
 * lua/moonrl/http/init.lua (rl.http), which adds base URLs, keys, JSON and coroutines:
 *
 *   core.http.client{max_connections=, retries=, connect_timeout=, timeout=, idle_timeout=,
 *                    backoff=, backoff_max=, retry_after_max=, seed=}   (times in seconds)
 *   client:submit{url=, method=, headers={"Name: value", ...}, body=, stream=, timeout=} -> req
 *   client:poll(seconds) -> requests finished; client:pending(); client:close()
 *   req:done(), req:events() (the SSE events parsed so far and not yet taken, as
 *   {type=, data=, id=} tables; stream = true only), req:has_events() (whether there are such
 *   events, without taking them), req:result() (a table), req:cancel(),
 *   req:close()
 *
 * Streamed bytes arrive inside libcurl's callbacks, where raising a Lua error would jump over C
 * frames: they go through the C SSE parser into a C queue, and Lua reads the queue afterwards. */
#include "lua_internal.h"

#include <stdlib.h>
#include <string.h>

#define CLIENT_MT "moonrl.http.client"
#define REQUEST_MT "moonrl.http.request"

typedef struct {
  mrl_http *h; /* NULL once closed */
} client_box;

typedef struct queued_event {
  struct queued_event *next;
  char *type, *data, *id;
  size_t data_len;
} queued_event;

typedef struct {
  mrl_http_request *r; /* NULL once closed; uservalue 1: the client (kept alive) */
  mrl_sse *sse;        /* stream = true */
  queued_event *head, *tail;
  int out_of_memory;
} request_box;

static client_box *check_client(lua_State *L, int idx) {
  client_box *b = luaL_checkudata(L, idx, CLIENT_MT);
  if (!b->h) luaL_argerror(L, idx, "the http client is closed");
  return b;
}

static request_box *check_request(lua_State *L, int idx) {
  request_box *b = luaL_checkudata(L, idx, REQUEST_MT);
  if (!b->r) luaL_argerror(L, idx, "the http request is closed");
  return b;
}

/* A non-negative number of seconds in field key as milliseconds (0 when absent). */
static int64_t ms_field(lua_State *L, int idx, const char *key) {
  double s = mrl__lua_opt_number(L, idx, key, 0);
  if (!(s >= 0 && s < 1e12))
    luaL_argerror(L, idx, lua_pushfstring(L, "%s: a non-negative number of seconds expected", key));
  return (int64_t)(s * 1000 + 0.5);
}

static int l_client(lua_State *L) {
  static const char *const known[] = {"max_connections", "retries", "connect_timeout", "timeout",
                                      "idle_timeout", "backoff", "backoff_max",
                                      "retry_after_max", "seed", NULL};
  luaL_checktype(L, 1, LUA_TTABLE);
  mrl__lua_check_fields(L, 1, known);
  mrl_http_config c = {0};
  lua_Integer conns = mrl__lua_opt_integer(L, 1, "max_connections", 0);
  lua_Integer retries = mrl__lua_opt_integer(L, 1, "retries", 2);
  if (conns < 0 || conns > 100000) luaL_argerror(L, 1, "max_connections: a positive integer expected");
  if (retries < 0 || retries > 1000) luaL_argerror(L, 1, "retries: an integer in [0, 1000] expected");
  c.max_connections = (int)conns;
  c.retries = retries == 0 ? MRL_HTTP_NO_RETRIES : (int)retries;
  c.connect_timeout_ms = ms_field(L, 1, "connect_timeout");
  c.timeout_ms = ms_field(L, 1, "timeout");
  c.idle_timeout_ms = ms_field(L, 1, "idle_timeout");
  c.backoff_ms = ms_field(L, 1, "backoff");
  c.backoff_max_ms = ms_field(L, 1, "backoff_max");
  c.retry_after_max_ms = ms_field(L, 1, "retry_after_max");
  c.seed = (uint64_t)mrl__lua_opt_integer(L, 1, "seed", 0);
  client_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->h = NULL;
  luaL_setmetatable(L, CLIENT_MT);
  mrl_engine *e = mrl__lua_engine(L);
  mrl_status st = mrl_http_new(e, &c, &b->h);
  if (st) return mrl__lua_raise(L, e, st, 0);
  return 1;
}

/* ---- the event queue (filled inside libcurl's callbacks: C only) ---- */

static char *copy(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p) {
    memcpy(p, s, n);
    p[n] = '\0';
  }
  return p;
}

static void free_event(queued_event *q) {
  free(q->type);
  free(q->data);
  free(q->id);
  free(q);
}

static int queue_event(void *ud, const mrl_sse_event *ev) {
  request_box *b = ud;
  queued_event *q = calloc(1, sizeof *q);
  if (q) {
    q->type = copy(ev->type, strlen(ev->type));
    q->data = copy(ev->data, ev->data_len);
    q->id = copy(ev->id, strlen(ev->id));
    q->data_len = ev->data_len;
  }
  if (!q || !q->type || !q->data || !q->id) {
    if (q) free_event(q);
    b->out_of_memory = 1;
    return 1;
  }
  if (b->tail) b->tail->next = q;
  else b->head = q;
  b->tail = q;
  return 0;
}

static int on_data(void *ud, const char *bytes, size_t len) {
  request_box *b = ud;
  return mrl_sse_feed(b->sse, bytes, len, queue_event, b) != MRL_OK;
}

/* ---- client methods ---- */

static int m_submit(lua_State *L) {
  static const char *const known[] = {"url", "method", "headers", "body", "stream", "timeout", NULL};
  client_box *cb = check_client(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  mrl__lua_check_fields(L, 2, known);
  mrl_http_call call = {0};
  call.url = mrl__lua_opt_string(L, 2, "url", NULL);
  if (!call.url) luaL_argerror(L, 2, "url: a string expected");
  call.method = mrl__lua_opt_string(L, 2, "method", NULL);
  call.timeout_ms = ms_field(L, 2, "timeout");
  lua_getfield(L, 2, "body");
  size_t body_len = 0;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TSTRING) luaL_argerror(L, 2, "body: a string expected");
    call.body = lua_tolstring(L, -1, &body_len);
    call.body_len = body_len;
  }
  /* headers: a list of "Name: value" strings, gathered into a NULL-terminated array */
  int ty = lua_getfield(L, 2, "headers");
  lua_Integer nh = 0;
  if (ty != LUA_TNIL) {
    if (ty != LUA_TTABLE) luaL_argerror(L, 2, "headers: a list of strings expected");
    nh = luaL_len(L, -1);
  }
  const char **headers = lua_newuserdatauv(L, (size_t)(nh + 1) * sizeof *headers, 0);
  for (lua_Integer i = 1; i <= nh; i++) {
    if (lua_geti(L, -2, i) != LUA_TSTRING) luaL_argerror(L, 2, "headers: a list of strings expected");
    headers[i - 1] = lua_tostring(L, -1);
    lua_pop(L, 1); /* the string stays alive in the headers table */
  }
  headers[nh] = NULL;
  call.headers = headers;
  lua_getfield(L, 2, "stream");
  int stream = lua_toboolean(L, -1);
  lua_pop(L, 1);

  request_box *rb = lua_newuserdatauv(L, sizeof *rb, 1);
  memset(rb, 0, sizeof *rb);
  luaL_setmetatable(L, REQUEST_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  mrl_engine *e = mrl__lua_engine(L);
  mrl_status st;
  if (stream) {
    if ((st = mrl_sse_new(e, 0, &rb->sse))) return mrl__lua_raise(L, e, st, 0);
    call.on_data = on_data;
    call.ud = rb;
  }
  st = mrl_http_submit(cb->h, &call, &rb->r);
  if (st) return mrl__lua_raise(L, e, st, 2);
  return 1;
}

static int m_poll(lua_State *L) {
  client_box *b = check_client(L, 1);
  double s = luaL_optnumber(L, 2, 0);
  if (!(s >= 0)) luaL_argerror(L, 2, "a non-negative number of seconds expected");
  if (s > 3600) s = 3600;
  int n = 0;
  mrl_status st = mrl_http_poll(b->h, (int64_t)(s * 1000 + 0.5), &n);
  if (st) return mrl__lua_raise(L, mrl__lua_engine(L), st, 0);
  /* finished requests are read through their boxes: the client's list is not needed */
  mrl_http_request *done;
  do mrl_http_next_done(b->h, &done);
  while (done);
  lua_pushinteger(L, n);
  return 1;
}

static int m_pending(lua_State *L) {
  lua_pushinteger(L, mrl_http_pending(check_client(L, 1)->h));
  return 1;
}

static int m_client_close(lua_State *L) {
  client_box *b = luaL_checkudata(L, 1, CLIENT_MT);
  mrl_http_free(b->h);
  b->h = NULL;
  return 0;
}

static int m_client_tostring(lua_State *L) {
  client_box *b = luaL_checkudata(L, 1, CLIENT_MT);
  if (b->h) lua_pushfstring(L, "http client (%p)", (void *)b->h);
  else lua_pushliteral(L, "http client (closed)");
  return 1;
}

/* ---- request methods ---- */

static int m_done(lua_State *L) {
  lua_pushboolean(L, mrl_http_request_finished(check_request(L, 1)->r) == 1);
  return 1;
}

static int m_events(lua_State *L) {
  request_box *b = check_request(L, 1);
  lua_newtable(L);
  int i = 0;
  while (b->head) {
    queued_event *q = b->head;
    lua_createtable(L, 0, 3);
    lua_pushstring(L, q->type);
    lua_setfield(L, -2, "type");
    lua_pushlstring(L, q->data, q->data_len);
    lua_setfield(L, -2, "data");
    lua_pushstring(L, q->id);
    lua_setfield(L, -2, "id");
    lua_rawseti(L, -2, ++i);
    b->head = q->next;
    if (!b->head) b->tail = NULL;
    free_event(q);
  }
  return 1;
}

static int m_has_events(lua_State *L) {
  lua_pushboolean(L, check_request(L, 1)->head != NULL);
  return 1;
}

static int m_result(lua_State *L) {
  request_box *b = check_request(L, 1);
  const mrl_http_response *r = mrl_http_response_of(b->r);
  lua_createtable(L, 0, 10);
  lua_pushstring(L, mrl_http_outcome_name(r->outcome));
  lua_setfield(L, -2, "outcome");
  lua_pushinteger(L, r->status);
  lua_setfield(L, -2, "status");
  lua_createtable(L, 0, (int)r->nheaders);
  for (size_t i = 0; i < r->nheaders; i++) {
    /* a repeated field: the values joined with ", " (RFC 9110) */
    if (lua_getfield(L, -1, r->header_names[i]) == LUA_TSTRING)
      lua_pushfstring(L, "%s, %s", lua_tostring(L, -1), r->header_values[i]);
    else
      lua_pushstring(L, r->header_values[i]);
    lua_setfield(L, -3, r->header_names[i]);
    lua_pop(L, 1);
  }
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, r->body, r->body_len);
  lua_setfield(L, -2, "body");
  lua_pushinteger(L, r->attempts);
  lua_setfield(L, -2, "attempts");
  lua_pushinteger(L, (lua_Integer)r->connects);
  lua_setfield(L, -2, "connects");
  lua_pushinteger(L, (lua_Integer)r->delivered);
  lua_setfield(L, -2, "delivered");
  lua_pushnumber(L, r->elapsed_ms / 1000);
  lua_setfield(L, -2, "elapsed");
  const char *message = r->message;
  if (b->out_of_memory) message = "out of memory while queueing streamed events";
  else if (r->outcome == MRL_HTTP_STOPPED && b->sse) message = mrl_engine_last_error(mrl__lua_engine(L));
  lua_pushstring(L, message);
  lua_setfield(L, -2, "message");
  if (b->sse && r->outcome != MRL_HTTP_PENDING) {
    int dropped = 0;
    mrl_sse_finish(b->sse, &dropped);
    lua_pushboolean(L, dropped);
    lua_setfield(L, -2, "stream_cut"); /* the stream ended inside an event */
  }
  return 1;
}

static int m_cancel(lua_State *L) {
  mrl_http_cancel(check_request(L, 1)->r);
  return 0;
}

static int m_request_close(lua_State *L) {
  request_box *b = luaL_checkudata(L, 1, REQUEST_MT);
  mrl_http_request_free(b->r);
  b->r = NULL;
  mrl_sse_free(b->sse);
  b->sse = NULL;
  while (b->head) {
    queued_event *q = b->head;
    b->head = q->next;
    free_event(q);
  }
  b->tail = NULL;
  return 0;
}

static int m_request_tostring(lua_State *L) {
  request_box *b = luaL_checkudata(L, 1, REQUEST_MT);
  if (b->r)
    lua_pushfstring(L, "http request (%s)",
                    mrl_http_outcome_name(mrl_http_response_of(b->r)->outcome));
  else
    lua_pushliteral(L, "http request (closed)");
  return 1;
}

static const luaL_Reg client_methods[] = {{"submit", m_submit},   {"poll", m_poll},
                                          {"pending", m_pending}, {"close", m_client_close},
                                          {NULL, NULL}};
static const luaL_Reg client_meta[] = {{"__gc", m_client_close},
                                       {"__close", m_client_close},
                                       {"__tostring", m_client_tostring},
                                       {NULL, NULL}};
static const luaL_Reg request_methods[] = {{"done", m_done},     {"events", m_events},
                                           {"has_events", m_has_events},
                                           {"result", m_result}, {"cancel", m_cancel},
                                           {"close", m_request_close}, {NULL, NULL}};
static const luaL_Reg request_meta[] = {{"__gc", m_request_close},
                                        {"__close", m_request_close},
                                        {"__tostring", m_request_tostring},
                                        {NULL, NULL}};
static const luaL_Reg http_funcs[] = {{"client", l_client}, {NULL, NULL}};

void mrl__lua_open_http(lua_State *L) {
  luaL_newmetatable(L, CLIENT_MT);
  luaL_setfuncs(L, client_meta, 0);
  luaL_newlib(L, client_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newmetatable(L, REQUEST_MT);
  luaL_setfuncs(L, request_meta, 0);
  luaL_newlib(L, request_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newlib(L, http_funcs);
}
