/* http.c - the HTTP client (mrl_http): one libcurl multi handle and its connection pool, a FIFO
 * of requests that start when their endpoint has room, retries with backoff and Retry-After,
 * per-attempt and idle timeouts, cancellation. */
#include "http_internal.h"

#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

enum {
  DEFAULT_MAX_CONNECTIONS = 16,
  DEFAULT_RETRIES = 2,
  DEFAULT_CONNECT_TIMEOUT_MS = 10000,
  DEFAULT_TIMEOUT_MS = 600000,
  DEFAULT_BACKOFF_MS = 500,
  DEFAULT_BACKOFF_MAX_MS = 8000,
  DEFAULT_RETRY_AFTER_MAX_MS = 60000,
  MESSAGE_CAP = 1024
};

typedef enum { ST_QUEUED, ST_ACTIVE, ST_DONE } req_state;

typedef struct {
  char *key; /* "scheme://host:port" */
  int active;
} endpoint;

/* a doubly linked list of requests (the queue, the running ones, all of a client's) */
typedef struct {
  mrl_http_request *head, *tail;
} req_list;

typedef struct {
  mrl_http_request *prev, *next;
} req_link;

struct mrl_http {
  mrl_engine *e;
  CURLM *multi;
  mrl_http_config cfg; /* defaults filled in */
  struct mrl_rng rng;
  endpoint *endpoints;
  size_t nendpoints;
  req_list queue, active, all;
  mrl_http_request *done_head, *done_tail; /* finished and not yet handed out by next_done */
  int pending;
  long finished; /* requests finished so far */
};

struct mrl_http_request {
  mrl_http *h; /* NULL once the client is freed */
  mrl_engine *e;
  CURL *easy;
  struct curl_slist *headers;
  char *url, *method, *body;
  size_t body_len;
  mrl_http_data_fn on_data;
  void *ud;
  size_t endpoint;
  req_state state;
  req_link link;     /* in the queue or the running list */
  req_link all_link; /* in the client's list of all requests */
  mrl_http_request *done_next;
  int in_done;
  double submitted, due, last_activity; /* mrl_clock seconds */
  int deliver;      /* this attempt hands its body to on_data: -1 until the first body byte */
  int stopped;      /* on_data asked to stop */
  int out_of_memory;
  mrl__buf body_buf, head_buf; /* this attempt's kept body and header lines */
  char *head_store;            /* the last response's header lines, split into names and values */
  size_t head_store_size;
  char **names, **values;
  size_t names_cap;
  mrl_http_response resp;
  char message[MESSAGE_CAP];
  char errbuf[CURL_ERROR_SIZE];
};

/* ---- lists ---- */

static req_link *link_of(mrl_http_request *r, int all) { return all ? &r->all_link : &r->link; }

static void list_push(req_list *l, mrl_http_request *r, int all) {
  req_link *k = link_of(r, all);
  k->prev = l->tail;
  k->next = NULL;
  if (l->tail) link_of(l->tail, all)->next = r;
  else l->head = r;
  l->tail = r;
}

static void list_remove(req_list *l, mrl_http_request *r, int all) {
  req_link *k = link_of(r, all);
  if (k->prev) link_of(k->prev, all)->next = k->next;
  else l->head = k->next;
  if (k->next) link_of(k->next, all)->prev = k->prev;
  else l->tail = k->prev;
  k->prev = k->next = NULL;
}

/* ---- libcurl's one-time setup ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result = CURLE_FAILED_INIT;
static void curl_init(void) { curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

const char *mrl_http_outcome_name(mrl_http_outcome o) {
  switch (o) {
  case MRL_HTTP_PENDING: return "pending";
  case MRL_HTTP_DONE: return "done";
  case MRL_HTTP_FAILED: return "failed";
  case MRL_HTTP_TIMEOUT: return "timeout";
  case MRL_HTTP_CANCELLED: return "cancelled";
  case MRL_HTTP_STOPPED: return "stopped";
  }
  return "unknown";
}

/* ---- the client ---- */

static int64_t or_default(int64_t v, int64_t dflt) { return v ? v : dflt; }

