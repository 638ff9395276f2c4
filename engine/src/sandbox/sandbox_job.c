/* sandbox_job.c - one sandboxed call from the engine's side: copying the call, the FIFO queue of
 * a full pool, starting the reaper (clone with the namespaces, id maps, cgroups), pumping the
 * output pipes, the report pipe, the reaper's pidfd and a timer, keeping head and tail of the
 * output, enforcing the wall, CPU, pids and output limits, classifying the outcome, and the
 * results. */
#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif

static const char FN_START[] = "mrl_sandbox_start";

enum { TAG_OUT = 0, TAG_ERR = 1, TAG_REPORT = 2, TAG_TIMER = 3, TAG_PID = 4 };
enum { TICK_MS = 20, READ_CHUNK = 65536 };

static const char *const default_env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/work",
                                          "LANG=C.UTF-8"};

const char *mrl_sandbox_status_name(mrl_sandbox_status s) {
  static const char *const names[] = {"exited",     "signaled",     "timeout", "cpu_limit",  "oom",
                                      "pids_limit", "output_limit", "seccomp", "setup_error"};
  return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

/* ---- checking and copying a call ---- */

/* A file name for /work: relative, components neither empty nor "." nor "..". */
static bool good_file_name(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n >= SB_NAME_MAX || name[0] == '/') return false;
  for (const char *c = name; *c;) {
    const char *end = strchr(c, '/');
    size_t k = end ? (size_t)(end - c) : strlen(c);
    if (k == 0 || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.')) return false;
    c += k + (end ? 1 : 0);
    if (end && !*c) return false; /* a trailing '/' */
  }
  return true;
}

static size_t env_name_len(const char *entry) {
  const char *eq = strchr(entry, '=');
  return eq ? (size_t)(eq - entry) : 0;
}

static mrl_status check_call(mrl_sandbox *p, const mrl_sandbox_call *call, bool need_argv) {
  mrl_engine *e = p->engine;
  if (need_argv && (!call->argv || !call->argv[0]))
    return mrl__fail(e, MRL_ERR_INVALID, FN_START, "argv is empty");
  if (need_argv && !call->argv[0][0])
    return mrl__fail(e, MRL_ERR_INVALID, FN_START, "argv[0] is an empty string");
  for (size_t i = 0; call->env && call->env[i]; i++)
    if (env_name_len(call->env[i]) == 0)
      return mrl__fail(e, MRL_ERR_INVALID, FN_START, "env[%zu] = '%s': expected NAME=value", i,
                       call->env[i]);
  if (call->stdin_len && !call->stdin_data)
    return mrl__fail(e, MRL_ERR_NULL, FN_START, "stdin_data is NULL but stdin_len is %zu",
                     call->stdin_len);
  if (call->nfiles && !call->files) return mrl__fail(e, MRL_ERR_NULL, FN_START, "files is NULL");
  if (call->nfiles > SB_MAX_FILES)
    return mrl__fail(e, MRL_ERR_INVALID, FN_START, "%zu files: at most %d", call->nfiles,
                     SB_MAX_FILES);
  for (size_t i = 0; i < call->nfiles; i++) {
    const mrl_sandbox_file *f = &call->files[i];
    if (!f->name) return mrl__fail(e, MRL_ERR_NULL, FN_START, "files[%zu].name is NULL", i);
    if (!good_file_name(f->name))
      return mrl__fail(e, MRL_ERR_INVALID, FN_START,
                       "files[%zu].name = '%s': expected a relative path inside the working "
                       "directory (no '..', no empty parts)",
                       i, f->name);
    if (f->len && !f->data)
      return mrl__fail(e, MRL_ERR_NULL, FN_START, "files[%zu].data is NULL", i);
    for (size_t k = 0; k < i; k++)
      if (strcmp(call->files[k].name, f->name) == 0)
        return mrl__fail(e, MRL_ERR_INVALID, FN_START, "files: '%s' is given twice", f->name);
  }
  return MRL_OK;
}

typedef struct layout {
  size_t argc, nenv, size;
} layout;

/* Whether the call's env sets the variable of the default entry dflt. */
static bool env_overridden(const mrl_sandbox_call *call, const char *dflt) {
  size_t n = env_name_len(dflt);
  for (size_t i = 0; call->env && call->env[i]; i++)
    if (env_name_len(call->env[i]) == n && strncmp(call->env[i], dflt, n) == 0) return true;
  return false;
}

/* Copies argv, the environment, the files and stdin into one block the reaper reads. */
static mrl_status copy_call(mrl_sandbox_job *j, const mrl_sandbox_call *call,
                            const char **stdin_copy) {
  mrl_engine *e = j->pool->engine;
  layout l = {0, 0, 0};
  size_t strings = 0;
  for (; call->argv && call->argv[l.argc] && !j->plan.fn; l.argc++)
    strings += strlen(call->argv[l.argc]) + 1;
  for (size_t i = 0; i < 3; i++)
    if (!env_overridden(call, default_env[i])) l.nenv++, strings += strlen(default_env[i]) + 1;
  for (size_t i = 0; call->env && call->env[i]; i++) l.nenv++, strings += strlen(call->env[i]) + 1;
  for (size_t i = 0; i < call->nfiles; i++)
    strings += strlen(call->files[i].name) + 1 + call->files[i].len + 1;
  strings += call->stdin_len + 1 + 64; /* stdin, the tmpfs options */
  size_t ptrs = (l.argc + 1 + l.nenv + 1) * sizeof(char *);
  size_t files = call->nfiles * sizeof(mrl_sandbox_file);
  if (strings > SIZE_MAX / 2 || call->stdin_len > SIZE_MAX / 4)
    return mrl__fail(e, MRL_ERR_OVERFLOW, FN_START, "the call is too large");
  l.size = ptrs + files + strings;
  char *block = mrl__alloc(e, l.size);
  if (!block) return mrl__fail(e, MRL_ERR_NOMEM, FN_START, "out of memory (%zu bytes)", l.size);
  char **argv = (char **)block, **envp = argv + l.argc + 1;
  mrl_sandbox_file *fc = (mrl_sandbox_file *)(block + ptrs);
  char *s = block + ptrs + files;
#define PUT(str, n) (memcpy(s, (str), (n)), s[n] = '\0', s += (n) + 1, s - (n)-1)
  for (size_t i = 0; i < l.argc; i++) argv[i] = PUT(call->argv[i], strlen(call->argv[i]));
  argv[l.argc] = NULL;
  size_t k = 0;
  for (size_t i = 0; call->env && call->env[i]; i++)
    envp[k++] = PUT(call->env[i], strlen(call->env[i]));
  for (size_t i = 0; i < 3; i++)
    if (!env_overridden(call, default_env[i]))
      envp[k++] = PUT(default_env[i], strlen(default_env[i]));
  envp[k] = NULL;
  for (size_t i = 0; i < call->nfiles; i++) {
    fc[i].name = PUT(call->files[i].name, strlen(call->files[i].name));
    fc[i].data = PUT(call->files[i].len ? call->files[i].data : "", call->files[i].len);
    fc[i].len = call->files[i].len;
  }
  *stdin_copy = PUT(call->stdin_len ? call->stdin_data : "", call->stdin_len);
  if (j->lim.disk_bytes != j->pool->lim.disk_bytes) {
    char opts[64];
    snprintf(opts, sizeof opts, "size=%lld", (long long)j->lim.disk_bytes);
    j->plan.resize_opts = PUT(opts, strlen(opts));
  }
#undef PUT
  j->block = block;
  j->block_size = l.size;
  j->plan.argv = argv;
  j->plan.envp = envp;
  j->plan.files = fc;
  j->plan.nfiles = call->nfiles;
  j->plan.path = "";
  for (size_t i = 0; envp[i]; i++)
    if (strncmp(envp[i], "PATH=", 5) == 0) j->plan.path = envp[i] + 5;
  return MRL_OK;
}

/* The call's part of the plan: rlimits and the CPU timer. */
static void plan_limits(mrl_sandbox *p, mrl_sandbox_job *j) {
  sb_plan *pl = &j->plan;
  const mrl_sandbox_limits *l = &j->lim;
  pl->files_cap = (uint64_t)l->files_cap;
  uint64_t cpu_s = (uint64_t)(l->cpu_ms + 999) / 1000;
  int n = 0;
  pl->rlimits[n++] = (sb_rlimit){RLIMIT_CORE, 0, 0};
  pl->rlimits[n++] = (sb_rlimit){RLIMIT_NOFILE, (uint64_t)l->nofile, (uint64_t)l->nofile};
  pl->rlimits[n++] = (sb_rlimit){RLIMIT_FSIZE, (uint64_t)l->fsize, (uint64_t)l->fsize};
  pl->rlimits[n++] = (sb_rlimit){RLIMIT_CPU, cpu_s, cpu_s + 1};
  /* a function call runs in a copy of the engine, whose address space can be any size */
  if (!(p->prot & MRL_SANDBOX_PROT_MEMORY) && !pl->fn)
    pl->rlimits[n++] = (sb_rlimit){RLIMIT_AS, (uint64_t)l->mem_bytes, (uint64_t)l->mem_bytes};
  if (!(p->prot & MRL_SANDBOX_PROT_PIDS))
    pl->rlimits[n++] = (sb_rlimit){RLIMIT_NPROC, (uint64_t)l->pids, (uint64_t)l->pids};
  pl->nrlimits = n;
  pl->cpu_timer_us = l->cpu_ms * 1000;
}

/* ---- output: head and tail ---- */
static void capture_init(sb_capture *c, int64_t cap) {
  memset(c, 0, sizeof *c);
  c->cap = (size_t)cap;
  c->head = c->cap - c->cap / 2;
}

static void capture_add(mrl_engine *e, sb_capture *c, const char *d, size_t n) {
  c->total += n;
  if (c->len < c->cap) {
    size_t take = n < c->cap - c->len ? n : c->cap - c->len;
    if (c->len + take + 1 > c->alloc) {
      size_t want = c->alloc ? c->alloc : 4096;
      while (want < c->len + take + 1) want *= 2;
      if (want > c->cap + 1) want = c->cap + 1;
      char *b = mrl__alloc(e, want);
      if (!b) return; /* the bytes are lost; total still counts them */
      if (c->len) memcpy(b, c->buf, c->len);
      if (c->buf) mrl__free(e, c->buf, c->alloc);
      c->buf = b;
      c->alloc = want;
    }
    memcpy(c->buf + c->len, d, take);
    c->len += take;
    d += take;
    n -= take;
  }
  size_t tail = c->cap - c->head;
  if (n == 0 || tail == 0 || c->len < c->cap) return;
  if (n >= tail) { /* only the newest `tail` bytes matter */
    memcpy(c->buf + c->head, d + n - tail, tail);
    c->ring_pos = 0;
    return;
  }
  while (n > 0) {
    size_t k = n < tail - c->ring_pos ? n : tail - c->ring_pos;
    memcpy(c->buf + c->head + c->ring_pos, d, k);
    c->ring_pos = (c->ring_pos + k) % tail;
    d += k;
    n -= k;
  }
}

static void reverse(char *a, size_t n) {
  for (size_t i = 0; i < n / 2; i++) {
    char t = a[i];
    a[i] = a[n - 1 - i];
    a[n - 1 - i] = t;
  }
}

/* Puts the tail in order (oldest first) and terminates the buffer. */
static void capture_finish(sb_capture *c) {
  if (!c->buf) return;
  if (c->total > c->cap && c->ring_pos) {
    char *t = c->buf + c->head;
    size_t tail = c->cap - c->head;
    reverse(t, c->ring_pos);
    reverse(t + c->ring_pos, tail - c->ring_pos);
    reverse(t, tail);
  }
  c->buf[c->len] = '\0';
}

/* ---- results ---- */
typedef struct result_box {
  mrl_sandbox_result r; /* first: the public pointer is the box's */
  mrl_engine *engine;
  size_t out_alloc, err_alloc, msg_size, files_alloc;
} result_box;

static void free_files(mrl_engine *e, mrl_sandbox_file *files, size_t n, size_t alloc) {
  for (size_t i = 0; i < n; i++) {
    mrl__free(e, (char *)files[i].name, strlen(files[i].name) + 1);
    mrl__free(e, (char *)files[i].data, files[i].len + 1);
  }
  if (files) mrl__free(e, files, alloc * sizeof *files);
}

void mrl_sandbox_result_free(mrl_sandbox_result *r) {
  if (!r) return;
  result_box *b = (result_box *)r;
  mrl_engine *e = b->engine;
  if (b->out_alloc) mrl__free(e, (char *)r->out, b->out_alloc);
  if (b->err_alloc) mrl__free(e, (char *)r->err, b->err_alloc);
  if (b->msg_size) mrl__free(e, (char *)r->message, b->msg_size);
  free_files(e, (mrl_sandbox_file *)r->files, r->nfiles, b->files_alloc);
  mrl__free(e, b, sizeof *b);
  mrl__engine_release(e);
}

/* Builds the job's result from what it collected; takes the buffers. Without memory for the
 * result box itself, result stays NULL and job_wait reports MRL_ERR_NOMEM. */
static void make_result(mrl_sandbox_job *j, mrl_sandbox_status status, int exit_code, int sig,
                        const char *message, double cpu_ms) {
  mrl_engine *e = j->pool->engine;
  result_box *b = mrl__alloc(e, sizeof *b);
  if (!b) return;
  memset(b, 0, sizeof *b);
  b->engine = e;
  mrl__engine_retain(e);
  mrl_sandbox_result *r = &b->r;
  r->status = status;
  r->exit_code = exit_code;
  r->signal = sig;
  sb_capture *c[2] = {&j->cap[0], &j->cap[1]};
  for (int k = 0; k < 2; k++) capture_finish(c[k]);
  r->out = c[0]->buf ? c[0]->buf : "";
  r->out_len = c[0]->buf ? c[0]->len : 0;
  r->out_total = c[0]->total;
  r->out_truncated = c[0]->total > r->out_len;
  b->out_alloc = c[0]->alloc;
  r->err = c[1]->buf ? c[1]->buf : "";
  r->err_len = c[1]->buf ? c[1]->len : 0;
  r->err_total = c[1]->total;
  r->err_truncated = c[1]->total > r->err_len;
  b->err_alloc = c[1]->alloc;
  c[0]->buf = c[1]->buf = NULL;
  c[0]->alloc = c[1]->alloc = 0;
  r->wall_ms = j->t_start > 0 ? (mrl_clock() - j->t_start) * 1000.0 : 0.0;
  r->cpu_ms = cpu_ms;
  r->max_rss_kb = j->have_status ? j->st.max_rss_kb : 0;
  r->files = j->files;
  r->nfiles = j->nfiles;
  b->files_alloc = j->files_alloc;
  r->files_truncated = j->files_truncated;
  j->files = NULL;
  j->nfiles = j->files_alloc = 0;
  r->message = "";
  if (message && *message) {
    size_t n = strlen(message) + 1;
    char *m = mrl__alloc(e, n);
    if (m) {
      memcpy(m, message, n);
      r->message = m;
      b->msg_size = n;
    }
  }
  j->result = r;
}

static void set_error(mrl_sandbox_job *j, const char *msg) {
  if (j->error) return;
  size_t n = strlen(msg) + 1;
  j->error = mrl__alloc(j->pool->engine, n);
  if (j->error) memcpy(j->error, msg, n);
}

/* ---- the report ---- */
static void report_record_done(mrl_sandbox_job *j) {
  mrl_engine *e = j->pool->engine;
  sb_record *r = &j->rec;
  switch (r->type) {
  case SB_REC_ERROR: {
    char msg[SB_NAME_MAX + 200];
    snprintf(msg, sizeof msg, "%s: %s", j->rec_name, strerror((int)r->data_len));
    set_error(j, msg);
    break;
  }
  case SB_REC_FILE:
    if (j->nfiles == j->files_alloc) {
      size_t want = j->files_alloc ? 2 * j->files_alloc : 16;
      mrl_sandbox_file *f = mrl__alloc(e, want * sizeof *f);
      if (!f) {
        j->files_truncated = 1;
        break;
      }
      if (j->nfiles) memcpy(f, j->files, j->nfiles * sizeof *f);
      if (j->files) mrl__free(e, j->files, j->files_alloc * sizeof *f);
      j->files = f;
      j->files_alloc = want;
    }
    j->files[j->nfiles].name = j->rec_name;
    j->files[j->nfiles].data = j->rec_data;
    j->files[j->nfiles].len = (size_t)r->data_len;
    j->nfiles++;
    j->rec_name = j->rec_data = NULL;
    break;
  case SB_REC_FILES_TRUNCATED: j->files_truncated = 1; break;
  case SB_REC_STATUS:
    memcpy(&j->st, j->rec_data, sizeof j->st);
    j->have_status = 1;
    break;
  }
  if (j->rec_name) mrl__free(e, j->rec_name, r->name_len + 1);
  if (j->rec_data) mrl__free(e, j->rec_data, (size_t)r->data_len + 1);
  j->rec_name = j->rec_data = NULL;
  j->hdr_got = 0;
  j->rec_got = 0;
}

/* Size of a record's data in the stream (an error carries its errno in data_len). */
static uint64_t payload(const sb_record *r) { return r->type == SB_REC_ERROR ? 0 : r->data_len; }

/* Checks a header and allocates what its record needs; false when it makes no sense. */
static bool report_header(mrl_sandbox_job *j) {
  mrl_engine *e = j->pool->engine;
  sb_record *r = &j->rec;
  memcpy(r, j->hdr, sizeof *r);
  bool ok = r->name_len <= SB_NAME_MAX + 64;
  switch (r->type) {
  case SB_REC_ERROR: ok = ok && r->data_len < 4096; break;
  case SB_REC_FILE:
    ok = ok && r->data_len <= (uint64_t)j->lim.files_cap - j->files_bytes;
    if (ok) j->files_bytes += r->data_len;
    break;
  case SB_REC_FILES_TRUNCATED: ok = ok && r->data_len == 0; break;
  case SB_REC_STATUS: ok = ok && r->data_len == sizeof(sb_status); break;
  default: ok = false;
  }
  if (!ok) return false;
  j->rec_name = mrl__alloc(e, r->name_len + 1);
  if (payload(r)) j->rec_data = mrl__alloc(e, (size_t)r->data_len + 1);
  if (!j->rec_name || (payload(r) && !j->rec_data)) return false;
  j->rec_name[r->name_len] = '\0';
  if (j->rec_data) j->rec_data[r->data_len] = '\0';
  return true;
}

static void report_feed(mrl_sandbox_job *j, const char *d, size_t n) {
  while (n > 0 && !j->report_bad) {
    if (j->hdr_got < sizeof j->hdr) {
      size_t k = sizeof j->hdr - j->hdr_got < n ? sizeof j->hdr - j->hdr_got : n;
      memcpy(j->hdr + j->hdr_got, d, k);
      j->hdr_got += k;
      d += k;
      n -= k;
      if (j->hdr_got < sizeof j->hdr) return;
      if (!report_header(j)) {
        j->report_bad = 1;
        return;
      }
    }
    uint64_t need = j->rec.name_len + payload(&j->rec);
    while (n > 0 && j->rec_got < need) {
      uint64_t at = j->rec_got;
      size_t k;
      if (at < j->rec.name_len) {
        k = (size_t)(j->rec.name_len - at) < n ? (size_t)(j->rec.name_len - at) : n;
        memcpy(j->rec_name + at, d, k);
      } else {
        uint64_t off = at - j->rec.name_len;
        k = (size_t)(payload(&j->rec) - off) < n ? (size_t)(payload(&j->rec) - off) : n;
        memcpy(j->rec_data + off, d, k);
      }
      j->rec_got += k;
      d += k;
      n -= k;
    }
    if (j->rec_got == need) report_record_done(j);
  }
}

/* ---- pumping ---- */
static void kill_job(mrl_sandbox_job *j, int reason) {
  if (j->kill_reason == SB_KILL_NONE) j->kill_reason = reason;
  /* our unreaped child: the pid cannot have been reused (and 0 would be our process group) */
  if (j->pid > 0) kill(j->pid, SIGKILL);
}

static void stop_watching(mrl_sandbox_job *j, int fd) {
  epoll_ctl(j->epfd, EPOLL_CTL_DEL, fd, NULL);
}

/* Reads what a pipe holds (all of it when final, else a bounded amount). */
static void drain(mrl_sandbox_job *j, int tag, bool final) {
  char buf[READ_CHUNK];
  int fd = tag == TAG_REPORT ? j->report_r : j->out_r[tag];
  int *eof = tag == TAG_REPORT ? &j->report_eof : &j->eof[tag];
  for (int i = 0; !*eof && (final || i < 16); i++) {
    ssize_t got = read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      /* after the reaper's end no writer is left, so "would block" counts as the end too */
      if (got == 0 || errno != EAGAIN || final) {
        *eof = 1;
        stop_watching(j, fd);
      }
      return;
    }
    if (tag == TAG_REPORT) {
      report_feed(j, buf, (size_t)got);
    } else {
      capture_add(j->pool->engine, &j->cap[tag], buf, (size_t)got);
      if (j->cap[0].total + j->cap[1].total > (uint64_t)j->lim.out_kill)
        kill_job(j, SB_KILL_OUTPUT);
    }
  }
}

