/* mock_server.c - the scripted loopback HTTP server of the HTTP client's tests (mock_server.h):
 * one thread per connection, keep-alive, faults on request, counters, a log of the requests with
 * their arrival times, and vLLM-, SGLang-, llama.cpp- and OpenAI-shaped replies (judge verdicts
 * and rankings among them). Test code: it may print and exit on impossible setup. */
#define _GNU_SOURCE
#include "mock_server.h"

#include "json.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { MAX_CONNS = 1024, MAX_KEYS = 256, MAX_HEAD = 65536, MAX_LOG = 16384 };

/* one request as it arrived: CLOCK_MONOTONIC seconds, its path (no query) and body */
typedef struct {
  double t;
  char *path, *body;
  size_t body_len;
} logged;

typedef struct {
  int fd;
  pthread_t thread;
  int used, finished;
  mock_server *server;
} conn;

struct mock_server {
  int listen_fd, port;
  pthread_t acceptor;
  pthread_mutex_t mu;
  int stopping, quit;
  conn conns[MAX_CONNS];
  long requests, connections, open, max_open, inflight, max_inflight;
  char *keys[MAX_KEYS];
  long hits[MAX_KEYS];
  int nkeys;
  logged *log; /* MAX_LOG entries; later requests are only counted in dropped */
  long nlog, dropped;
};

/* ---- a growing string ---- */
typedef struct {
  char *p;
  size_t len, cap;
} str;

static void str_add(str *s, const char *b, size_t n) {
  if (s->len + n + 1 > s->cap) {
    s->cap = (s->len + n + 1) * 2;
    s->p = realloc(s->p, s->cap);
    if (!s->p) abort();
  }
  memcpy(s->p + s->len, b, n);
  s->len += n;
  s->p[s->len] = '\0';
}

