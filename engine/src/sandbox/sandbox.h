/* sandbox.h - definitions shared by the sandbox's files (sandbox_pool.c, sandbox_cgroup.c,
 * sandbox_job.c, sandbox_child.c); Lua-free, not installed.
 *
 * Shape of one call. The engine's thread (the parent) prepares everything a call needs in a
 * plan, then clones the reaper with CLONE_VM and new namespaces: the reaper shares the engine's
 * memory (so a big engine costs no page-table copy) on a stack of its own, reads the plan, builds
 * the root, starts the tool, reaps, and reports through a pipe. Because it shares memory (and the
 * engine thread's errno), the reaper only makes raw system calls (sandbox_child.c). The tool is
 * cloned from the reaper with CLONE_VM | CLONE_VFORK and execs at once; a function call (the
 * restricted-Lua worker) forks a private copy instead. The parent polls the pipes, the reaper's
 * pidfd and a timer, keeps the output, enforces the limits, and classifies the outcome. */
#ifndef MRL_SANDBOX_H
#define MRL_SANDBOX_H

#include "internal.h"

#include <linux/filter.h>
#include <sys/types.h>

#define SB_INSIDE_ID 1000u /* the tool's uid and gid inside a user namespace */
#define SB_BASE "/tmp"     /* where the reaper builds the new root, in its own mount namespace */
#define SB_MAX_FILES 1024  /* files returned from /work */
#define SB_MAX_DEPTH 16    /* directory depth searched in /work */
#define SB_NAME_MAX 1024   /* longest file path in /work that is passed back */
#define SB_MAX_STEPS 256   /* steps of the root's construction */
#define SB_MAX_RLIMITS 8

/* ---- the root's construction, computed once per pool ---- */
enum sb_step_kind {
  SB_STEP_DIR,     /* mkdir dst */
  SB_STEP_SYMLINK, /* symlink src -> dst */
  SB_STEP_FILE,    /* write src[0..src_len) into the new file dst */
  SB_STEP_BIND,    /* bind host path src on dst (made first: a dir or an empty file), read-only */
  SB_STEP_DEV      /* bind a device node src on dst after the root became read-only */
};

typedef struct sb_step {
  int kind;
  int is_dir; /* BIND: the source is a directory */
  const char *src;
  size_t src_len;
  const char *dst; /* absolute, under SB_BASE */
} sb_step;

/* ---- what the reaper and the tool read (prepared by the parent; unchanged while they run) --- */
typedef struct sb_rlimit {
  int resource;
  uint64_t soft, hard;
} sb_rlimit;

typedef int (*mrl__sandbox_fn)(void *ud);

/* Each slot has its plan. The pool's part is written before the reaper is cloned; the call's
 * part (marked "call") before the parent sends the reaper "g". */
typedef struct sb_plan {
  const sb_step *steps;
  size_t nsteps;
  unsigned long unshare_flags; /* namespaces the reaper makes itself (not in the parent's clone) */
  int new_root_private;        /* no user namespace: make every mount private before touching any */
  int set_hostname;
  const char *work_opts, *tmp_opts; /* tmpfs options of /work and /tmp (the pool's size) */
  const char *resize_opts;          /* call: remount options for another size, or NULL */
  const mrl_sandbox_file *files;    /* call: written into /work */
  size_t nfiles;
  uint64_t files_cap; /* call */

  unsigned fs_uid, fs_gid; /* ids the reaper creates files as */
  unsigned tool_uid, tool_gid;
  int drop_groups; /* setgroups(0) is allowed */

  char *const *argv, *const *envp; /* call */
  const char *path;                /* call: PATH, for argv[0] without '/' */
  mrl__sandbox_fn fn;              /* call: a function instead of argv (runs in a forked copy) */
  void *fn_ud;
  sb_rlimit rlimits[SB_MAX_RLIMITS]; /* call */
  int nrlimits;
  int64_t cpu_timer_us;            /* call: ITIMER_PROF of the tool (0: none) */
  const struct sock_fprog *filter; /* NULL: no seccomp */

  /* fds the reaper gets (everything else is closed) */
  int sync_fd;   /* its end of a socket pair: "w" (ids and cgroups are set: warm up), then
                    "g" (the call's part of the plan is set: go); hang-up: the parent is gone */
  int report_fd; /* write end of the report pipe */
  int stdin_fd, out_fd, err_fd; /* the tool's 0, 1, 2 */
  int memcg_fd;                 /* cgroup.procs of the tool's memory cgroup, or -1 */
  char *tool_stack_top;
  char *fn_stack_lo; /* the reaper's stack, which the function-mode copy runs on */
  size_t fn_stack_size;
} sb_plan;