static void arm_timer(mrl_sandbox_job *j) {
  double now = mrl_clock(), next = j->deadline;
  mrl_sandbox *p = j->pool;
  if ((p->prot & (MRL_SANDBOX_PROT_PIDS | MRL_SANDBOX_PROT_CPU)) && now + TICK_MS / 1000.0 < next)
    next = now + TICK_MS / 1000.0;
  double in = next - now;
  if (in < 1e-6) in = 1e-6;
  struct itimerspec t = {{0, 0}, {(time_t)in, (long)((in - (double)(time_t)in) * 1e9)}};
  timerfd_settime(j->timer_fd, 0, &t, NULL);
}

/* The limits the parent watches: wall time, the pids cgroup's failed forks, tree CPU time. */
static void check_limits(mrl_sandbox_job *j) {
  mrl_sandbox *p = j->pool;
  if (mrl_clock() >= j->deadline) {
    kill_job(j, SB_KILL_TIMEOUT);
    return;
  }
  if (!(p->prot & (MRL_SANDBOX_PROT_PIDS | MRL_SANDBOX_PROT_CPU))) return;
  sb_cgroup_counts now;
  mrl__sb_cgroup_counts(p, j->slot, &now);
  if (now.pids_max_events > j->cg_before.pids_max_events)
    kill_job(j, SB_KILL_PIDS);
  else if (now.cpu_us >= 0 && now.cpu_us - j->cg_before.cpu_us >= j->lim.cpu_ms * 1000)
    kill_job(j, SB_KILL_CPU);
}

