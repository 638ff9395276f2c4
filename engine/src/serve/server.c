/* server.c - the HTTP side of `moonrl serve`: libmicrohttpd with one thread per connection; each
 * thread checks the key, reads the body (413 past the limit), answers /health and /v1/models
 * itself, and queues every other request for the engine thread (429 with Retry-After when the
 * queue is full), then waits for its reply or relays its event stream. */
#define _DEFAULT_SOURCE
#include "serve_internal.h"
#include "toolcall.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

void mrl_server_config_default(mrl_server_config *cfg) {
  if (!cfg) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->host = "127.0.0.1";
  cfg->max_queue = 64;
  cfg->max_batch = 8;
  cfg->max_body = (size_t)64 << 20;
}

/* What one connection's current request has read so far. */
typedef struct {
  srv_buf body;
  bool too_large;
} conn_state;

static enum MHD_Result send_bytes(struct MHD_Connection *c, int status, const char *type,
                                  const char *bytes, size_t len, const char *retry_after) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, (void *)bytes, MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, srv_buf *b,
                                 const char *retry_after) {
  if (b->failed) {
    mrl__sb_free(b);
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":\"internal_error\"}}";
    return send_bytes(c, 500, "application/json", oom, sizeof oom - 1, NULL);
  }
  enum MHD_Result ret =
      send_bytes(c, status, "application/json", b->p ? b->p : "", b->len, retry_after);
  mrl__sb_free(b);
  return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *message,
                                  const char *type, const char *code, const char *retry_after) {
  srv_buf b = {0};
  mrl__sb_error(&b, message, type, NULL, code);
  return send_json(c, status, &b, retry_after);
}

/* ---- replies the HTTP thread gives itself ---- */

static enum MHD_Result health(mrl_server *s, struct MHD_Connection *c) {
  srv_buf b = {0};
  pthread_mutex_lock(&s->mu);
  mrl__sb_printf(&b,
            "{\"status\":\"%s\",\"policy_version\":%lld,\"queued\":%d,\"running\":%d,"
            "\"paused\":%s,\"requests\":%lld,\"decode_steps\":%lld,\"max_batch_seen\":%lld,"
            "\"rejected\":%lld}",
            s->loading ? "loading" : "ok", (long long)s->policy_version, s->queued, s->running,
            s->paused ? "true" : "false", (long long)s->requests, (long long)s->steps,
            (long long)s->max_batch_seen, (long long)s->rejected);
  bool loading = s->loading || s->stopping;
  pthread_mutex_unlock(&s->mu);
  return send_json(c, loading ? 503 : 200, &b, NULL);
}

static enum MHD_Result models(mrl_server *s, struct MHD_Connection *c) {
  srv_buf b = {0};
  pthread_mutex_lock(&s->mu);
  long long version = (long long)s->policy_version;
  pthread_mutex_unlock(&s->mu);
  mrl__sb_str(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
  mrl__sb_json_str(&b, s->model_name, strlen(s->model_name));
  mrl__sb_printf(&b,
            ",\"object\":\"model\",\"created\":0,\"owned_by\":\"moonrl\",\"max_model_len\":%d,"
            "\"vocab_size\":%d,\"policy_version\":%lld}]}",
            s->ctx, s->vocab, version);
  return send_json(c, 200, &b, NULL);
}

/* ---- queued requests ---- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  srv_job *j = cls;
  mrl_server *s = j->srv;
  pthread_mutex_lock(&s->mu);
  while (j->sent == j->out.len && !j->done) pthread_cond_wait(&j->cond, &s->mu);
  ssize_t n;
  if (j->sent == j->out.len) {
    n = MHD_CONTENT_READER_END_OF_STREAM;
  } else {
    size_t k = j->out.len - j->sent;
    if (k > max) k = max;
    memcpy(buf, j->out.p + j->sent, k);
    j->sent += k;
    n = (ssize_t)k;
  }
  pthread_mutex_unlock(&s->mu);
  return n;
}

static void stream_free(void *cls) {
  srv_job *j = cls;
  mrl_server *s = j->srv;
  pthread_mutex_lock(&s->mu);
  j->cancelled = true;
  mrl__serve_release(j);
  pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result enqueue(mrl_server *s, struct MHD_Connection *c, int kind, conn_state *cs,
                               bool raw) {
  srv_job *j = calloc(1, sizeof *j);
  if (!j) return send_error(c, 500, "out of memory", "server_error", "internal_error", NULL);
  j->srv = s;
  j->kind = kind;
  j->raw = raw;
  j->refs = 2;
  pthread_cond_init(&j->cond, NULL);
  if (!cs->body.p) mrl__sb_add(&cs->body, "", 0);
  if (cs->body.failed) {
    pthread_cond_destroy(&j->cond);
    free(j);
    return send_error(c, 500, "out of memory", "server_error", "internal_error", NULL);
  }
  j->body = cs->body.p;
  j->body_len = cs->body.len;
  memset(&cs->body, 0, sizeof cs->body);

  pthread_mutex_lock(&s->mu);
  if (s->stopping) {
    pthread_mutex_unlock(&s->mu);
    free(j->body);
    pthread_cond_destroy(&j->cond);
    free(j);
    return send_error(c, 503, "the server is shutting down", "server_error",
                      "service_unavailable", "1");
  }
  if (s->queued >= s->max_queue) {
    s->rejected++;
    pthread_mutex_unlock(&s->mu);
    free(j->body);
    pthread_cond_destroy(&j->cond);
    free(j);
    return send_error(c, 429, "the request queue is full; retry later", "rate_limit_error",
                      "rate_limit_exceeded", "1");
  }
  if (s->tail)
    s->tail->next = j;
  else
    s->head = j;
  s->tail = j;
  s->queued++;
  pthread_cond_signal(&s->wake);
  while (!j->done && !j->streaming) pthread_cond_wait(&j->cond, &s->mu);
  int status = j->status;
  if (j->streaming) {
    pthread_mutex_unlock(&s->mu);
    /* the stream's free callback drops this side's reference */
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j, stream_free);
    if (!r) {
      stream_free(j);
      return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
  }
  srv_buf out = j->out;
  memset(&j->out, 0, sizeof j->out);
  mrl__serve_release(j);
  pthread_mutex_unlock(&s->mu);
  return send_json(c, status, &out, status == 503 ? "1" : NULL);
}

