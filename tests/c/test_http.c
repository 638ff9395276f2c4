/* test_http.c - tests of the HTTP client (mrl_http_*) against the scripted loopback server
 * (mock_server.c, started by each test in this process and stopped at its end; no network):
 * requests and headers, the retry rules (attempts counted by the client and by the server,
 * Retry-After and retry-after-ms honoured and capped, x-should-retry, resets before the first
 * byte retried, nothing retried after a streamed byte), streaming into the SSE parser, total and
 * idle timeouts, cancellation, the per-endpoint concurrency limit (the server's count of open
 * connections and requests in flight), overlap, bad arguments, freeing with requests in flight.
 * Run alone: ./build/tests/test_http [filter] */
#include "json.h"
#include "mock_server.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mock_server *server;
static char base[64];

static mrl_engine *setup(void) {
  server = mock_server_start();
  if (!server) {
    printf("Bail out! cannot start the mock server\n");
    exit(1);
  }
  snprintf(base, sizeof base, "http://127.0.0.1:%d", mock_server_port(server));
  return new_engine();
}

static void teardown(mrl_engine *e) {
  mock_server_stop(server);
  server = NULL;
  CHECKF(mrl_engine_memory_used(e) == 0, "%zu bytes left", mrl_engine_memory_used(e));
  mrl_engine_free(e);
}

static mrl_http *client(mrl_engine *e, int retries, int max_connections) {
  mrl_http_config c = {.retries = retries, .max_connections = max_connections, .backoff_ms = 10,
                       .seed = 1};
  mrl_http *h = NULL;
  MUST(mrl_http_new(e, &c, &h));
  return h;
}

/* Submits a GET of base + path and waits for it. */
static mrl_http_request *get(mrl_http *h, const char *path) {
  char url[512];
  snprintf(url, sizeof url, "%s%s", base, path);
  mrl_http_call call = {.url = url};
  mrl_http_request *r = NULL;
  MUST(mrl_http_submit(h, &call, &r));
  MUST(mrl_http_wait(r));
  return r;
}

/* A number from the server's /stats (fetched with a client of its own). */
static long stat_of(mrl_engine *e, const char *name, const char *hit_key) {
  mrl_http *h = client(e, MRL_HTTP_NO_RETRIES, 1);
  mrl_http_request *r = get(h, "/stats");
  const mrl_http_response *resp = mrl_http_response_of(r);
  mrl_json_doc *doc = NULL;
  long v = -1;
  if (mrl__json_parse(e, "test", "stats", resp->body, resp->body_len, &doc) == MRL_OK) {
    const mrl_json *j = mrl__json_get(mrl__json_root(doc), name);
    if (hit_key) j = mrl__json_get(j, hit_key);
    if (j) v = (long)j->number;
    mrl__json_free(doc);
  }
  mrl_http_request_free(r);
  mrl_http_free(h);
  return v;
}