static void finish(mrl_sandbox_job *j);

static void pump_job(mrl_sandbox_job *j) {
  if (j->state != SB_JOB_RUNNING) return;
  struct epoll_event ev[8];
  int n = epoll_wait(j->epfd, ev, 8, 0);
  bool exited = false;
  for (int i = 0; i < n; i++) {
    switch (ev[i].data.u32) {
    case TAG_OUT:
    case TAG_ERR:
    case TAG_REPORT: drain(j, (int)ev[i].data.u32, false); break;
    case TAG_TIMER: {
      uint64_t ticks;
      if (read(j->timer_fd, &ticks, sizeof ticks) < 0) ticks = 0;
      check_limits(j);
      arm_timer(j);
      break;
    }
    case TAG_PID: exited = true; break;
    }
  }
  if (exited) finish(j);
}

/* ---- starting ---- */

/* Moves fd above 2 (a process whose stdio is closed gets low fds from pipe2). */
static int high_fd(int fd) {
  if (fd < 0 || fd > 2) return fd;
  int h = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  close(fd);
  return h;
}

static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = write(fd, text, strlen(text));
  int err = n < 0 ? -errno : 0;
  close(fd);
  return err;
}

/* The id maps of the reaper's user namespace. */
static int write_id_maps(mrl_sandbox *p, pid_t pid, char *msg, size_t cap) {
  char path[64], map[64];
  int err;
  if (!p->caller_root) { /* an unprivileged map needs setgroups denied */
    snprintf(path, sizeof path, "/proc/%d/setgroups", (int)pid);
    if ((err = write_file(path, "deny")) < 0) goto fail;
  }
  snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
  snprintf(map, sizeof map, "%u %u 1\n", SB_INSIDE_ID, p->host_uid);
  if ((err = write_file(path, map)) < 0) goto fail;
  snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
  snprintf(map, sizeof map, "%u %u 1\n", SB_INSIDE_ID, p->host_gid);
  if ((err = write_file(path, map)) < 0) goto fail;
  return 0;
fail:
  snprintf(msg, cap, "write %s: %s", path, strerror(-err));
  return err;
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* The job ends without a process: its result says why. */
static void finish_unstarted(mrl_sandbox_job *j, mrl_sandbox_status status, const char *msg) {
  j->state = SB_JOB_DONE;
  make_result(j, status, -1, status == MRL_SANDBOX_SIGNALED ? SIGKILL : 0, msg, 0.0);
  epoll_ctl(j->epfd, EPOLL_CTL_DEL, j->pool->epfd, NULL);
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 0};
  epoll_ctl(j->epfd, EPOLL_CTL_ADD, j->pool->ready_fd, &ev);
}