mrl_status mrl_http_new(mrl_engine *e, const mrl_http_config *config, mrl_http **out) {
  static const char fn[] = "mrl_http_new";
  if (!e || !out) return mrl__fail(e, MRL_ERR_NULL, fn, "NULL argument");
  mrl_http_config c = {0};
  if (config) c = *config;
  if (c.max_connections < 0 || c.retries < MRL_HTTP_NO_RETRIES || c.connect_timeout_ms < 0 ||
      c.timeout_ms < 0 || c.idle_timeout_ms < 0 || c.backoff_ms < 0 || c.backoff_max_ms < 0 ||
      c.retry_after_max_ms < 0)
    return mrl__fail(e, MRL_ERR_INVALID, fn, "a negative setting");
  c.max_connections = (int)or_default(c.max_connections, DEFAULT_MAX_CONNECTIONS);
  c.retries = c.retries == MRL_HTTP_NO_RETRIES ? 0 : (int)or_default(c.retries, DEFAULT_RETRIES);
  c.connect_timeout_ms = or_default(c.connect_timeout_ms, DEFAULT_CONNECT_TIMEOUT_MS);
  c.timeout_ms = or_default(c.timeout_ms, DEFAULT_TIMEOUT_MS);
  c.backoff_ms = or_default(c.backoff_ms, DEFAULT_BACKOFF_MS);
  c.backoff_max_ms = or_default(c.backoff_max_ms, DEFAULT_BACKOFF_MAX_MS);
  c.retry_after_max_ms = or_default(c.retry_after_max_ms, DEFAULT_RETRY_AFTER_MAX_MS);

  pthread_once(&curl_once, curl_init);
  if (curl_init_result != CURLE_OK)
    return mrl__fail(e, MRL_ERR_UNSUPPORTED, fn, "libcurl: %s", curl_easy_strerror(curl_init_result));
  mrl_http *h = mrl__alloc(e, sizeof *h);
  if (!h) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  memset(h, 0, sizeof *h);
  h->multi = curl_multi_init();
  if (!h->multi) {
    mrl__free(e, h, sizeof *h);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "libcurl: no multi handle");
  }
  /* the client's own queue keeps each endpoint at max_connections; libcurl's limit agrees */
  curl_multi_setopt(h->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)c.max_connections);
  h->e = e;
  h->cfg = c;
  mrl__rng_seed(&h->rng, c.seed);
  mrl__engine_retain(e);
  *out = h;
  return MRL_OK;
}

static void finish(mrl_http_request *r, mrl_http_outcome outcome, const char *message);

mrl_status mrl_http_cancel(mrl_http_request *r) {
  if (!r) return MRL_ERR_NULL;
  mrl_http *h = r->h;
  if (!h || r->state == ST_DONE) return MRL_OK;
  if (r->state == ST_ACTIVE) {
    curl_multi_remove_handle(h->multi, r->easy);
    h->endpoints[r->endpoint].active--;
    list_remove(&h->active, r, 0);
  } else {
    list_remove(&h->queue, r, 0);
  }
  finish(r, MRL_HTTP_CANCELLED, "cancelled");
  return MRL_OK;
}

void mrl_http_free(mrl_http *h) {
  if (!h) return;
  mrl_engine *e = h->e;
  for (mrl_http_request *r = h->all.head; r; r = r->all_link.next) mrl_http_cancel(r);
  for (mrl_http_request *r = h->all.head, *next; r; r = next) {
    next = r->all_link.next;
    r->h = NULL;
    r->in_done = 0;
    r->done_next = NULL;
  }
  curl_multi_cleanup(h->multi);
  for (size_t i = 0; i < h->nendpoints; i++)
    mrl__free(e, h->endpoints[i].key, strlen(h->endpoints[i].key) + 1);
  mrl__free(e, h->endpoints, h->nendpoints * sizeof *h->endpoints);
  mrl__free(e, h, sizeof *h);
  mrl__engine_release(e);
}

int mrl_http_pending(const mrl_http *h) { return h ? h->pending : 0; }