static void test_get_and_post(void) {
  mrl_engine *e = setup();
  mrl_http *h = client(e, 0, 0);
  mrl_http_request *r = get(h, "/echo?a=1");
  const mrl_http_response *resp = mrl_http_response_of(r);
  CHECK(resp->outcome == MRL_HTTP_DONE && resp->status == 200 && resp->attempts == 1);
  CHECKF(strstr(resp->body, "\"method\":\"GET\"") && strstr(resp->body, "\"query\":\"a=1\""), "%s",
         resp->body);
  CHECK(strcmp(resp->message, "") == 0);
  CHECK(strcmp(mrl_http_response_header(r, "Content-Type"), "application/json") == 0);
  CHECK(mrl_http_response_header(r, "no-such-header") == NULL);
  CHECK(resp->nheaders >= 2 && strcmp(resp->header_names[0], "content-type") == 0);
  CHECK(mrl_http_request_finished(r) == 1);
  mrl_http_request_free(r);

  char url[128];
  snprintf(url, sizeof url, "%s/echo", base);
  const char *headers[] = {"X-Test: forty two", "Authorization: Bearer k", NULL};
  static char body[5000];
  memset(body, 'b', sizeof body - 1); /* past 1024 bytes: no Expect: 100-continue wait */
  mrl_http_call call = {.url = url, .headers = headers, .body = body, .body_len = sizeof body - 1};
  MUST(mrl_http_submit(h, &call, &r));
  CHECK(mrl_http_request_finished(r) == 0);
  CHECK(mrl_http_pending(h) == 1);
  MUST(mrl_http_wait(r));
  resp = mrl_http_response_of(r);
  CHECK(resp->status == 200 && strstr(resp->body, "\"method\":\"POST\"") &&
        strstr(resp->body, "\"x_test\":\"forty two\"") &&
        strstr(resp->body, "\"authorization\":\"Bearer k\"") && resp->body_len > sizeof body);
  mrl_http_request *done = NULL;
  MUST(mrl_http_next_done(h, &done)); /* (freeing the first request took it off the list) */
  CHECK(done == r);
  MUST(mrl_http_next_done(h, &done));
  CHECK(done == NULL);
  mrl_http_request_free(r);

  call = (mrl_http_call){.url = url, .method = "PUT", .body = "x", .body_len = 1};
  MUST(mrl_http_submit(h, &call, &r));
  MUST(mrl_http_wait(r));
  CHECK(strstr(mrl_http_response_of(r)->body, "\"method\":\"PUT\"") != NULL);
  mrl_http_request_free(r);
  r = get(h, "/nowhere");
  CHECK(mrl_http_response_of(r)->status == 404 && mrl_http_response_of(r)->attempts == 1);
  mrl_http_request_free(r);
  mrl_http_free(h);
  teardown(e);
}

static void test_retry_status(void) {
  mrl_engine *e = setup();
  mrl_http *h = client(e, 2, 0);
  mrl_http_request *r = get(h, "/status?code=503&key=a&fail=2");
  const mrl_http_response *resp = mrl_http_response_of(r);
  CHECK(resp->outcome == MRL_HTTP_DONE && resp->status == 200 && resp->attempts == 3);
  CHECK(strcmp(resp->body, "ok") == 0);
  mrl_http_request_free(r);
  CHECK(stat_of(e, "hits", "a") == 3);
  /* out of retries: the last response is the result */
  r = get(h, "/status?code=500&key=b&fail=9");
  resp = mrl_http_response_of(r);
  CHECK(resp->outcome == MRL_HTTP_DONE && resp->status == 500 && resp->attempts == 3);
  CHECK(strstr(resp->body, "injected") != NULL);
  mrl_http_request_free(r);
  CHECK(stat_of(e, "hits", "b") == 3);
  /* 400 is not retried; x-should-retry overrides in both directions */
  r = get(h, "/status?code=400&key=c");
  CHECK(mrl_http_response_of(r)->attempts == 1 && mrl_http_response_of(r)->status == 400);
  mrl_http_request_free(r);
  r = get(h, "/status?code=503&key=d&should_retry=false");
  CHECK(mrl_http_response_of(r)->attempts == 1);
  mrl_http_request_free(r);
  r = get(h, "/status?code=400&key=e&fail=1&should_retry=true");
  CHECK(mrl_http_response_of(r)->attempts == 2 && mrl_http_response_of(r)->status == 200);
  mrl_http_request_free(r);
  /* 408, 409 and 429 are retried like 5xx */
  r = get(h, "/status?code=409&key=f&fail=1");
  CHECK(mrl_http_response_of(r)->attempts == 2);
  mrl_http_request_free(r);
  mrl_http_free(h);
  /* no retries at all */
  h = client(e, MRL_HTTP_NO_RETRIES, 0);
  r = get(h, "/status?code=503&key=g&fail=1");
  CHECK(mrl_http_response_of(r)->attempts == 1 && mrl_http_response_of(r)->status == 503);
  mrl_http_request_free(r);
  mrl_http_free(h);
  teardown(e);
}