/* Ends a warm reaper and closes what the slot holds for it. */
static void cool_slot(sb_slot *s) {
  if (!s->warm) return;
  kill(s->pid, SIGKILL);
  while (waitpid(s->pid, NULL, __WALL) < 0 && errno == EINTR) {
  }
  int *fds[] = {&s->pidfd, &s->out_r[0], &s->out_r[1], &s->report_r, &s->sync_w, &s->stdin_w};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) close_fd(fds[i]);
  s->warm = 0;
}

void mrl__sb_cool(mrl_sandbox *p) {
  for (int i = 0; i < p->nslots; i++) cool_slot(&p->slots[i]);
}

/* Clones a reaper for the free slot i and lets it build the read-only root; it then waits for
 * a call. 0, or -1 with a message in msg. */
static int warm_slot(mrl_sandbox *p, int slot, char *msg, size_t cap) {
  sb_slot *s = &p->slots[slot];
  sb_plan *pl = &s->plan;
  int out[2] = {-1, -1}, err[2] = {-1, -1}, rep[2] = {-1, -1}, syn[2] = {-1, -1};
  int in = -1, memcg = -1, pidfd = -1;
  /* the slot's cgroups exist from its first warm-up on (a call may change their limits) */
  if (mrl__sb_slot_stack(p, slot) ||
      mrl__sb_cgroup_prepare(p, slot, s->cg_mem ? s->cg_mem : p->lim.mem_bytes,
                             s->cg_pids ? s->cg_pids : p->lim.pids)) {
    snprintf(msg, cap, "%s", mrl_engine_last_error(p->engine));
    return -1;
  }
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(rep, O_CLOEXEC) ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, syn)) {
    snprintf(msg, cap, "pipe: %s", strerror(errno));
    goto fail;
  }
  /* stdin: a file the call's bytes are written into, sealed before the tool starts, so that it
   * never blocks the engine and a tool that reads it all gets EOF */
  in = memfd_create("stdin", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (in < 0) {
    snprintf(msg, cap, "memfd_create: %s", strerror(errno));
    goto fail;
  }
  memcg = mrl__sb_cgroup_memcg_fd(p, slot);
  if ((p->prot & MRL_SANDBOX_PROT_MEMORY) && memcg < 0) {
    snprintf(msg, cap, "open the memory cgroup: %s", strerror(errno));
    goto fail;
  }
  int *fds[] = {&out[0], &out[1], &err[0], &err[1], &rep[0], &rep[1], &syn[0], &syn[1], &in};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
    if ((*fds[i] = high_fd(*fds[i])) < 0) {
      snprintf(msg, cap, "fcntl: %s", strerror(errno));
      goto fail;
    }
  if ((memcg = high_fd(memcg)) < 0 && (p->prot & MRL_SANDBOX_PROT_MEMORY)) {
    snprintf(msg, cap, "fcntl: %s", strerror(errno));
    goto fail;
  }
  memset(pl, 0, sizeof *pl);
  pl->steps = p->steps;
  pl->nsteps = p->nsteps;
  pl->work_opts = p->work_opts;
  pl->tmp_opts = p->tmp_opts;
  pl->new_root_private = !p->userns;
  pl->set_hostname = (p->prot & MRL_SANDBOX_PROT_UTS) != 0;
  pl->fs_uid = pl->tool_uid = p->userns ? SB_INSIDE_ID : p->host_uid;
  pl->fs_gid = pl->tool_gid = p->userns ? SB_INSIDE_ID : p->host_gid;
  pl->drop_groups = p->caller_root;
  pl->filter = (p->prot & MRL_SANDBOX_PROT_SECCOMP) ? &p->filter : NULL;
  pl->sync_fd = syn[1];
  pl->report_fd = rep[1];
  pl->stdin_fd = in;
  pl->out_fd = out[1];
  pl->err_fd = err[1];
  pl->memcg_fd = memcg;
  pl->tool_stack_top = mrl__sb_tool_stack_top(p, slot);
  pl->fn_stack_lo = mrl__sb_reaper_stack(p, slot, &pl->fn_stack_size);
  /* the user namespace comes first (the others belong to it) and pid must be new at the clone
   * (the reaper is its pid 1); the reaper unshares the rest itself */
  unsigned long flags = CLONE_VM | CLONE_PIDFD | CLONE_NEWPID | (p->userns ? CLONE_NEWUSER : 0);
  pl->unshare_flags = CLONE_NEWNS;
  if (p->prot & MRL_SANDBOX_PROT_NET) pl->unshare_flags |= CLONE_NEWNET;
  if (p->prot & MRL_SANDBOX_PROT_IPC) pl->unshare_flags |= CLONE_NEWIPC;
  if (p->prot & MRL_SANDBOX_PROT_UTS) pl->unshare_flags |= CLONE_NEWUTS;
  mrl__sb_slot_stack_reset(p, slot);
  /* the reaper starts with every signal blocked, so that no handler of the engine runs in it */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  long pid = mrl__sb_clone(flags, s->stack + s->stack_size, &pidfd, mrl__sb_reaper, pl);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  /* from here on the reaper reads the plan's pool part: it stays as it is */
  close_fd(&out[1]);
  close_fd(&err[1]);
  close_fd(&rep[1]);
  close_fd(&syn[1]);
  close_fd(&memcg);
  if (pid < 0) {
    snprintf(msg, cap, "clone: %s", strerror((int)-pid));
    goto fail;
  }
  s->pid = (pid_t)pid;
  s->pidfd = high_fd(pidfd);
  s->out_r[0] = out[0];
  s->out_r[1] = err[0];
  s->report_r = rep[0];
  s->sync_w = syn[0];
  s->stdin_w = in;
  s->warm = 1;
  int ok = s->pidfd >= 0;
  if (!ok) snprintf(msg, cap, "pidfd: %s", strerror(errno));
  if (ok && p->userns) ok = write_id_maps(p, s->pid, msg, cap) == 0;
  if (ok && mrl__sb_cgroup_attach(p, slot, s->pid)) {
    snprintf(msg, cap, "%s", mrl_engine_last_error(p->engine));
    ok = 0;
  }
  if (ok && send(s->sync_w, "w", 1, MSG_NOSIGNAL) != 1) {
    snprintf(msg, cap, "start the reaper: %s", strerror(errno));
    ok = 0;
  }
  if (!ok) { /* it waits for "w": it dies at once, before doing anything */
    cool_slot(s);
    return -1;
  }
  return 0;
fail:
  for (int k = 0; k < 2; k++) {
    close_fd(&out[k]);
    close_fd(&err[k]);
    close_fd(&rep[k]);
    close_fd(&syn[k]);
  }
  close_fd(&in);
  close_fd(&memcg);
  return -1;
}