mrl_status mrl_http_wakeup(mrl_http *h) {
  if (!h) return MRL_ERR_NULL;
  return curl_multi_wakeup(h->multi) == CURLM_OK ? MRL_OK : MRL_ERR_IO;
}

/* The index of the endpoint named key, added when new; (size_t)-1 when memory runs out. */
static size_t endpoint_index(mrl_http *h, const char *key) {
  for (size_t i = 0; i < h->nendpoints; i++)
    if (strcmp(h->endpoints[i].key, key) == 0) return i;
  endpoint *grown = mrl__alloc(h->e, (h->nendpoints + 1) * sizeof *grown);
  char *copy = mrl__strndup(h->e, key, strlen(key));
  if (!grown || !copy) {
    mrl__free(h->e, grown, (h->nendpoints + 1) * sizeof *grown);
    mrl__free(h->e, copy, strlen(key) + 1);
    return (size_t)-1;
  }
  if (h->nendpoints) memcpy(grown, h->endpoints, h->nendpoints * sizeof *grown);
  mrl__free(h->e, h->endpoints, h->nendpoints * sizeof *grown);
  grown[h->nendpoints] = (endpoint){copy, 0};
  h->endpoints = grown;
  return h->nendpoints++;
}

/* Writes "scheme://host:port" of url into key; returns 0, or -1 for a URL libcurl refuses or a
 * scheme other than http and https. */
static int endpoint_key(const char *url, char *key, size_t cap) {
  CURLU *u = curl_url();
  if (!u) return -1;
  char *scheme = NULL, *host = NULL, *port = NULL;
  int rc = -1;
  if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK &&
      (strcmp(scheme, "http") == 0 || strcmp(scheme, "https") == 0)) {
    int n = snprintf(key, cap, "%s://%s:%s", scheme, host, port);
    rc = n > 0 && (size_t)n < cap ? 0 : -1;
  }
  curl_free(scheme);
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
  return rc;
}

/* ---- libcurl's callbacks ---- */

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *ud) {
  mrl_http_request *r = ud;
  size_t n = size * nmemb;
  r->last_activity = mrl_clock();
  /* a new response begins (after a 100 Continue): only the last one's fields are kept */
  if (n >= 5 && memcmp(ptr, "HTTP/", 5) == 0) r->head_buf.len = 0;
  if (mrl__buf_add(r->e, &r->head_buf, ptr, n)) {
    r->out_of_memory = 1;
    return 0;
  }
  return n;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud) {
  mrl_http_request *r = ud;
  size_t n = size * nmemb;
  r->last_activity = mrl_clock();
  if (r->deliver < 0) {
    long code = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
    r->deliver = r->on_data && code >= 200 && code < 300;
  }
  if (r->deliver) {
    r->resp.delivered += n;
    if (r->on_data(r->ud, ptr, n)) {
      r->stopped = 1;
      return 0;
    }
    return n;
  }
  if (mrl__buf_add(r->e, &r->body_buf, ptr, n)) {
    r->out_of_memory = 1;
    return 0;
  }
  return n;
}

/* ---- requests ---- */

static void free_headers(mrl_http_request *r) {
  mrl__free(r->e, r->head_store, r->head_store_size);
  mrl__free(r->e, r->names, r->names_cap * sizeof *r->names);
  mrl__free(r->e, r->values, r->names_cap * sizeof *r->values);
  r->head_store = NULL;
  r->names = r->values = NULL;
  r->head_store_size = r->names_cap = 0;
  r->resp.nheaders = 0;
  r->resp.header_names = r->resp.header_values = NULL;
}

/* Splits the attempt's header lines into lower-case names and trimmed values; 0, or -1 when
 * memory runs out. */