static void test_retry_after(void) {
  mrl_engine *e = setup();
  mrl_http_config c = {.retries = 2, .backoff_ms = 5000, .backoff_max_ms = 5000};
  mrl_http *h = NULL;
  MUST(mrl_http_new(e, &c, &h));
  /* Retry-After in seconds */
  mrl_http_request *r = get(h, "/status?code=429&key=a&fail=1&retry_after=1");
  const mrl_http_response *resp = mrl_http_response_of(r);
  CHECKF(resp->status == 200 && resp->attempts == 2 && resp->elapsed_ms >= 1000 &&
             resp->elapsed_ms < 2500, "status %d attempts %d elapsed %.0f ms", resp->status,
         resp->attempts, resp->elapsed_ms);
  mrl_http_request_free(r);
  /* retry-after-ms wins over Retry-After, and over the (5 s) backoff */
  r = get(h, "/status?code=503&key=b&fail=1&retry_after_ms=300&retry_after=4");
  resp = mrl_http_response_of(r);
  CHECKF(resp->attempts == 2 && resp->elapsed_ms >= 300 && resp->elapsed_ms < 1500, "%.0f ms",
         resp->elapsed_ms);
  mrl_http_request_free(r);
  /* Retry-After: 0 retries at once */
  r = get(h, "/status?code=503&key=c&fail=2&retry_after=0");
  resp = mrl_http_response_of(r);
  CHECKF(resp->attempts == 3 && resp->elapsed_ms < 1000, "%.0f ms", resp->elapsed_ms);
  mrl_http_request_free(r);
  mrl_http_free(h);
  /* a long Retry-After is cut to retry_after_max_ms */
  c.retry_after_max_ms = 200;
  MUST(mrl_http_new(e, &c, &h));
  r = get(h, "/status?code=429&key=d&fail=1&retry_after=100");
  resp = mrl_http_response_of(r);
  CHECKF(resp->attempts == 2 && resp->elapsed_ms >= 200 && resp->elapsed_ms < 1500, "%.0f ms",
         resp->elapsed_ms);
  mrl_http_request_free(r);
  mrl_http_free(h);
  teardown(e);
}

static void test_backoff(void) {
  mrl_engine *e = setup();
  /* waits 100, 200, 400 ms, each less up to 25%: between 525 and 700 ms in all */
  mrl_http_config c = {.retries = 3, .backoff_ms = 100, .backoff_max_ms = 400, .seed = 7};
  mrl_http *h = NULL;
  MUST(mrl_http_new(e, &c, &h));
  mrl_http_request *r = get(h, "/status?code=502&key=a&fail=3");
  const mrl_http_response *resp = mrl_http_response_of(r);
  CHECKF(resp->attempts == 4 && resp->status == 200 && resp->elapsed_ms >= 525 &&
             resp->elapsed_ms < 2500, "attempts %d, %.0f ms", resp->attempts, resp->elapsed_ms);
  mrl_http_request_free(r);
  mrl_http_free(h);
  teardown(e);
}

static void test_reset_before_first_byte(void) {
  mrl_engine *e = setup();
  mrl_http *h = client(e, 2, 0);
  mrl_http_request *r = get(h, "/reset?key=a&fail=2");
  const mrl_http_response *resp = mrl_http_response_of(r);
  CHECKF(resp->outcome == MRL_HTTP_DONE && resp->status == 200 && resp->attempts == 3,
         "%s %d %d %s", mrl_http_outcome_name(resp->outcome), resp->status, resp->attempts,
         resp->message);
  mrl_http_request_free(r);
  CHECK(stat_of(e, "hits", "a") == 3);
  mrl_http_free(h);
  h = client(e, MRL_HTTP_NO_RETRIES, 0);
  r = get(h, "/reset?key=b");
  resp = mrl_http_response_of(r);
  CHECKF(resp->outcome == MRL_HTTP_FAILED && resp->attempts == 1 && resp->status == 0 &&
             strstr(resp->message, "GET http://127.0.0.1:") && strstr(resp->message, "attempt 1 of 1"),
         "%s", resp->message);
  mrl_http_request_free(r);
  mrl_http_free(h);
  teardown(e);
}