static void str_printf(str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void str_printf(str *s, const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  str_add(s, buf, n < 0 ? 0 : (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void str_json_string(str *s, const char *v, size_t n) {
  str_add(s, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)v[i];
    if (c == '"' || c == '\\') {
      char esc[2] = {'\\', (char)c};
      str_add(s, esc, 2);
    } else if (c < 0x20) {
      str_printf(s, "\\u%04x", c);
    } else {
      str_add(s, (const char *)&c, 1);
    }
  }
  str_add(s, "\"", 1);
}

/* ---- requests ---- */
typedef struct {
  char method[16], path[256], query[1024];
  char authorization[256], x_test[256];
  char *body;
  size_t body_len;
} request;

static void msleep(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {}
}

static int send_all(int fd, const char *b, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

/* The value of query parameter name, or dflt. */
static long qint(const request *r, const char *name, long dflt) {
  size_t n = strlen(name);
  for (const char *q = r->query; *q;) {
    if (strncmp(q, name, n) == 0 && q[n] == '=') return strtol(q + n + 1, NULL, 10);
    const char *amp = strchr(q, '&');
    if (!amp) break;
    q = amp + 1;
  }
  return dflt;
}

static int qstr(const request *r, const char *name, char *out, size_t cap) {
  size_t n = strlen(name);
  for (const char *q = r->query; *q;) {
    if (strncmp(q, name, n) == 0 && q[n] == '=') {
      const char *v = q + n + 1;
      size_t len = strcspn(v, "&");
      if (len >= cap) len = cap - 1;
      memcpy(out, v, len);
      out[len] = '\0';
      return 1;
    }
    const char *amp = strchr(q, '&');
    if (!amp) break;
    q = amp + 1;
  }
  return 0;
}

/* Counts a hit of the request's key; returns the hit's number (1 for the first). */
static long hit(mock_server *s, const request *r) {
  char key[128] = "";
  qstr(r, "key", key, sizeof key);
  pthread_mutex_lock(&s->mu);
  int i = 0;
  while (i < s->nkeys && strcmp(s->keys[i], key) != 0) i++;
  if (i == s->nkeys && s->nkeys < MAX_KEYS) s->keys[s->nkeys++] = strdup(key);
  long n = i < MAX_KEYS ? ++s->hits[i] : 0;
  pthread_mutex_unlock(&s->mu);
  return n;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The routes that read or reset the server's own records, which are not logged. */
static int is_control(const char *path) {
  return strcmp(path, "/requests") == 0 || strcmp(path, "/stats") == 0 ||
         strcmp(path, "/reset_stats") == 0 || strcmp(path, "/quit") == 0;
}

/* Logs a request that arrived at time t (before it is answered). */
static void log_request(mock_server *s, const request *r, double t) {
  if (is_control(r->path)) return;
  pthread_mutex_lock(&s->mu);
  if (!s->log) s->log = calloc(MAX_LOG, sizeof *s->log);
  if (!s->log) abort();
  if (s->nlog == MAX_LOG) {
    s->dropped++;
  } else {
    logged *e = &s->log[s->nlog++];
    e->t = t;
    e->path = strdup(r->path);
    e->body = malloc(r->body_len + 1);
    if (!e->path || !e->body) abort();
    memcpy(e->body, r->body, r->body_len + 1);
    e->body_len = r->body_len;
  }
  pthread_mutex_unlock(&s->mu);
}

/* Forgets the log; the caller holds s->mu. */
static void clear_log(mock_server *s) {
  for (long i = 0; i < s->nlog; i++) {
    free(s->log[i].path);
    free(s->log[i].body);
  }
  s->nlog = s->dropped = 0;
}

static int respond(int fd, int code, const char *type, const char *extra, const char *body,
                   size_t len) {
  str h = {0};
  str_printf(&h, "HTTP/1.1 %d Mock\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s\r\n", code,
             type, len, extra ? extra : "");
  int rc = send_all(fd, h.p, h.len);
  free(h.p);
  return rc ? rc : send_all(fd, body, len);
}

static int respond_json(int fd, int code, const str *body) {
  return respond(fd, code, "application/json", NULL, body->p ? body->p : "", body->len);
}

/* With a zero linger time, the close that follows (serve_connection) sends a TCP RST. */
static void reset_connection(int fd) {
  struct linger lg = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
}

/* ---- generation routes ---- */

static const mrl_json *path_get(const mrl_json *root, const char *a, const char *b) {
  const mrl_json *v = mrl__json_get(root, a);
  return v && b ? mrl__json_get(v, b) : v;
}

static long json_int(const mrl_json *v, long dflt) {
  return v && v->type == MRL_JSON_NUMBER ? (long)v->number : dflt;
}

static int json_true(const mrl_json *v) { return v && v->type == MRL_JSON_TRUE; }

static void generation(int fd, const char *route, const mrl_json *root) {
  const mrl_json *prompt = strcmp(route, "sglang") == 0 ? mrl__json_get(root, "input_ids")
                                                        : mrl__json_get(root, "prompt");
  long n = strcmp(route, "vllm") == 0     ? json_int(mrl__json_get(root, "max_tokens"), 16)
           : strcmp(route, "sglang") == 0 ? json_int(path_get(root, "sampling_params", "max_new_tokens"), 16)
                                          : json_int(mrl__json_get(root, "n_predict"), 16);
  if (!prompt || prompt->type != MRL_JSON_ARRAY) {
    str e = {0};
    str_printf(&e, "{\"error\":{\"message\":\"prompt must be token ids\",\"type\":\"invalid_request_error\",\"code\":400}}");
    respond_json(fd, 400, &e);
    free(e.p);
    return;
  }
  long sum = 0;
  for (size_t i = 0; i < prompt->length; i++) sum += (long)prompt->items[i].number;
  long ids[4096];
  double lps[4096];
  if (n > 4096) n = 4096;
  for (long k = 0; k < n; k++) {
    ids[k] = (31 * sum + 7 * k) % 1000 + 1;
    lps[k] = -(double)(k + 1) / 8.0;
  }
  str b = {0};
  str text = {0};
  for (long k = 0; k < n; k++) str_printf(&text, "<%ld>", ids[k]);
  if (strcmp(route, "vllm") == 0) {
    int want_ids = json_true(mrl__json_get(root, "return_token_ids"));
    str_printf(&b, "{\"id\":\"cmpl-mock\",\"object\":\"text_completion\",\"model\":\"mock\",");
    if (want_ids) {
      str_printf(&b, "\"prompt_token_ids\":[");
      for (size_t i = 0; i < prompt->length; i++) str_printf(&b, "%s%ld", i ? "," : "", (long)prompt->items[i].number);
      str_printf(&b, "],");
    }
    str_printf(&b, "\"choices\":[{\"index\":0,\"text\":");
    str_json_string(&b, text.p ? text.p : "", text.len);
    if (want_ids) {
      str_printf(&b, ",\"token_ids\":[");
      for (long k = 0; k < n; k++) str_printf(&b, "%s%ld", k ? "," : "", ids[k]);
      str_printf(&b, "]");
    }
    str_printf(&b, ",\"logprobs\":{\"tokens\":[");
    for (long k = 0; k < n; k++) str_printf(&b, "%s\"token_id:%ld\"", k ? "," : "", ids[k]);
    str_printf(&b, "],\"token_logprobs\":[");
    for (long k = 0; k < n; k++) str_printf(&b, "%s%.17g", k ? "," : "", lps[k]);
    str_printf(&b, "],\"top_logprobs\":[");
    for (long k = 0; k < n; k++) str_printf(&b, "%s{\"token_id:%ld\":%.17g}", k ? "," : "", ids[k], lps[k]);
    str_printf(&b, "]},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":%zu,"
               "\"completion_tokens\":%ld,\"total_tokens\":%ld}}", prompt->length, n,
               (long)prompt->length + n);
  } else if (strcmp(route, "sglang") == 0) {
    str_printf(&b, "{\"text\":");
    str_json_string(&b, text.p ? text.p : "", text.len);
    str_printf(&b, ",\"output_ids\":[");
    for (long k = 0; k < n; k++) str_printf(&b, "%s%ld", k ? "," : "", ids[k]);
    str_printf(&b, "],\"meta_info\":{\"prompt_tokens\":%zu,\"completion_tokens\":%ld,"
               "\"finish_reason\":{\"type\":\"length\",\"length\":%ld}", prompt->length, n, n);
    if (json_true(mrl__json_get(root, "return_logprob"))) {
      str_printf(&b, ",\"output_token_logprobs\":[");
      for (long k = 0; k < n; k++) str_printf(&b, "%s[%.17g,%ld,null]", k ? "," : "", lps[k], ids[k]);
      str_printf(&b, "]");
    }
    str_printf(&b, "}}");
  } else {
    str_printf(&b, "{\"content\":");
    str_json_string(&b, text.p ? text.p : "", text.len);
    if (json_true(mrl__json_get(root, "return_tokens"))) {
      str_printf(&b, ",\"tokens\":[");
      for (long k = 0; k < n; k++) str_printf(&b, "%s%ld", k ? "," : "", ids[k]);
      str_printf(&b, "]");
    }
    if (json_int(mrl__json_get(root, "n_probs"), 0) > 0) {
      str_printf(&b, ",\"completion_probabilities\":[");
      for (long k = 0; k < n; k++)
        str_printf(&b, "%s{\"id\":%ld,\"token\":\"<%ld>\",\"logprob\":%.17g,\"bytes\":[],"
                   "\"top_logprobs\":[{\"id\":%ld,\"token\":\"<%ld>\",\"logprob\":%.17g}]}",
                   k ? "," : "", ids[k], ids[k], lps[k], ids[k], ids[k], lps[k]);
      str_printf(&b, "]");
    }
    str_printf(&b, ",\"stop_type\":\"limit\",\"stop\":true,\"truncated\":false,"
               "\"tokens_predicted\":%ld,\"tokens_evaluated\":%zu}", n, prompt->length);
  }
  respond_json(fd, 200, &b);
  free(b.p);
  free(text.p);
}

/* A judge's verdict on text: "yes" when its first "answer: " is followed by a lowercase letter. */
static void verdict(const char *text, str *reply) {
  const char *a = strstr(text, "answer: ");
  str_printf(reply, "%s", a && a[8] >= 'a' && a[8] <= 'z' ? "yes" : "no");
}

/* A ranking of the candidates of text, its lines "[k] ... <number> ...": "Ranking: " and their
   numbers k, the largest <number> first (ties: the smaller k first). */
static void ranking(const char *text, str *reply) {
  enum { MAX_CAND = 64 };
  long k[MAX_CAND], v[MAX_CAND];
  int n = 0;
  for (const char *line = text; line && *line && n < MAX_CAND;) {
    const char *eol = strchr(line, '\n');
    char *end;
    if (line[0] == '[') {
      long id = strtol(line + 1, &end, 10);
      if (end > line + 1 && *end == ']') {
        const char *d = end;
        while (*d && d != eol && (*d < '0' || *d > '9')) d++;
        long value = *d && d != eol ? strtol(d, NULL, 10) : 0;
        int at = n++;
        while (at > 0 && (v[at - 1] < value || (v[at - 1] == value && k[at - 1] > id))) {
          k[at] = k[at - 1];
          v[at] = v[at - 1];
          at--;
        }
        k[at] = id;
        v[at] = value;
      }
    }
    line = eol ? eol + 1 : NULL;
  }
  str_printf(reply, "Ranking:");
  for (int i = 0; i < n; i++) str_printf(reply, " %ld", k[i]);
}

/* The reply's words, for chat, from the content of the last message: for the models "verdict..."
   a verdict, for "ranker" a ranking, for the others "reply to: <content>". */
static void chat_reply(const mrl_json *root, str *reply) {
  const mrl_json *msgs = mrl__json_get(root, "messages");
  const mrl_json *model = mrl__json_get(root, "model");
  const char *name = model && model->type == MRL_JSON_STRING ? model->string : "";
  const mrl_json *c = NULL;
  if (msgs && msgs->type == MRL_JSON_ARRAY && msgs->length > 0)
    c = mrl__json_get(&msgs->items[msgs->length - 1], "content");
  if (c && c->type != MRL_JSON_STRING) c = NULL;
  if (strncmp(name, "verdict", 7) == 0) {
    verdict(c ? c->string : "", reply);
  } else if (strcmp(name, "ranker") == 0) {
    ranking(c ? c->string : "", reply);
  } else {
    str_printf(reply, "reply to: ");
    if (c) str_add(reply, c->string, c->length);
  }
}

static int chat(int fd, const mrl_json *root, const request *r) {
  const mrl_json *model = mrl__json_get(root, "model");
  if (model && model->type == MRL_JSON_STRING && strcmp(model->string, "unknown") == 0) {
    str e = {0};
    str_printf(&e, "{\"error\":{\"message\":\"The model `unknown` does not exist.\","
               "\"type\":\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}");
    respond_json(fd, 404, &e);
    free(e.p);
    return 0;
  }
  str reply = {0};
  chat_reply(root, &reply);
  long nchoices = json_int(mrl__json_get(root, "n"), 1);
  int logprobs = json_true(mrl__json_get(root, "logprobs"));
  const mrl_json *tools = mrl__json_get(root, "tools");
  const char *tool = NULL;
  if (tools && tools->type == MRL_JSON_ARRAY && tools->length > 0) {
    const mrl_json *name = path_get(&tools->items[0], "function", "name");
    if (name && name->type == MRL_JSON_STRING) tool = name->string;
  }
  /* the words, each a "token" */
  const char *words[512];
  size_t wlen[512], nw = 0;
  for (const char *p = reply.p; *p && nw < 512;) {
    const char *sp = strchr(p, ' ');
    size_t l = sp ? (size_t)(sp - p) + 1 : strlen(p);
    words[nw] = p;
    wlen[nw++] = l;
    p += l;
  }
  str b = {0};
  if (json_true(mrl__json_get(root, "stream"))) {
    const char *eol = "\n";
    str_printf(&b, "HTTP/1.1 200 Mock\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n");
    str_printf(&b, ": ping%s%s", eol, eol);
    str_printf(&b, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
               "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}%s%s", eol, eol);
    for (size_t k = 0; k < nw; k++) {
      str_printf(&b, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
      str_json_string(&b, words[k], wlen[k]);
      str_printf(&b, "},\"finish_reason\":null}]}%s%s", eol, eol);
    }
    str_printf(&b, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},"
               "\"finish_reason\":\"stop\"}]}%s%s", eol, eol);
    if (json_true(path_get(root, "stream_options", "include_usage")))
      str_printf(&b, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":"
                 "{\"prompt_tokens\":3,\"completion_tokens\":%zu,\"total_tokens\":%zu}}%s%s", nw, nw + 3, eol, eol);
    str_printf(&b, "data: [DONE]%s%s", eol, eol);
    send_all(fd, b.p, b.len);
    free(b.p);
    free(reply.p);
    return -1; /* the stream ends with the connection */
  }
  str_printf(&b, "{\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion\",\"created\":0,\"model\":\"mock\",\"choices\":[");
  for (long c = 0; c < nchoices; c++) {
    str_printf(&b, "%s{\"index\":%ld,\"message\":{\"role\":\"assistant\",", c ? "," : "", c);
    if (tool) {
      str_printf(&b, "\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                 "\"function\":{\"name\":");
      str_json_string(&b, tool, strlen(tool));
      str_printf(&b, ",\"arguments\":\"{\\\"q\\\":1}\"}}]}");
    } else {
      str_printf(&b, "\"content\":");
      str_json_string(&b, reply.p, reply.len);
      str_printf(&b, "}");
    }
    if (logprobs) {
      str_printf(&b, ",\"logprobs\":{\"content\":[");
      for (size_t k = 0; k < nw; k++) {
        str_printf(&b, "%s{\"token\":", k ? "," : "");
        str_json_string(&b, words[k], wlen[k]);
        str_printf(&b, ",\"logprob\":%.17g,\"bytes\":null,\"top_logprobs\":[]}", -(double)(k + 1) / 8.0);
      }
      str_printf(&b, "]}");
    }
    str_printf(&b, ",\"finish_reason\":\"%s\"}", tool ? "tool_calls" : "stop");
  }
  str_printf(&b, "],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":%zu,\"total_tokens\":%zu},"
             "\"echo\":", nw, nw + 3);
  str_add(&b, r->body, r->body_len);
  str_printf(&b, "}");
  int rc = respond_json(fd, 200, &b);
  free(b.p);
  free(reply.p);
  return rc;
}

static int json_route(int fd, const char *route, const request *r) {
  int rc = 0;
  mrl_engine *e = NULL;
  mrl_json_doc *doc = NULL;
  if (mrl_engine_new(&e) || mrl__json_parse(e, "mock", "request body", r->body ? r->body : "",
                                            r->body_len, &doc)) {
    str m = {0};
    str_printf(&m, "{\"error\":{\"message\":\"malformed JSON\",\"type\":\"invalid_request_error\",\"code\":400}}");
    respond_json(fd, 400, &m);
    free(m.p);
  } else if (strcmp(route, "chat") == 0) {
    rc = chat(fd, mrl__json_root(doc), r);
  } else {
    generation(fd, route, mrl__json_root(doc));
  }
  mrl__json_free(doc);
  mrl_engine_free(e);
  return rc;
}

/* ---- routes ---- */

/* Answers one request; returns 0 to keep the connection, -1 to close it. */
static int route(mock_server *s, int fd, const request *r) {
  const char *p = r->path;
  long arg;
  int used = 0;
  if (sscanf(p, "/code/%ld%n", &arg, &used) == 1 && used > 0 && p[used] == '/') {
    str e = {0};
    str_printf(&e, "{\"error\":{\"message\":\"injected %ld\",\"type\":\"server_error\",\"code\":null}}", arg);
    int rc = respond_json(fd, (int)arg, &e);
    free(e.p);
    return rc;
  }
  if (sscanf(p, "/delay/%ld%n", &arg, &used) == 1 && used > 0 && p[used] == '/') {
    msleep(arg);
    request inner = *r;
    snprintf(inner.path, sizeof inner.path, "%s", p + used);
    return route(s, fd, &inner);
  }
  if (strcmp(p, "/requests") == 0) {
    str b = {0};
    pthread_mutex_lock(&s->mu);
    str_printf(&b, "{\"now\":%.9f,\"dropped\":%ld,\"requests\":[", now_seconds(), s->dropped);
    for (long i = 0; i < s->nlog; i++) {
      const logged *e = &s->log[i];
      str_printf(&b, "%s{\"t\":%.9f,\"path\":", i ? "," : "", e->t);
      str_json_string(&b, e->path, strlen(e->path));
      str_printf(&b, ",\"body\":");
      str_json_string(&b, e->body, e->body_len);
      str_printf(&b, "}");
    }
    str_printf(&b, "]}");
    pthread_mutex_unlock(&s->mu);
    int rc = respond_json(fd, 200, &b);
    free(b.p);
    return rc;
  }
  if (strcmp(p, "/echo") == 0) {
    str b = {0};
    str_printf(&b, "{\"method\":");
    str_json_string(&b, r->method, strlen(r->method));
    str_printf(&b, ",\"path\":");
    str_json_string(&b, r->path, strlen(r->path));
    str_printf(&b, ",\"query\":");
    str_json_string(&b, r->query, strlen(r->query));
    str_printf(&b, ",\"body\":");
    str_json_string(&b, r->body ? r->body : "", r->body_len);
    str_printf(&b, ",\"authorization\":");
    str_json_string(&b, r->authorization, strlen(r->authorization));
    str_printf(&b, ",\"x_test\":");
    str_json_string(&b, r->x_test, strlen(r->x_test));
    str_printf(&b, "}");
    int rc = respond_json(fd, 200, &b);
    free(b.p);
    return rc;
  }
  if (strcmp(p, "/status") == 0) {
    long n = hit(s, r), fail = qint(r, "fail", -1);
    if (fail >= 0 && n > fail) return respond(fd, 200, "text/plain", NULL, "ok", 2);
    str extra = {0};
    char v[64];
    if (qstr(r, "retry_after", v, sizeof v)) str_printf(&extra, "Retry-After: %s\r\n", v);
    if (qstr(r, "retry_after_ms", v, sizeof v)) str_printf(&extra, "retry-after-ms: %s\r\n", v);
    if (qstr(r, "should_retry", v, sizeof v)) str_printf(&extra, "x-should-retry: %s\r\n", v);
    const char *body = "{\"error\":{\"message\":\"injected\",\"type\":\"server_error\",\"code\":null}}";
    int rc = respond(fd, (int)qint(r, "code", 503), "application/json", extra.p, body, strlen(body));
    free(extra.p);
    return rc;
  }
  if (strcmp(p, "/reset") == 0) {
    long n = hit(s, r), fail = qint(r, "fail", -1);
    if (fail >= 0 && n > fail) return respond(fd, 200, "text/plain", NULL, "ok", 2);
    reset_connection(fd);
    return -1;
  }
  if (strcmp(p, "/sse") == 0) {
    hit(s, r);
    long n = qint(r, "n", 3), delay = qint(r, "delay_ms", 0), reset_after = qint(r, "reset_after", -1);
    char eolname[8] = "lf";
    qstr(r, "eol", eolname, sizeof eolname);
    const char *eol = strcmp(eolname, "crlf") == 0 ? "\r\n" : strcmp(eolname, "cr") == 0 ? "\r" : "\n";
    const char *head = "HTTP/1.1 200 Mock\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    if (send_all(fd, head, strlen(head))) return -1;
    for (long k = 0; k < n; k++) {
      if (k == reset_after) {
        reset_connection(fd);
        return -1;
      }
      if (delay) msleep(delay);
      char ev[128];
      snprintf(ev, sizeof ev, "data: {\"i\":%ld}%s%s", k, eol, eol);
      if (send_all(fd, ev, strlen(ev))) return -1;
    }
    char done[64];
    snprintf(done, sizeof done, "data: [DONE]%s%s", eol, eol);
    send_all(fd, done, strlen(done));
    return -1;
  }
  if (strcmp(p, "/slow") == 0) {
    msleep(qint(r, "ms", 1000));
    return respond(fd, 200, "text/plain", NULL, "ok", 2);
  }
  if (strcmp(p, "/stall") == 0) {
    const char *head = "HTTP/1.1 200 Mock\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nok";
    if (send_all(fd, head, strlen(head))) return -1;
    msleep(qint(r, "ms", 1000));
    send_all(fd, "ok", 2);
    return -1;
  }
  if (strcmp(p, "/hold") == 0) {
    pthread_mutex_lock(&s->mu);
    if (++s->inflight > s->max_inflight) s->max_inflight = s->inflight;
    pthread_mutex_unlock(&s->mu);
    msleep(qint(r, "ms", 50));
    pthread_mutex_lock(&s->mu);
    s->inflight--;
    pthread_mutex_unlock(&s->mu);
    return respond(fd, 200, "text/plain", NULL, "ok", 2);
  }
  if (strcmp(p, "/stats") == 0) {
    str b = {0};
    pthread_mutex_lock(&s->mu);
    str_printf(&b, "{\"requests\":%ld,\"connections\":%ld,\"open\":%ld,\"max_open\":%ld,"
               "\"inflight\":%ld,\"max_inflight\":%ld,\"hits\":{", s->requests, s->connections,
               s->open, s->max_open, s->inflight, s->max_inflight);
    for (int i = 0; i < s->nkeys; i++) {
      str_printf(&b, "%s", i ? "," : "");
      str_json_string(&b, s->keys[i], strlen(s->keys[i]));
      str_printf(&b, ":%ld", s->hits[i]);
    }
    str_printf(&b, "}}");
    pthread_mutex_unlock(&s->mu);
    int rc = respond_json(fd, 200, &b);
    free(b.p);
    return rc;
  }
  if (strcmp(p, "/reset_stats") == 0) {
    pthread_mutex_lock(&s->mu);
    s->requests = s->connections = s->max_inflight = 0;
    s->max_open = s->open;
    for (int i = 0; i < s->nkeys; i++) free(s->keys[i]);
    s->nkeys = 0;
    memset(s->hits, 0, sizeof s->hits);
    clear_log(s);
    pthread_mutex_unlock(&s->mu);
    return respond(fd, 200, "text/plain", NULL, "ok", 2);
  }
  if (strcmp(p, "/v1/completions") == 0) return json_route(fd, "vllm", r);
  if (strcmp(p, "/generate") == 0) return json_route(fd, "sglang", r);
  if (strcmp(p, "/completion") == 0) return json_route(fd, "llamacpp", r);
  if (strcmp(p, "/v1/chat/completions") == 0) return json_route(fd, "chat", r);
  if (strcmp(p, "/shop") == 0) {
    /* a tiny web site for envs/shop.lua: pages that link to each other, each carrying the
       server's visit number (state a replay must freeze) */
    static const char *const pages[][2] = {
        {"home", "hats shoes"}, {"hats", "home cart"}, {"shoes", "home sale"},
        {"sale", "shoes cart"}, {"cart", "home"},
    };
    char name[32] = "home";
    qstr(r, "page", name, sizeof name);
    long visit = hit(s, r);
    for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++) {
      if (strcmp(pages[i][0], name) != 0) continue;
      str b = {0};
      str_printf(&b, "page %s\nlinks %s\nvisit %ld\n", pages[i][0], pages[i][1], visit);
      int rc = respond(fd, 200, "text/plain", NULL, b.p, b.len);
      free(b.p);
      return rc;
    }
    return respond(fd, 404, "text/plain", NULL, "no such page", 12);
  }
  if (strcmp(p, "/quit") == 0) {
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_mutex_unlock(&s->mu);
    respond(fd, 200, "text/plain", NULL, "bye", 3);
    return -1;
  }
  return respond(fd, 404, "text/plain", NULL, "not found", 9);
}

/* Reads one request; 0, or -1 when the connection ended or the request is malformed. */
static int read_request(int fd, str *in, request *r) {
  char *end;
  while (!(in->p && (end = strstr(in->p, "\r\n\r\n")))) {
    char buf[8192];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0 || in->len > MAX_HEAD) return -1;
    str_add(in, buf, (size_t)n);
  }
  size_t head_len = (size_t)(end - in->p) + 4;
  memset(r, 0, sizeof *r);
  char target[1280] = "";
  if (sscanf(in->p, "%15s %1279s", r->method, target) != 2) return -1;
  char *q = strchr(target, '?');
  if (q) {
    *q = '\0';
    snprintf(r->query, sizeof r->query, "%s", q + 1);
  }
  snprintf(r->path, sizeof r->path, "%s", target);
  size_t body_len = 0;
  for (char *line = strstr(in->p, "\r\n") + 2; line < in->p + head_len - 2;) {
    char *eol = strstr(line, "\r\n");
    if (strncasecmp(line, "content-length:", 15) == 0) body_len = strtoul(line + 15, NULL, 10);
    if (strncasecmp(line, "authorization:", 14) == 0)
      snprintf(r->authorization, sizeof r->authorization, "%.*s", (int)(eol - line - 15), line + 15);
    if (strncasecmp(line, "x-test:", 7) == 0)
      snprintf(r->x_test, sizeof r->x_test, "%.*s", (int)(eol - line - 8), line + 8);
    line = eol + 2;
  }
  while (in->len < head_len + body_len) {
    char buf[8192];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return -1;
    str_add(in, buf, (size_t)n);
  }
  r->body = malloc(body_len + 1);
  if (!r->body) abort();
  memcpy(r->body, in->p + head_len, body_len);
  r->body[body_len] = '\0';
  r->body_len = body_len;
  /* what follows belongs to the next request */
  size_t used = head_len + body_len;
  memmove(in->p, in->p + used, in->len - used);
  in->len -= used;
  in->p[in->len] = '\0';
  return 0;
}

static void *serve_connection(void *arg) {
  conn *c = arg;
  mock_server *s = c->server;
  str in = {0};
  request r;
  while (read_request(c->fd, &in, &r) == 0) {
    log_request(s, &r, now_seconds());
    pthread_mutex_lock(&s->mu);
    s->requests++;
    pthread_mutex_unlock(&s->mu);
    int rc = route(s, c->fd, &r);
    free(r.body);
    if (rc) break;
  }
  free(in.p);
  pthread_mutex_lock(&s->mu);
  s->open--;
  close(c->fd);
  c->fd = -1;
  c->finished = 1;
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static void *accept_loop(void *arg) {
  mock_server *s = arg;
  for (;;) {
    int fd = accept(s->listen_fd, NULL, NULL);
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
      pthread_mutex_unlock(&s->mu);
      if (fd >= 0) close(fd);
      break;
    }
    if (fd < 0) {
      pthread_mutex_unlock(&s->mu);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int i = 0;
    while (i < MAX_CONNS && s->conns[i].used && !s->conns[i].finished) i++;
    if (i == MAX_CONNS) {
      pthread_mutex_unlock(&s->mu);
      close(fd);
      continue;
    }
    if (s->conns[i].used) pthread_join(s->conns[i].thread, NULL);
    s->conns[i] = (conn){.fd = fd, .used = 1, .server = s};
    s->connections++;
    if (++s->open > s->max_open) s->max_open = s->open;
    pthread_create(&s->conns[i].thread, NULL, serve_connection, &s->conns[i]);
    pthread_mutex_unlock(&s->mu);
  }
  return NULL;
}

mock_server *mock_server_start(void) {
  mock_server *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (s->listen_fd < 0 || bind(s->listen_fd, (struct sockaddr *)&a, sizeof a) ||
      listen(s->listen_fd, 512) || getsockname(s->listen_fd, (struct sockaddr *)&a, &len)) {
    if (s->listen_fd >= 0) close(s->listen_fd);
    free(s);
    return NULL;
  }
  s->port = ntohs(a.sin_port);
  pthread_mutex_init(&s->mu, NULL);
  pthread_create(&s->acceptor, NULL, accept_loop, s);
  return s;
}

int mock_server_port(const mock_server *s) { return s->port; }

int mock_server_quit_requested(mock_server *s) {
  pthread_mutex_lock(&s->mu);
  int q = s->quit;
  pthread_mutex_unlock(&s->mu);
  return q;
}

void mock_server_stop(mock_server *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  for (int i = 0; i < MAX_CONNS; i++)
    if (s->conns[i].used && !s->conns[i].finished) shutdown(s->conns[i].fd, SHUT_RDWR);
  pthread_mutex_unlock(&s->mu);
  shutdown(s->listen_fd, SHUT_RDWR);
  pthread_join(s->acceptor, NULL);
  close(s->listen_fd);
  for (int i = 0; i < MAX_CONNS; i++)
    if (s->conns[i].used) pthread_join(s->conns[i].thread, NULL);
  for (int i = 0; i < s->nkeys; i++) free(s->keys[i]);
  if (s->log) clear_log(s);
  free(s->log);
  pthread_mutex_destroy(&s->mu);
  free(s);
}