static int parse_headers(mrl_http_request *r) {
  free_headers(r);
  size_t len = r->head_buf.len;
  if (len == 0) return 0;
  size_t lines = 1;
  for (size_t i = 0; i < len; i++) lines += r->head_buf.p[i] == '\n';
  r->head_store = mrl__strndup(r->e, r->head_buf.p, len);
  r->names = mrl__alloc(r->e, lines * sizeof *r->names);
  r->values = mrl__alloc(r->e, lines * sizeof *r->values);
  r->head_store_size = len + 1;
  r->names_cap = lines;
  if (!r->head_store || !r->names || !r->values) {
    free_headers(r);
    return -1;
  }
  size_t n = 0;
  char *s = r->head_store, *end = s + len;
  while (s < end) {
    char *eol = memchr(s, '\n', (size_t)(end - s));
    if (!eol) eol = end;
    char *line_end = eol;
    if (line_end > s && line_end[-1] == '\r') line_end--;
    *line_end = '\0';
    char *colon = memchr(s, ':', (size_t)(line_end - s));
    if (colon && colon > s && memcmp(s, "HTTP/", 5) != 0) {
      *colon = '\0';
      for (char *c = s; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
      char *v = colon + 1;
      while (*v == ' ' || *v == '\t') v++;
      char *ve = line_end;
      while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) *--ve = '\0';
      r->names[n] = s;
      r->values[n] = v;
      n++;
    }
    s = eol + 1;
  }
  r->resp.nheaders = n;
  r->resp.header_names = (const char *const *)r->names;
  r->resp.header_values = (const char *const *)r->values;
  return 0;
}

const char *mrl_http_response_header(const mrl_http_request *r, const char *name) {
  if (!r || !name) return NULL;
  for (size_t i = r->resp.nheaders; i-- > 0;)
    if (strcasecmp(r->resp.header_names[i], name) == 0) return r->resp.header_values[i];
  return NULL;
}

static void request_release(mrl_http_request *r) {
  mrl_engine *e = r->e;
  if (r->easy) curl_easy_cleanup(r->easy);
  curl_slist_free_all(r->headers);
  if (r->url) mrl__free(e, r->url, strlen(r->url) + 1);
  if (r->method) mrl__free(e, r->method, strlen(r->method) + 1);
  mrl__free(e, r->body, r->body_len + 1);
  mrl__buf_free(e, &r->body_buf);
  mrl__buf_free(e, &r->head_buf);
  free_headers(r);
  mrl__free(e, r, sizeof *r);
  mrl__engine_release(e);
}

mrl_status mrl_http_submit(mrl_http *h, const mrl_http_call *call, mrl_http_request **out) {
  static const char fn[] = "mrl_http_submit";
  if (!h || !call || !out) return mrl__fail(h ? h->e : NULL, MRL_ERR_NULL, fn, "NULL argument");
  mrl_engine *e = h->e;
  if (!call->url) return mrl__fail(e, MRL_ERR_NULL, fn, "call.url is NULL");
  if (!call->body && call->body_len)
    return mrl__fail(e, MRL_ERR_NULL, fn, "call.body is NULL but body_len is %zu", call->body_len);
  if (call->timeout_ms < 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "call.timeout_ms < 0");
  char key[1024];
  if (endpoint_key(call->url, key, sizeof key))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "not an http:// or https:// URL: \"%.200s\"", call->url);
  const char *method = call->method ? call->method : call->body ? "POST" : "GET";
  if (!*method || strpbrk(method, " \r\n"))
    return mrl__fail(e, MRL_ERR_INVALID, fn, "bad method \"%.40s\"", method);
  for (const char *const *hl = call->headers; hl && *hl; hl++) {
    const char *colon = strchr(*hl, ':');
    if (!colon || colon == *hl || strpbrk(*hl, "\r\n"))
      return mrl__fail(e, MRL_ERR_INVALID, fn, "header \"%.80s\" is not \"Name: value\"", *hl);
  }

  mrl_http_request *r = mrl__alloc(e, sizeof *r);
  if (!r) return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  memset(r, 0, sizeof *r);
  r->e = e;
  mrl__engine_retain(e);
  r->url = mrl__strndup(e, call->url, strlen(call->url));
  r->method = mrl__strndup(e, method, strlen(method));
  r->body_len = call->body ? call->body_len : 0;
  r->body = call->body ? mrl__strndup(e, call->body, call->body_len) : NULL;
  r->easy = curl_easy_init();
  r->endpoint = endpoint_index(h, key);
  int ok = r->url && r->method && (r->body || !call->body) && r->easy && r->endpoint != (size_t)-1;
  int has_expect = 0;
  for (const char *const *hl = call->headers; ok && hl && *hl; hl++) {
    struct curl_slist *l = curl_slist_append(r->headers, *hl);
    if (!l) ok = 0;
    else r->headers = l;
    has_expect |= strncasecmp(*hl, "expect:", 7) == 0;
  }
  /* no "Expect: 100-continue" round trip before larger bodies, unless the caller asks for it */
  if (ok && !has_expect) {
    struct curl_slist *l = curl_slist_append(r->headers, "Expect:");
    if (!l) ok = 0;
    else r->headers = l;
  }
  if (!ok) {
    request_release(r);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "out of memory");
  }
  CURL *c = r->easy;
  int64_t timeout = call->timeout_ms ? call->timeout_ms : h->cfg.timeout_ms;
  curl_easy_setopt(c, CURLOPT_URL, r->url);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)h->cfg.connect_timeout_ms);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)timeout);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->errbuf);
  curl_easy_setopt(c, CURLOPT_PRIVATE, r);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, r->headers);
  if (r->body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, r->body);
  }
  if (strcmp(method, "HEAD") == 0) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  else if (strcmp(method, r->body ? "POST" : "GET") != 0)
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, r->method);
  r->on_data = call->on_data;
  r->ud = call->ud;
  r->h = h;
  r->state = ST_QUEUED;
  r->submitted = r->due = mrl_clock();
  r->resp.message = "";
  r->resp.body = "";
  list_push(&h->queue, r, 0);
  list_push(&h->all, r, 1);
  h->pending++;
  *out = r;
  return MRL_OK;
}