/* ---- the report the reaper writes: records of a header, a name and data ---- */
enum sb_record_type {
  SB_REC_ERROR = 1, /* name: what failed ("mount /usr"); data_len: the errno; no data */
  SB_REC_FILE = 2,  /* name: path under /work; data: the content */
  SB_REC_FILES_TRUNCATED = 3,
  SB_REC_STATUS = 4 /* data: an sb_status */
};

typedef struct sb_record {
  uint32_t type;
  uint32_t name_len;
  uint64_t data_len;
} sb_record;

typedef struct sb_status {
  int32_t wait_status; /* of the tool, as wait4 gives it */
  int32_t pad;
  int64_t cpu_us; /* user + system time of every process reaped */
  int64_t max_rss_kb;
} sb_status;

/* ---- the parent's side ---- */
typedef struct sb_capture { /* head and tail of one output stream */
  char *buf;
  size_t alloc, len, cap, head, ring_pos;
  uint64_t total;
} sb_capture;

enum sb_kill_reason {
  SB_KILL_NONE,
  SB_KILL_CALLER,
  SB_KILL_TIMEOUT,
  SB_KILL_CPU,
  SB_KILL_PIDS,
  SB_KILL_OUTPUT
};

enum sb_job_state { SB_JOB_QUEUED, SB_JOB_RUNNING, SB_JOB_DONE };

typedef struct sb_cgroup_counts {
  uint64_t pids_max_events; /* times a fork failed at pids.max */
  uint64_t oom_kills;
  int64_t cpu_us; /* CPU time of the slot's tree; -1 without the cpu cgroup */
} sb_cgroup_counts;

struct mrl_sandbox_job {
  mrl_sandbox *pool;
  int state;
  struct mrl_sandbox_job *next; /* in the pool's queue */
  int slot;
  mrl_sandbox_limits lim; /* resolved: no zero fields */
  sb_plan plan;           /* the call's part, copied into the slot's plan at the start */
  char *block;            /* argv, env, files, stdin: one allocation */
  size_t block_size;
  const char *stdin_data; /* in block */
  size_t stdin_len;

  int epfd; /* the job's pollable fd */
  int pidfd, out_r[2], report_r, sync_w, timer_fd;
  pid_t pid;
  double t_start, deadline;
  int kill_reason;
  int eof[2];
  sb_capture cap[2];
  sb_cgroup_counts cg_before;

  /* the report parser */
  unsigned char hdr[sizeof(sb_record)];
  size_t hdr_got;
  sb_record rec;
  char *rec_name;
  char *rec_data;
  uint64_t rec_got;
  int report_eof, report_bad;
  int have_status;
  sb_status st;
  char *error; /* a setup error ("mount /usr: Permission denied") */
  mrl_sandbox_file *files;
  size_t nfiles, files_alloc;
  uint64_t files_bytes;
  int files_truncated;

  mrl_sandbox_result *result; /* once done, until taken */
  int result_taken;
};

typedef struct sb_cgroups {
  int version;                        /* 0 (none), 1 or 2 */
  char *pids_dir, *mem_dir, *cpu_dir; /* the pool's directories (NULL when missing) */
  int swap;                           /* v1: memory.memsw files exist and the host has swap */
} sb_cgroups;

/* A slot runs one job at a time. Before a call arrives, a free slot may hold a warm reaper:
 * cloned, with its namespaces, cgroups and read-only root ready, waiting for "g". */
typedef struct sb_slot {
  char *stack; /* guard page, tool stack, guard page, reaper stack */
  size_t stack_size;
  int cg_made;
  int64_t cg_mem, cg_pids; /* limits written into the slot's cgroups (0: none yet) */
  mrl_sandbox_job *job;
  sb_plan plan;
  int warm; /* the fields below belong to a waiting reaper */
  pid_t pid;
  int pidfd, out_r[2], report_r, sync_w, stdin_w;
} sb_slot;

#define SB_NPROT 10