static bool authorized(mrl_server *s, struct MHD_Connection *c) {
  if (!s->api_key) return true;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
  /* compared in time that does not depend on where the first difference is */
  const char *k = h + 7;
  size_t n = strlen(k), m = strlen(s->api_key);
  unsigned char diff = n != m;
  for (size_t i = 0; i < m; i++) diff |= (unsigned char)(s->api_key[i] ^ (i < n ? k[i] : 0));
  return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
  (void)version;
  mrl_server *s = cls;
  conn_state *cs = *con_cls;
  if (!cs) {
    cs = calloc(1, sizeof *cs);
    if (!cs) return MHD_NO;
    *con_cls = cs;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > s->max_body) {
      cs->too_large = true;
      return send_error(c, 413, "the request body is larger than the server accepts",
                        "invalid_request_error", "request_too_large", NULL);
    }
    return MHD_YES;
  }
  if (*upload_size) {
    if (!cs->too_large) {
      if (cs->body.len + *upload_size > s->max_body) {
        cs->too_large = true;
        mrl__sb_free(&cs->body);
      } else {
        mrl__sb_add(&cs->body, upload_data, *upload_size);
      }
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (cs->too_large)
    return send_error(c, 413, "the request body is larger than the server accepts",
                      "invalid_request_error", "request_too_large", NULL);

  bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
  if (get && !strcmp(url, "/health")) return health(s, c);
  if (!authorized(s, c))
    return send_error(c, 401, "a valid API key is needed: Authorization: Bearer KEY",
                      "invalid_request_error", "invalid_api_key", NULL);
  static const struct {
    const char *path;
    int kind;
  } routes[] = {{"/v1/completions", JOB_COMPLETION}, {"/v1/chat/completions", JOB_CHAT},
                {"/inference/v1/generate", JOB_GENERATE},
                {"/v1/chat/completions/tokens", JOB_CHAT_TOKENS},
                {"/tokenize", JOB_TOKENIZE},         {"/detokenize", JOB_DETOKENIZE},
                {"/v1/load_weights", JOB_LOAD_WEIGHTS}};
  if (!strcmp(url, "/v1/models")) {
    if (get) return models(s, c);
  } else if (!strcmp(url, "/pause") || !strcmp(url, "/resume")) {
    if (post) {
      pthread_mutex_lock(&s->mu);
      s->paused = url[1] == 'p';
      pthread_cond_signal(&s->wake);
      pthread_mutex_unlock(&s->mu);
      srv_buf b = {0};
      mrl__sb_printf(&b, "{\"status\":\"%s\"}", url[1] == 'p' ? "paused" : "running");
      return send_json(c, 200, &b, NULL);
    }
  } else {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
      if (strcmp(url, routes[i].path)) continue;
      if (!post) break;
      const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
      bool raw = routes[i].kind == JOB_LOAD_WEIGHTS && type &&
                 !strncmp(type, "application/octet-stream", 24);
      return enqueue(s, c, routes[i].kind, cs, raw);
    }
    bool known = !strcmp(url, "/health");
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
      known = known || !strcmp(url, routes[i].path);
    if (!known) {
      srv_buf b = {0};
      srv_buf msg = {0};
      mrl__sb_printf(&msg, "no route %s %s", method, url);
      mrl__sb_error(&b, msg.p ? msg.p : "no such route", "invalid_request_error", NULL, "not_found");
      mrl__sb_free(&msg);
      return send_json(c, 404, &b, NULL);
    }
  }
  return send_error(c, 405, "method not allowed on this path", "invalid_request_error",
                    "method_not_allowed", NULL);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)cls, (void)c, (void)toe;
  conn_state *cs = *con_cls;
  if (!cs) return;
  mrl__sb_free(&cs->body);
  free(cs);
  *con_cls = NULL;
}