/* Keeps one free slot warm, so that the next call finds its reaper ready. */
static void keep_warm(mrl_sandbox *p) {
  int cold = -1;
  for (int i = 0; i < p->nslots; i++) {
    if (p->slots[i].job) continue;
    if (p->slots[i].warm) return;
    if (cold < 0) cold = i;
  }
  char msg[512];
  if (cold >= 0) warm_slot(p, cold, msg, sizeof msg); /* on failure a call warms it again */
}

/* Starts job j in the free slot i: a warm reaper gets the call and "g". */
static void launch(mrl_sandbox *p, mrl_sandbox_job *j, int slot) {
  sb_slot *s = &p->slots[slot];
  char msg[512] = "";
  epoll_ctl(j->epfd, EPOLL_CTL_DEL, p->epfd, NULL);
  if (!s->warm && warm_slot(p, slot, msg, sizeof msg) < 0) {
    finish_unstarted(j, MRL_SANDBOX_SETUP_ERROR, msg);
    return;
  }
  if (mrl__sb_cgroup_prepare(p, slot, j->lim.mem_bytes, j->lim.pids)) {
    snprintf(msg, sizeof msg, "%s", mrl_engine_last_error(p->engine));
    cool_slot(s);
    finish_unstarted(j, MRL_SANDBOX_SETUP_ERROR, msg);
    return;
  }
  /* the reaper now belongs to the job */
  j->slot = slot;
  s->job = j;
  s->warm = 0;
  j->pid = s->pid;
  j->pidfd = s->pidfd;
  j->out_r[0] = s->out_r[0];
  j->out_r[1] = s->out_r[1];
  j->report_r = s->report_r;
  j->sync_w = s->sync_w;
  j->state = SB_JOB_RUNNING;
  sb_plan *pl = &s->plan;
  const sb_plan *c = &j->plan;
  pl->resize_opts = c->resize_opts;
  pl->files = c->files;
  pl->nfiles = c->nfiles;
  pl->files_cap = c->files_cap;
  pl->argv = c->argv;
  pl->envp = c->envp;
  pl->path = c->path;
  pl->fn = c->fn;
  pl->fn_ud = c->fn_ud;
  memcpy(pl->rlimits, c->rlimits, sizeof pl->rlimits);
  pl->nrlimits = c->nrlimits;
  pl->cpu_timer_us = c->cpu_timer_us;
  mrl__sb_cgroup_counts(p, slot, &j->cg_before);
  int ok =
      (!j->stdin_len ||
       pwrite(s->stdin_w, j->stdin_data, j->stdin_len, 0) == (ssize_t)j->stdin_len) &&
      fcntl(s->stdin_w, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK) == 0;
  if (!ok) snprintf(msg, sizeof msg, "stdin: %s", strerror(errno));
  close_fd(&s->stdin_w);
  for (int k = 0; k < 3; k++) fcntl(k < 2 ? j->out_r[k] : j->report_r, F_SETFL, O_NONBLOCK);
  j->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  struct epoll_event ev = {.events = EPOLLIN};
  int watch[5] = {j->out_r[0], j->out_r[1], j->report_r, j->timer_fd, j->pidfd};
  for (int k = 0; k < 5 && ok; k++) {
    ev.data.u32 = (uint32_t)k;
    ok = epoll_ctl(j->epfd, EPOLL_CTL_ADD, watch[k], &ev) == 0;
  }
  ev.data.ptr = j;
  ok = ok && epoll_ctl(p->epfd, EPOLL_CTL_ADD, j->epfd, &ev) == 0;
  if (!ok && !*msg) snprintf(msg, sizeof msg, "epoll/timerfd: %s", strerror(errno));
  j->t_start = mrl_clock();
  j->deadline = j->t_start + (double)j->lim.wall_ms / 1000.0;
  /* a reaper that already died (its warm-up failed) has reported why: its end is heard */
  if (ok) send(j->sync_w, "g", 1, MSG_NOSIGNAL);
  if (!ok) {
    set_error(j, msg);
    kill_job(j, SB_KILL_CALLER);
    while (waitpid(j->pid, NULL, __WALL) < 0 && errno == EINTR) {
    }
    j->pid = 0;
    finish(j);
    return;
  }
  arm_timer(j);
}