static void test_connection_refused(void) {
  mrl_engine *e = setup();
  mock_server *other = mock_server_start();
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/echo", mock_server_port(other));
  mock_server_stop(other); /* nothing listens there now */
  mrl_http *h = client(e, 1, 0);
  mrl_http_call call = {.url = url};
  mrl_http_request *r = NULL;
  MUST(mrl_http_submit(h, &call, &r));
  MUST(mrl_http_wait(r));
  const mrl_http_response *resp = mrl_http_response_of(r);
  CHECKF(resp->outcome == MRL_HTTP_FAILED && resp->attempts == 2 && strstr(resp->message, "attempt 2 of 2"),
         "%s", resp->message);
  mrl_http_request_free(r);
  mrl_http_free(h);
  teardown(e);
}

typedef struct {
  mrl_sse *sse;
  int events, done;
  char last[64];
} stream_state;

static int on_event(void *ud, const mrl_sse_event *ev) {
  stream_state *s = ud;
  s->events++;
  s->done |= ev->done;
  snprintf(s->last, sizeof s->last, "%s", ev->data);
  return 0;
}

static int on_data(void *ud, const char *bytes, size_t len) {
  stream_state *s = ud;
  return mrl_sse_feed(s->sse, bytes, len, on_event, s) != MRL_OK;
}

static mrl_http_request *stream(mrl_http *h, const char *path, stream_state *s) {
  char url[256];
  snprintf(url, sizeof url, "%s%s", base, path);
  mrl_http_call call = {.url = url, .on_data = on_data, .ud = s};
  mrl_http_request *r = NULL;
  MUST(mrl_http_submit(h, &call, &r));
  MUST(mrl_http_wait(r));
  return r;
}

static void test_streaming(void) {
  mrl_engine *e = setup();
  mrl_http *h = client(e, 2, 0);
  const char *eols[] = {"lf", "crlf", "cr"};
  for (int i = 0; i < 3; i++) {
    stream_state s = {0};
    MUST(mrl_sse_new(e, 0, &s.sse));
    char path[64];
    snprintf(path, sizeof path, "/sse?n=5&eol=%s", eols[i]);
    mrl_http_request *r = stream(h, path, &s);
    const mrl_http_response *resp = mrl_http_response_of(r);
    CHECKF(resp->outcome == MRL_HTTP_DONE && s.events == 6 && s.done && resp->body_len == 0 &&
               resp->delivered > 0, "%s: %d events, %s", eols[i], s.events, resp->message);
    mrl_http_request_free(r);
    mrl_sse_free(s.sse);
  }
  /* an error status is not streamed: its body is kept */
  stream_state s = {0};
  MUST(mrl_sse_new(e, 0, &s.sse));
  mrl_http_request *r = stream(h, "/status?code=400", &s);
  CHECK(s.events == 0 && mrl_http_response_of(r)->delivered == 0 &&
        strstr(mrl_http_response_of(r)->body, "injected"));
  mrl_http_request_free(r);
  mrl_sse_free(s.sse);
  mrl_http_free(h);
  teardown(e);
}

static void test_no_retry_after_streamed_byte(void) {
  mrl_engine *e = setup();
  mrl_http *h = client(e, 3, 0);
  stream_state s = {0};
  MUST(mrl_sse_new(e, 0, &s.sse));
  mrl_http_request *r = stream(h, "/sse?n=5&delay_ms=30&reset_after=2&key=m", &s);
  const mrl_http_response *resp = mrl_http_response_of(r);
  CHECKF(resp->outcome == MRL_HTTP_FAILED && resp->attempts == 1 && resp->delivered > 0 &&
             s.events == 2 && strstr(resp->message, "not retried"),
         "%s, %d attempts, %d events: %s", mrl_http_outcome_name(resp->outcome), resp->attempts,
         s.events, resp->message);
  mrl_http_request_free(r);
  mrl_sse_free(s.sse);
  CHECK(stat_of(e, "hits", "m") == 1);
  mrl_http_free(h);
  teardown(e);
}

static int stop_at_two(void *ud, const char *bytes, size_t len) {
  (void)bytes;
  (void)len;
  return ++*(int *)ud >= 2;
}