/* ---- lifetime ---- */

static char *dup_or_null(const char *s) {
  if (!s || !*s) return NULL;
  return strdup(s);
}

static void free_fields(mrl_server *s) {
  free(s->host);
  free(s->api_key);
  free(s->model_name);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->wake);
  free(s);
}

mrl_status mrl_server_start(mrl_engine *e, mrl_model *m, mrl_tokenizer *t,
                            const mrl_server_config *cfg, mrl_server **out) {
  const char *fn = "mrl_server_start";
  if (!e || !m || !t || !out) return mrl__fail(e, MRL_ERR_NULL, fn, "NULL argument");
  mrl_server_config d;
  mrl_server_config_default(&d);
  if (!cfg) cfg = &d;
  if (cfg->port < 0 || cfg->port > 65535 || cfg->max_queue < 0 || cfg->max_batch < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "need port in 0..65535, max_queue, max_batch >= 0");
  mrl_model_config mc;
  mrl_status st = mrl_model_config_get(m, &mc);
  if (st != MRL_OK) return st;
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)cfg->port);
  const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
  int tool_format = TOOL_FORMAT_HERMES;
  if (cfg->tool_format && strcmp(cfg->tool_format, "hermes")) {
    if (strcmp(cfg->tool_format, "line"))
      return mrl__fail(e, MRL_ERR_INVALID, fn, "tool_format '%s' is not \"hermes\" or \"line\"",
                       cfg->tool_format);
    tool_format = TOOL_FORMAT_LINE;
  }
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "host '%s' is not an IPv4 address", host);

  mrl_server *s = calloc(1, sizeof *s);
  if (!s) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->wake, NULL);
  s->e = e;
  s->m = m;
  s->t = t;
  s->host = strdup(host);
  s->api_key = dup_or_null(cfg->api_key);
  s->model_name = strdup(cfg->model_name && *cfg->model_name ? cfg->model_name : "moonrl");
  s->max_queue = cfg->max_queue ? cfg->max_queue : 64;
  s->max_batch = cfg->max_batch ? cfg->max_batch : 8;
  s->batch_invariant = cfg->batch_invariant != 0;
  s->tool_format = tool_format;
  s->max_body = cfg->max_body ? cfg->max_body : (size_t)64 << 20;
  s->ctx = mc.ctx;
  s->vocab = mc.vocab;
  if (!s->host || !s->model_name || (cfg->api_key && *cfg->api_key && !s->api_key)) {
    free_fields(s);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  }
  unsigned limit = (unsigned)(s->max_queue + s->max_batch + 64);
  s->daemon = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request,
      s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
      s, MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)256 << 10, MHD_OPTION_END);
  if (!s->daemon) {
    free_fields(s);
    return mrl__fail(e, MRL_ERR_IO, fn, "cannot listen on %s:%d (in use, or not allowed)", host,
                     cfg->port);
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = info ? (int)info->port : cfg->port;
  if (pthread_create(&s->worker, NULL, mrl__serve_worker, s) != 0) {
    MHD_stop_daemon(s->daemon);
    free_fields(s);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot start the engine thread");
  }
  s->worker_started = true;
  *out = s;
  return MRL_OK;
}

int mrl_server_port(const mrl_server *s) { return s ? s->port : -1; }

void mrl_server_stop(mrl_server *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_broadcast(&s->wake);
  pthread_mutex_unlock(&s->mu);
  if (s->worker_started) pthread_join(s->worker, NULL);
  MHD_stop_daemon(s->daemon);
  mrl_tokenizer_free(s->t);
  mrl_model_free(s->m);
  free_fields(s);
}
