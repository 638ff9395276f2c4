/* serve_internal.h - what the server's files share: the server handle, queued jobs, and a small
 * JSON writer on malloc (jobs cross threads, so they cannot use the engine's allocator, which
 * belongs to the engine thread). Not installed. */
#ifndef MRL_SERVE_INTERNAL_H
#define MRL_SERVE_INTERNAL_H

#include "internal.h"

#include <pthread.h>
#include <stdbool.h>

/* A growing byte string; `failed` records an allocation that failed (the text is then cut). */
typedef struct {
  char *p;
  size_t len, cap;
  bool failed;
} srv_buf;

void mrl__sb_add(srv_buf *b, const char *s, size_t n);
void mrl__sb_str(srv_buf *b, const char *s);
void mrl__sb_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s[0..n) as a JSON string: quotes, escapes, and U+FFFD for bytes that are not UTF-8. */
void mrl__sb_json_str(srv_buf *b, const char *s, size_t n);
/* A float as JSON (9 significant digits read back to the same float; -9999.0 if not finite). */
void mrl__sb_json_float(srv_buf *b, float x);
void mrl__sb_free(srv_buf *b);
/* The OpenAI error body {"error": {"message", "type", "param", "code"}} (param may be NULL). */
void mrl__sb_error(srv_buf *b, const char *message, const char *type, const char *param,
              const char *code);

enum srv_kind {
  JOB_COMPLETION,
  JOB_CHAT,
  JOB_CHAT_TOKENS, /* prime-rl's /v1/chat/completions/tokens: the prompt given as ids */
  JOB_GENERATE,
  JOB_TOKENIZE,
  JOB_DETOKENIZE,
  JOB_LOAD_WEIGHTS
};

/* One request, shared by its HTTP thread and the engine thread; every field below `srv` is
 * guarded by the server's mutex, and the job is freed when both sides have let go (refs). */
typedef struct srv_job {
  struct srv_job *next;
  struct mrl_server *srv;
  int kind;
  char *body; /* the request body, NUL-terminated (malloc; the engine thread frees it) */
  size_t body_len;
  bool raw;   /* load_weights with the checkpoint's bytes as the body */
  int refs;
  int status;      /* 0 until the engine thread has decided */
  bool streaming;  /* status 200 and `out` grows as tokens come (SSE) */
  bool done;       /* `out` is complete */
  bool cancelled;  /* the client went away */
  srv_buf out;
  size_t sent;     /* bytes of `out` handed to the connection (streams) */
  pthread_cond_t cond;
} srv_job;

struct mrl_server {
  mrl_engine *e;
  mrl_model *m;
  mrl_tokenizer *t;
  struct MHD_Daemon *daemon;
  int port;
  char *host, *api_key, *model_name;
  int max_queue, max_batch, batch_invariant;
  int tool_format; /* TOOL_FORMAT_* of toolcall.h */
  size_t max_body;
  int ctx, vocab;
  pthread_t worker;
  bool worker_started;
  pthread_mutex_t mu;
  pthread_cond_t wake;   /* the engine thread waits on it for jobs */
  srv_job *head, *tail;  /* the queue */
  int queued, running;
  bool stopping, paused, loading;
  int64_t policy_version, requests, steps, max_batch_seen, rejected;
};

/* What the engine thread would answer to a request body of kind (enum srv_kind, not
 * JOB_LOAD_WEIGHTS), without running it: the HTTP status (200 for a valid generation, which is
 * parsed and dropped; tokenize/detokenize answer fully) with the reply's body in *reply (the
 * caller frees it); -1 when the check itself could not run. For the request-body fuzz target;
 * uses s's engine, tokenizer and settings on the calling thread (no worker may run). */
int mrl__serve_check_request(mrl_server *s, int kind, const char *body, size_t len,
                             srv_buf *reply);

/* The engine thread (worker.c). */
void *mrl__serve_worker(void *server);
/* Under the mutex: the job's reply is complete; wakes its HTTP thread; drops the engine side's
 * reference. */
void mrl__serve_finish(srv_job *j, int status);
/* Under the mutex: drops one reference, freeing the job at the last one. */
void mrl__serve_release(srv_job *j);

#endif /* MRL_SERVE_INTERNAL_H */