static void finish(mrl_http_request *r, mrl_http_outcome outcome, const char *message) {
  mrl_http *h = r->h;
  r->state = ST_DONE;
  r->resp.outcome = outcome;
  snprintf(r->message, sizeof r->message, "%s", message);
  r->resp.message = r->message;
  r->resp.elapsed_ms = 1e3 * (mrl_clock() - r->submitted);
  h->pending--;
  h->finished++;
  r->in_done = 1;
  r->done_next = NULL;
  if (h->done_tail) h->done_tail->done_next = r;
  else h->done_head = r;
  h->done_tail = r;
}

static int status_retryable(int status) {
  return status == 408 || status == 409 || status == 429 || status >= 500;
}

static int transport_retryable(CURLcode res) {
  switch (res) {
  case CURLE_COULDNT_CONNECT:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_PARTIAL_FILE:
    return 1;
  default:
    return 0;
  }
}

/* Milliseconds to wait before the next attempt: the response's retry-after-ms or Retry-After
 * (capped), else the exponential backoff less up to 25% jitter. */
static double retry_wait_ms(mrl_http *h, mrl_http_request *r, int have_response) {
  double cap = (double)h->cfg.retry_after_max_ms;
  const char *v;
  if (have_response && (v = mrl_http_response_header(r, "retry-after-ms"))) {
    char *end;
    double ms = strtod(v, &end);
    if (end != v && isfinite(ms)) return ms < 0 ? 0 : ms > cap ? cap : ms;
  }
  if (have_response && (v = mrl_http_response_header(r, "retry-after")) && *v) {
    double ms = -1;
    if (strspn(v, "0123456789") == strlen(v)) {
      ms = 1e3 * strtod(v, NULL);
    } else {
      time_t t = curl_getdate(v, NULL);
      if (t != (time_t)-1) ms = 1e3 * difftime(t, time(NULL));
      if (t != (time_t)-1 && ms < 0) ms = 0;
    }
    if (ms >= 0) return ms > cap ? cap : ms;
  }
  double wait = (double)h->cfg.backoff_ms * ldexp(1.0, r->resp.attempts - 1);
  if (wait > (double)h->cfg.backoff_max_ms) wait = (double)h->cfg.backoff_max_ms;
  return wait * (1.0 - 0.25 * mrl__rng_uniform(&h->rng));
}

