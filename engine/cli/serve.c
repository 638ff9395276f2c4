/* serve.c - `moonrl serve`: loads a model directory (and its tokenizer.json, else the byte
 * tokenizer), starts the OpenAI-compatible server on it, prints where it listens, and runs until
 * SIGINT or SIGTERM. */
#define _DEFAULT_SOURCE
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char serve_usage[] =
    "usage: moonrl serve --model DIR|builtin [--host 127.0.0.1] [--port 8000] [--api-key KEY]\n"
    "                    [--served-model-name NAME] [--max-queue 64] [--max-batch 8]\n"
    "                    [--max-body BYTES] [--port-file FILE] [--batch-invariant]\n"
    "                    [--tool-format hermes|line]\n"
    "  DIR holds config.json and model.safetensors (rl.model save) and, optionally,\n"
    "  tokenizer.json; without one the byte tokenizer is used. `builtin` is a fresh default\n"
    "  model (seed 0). --port 0 picks a free port; the chosen one is printed (and written to\n"
    "  --port-file). --batch-invariant decodes each running sequence on its own, so that a\n"
    "  request's tokens and log-probs do not depend on what else runs (slower). --tool-format\n"
    "  is how the model writes tool calls: hermes (<tool_call>{...}</tool_call>, the default)\n"
    "  or line (CALL name arg ...). Stops on SIGINT or SIGTERM.\n";

static bool parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

int mrl_cli_serve(int argc, char **argv) {
  const char *model_dir = NULL, *port_file = NULL;
  mrl_server_config cfg;
  mrl_server_config_default(&cfg);
  cfg.port = 8000;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long n;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(serve_usage, stdout);
      return 0;
    }
    if (!strcmp(a, "--batch-invariant")) {
      cfg.batch_invariant = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "moonrl serve: %s needs a value\n\n%s", a, serve_usage);
      return 2;
    }
    i++;
    if (!strcmp(a, "--model")) model_dir = v;
    else if (!strcmp(a, "--host")) cfg.host = v;
    else if (!strcmp(a, "--api-key")) cfg.api_key = v;
    else if (!strcmp(a, "--served-model-name")) cfg.model_name = v;
    else if (!strcmp(a, "--port-file")) port_file = v;
    else if (!strcmp(a, "--tool-format") && (!strcmp(v, "hermes") || !strcmp(v, "line")))
      cfg.tool_format = v;
    else if (!strcmp(a, "--port") && parse_int(v, 0, 65535, &n)) cfg.port = (int)n;
    else if (!strcmp(a, "--max-queue") && parse_int(v, 1, 1 << 20, &n)) cfg.max_queue = (int)n;
    else if (!strcmp(a, "--max-batch") && parse_int(v, 1, 4096, &n)) cfg.max_batch = (int)n;
    else if (!strcmp(a, "--max-body") && parse_int(v, 1, LONG_MAX, &n)) cfg.max_body = (size_t)n;
    else {
      fprintf(stderr, "moonrl serve: bad option or value: %s %s\n\n%s", a, v, serve_usage);
      return 2;
    }
  }
  if (!model_dir) {
    fprintf(stderr, "moonrl serve: --model is required\n\n%s", serve_usage);
    return 2;
  }

  /* blocked before any thread exists (the engine's, OpenBLAS's, the server's), so that every
   * thread inherits the mask and the signals reach sigwait below */
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);
  mrl_engine *e;
  if (mrl_engine_new(&e) != MRL_OK) {
    fputs("moonrl serve: cannot create the engine (out of memory)\n", stderr);
    return 1;
  }
  mrl_model *m = NULL;
  mrl_tokenizer *t = NULL;
  mrl_status st;
  if (!strcmp(model_dir, "builtin")) {
    mrl_model_config mc;
    mrl_model_config_default(&mc);
    st = mrl_model_new(e, &mc, 0, &m);
  } else {
    st = mrl_model_load(e, model_dir, &m);
  }
  if (st == MRL_OK) {
    char path[PATH_MAX];
    struct stat sb;
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    if (strcmp(model_dir, "builtin") && stat(path, &sb) == 0)
      st = mrl_tokenizer_load(e, path, &t);
    else
      st = mrl_tokenizer_bytes(e, &t);
  }
  mrl_server *s = NULL;
  if (st == MRL_OK) st = mrl_server_start(e, m, t, &cfg, &s);
  if (st != MRL_OK) {
    fprintf(stderr, "moonrl serve: %s\n", mrl_engine_last_error(e));
    mrl_tokenizer_free(t);
    mrl_model_free(m);
    mrl_engine_free(e);
    return 1;
  }
  int port = mrl_server_port(s);
  if (port_file) {
    FILE *f = fopen(port_file, "w");
    if (f) {
      fprintf(f, "%d\n", port);
      fclose(f);
    }
  }
  printf("moonrl serve: listening on http://%s:%d\n", cfg.host ? cfg.host : "127.0.0.1", port);
  fflush(stdout);
  int sig;
  sigwait(&stop, &sig);
  mrl_server_stop(s);
  mrl_engine_free(e);
  return 0;
}