static void start_queued(mrl_sandbox *p) {
  while (p->queue_head) {
    int slot = -1;
    for (int i = 0; i < p->nslots; i++) /* a warm one first */
      if (!p->slots[i].job && (slot < 0 || p->slots[i].warm)) {
        slot = i;
        if (p->slots[i].warm) break;
      }
    if (slot < 0) break;
    mrl_sandbox_job *j = p->queue_head;
    p->queue_head = j->next;
    if (!p->queue_head) p->queue_tail = NULL;
    j->next = NULL;
    launch(p, j, slot);
  }
  if (!p->user_freed) keep_warm(p);
}

/* Handles whatever is ready in the pool, waiting up to timeout_ms (-1: until something is). */
static void pump_pool(mrl_sandbox *p, int timeout_ms) {
  struct epoll_event ev[64];
  int n = epoll_wait(p->epfd, ev, 64, timeout_ms);
  for (int i = 0; i < n; i++) pump_job(ev[i].data.ptr);
  start_queued(p);
}

/* ---- the end of a job ---- */
static mrl_sandbox_status classify(mrl_sandbox_job *j, const sb_cgroup_counts *after, double cpu_ms,
                                   int *exit_code, int *sig, char *msg, size_t cap) {
  const mrl_sandbox_limits *l = &j->lim;
  *exit_code = -1;
  *sig = 0;
  msg[0] = '\0';
  if (j->error) {
    snprintf(msg, cap, "%s", j->error);
    return MRL_SANDBOX_SETUP_ERROR;
  }
  switch (j->kill_reason) {
  case SB_KILL_OUTPUT:
    *sig = SIGKILL;
    snprintf(msg, cap, "more than %lld bytes of output", (long long)l->out_kill);
    return MRL_SANDBOX_OUTPUT_LIMIT;
  case SB_KILL_TIMEOUT:
    *sig = SIGKILL;
    snprintf(msg, cap, "wall-clock limit of %lld ms", (long long)l->wall_ms);
    return MRL_SANDBOX_TIMEOUT;
  case SB_KILL_CPU:
    *sig = SIGKILL;
    snprintf(msg, cap, "CPU limit of %lld ms", (long long)l->cpu_ms);
    return MRL_SANDBOX_CPU_LIMIT;
  case SB_KILL_PIDS:
    *sig = SIGKILL;
    snprintf(msg, cap, "process limit of %lld", (long long)l->pids);
    return MRL_SANDBOX_PIDS_LIMIT;
  case SB_KILL_CALLER:
    *sig = SIGKILL;
    snprintf(msg, cap, "killed by the caller");
    return MRL_SANDBOX_SIGNALED;
  }
  if (!j->have_status || j->report_bad) {
    snprintf(msg, cap, "the sandbox ended without a report");
    return MRL_SANDBOX_SETUP_ERROR;
  }
  int ws = j->st.wait_status;
  if (WIFEXITED(ws))
    *exit_code = WEXITSTATUS(ws);
  else if (WIFSIGNALED(ws))
    *sig = WTERMSIG(ws);
  bool clean = *exit_code == 0;
  if (after->oom_kills > j->cg_before.oom_kills && !clean) {
    snprintf(msg, cap, "memory limit of %lld MiB", (long long)(l->mem_bytes >> 20));
    return MRL_SANDBOX_OOM;
  }
  if (*sig == SIGSYS) {
    snprintf(msg, cap, "a forbidden system call");
    return MRL_SANDBOX_SECCOMP;
  }
  if (*sig == SIGXCPU || *sig == SIGPROF || (*sig == SIGKILL && cpu_ms >= (double)l->cpu_ms)) {
    snprintf(msg, cap, "CPU limit of %lld ms", (long long)l->cpu_ms);
    return MRL_SANDBOX_CPU_LIMIT;
  }
  if (after->pids_max_events > j->cg_before.pids_max_events && !clean) {
    snprintf(msg, cap, "process limit of %lld", (long long)l->pids);
    return MRL_SANDBOX_PIDS_LIMIT;
  }
  return *sig ? MRL_SANDBOX_SIGNALED : MRL_SANDBOX_EXITED;
}