/* The attempt on r has ended (res from libcurl; idle: the client stopped it for silence):
 * schedules a retry or finishes r. */
static void attempt_ended(mrl_http *h, mrl_http_request *r, CURLcode res, int idle) {
  curl_multi_remove_handle(h->multi, r->easy);
  h->endpoints[r->endpoint].active--;
  list_remove(&h->active, r, 0);
  long code = 0, connects = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_getinfo(r->easy, CURLINFO_NUM_CONNECTS, &connects);
  r->resp.connects += connects;
  r->resp.status = (int)code;
  r->resp.body = r->body_buf.p ? r->body_buf.p : "";
  r->resp.body_len = r->body_buf.len;
  if (parse_headers(r) || r->out_of_memory) {
    finish(r, MRL_HTTP_FAILED, "out of memory");
    return;
  }
  if (r->stopped) {
    finish(r, MRL_HTTP_STOPPED, "stopped by on_data");
    return;
  }
  char what[CURL_ERROR_SIZE + 64];
  mrl_http_outcome outcome;
  int retryable;
  if (idle) {
    outcome = MRL_HTTP_TIMEOUT;
    snprintf(what, sizeof what, "nothing received for %lld ms", (long long)h->cfg.idle_timeout_ms);
    retryable = 1;
  } else if (res == CURLE_OK) {
    outcome = MRL_HTTP_DONE;
    snprintf(what, sizeof what, "HTTP status %d", r->resp.status);
    retryable = status_retryable(r->resp.status);
    const char *should = mrl_http_response_header(r, "x-should-retry");
    if (should && strcmp(should, "true") == 0) retryable = 1;
    if (should && strcmp(should, "false") == 0) retryable = 0;
  } else {
    outcome = res == CURLE_OPERATION_TIMEDOUT ? MRL_HTTP_TIMEOUT : MRL_HTTP_FAILED;
    snprintf(what, sizeof what, "%s", r->errbuf[0] ? r->errbuf : curl_easy_strerror(res));
    retryable = transport_retryable(res);
  }
  if (retryable && r->resp.delivered == 0 && r->resp.attempts <= h->cfg.retries) {
    r->due = mrl_clock() + 1e-3 * retry_wait_ms(h, r, res == CURLE_OK && !idle);
    r->state = ST_QUEUED;
    list_push(&h->queue, r, 0);
    return;
  }
  if (outcome == MRL_HTTP_DONE) {
    finish(r, outcome, "");
    return;
  }
  char message[MESSAGE_CAP];
  snprintf(message, sizeof message, "%.40s %.200s: %s (attempt %d of %d%s)", r->method, r->url, what,
           r->resp.attempts, h->cfg.retries + 1,
           r->resp.delivered ? ", after streamed bytes: not retried" : "");
  finish(r, outcome, message);
}

static void start_attempt(mrl_http *h, mrl_http_request *r) {
  list_remove(&h->queue, r, 0);
  r->body_buf.len = r->head_buf.len = 0;
  r->deliver = -1;
  r->stopped = 0;
  r->errbuf[0] = '\0';
  r->resp.attempts++;
  r->last_activity = mrl_clock();
  CURLMcode mc = curl_multi_add_handle(h->multi, r->easy);
  if (mc != CURLM_OK) {
    char message[MESSAGE_CAP];
    snprintf(message, sizeof message, "%.40s %.200s: libcurl: %s", r->method, r->url,
             curl_multi_strerror(mc));
    finish(r, MRL_HTTP_FAILED, message);
    return;
  }
  h->endpoints[r->endpoint].active++;
  r->state = ST_ACTIVE;
  list_push(&h->active, r, 0);
}

/* Starts the queued requests that are due and whose endpoint has room, oldest first. */
static void start_due(mrl_http *h) {
  double now = mrl_clock();
  for (mrl_http_request *r = h->queue.head, *next; r; r = next) {
    next = r->link.next;
    if (r->due <= now && h->endpoints[r->endpoint].active < h->cfg.max_connections)
      start_attempt(h, r);
  }
}