struct mrl_sandbox {
  mrl_engine *engine;
  long refs; /* the caller's reference plus one per job */
  int user_freed;
  mrl_sandbox_limits lim; /* resolved pool limits */
  unsigned prot;
  char *notes[SB_NPROT];
  int userns, caller_root;
  unsigned host_uid, host_gid;
  sb_step *steps;
  size_t nsteps;
  char work_opts[64], tmp_opts[64]; /* tmpfs options of /work and /tmp at the pool's size */
  char *strings;                    /* the steps' paths and contents */
  size_t strings_size;
  struct sock_filter *filter_code;
  struct sock_fprog filter;
  sb_cgroups cg;
  sb_slot *slots;
  int nslots;
  mrl_sandbox_job *queue_head, *queue_tail;
  int epfd;     /* holds the epoll fds of running jobs */
  int ready_fd; /* an eventfd that stays readable: put into finished jobs' epfd */
};

/* ---- sandbox_pool.c ---- */
void mrl__sb_pool_release(mrl_sandbox *p); /* drops one reference */
/* Fills the zero fields of l from dflt; fails (naming fn) on a negative or absurd value. */
mrl_status mrl__sb_resolve_limits(mrl_engine *e, const char *fn, mrl_sandbox_limits *l,
                                  const mrl_sandbox_limits *dflt);
/* Maps slot i's stacks if they are not yet. */
mrl_status mrl__sb_slot_stack(mrl_sandbox *p, int slot);
char *mrl__sb_tool_stack_top(const mrl_sandbox *p, int slot);
/* The reaper's stack of a slot: its lowest address and size. */
char *mrl__sb_reaper_stack(const mrl_sandbox *p, int slot, size_t *size);
/* Before a slot's stacks serve a new reaper (only AddressSanitizer builds need anything). */
void mrl__sb_slot_stack_reset(mrl_sandbox *p, int slot);
/* Sets the note of a protection bit (replacing an earlier one); silently keeps the old note when
 * memory runs out. */
void mrl__sb_note(mrl_sandbox *p, unsigned bit, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- sandbox_cgroup.c ---- */
/* Finds the cgroup controllers this process may use and makes the pool's directories; records
 * notes; turns off the bits of `want` it cannot provide. */
unsigned mrl__sb_cgroup_probe(mrl_sandbox *p, unsigned want);
/* Creates slot i's cgroups if needed and writes the limits that changed. */
mrl_status mrl__sb_cgroup_prepare(mrl_sandbox *p, int slot, int64_t mem_bytes, int64_t pids);
/* Opens the slot's memory cgroup.procs for writing (-1 when there is no memory cgroup). */
int mrl__sb_cgroup_memcg_fd(mrl_sandbox *p, int slot);
/* Moves pid into the slot's pids and cpu cgroups. */
mrl_status mrl__sb_cgroup_attach(mrl_sandbox *p, int slot, pid_t pid);
void mrl__sb_cgroup_counts(mrl_sandbox *p, int slot, sb_cgroup_counts *c);
void mrl__sb_cgroup_free(mrl_sandbox *p); /* removes every directory the pool made */

/* ---- sandbox_child.c ---- */
/* The reaper's entry point (arg: the sb_plan). */
int mrl__sb_reaper(void *plan);
/* clone(2) that runs fn(arg) in the child on stack_top (NULL: on a copy of the current stack,
 * for a fork without CLONE_VM). Returns the pid or -errno, and never touches errno. pidfd
 * receives the pidfd when flags has CLONE_PIDFD. */
long mrl__sb_clone(unsigned long flags, char *stack_top, int *pidfd, int (*fn)(void *), void *arg);

/* ---- sandbox_job.c ---- */
/* Starts fn(ud) in a forked copy of this process inside the sandbox instead of exec'ing argv
 * (call->argv is ignored). fn's return value is the exit code. fn runs after the whole sandbox is
 * in place (seccomp included) and must not use locks another thread may have held when the copy
 * was made: no malloc, no stdio. ud and what it points to must stay unchanged until the job is
 * done. Used by the restricted-Lua worker. */
/* Cancels the queued jobs, kills the running ones and waits until they are done. */
void mrl__sb_pool_shutdown(mrl_sandbox *p);
/* Ends the warm reapers. */
void mrl__sb_cool(mrl_sandbox *p);
mrl_status mrl__sandbox_start_fn(mrl_sandbox *p, const mrl_sandbox_call *call, mrl__sandbox_fn fn,
                                 void *ud, mrl_sandbox_job **out);

#endif /* MRL_SANDBOX_H */