static void test_on_data_stops(void) {
  mrl_engine *e = setup();
  mrl_http *h = client(e, 3, 0);
  char url[128];
  snprintf(url, sizeof url, "%s/sse?n=10&delay_ms=10", base);
  int calls = 0;
  mrl_http_call call = {.url = url, .on_data = stop_at_two, .ud = &calls};
  mrl_http_request *r = NULL;
  MUST(mrl_http_submit(h, &call, &r));
  MUST(mrl_http_wait(r));
  CHECK(mrl_http_response_of(r)->outcome == MRL_HTTP_STOPPED && calls == 2 &&
        mrl_http_response_of(r)->attempts == 1);
  mrl_http_request_free(r);
  mrl_http_free(h);
  teardown(e);
}

static void test_timeouts(void) {
  mrl_engine *e = setup();
  mrl_http_config c = {.retries = MRL_HTTP_NO_RETRIES, .timeout_ms = 200};
  mrl_http *h = NULL;
  MUST(mrl_http_new(e, &c, &h));
  mrl_http_request *r = get(h, "/slow?ms=1500");
  const mrl_http_response *resp = mrl_http_response_of(r);
  CHECKF(resp->outcome == MRL_HTTP_TIMEOUT && resp->elapsed_ms >= 190 && resp->elapsed_ms < 1000,
         "%s after %.0f ms: %s", mrl_http_outcome_name(resp->outcome), resp->elapsed_ms, resp->message);
  mrl_http_request_free(r);
  /* a per-request timeout overrides the client's */
  char url[128];
  snprintf(url, sizeof url, "%s/slow?ms=300", base);
  mrl_http_call call = {.url = url, .timeout_ms = 2000};
  MUST(mrl_http_submit(h, &call, &r));
  MUST(mrl_http_wait(r));
  CHECK(mrl_http_response_of(r)->outcome == MRL_HTTP_DONE);
  mrl_http_request_free(r);
  mrl_http_free(h);
  /* a timeout is retried like a connection error */
  c.retries = 1;
  c.backoff_ms = 10;
  MUST(mrl_http_new(e, &c, &h));
  r = get(h, "/slow?ms=1500");
  CHECK(mrl_http_response_of(r)->outcome == MRL_HTTP_TIMEOUT && mrl_http_response_of(r)->attempts == 2);
  mrl_http_request_free(r);
  mrl_http_free(h);
  /* the idle timeout: headers and 2 bytes, then silence */
  c = (mrl_http_config){.retries = MRL_HTTP_NO_RETRIES, .idle_timeout_ms = 250};
  MUST(mrl_http_new(e, &c, &h));
  r = get(h, "/stall?ms=2000");
  resp = mrl_http_response_of(r);
  CHECKF(resp->outcome == MRL_HTTP_TIMEOUT && strstr(resp->message, "nothing received for 250 ms") &&
             resp->elapsed_ms >= 240 && resp->elapsed_ms < 1500,
         "%s after %.0f ms: %s", mrl_http_outcome_name(resp->outcome), resp->elapsed_ms, resp->message);
  mrl_http_request_free(r);
  r = get(h, "/slow?ms=100"); /* silence shorter than the idle timeout is fine */
  CHECK(mrl_http_response_of(r)->outcome == MRL_HTTP_DONE);
  mrl_http_request_free(r);
  mrl_http_free(h);
  teardown(e);
}