static void finish(mrl_sandbox_job *j) {
  mrl_sandbox *p = j->pool;
  for (int tag = TAG_OUT; tag <= TAG_REPORT; tag++) drain(j, tag, true);
  if (j->pid > 0)
    while (waitpid(j->pid, NULL, __WALL) < 0 && errno == EINTR) {
    }
  epoll_ctl(p->epfd, EPOLL_CTL_DEL, j->epfd, NULL);
  int *fds[] = {&j->pidfd, &j->out_r[0], &j->out_r[1], &j->report_r, &j->sync_w, &j->timer_fd};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) close_fd(fds[i]);
  sb_cgroup_counts after;
  mrl__sb_cgroup_counts(p, j->slot, &after);
  double cpu_ms = after.cpu_us >= 0 && j->cg_before.cpu_us >= 0
                      ? (double)(after.cpu_us - j->cg_before.cpu_us) / 1000.0
                      : (double)j->st.cpu_us / 1000.0;
  char msg[SB_NAME_MAX + 256];
  int code, sig;
  mrl_sandbox_status status = classify(j, &after, cpu_ms, &code, &sig, msg, sizeof msg);
  j->state = SB_JOB_DONE;
  make_result(j, status, code, sig, msg, cpu_ms);
  p->slots[j->slot].job = NULL;
  struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 0};
  epoll_ctl(j->epfd, EPOLL_CTL_ADD, p->ready_fd, &ev);
}

/* ---- the API ---- */
static mrl_status start_common(mrl_sandbox *p, const mrl_sandbox_call *call, mrl__sandbox_fn fn,
                               void *ud, mrl_sandbox_job **out) {
  if (!p || !call || !out)
    return mrl__fail(p ? p->engine : NULL, MRL_ERR_NULL, FN_START, "%s is NULL",
                     !p      ? "pool"
                     : !call ? "call"
                             : "out");
  mrl_engine *e = p->engine;
  if (p->user_freed) return mrl__fail(e, MRL_ERR_INVALID, FN_START, "the pool is freed");
  mrl_status st = check_call(p, call, fn == NULL);
  if (st) return st;
  mrl_sandbox_job *j = mrl__alloc(e, sizeof *j);
  if (!j) return mrl__fail(e, MRL_ERR_NOMEM, FN_START, "out of memory");
  memset(j, 0, sizeof *j);
  j->pool = p;
  j->pid = 0;
  j->pidfd = j->out_r[0] = j->out_r[1] = j->report_r = j->sync_w = j->timer_fd = -1;
  j->lim = call->limits;
  j->plan.fn = fn;
  j->plan.fn_ud = ud;
  st = mrl__sb_resolve_limits(e, FN_START, &j->lim, &p->lim);
  const char *stdin_copy = NULL;
  if (!st) st = copy_call(j, call, &stdin_copy);
  if (!st) {
    j->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 0};
    if (j->epfd < 0 || epoll_ctl(j->epfd, EPOLL_CTL_ADD, p->epfd, &ev) < 0) {
      st = mrl__fail(e, MRL_ERR_IO, FN_START, "epoll: %s", strerror(errno));
      if (j->epfd >= 0) close(j->epfd);
    }
  }
  if (st) {
    if (j->block) mrl__free(e, j->block, j->block_size);
    mrl__free(e, j, sizeof *j);
    return st;
  }
  j->stdin_data = stdin_copy;
  j->stdin_len = call->stdin_len;
  plan_limits(p, j);
  capture_init(&j->cap[0], j->lim.out_cap);
  capture_init(&j->cap[1], j->lim.out_cap);
  p->refs++;
  if (p->queue_tail)
    p->queue_tail->next = j;
  else
    p->queue_head = j;
  p->queue_tail = j;
  start_queued(p);
  *out = j;
  return MRL_OK;
}