/* Runs libcurl, then ends the attempts it finished and those silent past the idle timeout. */
static void perform(mrl_http *h) {
  int running = 0;
  curl_multi_perform(h->multi, &running);
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(h->multi, &left))) {
    if (msg->msg != CURLMSG_DONE) continue;
    mrl_http_request *r = NULL;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
    CURLcode res = msg->data.result;
    if (r) attempt_ended(h, r, res, 0);
  }
  if (h->cfg.idle_timeout_ms) {
    double now = mrl_clock(), idle = 1e-3 * (double)h->cfg.idle_timeout_ms;
    for (mrl_http_request *r = h->active.head, *next; r; r = next) {
      next = r->link.next;
      if (now - r->last_activity >= idle) attempt_ended(h, r, CURLE_OK, 1);
    }
  }
}

/* Milliseconds until the next retry is due or an idle timeout may strike, at most limit. */
static int64_t next_deadline_ms(mrl_http *h, int64_t limit) {
  double now = mrl_clock(), soonest = now + 1e-3 * (double)limit;
  for (mrl_http_request *r = h->queue.head; r; r = r->link.next)
    if (r->due < soonest && h->endpoints[r->endpoint].active < h->cfg.max_connections)
      soonest = r->due;
  if (h->cfg.idle_timeout_ms)
    for (mrl_http_request *r = h->active.head; r; r = r->link.next) {
      double t = r->last_activity + 1e-3 * (double)h->cfg.idle_timeout_ms;
      if (t < soonest) soonest = t;
    }
  double ms = ceil(1e3 * (soonest - now));
  return ms < 0 ? 0 : ms > (double)limit ? limit : (int64_t)ms;
}

mrl_status mrl_http_poll(mrl_http *h, int64_t timeout_ms, int *n_done) {
  if (!h) return MRL_ERR_NULL;
  if (timeout_ms < 0) return mrl__fail(h->e, MRL_ERR_INVALID, "mrl_http_poll", "timeout_ms < 0");
  long before = h->finished;
  if (h->pending > 0) {
    start_due(h);
    perform(h);
    if (h->finished == before && timeout_ms > 0 && h->pending > 0) {
      int64_t wait = next_deadline_ms(h, timeout_ms > INT32_MAX ? INT32_MAX : timeout_ms);
      if (wait > 0) curl_multi_poll(h->multi, NULL, 0, (int)wait, NULL);
      start_due(h);
      perform(h);
    }
    start_due(h);
  }
  if (n_done) *n_done = (int)(h->finished - before);
  return MRL_OK;
}

mrl_status mrl_http_next_done(mrl_http *h, mrl_http_request **out) {
  if (!h || !out) return MRL_ERR_NULL;
  mrl_http_request *r = h->done_head;
  if (r) {
    h->done_head = r->done_next;
    if (!h->done_head) h->done_tail = NULL;
    r->done_next = NULL;
    r->in_done = 0;
  }
  *out = r;
  return MRL_OK;
}

mrl_status mrl_http_wait(mrl_http_request *r) {
  if (!r) return MRL_ERR_NULL;
  while (r->state != ST_DONE) {
    mrl_status st = mrl_http_poll(r->h, 1000, NULL);
    if (st) return st;
  }
  return MRL_OK;
}

int mrl_http_request_finished(const mrl_http_request *r) {
  return r ? r->state == ST_DONE : -1;
}

const mrl_http_response *mrl_http_response_of(const mrl_http_request *r) {
  return r ? &r->resp : NULL;
}

void mrl_http_request_free(mrl_http_request *r) {
  if (!r) return;
  mrl_http *h = r->h;
  if (h) {
    mrl_http_cancel(r);
    if (r->in_done) {
      mrl_http_request **p = &h->done_head, *prev = NULL;
      while (*p != r) prev = *p, p = &(*p)->done_next;
      *p = r->done_next;
      if (h->done_tail == r) h->done_tail = prev;
    }
    list_remove(&h->all, r, 1);
  }
  request_release(r);
}