static void test_cancel(void) {
  mrl_engine *e = setup();
  mrl_http *h = client(e, 2, 1);
  char url[128];
  snprintf(url, sizeof url, "%s/slow?ms=3000", base);
  mrl_http_call call = {.url = url};
  mrl_http_request *running = NULL, *queued = NULL;
  MUST(mrl_http_submit(h, &call, &running));
  MUST(mrl_http_submit(h, &call, &queued)); /* waits: one connection at a time */
  double t0 = mrl_clock();
  for (int i = 0; i < 5; i++) MUST(mrl_http_poll(h, 20, NULL));
  MUST(mrl_http_cancel(running));
  MUST(mrl_http_cancel(queued));
  CHECK(mrl_http_response_of(running)->outcome == MRL_HTTP_CANCELLED);
  CHECK(mrl_http_response_of(queued)->outcome == MRL_HTTP_CANCELLED);
  CHECK(mrl_http_response_of(running)->attempts == 1 && mrl_http_response_of(queued)->attempts == 0);
  CHECK(mrl_http_pending(h) == 0);
  CHECK(mrl_clock() - t0 < 2.5); /* long before the 3 s response: not waited for */
  MUST(mrl_http_cancel(running)); /* a finished request: nothing */
  mrl_http_request_free(running);
  mrl_http_request_free(queued);
  /* the endpoint's slot is free again */
  mrl_http_request *r = get(h, "/echo");
  CHECK(mrl_http_response_of(r)->status == 200);
  mrl_http_request_free(r);
  /* freeing an unfinished request cancels it */
  MUST(mrl_http_submit(h, &call, &r));
  MUST(mrl_http_poll(h, 10, NULL));
  mrl_http_request_free(r);
  CHECK(mrl_http_pending(h) == 0);
  mrl_http_free(h);
  teardown(e);
}

static void test_concurrency_limit(void) {
  mrl_engine *e = setup();
  enum { N = 40, LIMIT = 4 };
  mrl_http *h = client(e, 0, LIMIT);
  mrl_http_request *r = get(h, "/reset_stats");
  int64_t connects = mrl_http_response_of(r)->connects;
  mrl_http_request_free(r);
  char url[128];
  snprintf(url, sizeof url, "%s/hold?ms=30", base);
  mrl_http_request *rs[N];
  for (int i = 0; i < N; i++) {
    mrl_http_call call = {.url = url};
    MUST(mrl_http_submit(h, &call, &rs[i]));
  }
  int finished = 0;
  while (mrl_http_pending(h) > 0) {
    int n = 0;
    MUST(mrl_http_poll(h, 100, &n));
    finished += n;
  }
  CHECK(finished == N);
  int ok = 0;
  for (int i = 0; i < N; i++) {
    ok += mrl_http_response_of(rs[i])->status == 200;
    connects += mrl_http_response_of(rs[i])->connects;
    mrl_http_request_free(rs[i]);
  }
  CHECK(ok == N);
  r = get(h, "/stats");
  connects += mrl_http_response_of(r)->connects;
  const char *body = mrl_http_response_of(r)->body;
  mrl_json_doc *doc = NULL;
  MUST(mrl__json_parse(e, "test", "stats", body, strlen(body), &doc));
  const mrl_json *root = mrl__json_root(doc);
  long max_inflight = (long)mrl__json_get(root, "max_inflight")->number;
  long max_open = (long)mrl__json_get(root, "max_open")->number;
  CHECKF(max_inflight == LIMIT && max_open <= LIMIT, "max in flight %ld, max open %ld", max_inflight,
         max_open);
  CHECKF(connects == LIMIT, "%lld connections opened", (long long)connects);
  mrl__json_free(doc);
  mrl_http_request_free(r);
  mrl_http_free(h);
  teardown(e);
}

static void test_overlap(void) {
  mrl_engine *e = setup();
  enum { N = 8 };
  mrl_http *h = client(e, 0, N);
  char url[128];
  snprintf(url, sizeof url, "%s/hold?ms=300", base);
  mrl_http_request *rs[N];
  for (int i = 0; i < N; i++) {
    mrl_http_call call = {.url = url};
    MUST(mrl_http_submit(h, &call, &rs[i]));
  }
  for (int i = 0; i < N; i++) MUST(mrl_http_wait(rs[i]));
  CHECK(stat_of(e, "max_inflight", NULL) == N); /* all N held by the server at once */
  for (int i = 0; i < N; i++) mrl_http_request_free(rs[i]);
  mrl_http_free(h);
  teardown(e);
}