mrl_status mrl_sandbox_start(mrl_sandbox *p, const mrl_sandbox_call *call, mrl_sandbox_job **out) {
  return start_common(p, call, NULL, NULL, out);
}

mrl_status mrl__sandbox_start_fn(mrl_sandbox *p, const mrl_sandbox_call *call, mrl__sandbox_fn fn,
                                 void *ud, mrl_sandbox_job **out) {
  return start_common(p, call, fn, ud, out);
}

int mrl_sandbox_job_fd(const mrl_sandbox_job *j) { return j ? j->epfd : -1; }

mrl_status mrl_sandbox_job_poll(mrl_sandbox_job *j, int *done) {
  if (!j || !done)
    return mrl__fail(j ? j->pool->engine : NULL, MRL_ERR_NULL, "mrl_sandbox_job_poll", "%s is NULL",
                     j ? "done" : "job");
  pump_pool(j->pool, 0);
  *done = j->state == SB_JOB_DONE;
  return MRL_OK;
}

static void wait_done(mrl_sandbox_job *j) {
  while (j->state != SB_JOB_DONE) pump_pool(j->pool, -1);
}

mrl_status mrl_sandbox_job_wait(mrl_sandbox_job *j, mrl_sandbox_result **out) {
  static const char fn[] = "mrl_sandbox_job_wait";
  if (!j || !out)
    return mrl__fail(j ? j->pool->engine : NULL, MRL_ERR_NULL, fn, "%s is NULL", j ? "out" : "job");
  if (j->result_taken)
    return mrl__fail(j->pool->engine, MRL_ERR_INVALID, fn, "the result was already taken");
  wait_done(j);
  if (!j->result) return mrl__fail(j->pool->engine, MRL_ERR_NOMEM, fn, "out of memory");
  *out = j->result;
  j->result = NULL;
  j->result_taken = 1;
  return MRL_OK;
}

static void unqueue(mrl_sandbox_job *j) {
  mrl_sandbox *p = j->pool;
  mrl_sandbox_job **at = &p->queue_head, *prev = NULL;
  while (*at && *at != j) prev = *at, at = &(*at)->next;
  if (!*at) return;
  *at = j->next;
  if (p->queue_tail == j) p->queue_tail = prev;
  j->next = NULL;
}

mrl_status mrl_sandbox_job_kill(mrl_sandbox_job *j) {
  if (!j) return mrl__fail(NULL, MRL_ERR_NULL, "mrl_sandbox_job_kill", "job is NULL");
  if (j->state == SB_JOB_QUEUED) {
    unqueue(j);
    finish_unstarted(j, MRL_SANDBOX_SIGNALED, "killed by the caller before it started");
  } else if (j->state == SB_JOB_RUNNING) {
    kill_job(j, SB_KILL_CALLER);
  }
  return MRL_OK;
}

void mrl_sandbox_job_free(mrl_sandbox_job *j) {
  if (!j) return;
  mrl_sandbox *p = j->pool;
  mrl_engine *e = p->engine;
  if (j->state == SB_JOB_QUEUED) unqueue(j);
  if (j->state == SB_JOB_RUNNING) {
    kill_job(j, SB_KILL_CALLER);
    wait_done(j);
  }
  mrl_sandbox_result_free(j->result);
  for (int k = 0; k < 2; k++)
    if (j->cap[k].buf) mrl__free(e, j->cap[k].buf, j->cap[k].alloc);
  free_files(e, j->files, j->nfiles, j->files_alloc);
  if (j->rec_name) mrl__free(e, j->rec_name, j->rec.name_len + 1);
  if (j->rec_data) mrl__free(e, j->rec_data, (size_t)j->rec.data_len + 1);
  if (j->error) mrl__free(e, j->error, strlen(j->error) + 1);
  if (j->block) mrl__free(e, j->block, j->block_size);
  close(j->epfd);
  mrl__free(e, j, sizeof *j);
  mrl__sb_pool_release(p);
}

void mrl__sb_pool_shutdown(mrl_sandbox *p) {
  while (p->queue_head) {
    mrl_sandbox_job *j = p->queue_head;
    unqueue(j);
    finish_unstarted(j, MRL_SANDBOX_SIGNALED, "the pool was freed before the call started");
  }
  bool running = true;
  for (int s = 0; s < p->nslots; s++)
    if (p->slots[s].job) kill_job(p->slots[s].job, SB_KILL_CALLER);
  while (running) {
    running = false;
    for (int s = 0; s < p->nslots; s++) running = running || p->slots[s].job;
    if (running) pump_pool(p, -1);
  }
  mrl__sb_cool(p);
}

mrl_status mrl_sandbox_run(mrl_sandbox *p, const mrl_sandbox_call *call, mrl_sandbox_result **out) {
  if (!out) return mrl__fail(p ? p->engine : NULL, MRL_ERR_NULL, "mrl_sandbox_run", "out is NULL");
  mrl_sandbox_job *j = NULL;
  mrl_status st = mrl_sandbox_start(p, call, &j);
  if (st) return st;
  st = mrl_sandbox_job_wait(j, out);
  mrl_sandbox_job_free(j);
  return st;
}
