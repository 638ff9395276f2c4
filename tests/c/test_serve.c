/* test_serve.c - tests of the server library behind `moonrl serve` (mrl_server_*): bad arguments
 * fail with a status and a message and take nothing, a port already in use is refused, and a
 * server on a free loopback port answers health, completions, and 400/401/404 in the OpenAI
 * shape over a plain socket, then stops leaving nothing behind (the ASan build checks). */
#define _DEFAULT_SOURCE
#include "support.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* One HTTP/1.0 exchange with 127.0.0.1:port; the reply (headers and body) goes into out.
 * Returns the status, or -1 when the exchange failed. */
static int exchange(int port, const char *request, char *out, size_t cap) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  size_t len = strlen(request);
  for (size_t off = 0; off < len;) {
    ssize_t k = write(fd, request + off, len - off);
    if (k <= 0) {
      close(fd);
      return -1;
    }
    off += (size_t)k;
  }
  size_t got = 0;
  for (;;) {
    ssize_t k = read(fd, out + got, cap - 1 - got);
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  out[got] = '\0';
  int status = -1;
  if (sscanf(out, "HTTP/1.%*d %d", &status) != 1) return -1;
  return status;
}

static int post(int port, const char *path, const char *key, const char *body, char *out,
                size_t cap) {
  char req[4096];
  snprintf(req, sizeof req,
           "POST %s HTTP/1.0\r\nContent-Type: application/json\r\n%s%s%sContent-Length: %zu\r\n"
           "\r\n%s",
           path, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "",
           strlen(body), body);
  return exchange(port, req, out, cap);
}

static mrl_model *small_model(mrl_engine *e) {
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.dim = 32;
  c.layers = 1;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn = 64;
  c.ctx = 64;
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, &c, 3, &m));
  return m;
}

static void test_bad_arguments(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = small_model(e);
  mrl_tokenizer *t = NULL;
  MUST(mrl_tokenizer_bytes(e, &t));
  mrl_server *s = NULL;
  mrl_server_config cfg;
  mrl_server_config_default(&cfg);
  CHECK(mrl_server_start(e, NULL, t, &cfg, &s) == MRL_ERR_NULL);
  CHECK(mrl_server_start(e, m, t, &cfg, NULL) == MRL_ERR_NULL);
  cfg.host = "not-an-address";
  CHECK_FAILS(e, MRL_ERR_INVALID, "not-an-address", mrl_server_start(e, m, t, &cfg, &s));
  mrl_server_config_default(&cfg);
  cfg.port = 70000;
  CHECK_FAILS(e, MRL_ERR_INVALID, "port", mrl_server_start(e, m, t, &cfg, &s));
  CHECK(s == NULL);
  CHECK(mrl_server_port(NULL) == -1);
  mrl_server_stop(NULL);
  /* nothing was taken: the caller still owns and frees both */
  mrl_tokenizer_free(t);
  mrl_model_free(m);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static void test_serves_and_stops(void) {
  mrl_engine *e = new_engine();
  mrl_engine *e2 = new_engine();
  mrl_tokenizer *t = NULL, *t2 = NULL;
  MUST(mrl_tokenizer_bytes(e, &t));
  MUST(mrl_tokenizer_bytes(e2, &t2));
  mrl_model *m = small_model(e), *m2 = small_model(e2);
  mrl_server_config cfg;
  mrl_server_config_default(&cfg);
  cfg.api_key = "sk-c";
  mrl_server *s = NULL;
  MUST(mrl_server_start(e, m, t, &cfg, &s));
  int port = mrl_server_port(s);
  CHECK(port > 0);

  /* the same port again is refused, and the second model stays its caller's */
  mrl_server *s2 = NULL;
  cfg.port = port;
  CHECK_FAILS(e2, MRL_ERR_IO, "cannot listen", mrl_server_start(e2, m2, t2, &cfg, &s2));
  mrl_model_free(m2);
  mrl_tokenizer_free(t2);
  mrl_engine_free(e2);

  static char out[1 << 16];
  CHECK(exchange(port, "GET /health HTTP/1.0\r\n\r\n", out, sizeof out) == 200);
  CHECK(strstr(out, "\"status\":\"ok\"") != NULL);
  CHECK(post(port, "/v1/completions", "sk-c",
             "{\"prompt\":[1,2,3],\"max_tokens\":4,\"seed\":1,\"logprobs\":0,"
             "\"return_token_ids\":true,\"ignore_eos\":true}",
             out, sizeof out) == 200);
  CHECK(strstr(out, "\"object\":\"text_completion\"") != NULL);
  CHECK(strstr(out, "\"completion_tokens\":4") != NULL);
  CHECK(post(port, "/v1/completions", "sk-c", "{\"prompt\":[1],\"bogus\":true}", out,
             sizeof out) == 400);
  CHECK(strstr(out, "\"param\":\"bogus\"") != NULL);
  CHECK(strstr(out, "\"type\":\"invalid_request_error\"") != NULL);
  CHECK(post(port, "/v1/completions", "sk-wrong", "{\"prompt\":[1]}", out, sizeof out) == 401);
  CHECK(post(port, "/v1/completions", NULL, "{\"prompt\":[1]}", out, sizeof out) == 401);
  CHECK(post(port, "/nowhere", "sk-c", "{}", out, sizeof out) == 404);
  CHECK(strstr(out, "\"code\":\"not_found\"") != NULL);
  CHECK(post(port, "/v1/chat/completions", "sk-c",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,"
             "\"stream\":true}",
             out, sizeof out) == 200);
  CHECK(strstr(out, "text/event-stream") != NULL);
  CHECK(strstr(out, "data: [DONE]") != NULL);
  mrl_server_stop(s); /* frees m and t */
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static const test_case tests[] = {
    {"bad_arguments", test_bad_arguments},
    {"serves_and_stops", test_serves_and_stops},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