static void test_bad_arguments(void) {
  mrl_engine *e = setup();
  mrl_http *h = NULL;
  mrl_http_config bad = {.timeout_ms = -1};
  CHECK_FAILS(e, MRL_ERR_INVALID, "negative", mrl_http_new(e, &bad, &h));
  bad = (mrl_http_config){.retries = -2};
  CHECK_FAILS(e, MRL_ERR_INVALID, "negative", mrl_http_new(e, &bad, &h));
  CHECK(mrl_http_new(NULL, NULL, &h) == MRL_ERR_NULL);
  h = client(e, 0, 0);
  mrl_http_request *r = NULL;
  mrl_http_call call = {.url = "ftp://127.0.0.1/x"};
  CHECK_FAILS(e, MRL_ERR_INVALID, "not an http:// or https:// URL", mrl_http_submit(h, &call, &r));
  call.url = "no url at all";
  CHECK_FAILS(e, MRL_ERR_INVALID, "not an http:// or https:// URL", mrl_http_submit(h, &call, &r));
  call.url = NULL;
  CHECK_FAILS(e, MRL_ERR_NULL, "call.url", mrl_http_submit(h, &call, &r));
  const char *headers[] = {"NoColon", NULL};
  call = (mrl_http_call){.url = base, .headers = headers};
  CHECK_FAILS(e, MRL_ERR_INVALID, "header \"NoColon\"", mrl_http_submit(h, &call, &r));
  call = (mrl_http_call){.url = base, .method = "GET X"};
  CHECK_FAILS(e, MRL_ERR_INVALID, "bad method", mrl_http_submit(h, &call, &r));
  call = (mrl_http_call){.url = base, .body_len = 3};
  CHECK_FAILS(e, MRL_ERR_NULL, "call.body is NULL", mrl_http_submit(h, &call, &r));
  CHECK(r == NULL);
  CHECK_FAILS(e, MRL_ERR_INVALID, "timeout_ms < 0", mrl_http_poll(h, -1, NULL));
  CHECK(mrl_http_poll(NULL, 0, NULL) == MRL_ERR_NULL);
  CHECK(mrl_http_wait(NULL) == MRL_ERR_NULL);
  CHECK(mrl_http_cancel(NULL) == MRL_ERR_NULL);
  CHECK(mrl_http_request_finished(NULL) == -1);
  CHECK(mrl_http_response_of(NULL) == NULL);
  CHECK(strcmp(mrl_http_outcome_name(MRL_HTTP_TIMEOUT), "timeout") == 0);
  CHECK(strcmp(mrl_http_outcome_name((mrl_http_outcome)99), "unknown") == 0);
  int n = -1;
  MUST(mrl_http_poll(h, 1000, &n)); /* nothing pending: at once */
  CHECK(n == 0);
  mrl_http_free(h);
  mrl_http_free(NULL);
  mrl_http_request_free(NULL);
  teardown(e);
}

static void test_free_with_requests_in_flight(void) {
  mrl_engine *e = setup();
  mrl_http *h = client(e, 0, 2);
  char url[128];
  snprintf(url, sizeof url, "%s/slow?ms=2000", base);
  mrl_http_request *rs[4];
  for (int i = 0; i < 4; i++) {
    mrl_http_call call = {.url = url};
    MUST(mrl_http_submit(h, &call, &rs[i]));
  }
  MUST(mrl_http_poll(h, 50, NULL));
  mrl_http_free(h);
  for (int i = 0; i < 4; i++) {
    CHECK(mrl_http_response_of(rs[i])->outcome == MRL_HTTP_CANCELLED);
    CHECK(mrl_http_wait(rs[i]) == MRL_OK);
    mrl_http_request_free(rs[i]);
  }
  teardown(e);
}

static const test_case tests[] = {
    {"get_and_post", test_get_and_post},
    {"retry_status", test_retry_status},
    {"retry_after", test_retry_after},
    {"backoff", test_backoff},
    {"reset_before_first_byte", test_reset_before_first_byte},
    {"connection_refused", test_connection_refused},
    {"streaming", test_streaming},
    {"no_retry_after_streamed_byte", test_no_retry_after_streamed_byte},
    {"on_data_stops", test_on_data_stops},
    {"timeouts", test_timeouts},
    {"cancel", test_cancel},
    {"concurrency_limit", test_concurrency_limit},
    {"overlap", test_overlap},
    {"bad_arguments", test_bad_arguments},
    {"free_with_requests_in_flight", test_free_with_requests_in_flight},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
