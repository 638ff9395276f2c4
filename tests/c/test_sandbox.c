/* test_sandbox.c - tests of the tool sandbox (mrl_sandbox_*): ordinary calls (exit codes, stdin,
 * byte-exact output, files in and out, the environment, 32 concurrent jobs, the queue, kills),
 * bad arguments, and the spec's bad inputs 1-25 (shared/spec/sandbox.md), each checking the
 * outcome's classification and that the host has the same processes, fds, mounts and files
 * afterwards. Bad inputs 26-30 (restricted Lua) are in tests/lua/sandbox_spec.lua.
 *
 * Tools run as a host uid of this run's own (so that "no process of that uid is left" means
 * something on a shared machine). Some bad inputs need precise system calls: this binary,
 * copied into a directory the sandbox shows read-only, is also the tool ("--helper NAME").
 * Run alone: ./build/tests/test_sandbox [filter] */
#define _GNU_SOURCE
#include "support.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the helper: runs inside the sandbox ---- */
static const char *errno_name(int e) {
  switch (e) {
  case 0: return "OK";
  case EPERM: return "EPERM";
  case EACCES: return "EACCES";
  case ENOSYS: return "ENOSYS";
  case ESRCH: return "ESRCH";
  case ENETUNREACH: return "ENETUNREACH";
  case ECONNREFUSED: return "ECONNREFUSED";
  case EINVAL: return "EINVAL";
  case ENOMEM: return "ENOMEM";
  default: return "other";
  }
}

static void *sleeper(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

/* Each line: "name=ERRNO". */
static void probe(const char *name, long r) {
  printf("%s=%s\n", name, errno_name(r < 0 ? errno : 0));
}

static int helper(int argc, char **argv) {
  const char *what = argv[0];
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!strcmp(what, "threads")) { /* a thread bomb: creates threads until killed */
    for (unsigned long n = 0;; n++) {
      pthread_t t;
      if (pthread_create(&t, NULL, sleeper, NULL) != 0) usleep(1000);
    }
  }
  if (!strcmp(what, "touch")) { /* a memory bomb that touches every page */
    for (;;) {
      char *p = malloc(1 << 20);
      if (p) memset(p, 1, 1 << 20);
    }
  }
  if (!strcmp(what, "mmap-huge")) {
    size_t size = (size_t)1 << 40;
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      printf("refused\n");
      return 2;
    }
    for (size_t off = 0;; off = (off + 4096) % size) p[off] = 1;
  }
  if (!strcmp(what, "probe")) {
    probe("ptrace", ptrace(PTRACE_ATTACH, 1, NULL, NULL));
    probe("perf_event_open", syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0));
    probe("bpf", syscall(SYS_bpf, 0, NULL, 0));
    probe("userfaultfd", syscall(SYS_userfaultfd, 0));
    probe("keyctl", syscall(SYS_keyctl, 0, 0, 0, 0, 0));
    probe("process_vm_readv", syscall(SYS_process_vm_readv, 1, NULL, 0, NULL, 0, 0));
    probe("unshare_user", syscall(SYS_unshare, 0x10000000 /* CLONE_NEWUSER */));
    probe("clone_newuser", syscall(SYS_clone, 0x10000000 | SIGCHLD, NULL, NULL, NULL, NULL));
    probe("mount", syscall(SYS_mount, "none", "/tmp", "tmpfs", 0, NULL));
    probe("setns", syscall(SYS_setns, 0, 0));
    return 0;
  }
  if (!strcmp(what, "kill") && argc > 1) {
    probe("kill", kill((pid_t)atoi(argv[1]), SIGKILL));
    return 0;
  }
  if (!strcmp(what, "fds")) { /* the open fds, but the directory's own */
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d)))
      if (e->d_name[0] != '.' && atoi(e->d_name) != dirfd(d)) printf("%s ", e->d_name);
    printf("\n");
    return 0;
  }
  if (!strcmp(what, "connect") && argc > 1) {
    int ports[2] = {atoi(argv[1]), 53};
    const char *hosts[2] = {"127.0.0.1", "8.8.8.8"};
    for (int i = 0; i < 2; i++) {
      int s = socket(AF_INET, SOCK_STREAM, 0);
      struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[i])};
      a.sin_addr.s_addr = htonl(i == 0 ? 0x7f000001 : 0x08080808);
      probe(hosts[i], s < 0 ? -1 : connect(s, (struct sockaddr *)&a, sizeof a));
    }
    return 0;
  }
  if (!strcmp(what, "segv")) { /* the default action dumps core */
    raise(SIGSEGV);
    return 1;
  }
  if (!strcmp(what, "kexec")) return (int)syscall(SYS_kexec_load, 0, 0, NULL, 0);
  fprintf(stderr, "unknown helper %s\n", what);
  return 100;
}

/* ---- fixtures: the pool, the read-only directory, the host's state ---- */
static unsigned test_uid;  /* the host uid tools run as, this run's own */
static char shown_dir[64]; /* a host directory the sandbox shows read-only */
static char helper_path[128], setuid_id_path[128], sentinel_path[128];
static mrl_engine *engine;
static mrl_sandbox *pool;

static void copy_file(const char *from, const char *to, mode_t mode) {
  size_t n;
  unsigned char *data = read_bytes(from, &n);
  if (!data) {
    printf("Bail out! cannot read %s\n", from);
    exit(1);
  }
  write_bytes(to, data, n);
  free(data);
  chmod(to, mode);
}

/* At exit (for runs that filter out the last test): the pool, the engine, the directory. */
static void cleanup(void) {
  mrl_sandbox_free(pool);
  mrl_engine_free(engine);
  pool = NULL;
  engine = NULL;
  if (shown_dir[0]) remove_tree(shown_dir);
  shown_dir[0] = '\0';
}

static void setup(void) {
  if (pool) return;
  atexit(cleanup);
  test_uid = 200000u + (unsigned)getpid() % 100000u;
  snprintf(shown_dir, sizeof shown_dir, "/var/tmp/moonrl-sandbox-test-XXXXXX");
  if (!mkdtemp(shown_dir)) {
    printf("Bail out! mkdtemp: %s\n", strerror(errno));
    exit(1);
  }
  chmod(shown_dir, 0755);
  snprintf(helper_path, sizeof helper_path, "%s/helper", shown_dir);
  snprintf(setuid_id_path, sizeof setuid_id_path, "%s/id-setuid", shown_dir);
  snprintf(sentinel_path, sizeof sentinel_path, "%s/sentinel", shown_dir);
  copy_file("/proc/self/exe", helper_path, 0755);
  copy_file("/usr/bin/id", setuid_id_path, 04755); /* setuid root: we are root in CI */
  write_bytes(sentinel_path, "sentinel\n", 9);
  chmod(sentinel_path, 0666); /* writable by anyone on the host: the view must still refuse */
  engine = new_engine();
  const char *ro[] = {shown_dir, NULL};
  mrl_sandbox_config c;
  memset(&c, 0, sizeof c);
  c.ro_paths = ro;
  c.host_uid = c.host_gid = test_uid;
  c.limits.wall_ms = 5000;
  MUST(mrl_sandbox_new(engine, &c, &pool));
}

/* What the host must still look like after a bad input. */
typedef struct host_state {
  char fds[4096];      /* what our open fds are, sorted ("pipe", "socket", "/etc/hostname"): a
                          pool keeps one warm reaper, whose fds change numbers from call to call */
  char *mounts;        /* our mountinfo */
  int uid_procs;       /* processes of test_uid */
  int children;        /* our children, zombies included */
  char sentinel[64];   /* the shown file's content and mtime */
  char tmp_files[256]; /* files in host /tmp owned by test_uid */
} host_state;

static int count_procs(void) {
  int n = 0;
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%s", e->d_name);
    if (stat(path, &st) == 0 && st.st_uid == test_uid) n++;
  }
  if (d) closedir(d);
  return n;
}

static int count_children(void) {
  int n = 0;
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    const char *rp = strrchr(buf, ')');
    int ppid;
    if (rp && sscanf(rp + 2, "%*c %d", &ppid) == 1 && ppid == getpid()) n++;
  }
  if (d) closedir(d);
  return n;
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void snapshot(host_state *s) {
  memset(s, 0, sizeof *s);
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  char targets[256][64], *sorted[256];
  int nt = 0;
  while (d && (e = readdir(d)) && nt < 256) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) continue;
    char path[300], target[256] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(path, target, sizeof target - 1);
    if (k > 0) target[k] = '\0';
    target[strcspn(target, ":")] = '\0'; /* pipe:[1234] -> pipe */
    snprintf(targets[nt], sizeof targets[nt], "%s", target);
    sorted[nt] = targets[nt];
    nt++;
  }
  if (d) closedir(d);
  qsort(sorted, (size_t)nt, sizeof *sorted, compare_strings);
  size_t n = 0;
  for (int i = 0; i < nt && n < sizeof s->fds; i++)
    n += (size_t)snprintf(s->fds + n, sizeof s->fds - n, "%s\n", sorted[i]);
  size_t len;
  s->mounts = (char *)read_bytes("/proc/self/mountinfo", &len);
  s->uid_procs = count_procs();
  s->children = count_children();
  struct stat st;
  size_t sl = 0;
  unsigned char *content = read_bytes(sentinel_path, &sl);
  if (stat(sentinel_path, &st) == 0)
    snprintf(s->sentinel, sizeof s->sentinel, "%.*s|%ld.%ld", (int)(sl < 20 ? sl : 20),
             content ? (char *)content : "", (long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  free(content);
  d = opendir("/tmp");
  n = 0;
  while (d && (e = readdir(d))) {
    char path[300];
    snprintf(path, sizeof path, "/tmp/%s", e->d_name);
    if (lstat(path, &st) == 0 && st.st_uid == test_uid && n < sizeof s->tmp_files)
      n += (size_t)snprintf(s->tmp_files + n, sizeof s->tmp_files - n, "%s ", e->d_name);
  }
  if (d) closedir(d);
}

/* Checks that the host is as before (processes of the tool's uid must be gone already). */
static void check_host_unchanged(host_state *before) {
  host_state after;
  snapshot(&after);
  CHECKF(strcmp(before->fds, after.fds) == 0, "open fds changed:\n%s---\n%s", before->fds,
         after.fds);
  CHECKF(before->mounts && after.mounts && strcmp(before->mounts, after.mounts) == 0,
         "the host's mounts changed");
  CHECKF(after.uid_procs == 0, "%d processes of uid %u are left", after.uid_procs, test_uid);
  CHECKF(after.children == before->children, "children: %d before, %d after", before->children,
         after.children);
  CHECKF(strcmp(before->sentinel, after.sentinel) == 0, "the shown host file changed: %s -> %s",
         before->sentinel, after.sentinel);
  CHECKF(after.tmp_files[0] == '\0', "files of uid %u in host /tmp: %s", test_uid, after.tmp_files);
  free(before->mounts);
  free(after.mounts);
}

/* ---- calls ---- */
typedef struct call_opts {
  const char *stdin_data;
  size_t stdin_len;
  const mrl_sandbox_file *files;
  size_t nfiles;
  const char *const *env;
  mrl_sandbox_limits limits;
} call_opts;

static mrl_sandbox_result *run_in(mrl_sandbox *p, const char *const *argv, const call_opts *o) {
  mrl_sandbox_call c;
  memset(&c, 0, sizeof c);
  c.argv = argv;
  if (o) {
    c.stdin_data = o->stdin_data;
    c.stdin_len = o->stdin_len;
    c.files = o->files;
    c.nfiles = o->nfiles;
    c.env = o->env;
    c.limits = o->limits;
  }
  mrl_sandbox_result *r = NULL;
  MUST(mrl_sandbox_run(p, &c, &r));
  return r;
}

static mrl_sandbox_result *run(const char *const *argv, const call_opts *o) {
  setup();
  return run_in(pool, argv, o);
}

/* sh -c script */
static mrl_sandbox_result *sh(const char *script, const call_opts *o) {
  const char *argv[] = {"/bin/sh", "-c", script, NULL};
  return run(argv, o);
}

static const char *const helper_env[] = {
    "ASAN_OPTIONS=detect_leaks=0:handle_segv=0:allow_user_segv_handler=1", NULL};

/* The helper (this binary) in the sandbox. */
static mrl_sandbox_result *run_helper(const char *name, const char *arg, call_opts *o) {
  setup();
  call_opts local;
  if (!o) {
    memset(&local, 0, sizeof local);
    o = &local;
  }
  o->env = helper_env;
  const char *argv[] = {helper_path, "--helper", name, arg, NULL};
  return run(argv, o);
}

static const char *status_of(const mrl_sandbox_result *r) {
  return mrl_sandbox_status_name(r->status);
}

#define CHECK_STATUS(r, want)                                                                      \
  CHECKF((r)->status == (want), "status %s (%s), expected %s; exit %d, signal %d; stderr: %.300s", \
         status_of(r), (r)->message, mrl_sandbox_status_name(want), (r)->exit_code, (r)->signal,   \
         (r)->err)

static bool has(const mrl_sandbox_result *r, const char *needle) {
  return strstr(r->out, needle) || strstr(r->err, needle);
}

/* ---- ordinary behaviour ---- */
static void test_pool_reports_protections(void) {
  setup();
  unsigned on = mrl_sandbox_protections(pool);
  for (unsigned bit = 1; bit <= MRL_SANDBOX_PROT_CPU; bit <<= 1)
    check_note("%-8s %-3s %s", mrl_sandbox_protection_name(bit), on & bit ? "on" : "off",
               mrl_sandbox_protection_note(pool, bit));
  CHECK((on & (MRL_SANDBOX_PROT_MOUNT | MRL_SANDBOX_PROT_PID)) ==
        (MRL_SANDBOX_PROT_MOUNT | MRL_SANDBOX_PROT_PID));
  for (unsigned bit = 1; bit <= MRL_SANDBOX_PROT_CPU; bit <<= 1)
    CHECKF(*mrl_sandbox_protection_note(pool, bit), "no note for %s",
           mrl_sandbox_protection_name(bit));
  CHECK(mrl_sandbox_protection_name(3) == NULL &&
        mrl_sandbox_protection_note(pool, 1u << 12) == NULL);
  CHECK(strcmp(mrl_sandbox_status_name(MRL_SANDBOX_PIDS_LIMIT), "pids_limit") == 0);
}

static void test_exit_codes(void) {
  const int codes[] = {0, 1, 42, 255};
  for (size_t i = 0; i < 4; i++) {
    char script[32];
    snprintf(script, sizeof script, "exit %d", codes[i]);
    mrl_sandbox_result *r = sh(script, NULL);
    CHECK_STATUS(r, MRL_SANDBOX_EXITED);
    CHECKF(r->exit_code == codes[i] && r->signal == 0, "exit %d for %d", r->exit_code, codes[i]);
    mrl_sandbox_result_free(r);
  }
  mrl_sandbox_result *r = sh("kill -TERM $$", NULL);
  CHECK_STATUS(r, MRL_SANDBOX_SIGNALED);
  CHECK(r->signal == SIGTERM && r->exit_code == -1);
  mrl_sandbox_result_free(r);
}

static void test_stdin(void) {
  call_opts o = {.stdin_data = "line one\nline two\n", .stdin_len = 18};
  const char *cat[] = {"cat", NULL};
  mrl_sandbox_result *r = run(cat, &o);
  CHECK_STATUS(r, MRL_SANDBOX_EXITED);
  CHECK(r->out_len == 18 && memcmp(r->out, "line one\nline two\n", 18) == 0);
  mrl_sandbox_result_free(r);
  r = run(cat, NULL); /* no stdin: empty */
  CHECK(r->exit_code == 0 && r->out_len == 0);
  mrl_sandbox_result_free(r);
}

static void test_output_byte_exact(void) {
  /* every byte value, NULs and invalid UTF-8 included, on both streams */
  mrl_sandbox_result *r =
      sh("i=0; while [ $i -lt 256 ]; do printf \"\\\\$(printf %o $i)\"; i=$((i+1)); done; "
         "printf '\\377\\376\\000x' >&2",
         NULL);
  CHECK_STATUS(r, MRL_SANDBOX_EXITED);
  CHECKF(r->out_len == 256 && r->out_total == 256, "out_len %zu", r->out_len);
  bool exact = r->out_len == 256;
  for (size_t i = 0; exact && i < 256; i++) exact = (unsigned char)r->out[i] == i;
  CHECK(exact);
  CHECK(r->err_len == 4 && memcmp(r->err, "\377\376\000x", 4) == 0);
  CHECK(!r->out_truncated && !r->err_truncated);
  mrl_sandbox_result_free(r);
}

static void test_files_in_and_out(void) {
  const mrl_sandbox_file in[] = {
      {"input.txt", "abc\n", 4}, {"src/deep/data.bin", "\0\1\2", 3}, {"keep.txt", "same", 4}};
  call_opts o = {.files = in, .nfiles = 3};
  mrl_sandbox_result *r =
      sh("pwd; cat input.txt; od -An -tx1 src/deep/data.bin; echo new > out.txt; "
         "mkdir -p a/b && printf '\\000\\377' > a/b/bin; echo changed >> input.txt",
         &o);
  CHECK_STATUS(r, MRL_SANDBOX_EXITED);
  CHECKF(has(r, "/work\nabc\n 00 01 02"), "out: %s", r->out);
  const char *want[][2] = {
      {"out.txt", "new\n"}, {"a/b/bin", "\0\377"}, {"input.txt", "abc\nchanged\n"}};
  size_t want_len[] = {4, 2, 12};
  CHECKF(r->nfiles == 3, "%zu files returned", r->nfiles);
  for (size_t i = 0; i < 3; i++) {
    bool found = false;
    for (size_t k = 0; k < r->nfiles; k++)
      if (!strcmp(r->files[k].name, want[i][0]))
        found =
            r->files[k].len == want_len[i] && !memcmp(r->files[k].data, want[i][1], want_len[i]);
    CHECKF(found, "%s missing or wrong", want[i][0]);
  }
  for (size_t k = 0; k < r->nfiles; k++) CHECK(strcmp(r->files[k].name, "keep.txt") != 0);
  mrl_sandbox_result_free(r);
}

static void test_environment(void) {
  const char *env[] = {"EXTRA=1", "LANG=C", NULL};
  call_opts o = {.env = env};
  setenv("MOONRL_TEST_PARENT_ONLY", "x", 1);
  mrl_sandbox_result *r = sh("env | sort", &o);
  CHECKF(strcmp(r->out,
                "EXTRA=1\nHOME=/work\nLANG=C\nPATH=/usr/local/bin:/usr/bin:/bin\nPWD=/work\n") == 0,
         "env: %s", r->out);
  mrl_sandbox_result_free(r);
  r = sh("hostname; id -un; cat /etc/hostname", NULL);
  CHECKF(!strcmp(r->out, "sandbox\nsandbox\nsandbox\n") ||
             !(mrl_sandbox_protections(pool) & MRL_SANDBOX_PROT_UTS),
         "%s", r->out);
  mrl_sandbox_result_free(r);
}

static void test_program_lookup(void) {
  const char *argv[] = {"echo", "found", "in", "PATH", NULL};
  mrl_sandbox_result *r = run(argv, NULL);
  CHECK(r->exit_code == 0 && !strcmp(r->out, "found in PATH\n"));
  mrl_sandbox_result_free(r);
  const char *missing[] = {"no-such-program-xyz", NULL};
  r = run(missing, NULL);
  CHECK_STATUS(r, MRL_SANDBOX_SETUP_ERROR);
  CHECKF(strstr(r->message, "no-such-program-xyz") && strstr(r->message, "No such file"), "%s",
         r->message);
  mrl_sandbox_result_free(r);
  const char *dir[] = {"/usr", NULL};
  r = run(dir, NULL);
  CHECK_STATUS(r, MRL_SANDBOX_SETUP_ERROR);
  CHECKF(strstr(r->message, "Permission denied"), "%s", r->message);
  mrl_sandbox_result_free(r);
}

static void test_output_head_and_tail(void) {
  call_opts o = {.limits = {.out_cap = 10}};
  mrl_sandbox_result *r = sh("printf 0123456789abcdefghij; printf ABCDEFGHIJKLMNOPQRST >&2", &o);
  CHECK(r->out_truncated && r->out_total == 20 && r->out_len == 10);
  CHECKF(memcmp(r->out, "01234fghij", 10) == 0, "out: %.10s", r->out);
  CHECK(r->err_truncated && memcmp(r->err, "ABCDEPQRST", 10) == 0);
  mrl_sandbox_result_free(r);
  o.limits.out_cap = 7; /* odd: 4 bytes of head, 3 of tail, over many small writes */
  r = sh("for i in 1 2 3 4 5 6 7 8 9; do printf $i; done", &o);
  CHECKF(r->out_len == 7 && memcmp(r->out, "1234789", 7) == 0, "out: %.7s", r->out);
  mrl_sandbox_result_free(r);
}

static void test_concurrent_jobs(void) {
  setup();
  enum { N = 32 };
  mrl_sandbox_job *jobs[N];
  char scripts[N][64];
  double t0 = mrl_clock();
  for (int i = 0; i < N; i++) {
    /* each job writes the wall clock (ns) when it starts and when it ends */
    snprintf(scripts[i], sizeof scripts[i], "date +%%s%%N; sleep 1; date +%%s%%N; echo job %d", i);
    const char *argv[] = {"/bin/sh", "-c", scripts[i], NULL};
    mrl_sandbox_call c;
    memset(&c, 0, sizeof c);
    c.argv = argv;
    MUST(mrl_sandbox_start(pool, &c, &jobs[i]));
  }
  /* drive them with poll(2) on their fds, as an event loop would */
  int left = N;
  bool done[N] = {false};
  while (left > 0) {
    struct pollfd fds[N];
    int map[N], n = 0;
    for (int i = 0; i < N; i++)
      if (!done[i]) fds[n] = (struct pollfd){mrl_sandbox_job_fd(jobs[i]), POLLIN, 0}, map[n++] = i;
    CHECK(poll(fds, (nfds_t)n, 10000) > 0);
    for (int k = 0; k < n; k++) {
      int d = 0;
      if (!fds[k].revents) continue;
      MUST(mrl_sandbox_job_poll(jobs[map[k]], &d));
      if (d) done[map[k]] = true, left--;
    }
    if (mrl_clock() - t0 > 60) break; /* a bound for a hang, not a speed test */
  }
  CHECK(left == 0);
  long long latest_start = 0, earliest_end = LLONG_MAX;
  for (int i = 0; i < N; i++) {
    mrl_sandbox_result *r = NULL;
    MUST(mrl_sandbox_job_wait(jobs[i], &r));
    long long start = 0, end = 0;
    char want[32], tail[32] = "";
    snprintf(want, sizeof want, "job %d", i);
    CHECKF(r->status == MRL_SANDBOX_EXITED && r->out &&
               sscanf(r->out, "%lld\n%lld\n%31[^\n]", &start, &end, tail) == 3 &&
               !strcmp(tail, want) && end > start,
           "job %d: %s %s", i, status_of(r), r->out ? r->out : "");
    if (start > latest_start) latest_start = start;
    if (end < earliest_end) earliest_end = end;
    mrl_sandbox_result_free(r);
    mrl_sandbox_result *again = NULL;
    CHECK_FAILS(engine, MRL_ERR_INVALID, "already taken", mrl_sandbox_job_wait(jobs[i], &again));
    mrl_sandbox_job_free(jobs[i]);
  }
  /* they ran at once: every job had started before the first one ended */
  check_note("latest start %.3f s before the earliest end", (earliest_end - latest_start) / 1e9);
  CHECK(latest_start < earliest_end);
}

static void test_queue_and_kill(void) {
  setup();
  host_state before;
  snapshot(&before);
  mrl_sandbox *small = NULL;
  mrl_sandbox_config c;
  memset(&c, 0, sizeof c);
  c.max_jobs = 2;
  c.host_uid = c.host_gid = test_uid;
  MUST(mrl_sandbox_new(engine, &c, &small));
  const char *slow[] = {"sleep", "1000", NULL}, *fast[] = {"echo", "queued", NULL};
  mrl_sandbox_call call;
  memset(&call, 0, sizeof call);
  mrl_sandbox_job *a, *b, *q1, *q2;
  call.argv = slow;
  MUST(mrl_sandbox_start(small, &call, &a));
  MUST(mrl_sandbox_start(small, &call, &b));
  call.argv = fast;
  MUST(mrl_sandbox_start(small, &call, &q1)); /* both slots are taken: these wait */
  MUST(mrl_sandbox_start(small, &call, &q2));
  int d = 1;
  MUST(mrl_sandbox_job_poll(q1, &d));
  CHECK(d == 0);
  MUST(mrl_sandbox_job_kill(q2)); /* a queued job that is killed never starts */
  MUST(mrl_sandbox_job_kill(a));  /* frees a slot: q1 runs */
  mrl_sandbox_result *r;
  MUST(mrl_sandbox_job_wait(q1, &r));
  CHECK(r->status == MRL_SANDBOX_EXITED && !strcmp(r->out, "queued\n"));
  mrl_sandbox_result_free(r);
  MUST(mrl_sandbox_job_wait(q2, &r));
  CHECK(r->status == MRL_SANDBOX_SIGNALED && r->signal == SIGKILL && r->wall_ms == 0);
  CHECKF(strstr(r->message, "before it started"), "%s", r->message);
  mrl_sandbox_result_free(r);
  MUST(mrl_sandbox_job_wait(a, &r));
  CHECK(r->status == MRL_SANDBOX_SIGNALED && r->signal == SIGKILL);
  mrl_sandbox_result_free(r);
  mrl_sandbox_job_free(a);
  mrl_sandbox_job_free(q1);
  mrl_sandbox_job_free(q2);
  mrl_sandbox_free(small); /* b still runs: freeing the pool kills it, b stays usable */
  MUST(mrl_sandbox_job_wait(b, &r));
  CHECK(r->status == MRL_SANDBOX_SIGNALED);
  mrl_sandbox_result_free(r);
  mrl_sandbox_job_free(b);
  check_host_unchanged(&before);
}

static void test_bad_arguments(void) {
  setup();
  mrl_sandbox_call c;
  memset(&c, 0, sizeof c);
  mrl_sandbox_result *r = NULL;
  CHECK_FAILS(engine, MRL_ERR_INVALID, "argv is empty", mrl_sandbox_run(pool, &c, &r));
  const char *argv[] = {"true", NULL};
  c.argv = argv;
  const char *bad_names[] = {"../x", "/etc/x", "a//b", "a/./b", "", "a/", "a/.."};
  for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
    mrl_sandbox_file f = {bad_names[i], "x", 1};
    c.files = &f;
    c.nfiles = 1;
    CHECK_FAILS(engine, MRL_ERR_INVALID, "files[0].name", mrl_sandbox_run(pool, &c, &r));
  }
  mrl_sandbox_file twice[] = {{"a", "x", 1}, {"a", "y", 1}};
  c.files = twice;
  c.nfiles = 2;
  CHECK_FAILS(engine, MRL_ERR_INVALID, "given twice", mrl_sandbox_run(pool, &c, &r));
  c.nfiles = 0;
  c.limits.wall_ms = -1;
  CHECK_FAILS(engine, MRL_ERR_INVALID, "wall_ms", mrl_sandbox_run(pool, &c, &r));
  c.limits.wall_ms = 0;
  const char *env[] = {"NOEQUALS", NULL};
  c.env = env;
  CHECK_FAILS(engine, MRL_ERR_INVALID, "NAME=value", mrl_sandbox_run(pool, &c, &r));
  c.env = NULL;
  CHECK_FAILS(engine, MRL_ERR_NULL, NULL, mrl_sandbox_run(NULL, &c, &r));
  CHECK_FAILS(engine, MRL_ERR_NULL, "out", mrl_sandbox_run(pool, &c, NULL));
  CHECK(r == NULL);
  mrl_sandbox *p = NULL;
  mrl_sandbox_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.disable = MRL_SANDBOX_PROT_MOUNT;
  CHECK_FAILS(engine, MRL_ERR_INVALID, "cannot be turned off", mrl_sandbox_new(engine, &cfg, &p));
  cfg.disable = cfg.require = MRL_SANDBOX_PROT_NET;
  CHECK_FAILS(engine, MRL_ERR_INVALID, "both required and disabled",
              mrl_sandbox_new(engine, &cfg, &p));
  cfg.disable = cfg.require = 0;
  const char *rel[] = {"usr", NULL}, *hidden[] = {"/tmp/x", NULL}, *gone[] = {"/no/such/dir", NULL};
  cfg.ro_paths = rel;
  CHECK_FAILS(engine, MRL_ERR_INVALID, "normalized", mrl_sandbox_new(engine, &cfg, &p));
  cfg.ro_paths = hidden;
  CHECK_FAILS(engine, MRL_ERR_INVALID, "hidden", mrl_sandbox_new(engine, &cfg, &p));
  cfg.ro_paths = gone;
  CHECK_FAILS(engine, MRL_ERR_INVALID, "/no/such/dir", mrl_sandbox_new(engine, &cfg, &p));
  CHECK(p == NULL);
}

/* A caller can demand protections: each one this host lacks is refused by name; one turned off
 * on purpose is off and reported so. */
static void test_require_and_disable(void) {
  setup();
  unsigned on = mrl_sandbox_protections(pool);
  int missing = 0;
  for (unsigned bit = 1; bit <= MRL_SANDBOX_PROT_CPU; bit <<= 1) {
    if (on & bit) continue;
    missing++;
    mrl_sandbox *p = NULL;
    mrl_sandbox_config c;
    memset(&c, 0, sizeof c);
    c.require = bit;
    CHECK_FAILS(engine, MRL_ERR_UNSUPPORTED, mrl_sandbox_protection_name(bit),
                mrl_sandbox_new(engine, &c, &p));
  }
  if (!missing) check_note("this host has every protection: no refusal to check here");
  mrl_sandbox *p = NULL;
  mrl_sandbox_config c;
  memset(&c, 0, sizeof c);
  c.disable = MRL_SANDBOX_PROT_NET | MRL_SANDBOX_PROT_SECCOMP;
  c.require = on & MRL_SANDBOX_PROT_PIDS;
  c.host_uid = c.host_gid = test_uid;
  MUST(mrl_sandbox_new(engine, &c, &p));
  CHECK(!(mrl_sandbox_protections(p) & (MRL_SANDBOX_PROT_NET | MRL_SANDBOX_PROT_SECCOMP)));
  CHECK(strstr(mrl_sandbox_protection_note(p, MRL_SANDBOX_PROT_NET), "disabled by the caller"));
  const char *argv[] = {"/bin/sh", "-c", "grep -c . /proc/net/dev; grep Seccomp: /proc/self/status",
                        NULL};
  mrl_sandbox_result *r = run_in(p, argv, NULL);
  int lines = atoi(r->out);
  CHECKF(lines > 3 && strstr(r->out, "Seccomp:\t0"), "without net: %s",
         r->out); /* host's interfaces */
  mrl_sandbox_result_free(r);
  mrl_sandbox_free(p);
  r = run(argv, NULL);
  CHECKF(atoi(r->out) == 3 || !(on & MRL_SANDBOX_PROT_NET), "with net: %s", r->out); /* lo only */
  mrl_sandbox_result_free(r);
}

/* Root without a user namespace (a host that has none): the other namespaces still hold, the
 * tool runs as the host uid, and the mounts made for it never reach the host. */
static void test_without_user_namespace(void) {
  setup();
  if (geteuid() != 0) {
    check_skip("a pool without a user namespace needs root");
    return;
  }
  host_state before;
  snapshot(&before);
  mrl_sandbox *p = NULL;
  mrl_sandbox_config c;
  memset(&c, 0, sizeof c);
  c.disable = MRL_SANDBOX_PROT_USER;
  c.host_uid = c.host_gid = test_uid;
  MUST(mrl_sandbox_new(engine, &c, &p));
  CHECK(!(mrl_sandbox_protections(p) & MRL_SANDBOX_PROT_USER));
  const char *argv[] = {"/bin/sh", "-c",
                        "id -u; grep CapEff /proc/self/status; echo x > f && cat f; "
                        "touch /usr/x 2>/dev/null || echo read-only",
                        NULL};
  mrl_sandbox_result *r = run_in(p, argv, NULL);
  char want[128];
  snprintf(want, sizeof want, "%u\nCapEff:\t0000000000000000\nx\nread-only\n", test_uid);
  CHECKF(r->exit_code == 0 && !strcmp(r->out, want), "%s%s", r->out, r->err);
  mrl_sandbox_result_free(r);
  mrl_sandbox_free(p);
  check_host_unchanged(&before);
}

/* ---- the spec's bad inputs ---- */
static void test_bad_01_fork_and_thread_bombs(void) {
  setup();
  if (!(mrl_sandbox_protections(pool) & MRL_SANDBOX_PROT_PIDS)) {
    check_skip("no pids cgroup on this host: %s",
               mrl_sandbox_protection_note(pool, MRL_SANDBOX_PROT_PIDS));
    return;
  }
  host_state before;
  snapshot(&before);
  call_opts o = {.limits = {.pids = 32, .wall_ms = 10000}};
  mrl_sandbox_result *r = sh("b() { b | b & }; b; sleep 10", &o);
  CHECK_STATUS(r, MRL_SANDBOX_PIDS_LIMIT);
  CHECKF(r->wall_ms < 8000, "took %.0f ms", r->wall_ms);
  mrl_sandbox_result_free(r);
  r = run_helper("threads", NULL, &o);
  CHECK_STATUS(r, MRL_SANDBOX_PIDS_LIMIT);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_02_memory_bomb(void) {
  setup();
  if (!(mrl_sandbox_protections(pool) & MRL_SANDBOX_PROT_MEMORY)) {
    check_skip("no memory cgroup on this host (%s): RLIMIT_AS makes allocations fail instead",
               mrl_sandbox_protection_note(pool, MRL_SANDBOX_PROT_MEMORY));
    return;
  }
  host_state before;
  snapshot(&before);
  call_opts o = {.limits = {.mem_bytes = 64 << 20}};
  mrl_sandbox_result *r = run_helper("touch", NULL, &o);
  CHECK_STATUS(r, MRL_SANDBOX_OOM);
  CHECK(r->signal == SIGKILL && strstr(r->message, "64 MiB"));
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_03_huge_mmap(void) {
  host_state before;
  setup();
  snapshot(&before);
  call_opts o = {.limits = {.mem_bytes = 64 << 20}};
  mrl_sandbox_result *r = run_helper("mmap-huge", NULL, &o);
  CHECKF((r->status == MRL_SANDBOX_EXITED && r->exit_code == 2 && has(r, "refused")) ||
             r->status == MRL_SANDBOX_OOM,
         "%s %d %s", status_of(r), r->exit_code, r->out);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_04_busy_loop(void) {
  host_state before;
  setup();
  snapshot(&before);
  /* a wall limit far away: on a busy machine 300 ms of CPU can take seconds */
  call_opts o = {.limits = {.cpu_ms = 300, .wall_ms = 30000}};
  mrl_sandbox_result *r = sh("while :; do :; done", &o);
  CHECK_STATUS(r, MRL_SANDBOX_CPU_LIMIT);
  CHECKF(r->cpu_ms >= 150, "cpu %.0f ms, wall %.0f ms", r->cpu_ms, r->wall_ms); /* tick-sampled */
  mrl_sandbox_result_free(r);
  /* the loop in a child of the tool is counted too */
  r = sh("sh -c 'while :; do :; done'; echo survived", &o);
  CHECK_STATUS(r, MRL_SANDBOX_CPU_LIMIT);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_05_sleep_and_blocked_read(void) {
  host_state before;
  setup();
  snapshot(&before);
  call_opts o = {.limits = {.wall_ms = 300}};
  const char *argv[] = {"sleep", "1000000", NULL};
  mrl_sandbox_result *r = run(argv, &o);
  CHECK_STATUS(r, MRL_SANDBOX_TIMEOUT);
  CHECKF(r->wall_ms >= 290 && r->wall_ms < 5000, "wall %.0f ms", r->wall_ms);
  CHECK(r->signal == SIGKILL && strstr(r->message, "300 ms"));
  mrl_sandbox_result_free(r);
  r = sh("mkfifo f && cat f", &o); /* nobody ever writes the fifo */
  CHECK_STATUS(r, MRL_SANDBOX_TIMEOUT);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_06_output_flood(void) {
  host_state before;
  setup();
  snapshot(&before);
  call_opts o = {.limits = {.out_cap = 4096, .out_kill = 4 << 20}};
  const char *argv[] = {"yes", "flood", NULL};
  mrl_sandbox_result *r = run(argv, &o);
  CHECK_STATUS(r, MRL_SANDBOX_OUTPUT_LIMIT);
  CHECK(r->out_truncated && r->out_len == 4096 && r->out_total > (4u << 20));
  CHECK(memcmp(r->out, "flood\nflood\n", 12) == 0);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_07_grandchild_keeps_stdout(void) {
  host_state before;
  setup();
  snapshot(&before);
  mrl_sandbox_result *r = sh("(sleep 1000 &); sleep 1000 >&2 & echo done", NULL);
  CHECK_STATUS(r, MRL_SANDBOX_EXITED);
  CHECK(r->exit_code == 0 && !strcmp(r->out, "done\n"));
  CHECKF(r->wall_ms < 5000, "took %.0f ms", r->wall_ms); /* not the sleeps' 1000 s */
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_08_reads_stdin_forever(void) {
  host_state before;
  setup();
  snapshot(&before);
  mrl_sandbox_result *r = sh("while read line; do echo \"got $line\"; done; echo end", NULL);
  CHECK(r->exit_code == 0 && !strcmp(r->out, "end\n") && r->wall_ms < 5000);
  mrl_sandbox_result_free(r);
  call_opts o = {.stdin_data = "a\nb\n", .stdin_len = 4};
  r = sh("while read line; do echo \"got $line\"; done; echo end", &o);
  CHECK(!strcmp(r->out, "got a\ngot b\nend\n"));
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_09_binary_output(void) {
  host_state before;
  setup();
  snapshot(&before);
  mrl_sandbox_result *r = sh("printf '\\377\\000\\300\\200\\355\\240\\200tail' ", NULL);
  CHECKF(r->out_len == 11 && r->out_total == 11 &&
             memcmp(r->out, "\377\000\300\200\355\240\200tail", 11) == 0,
         "%zu bytes", r->out_len);
  CHECK(r->out[r->out_len] == '\0'); /* terminated for convenience */
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_10_write_outside_workdir(void) {
  host_state before;
  setup();
  snapshot(&before);
  char script[1024];
  snprintf(script, sizeof script,
           "for f in /etc/passwd /usr/bin/x /x %s %s/new; do (echo x > $f) 2>/dev/null && echo "
           "wrote $f; done; rm -f %s 2>/dev/null && echo removed; touch /tmp/ok && echo tmp-ok",
           sentinel_path, shown_dir, sentinel_path);
  struct stat st0, st1;
  stat("/etc/passwd", &st0);
  mrl_sandbox_result *r = sh(script, NULL);
  CHECK(r->exit_code == 0);
  CHECKF(!strcmp(r->out, "tmp-ok\n"), "out: %s", r->out);
  stat("/etc/passwd", &st1);
  CHECK(st0.st_mtim.tv_sec == st1.st_mtim.tv_sec && st0.st_mtim.tv_nsec == st1.st_mtim.tv_nsec);
  char newfile[160];
  snprintf(newfile, sizeof newfile, "%s/new", shown_dir);
  CHECK(access(newfile, F_OK) != 0 && access("/x", F_OK) != 0);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_11_fill_the_disk(void) {
  host_state before;
  setup();
  snapshot(&before);
  call_opts o = {.limits = {.fsize = 4 << 20}};
  mrl_sandbox_result *r = sh("dd if=/dev/zero of=big bs=1M count=100 2>/dev/null; echo after", &o);
  /* the file-size limit: SIGXFSZ ends dd, the script goes on */
  CHECKF(r->exit_code == 0 && !strcmp(r->out, "after\n"), "%s %s", status_of(r), r->out);
  mrl_sandbox_result_free(r);
  r = sh("exec dd if=/dev/zero of=big bs=1M count=100", &o);
  CHECK_STATUS(r, MRL_SANDBOX_SIGNALED);
  CHECK(r->signal == SIGXFSZ);
  mrl_sandbox_result_free(r);
  call_opts full = {.limits = {.disk_bytes = 4 << 20, .files_cap = 1 << 20}};
  r = sh("dd if=/dev/zero of=big bs=1M count=100", &full); /* the tmpfs is full first */
  CHECK(r->status == MRL_SANDBOX_EXITED && r->exit_code != 0 && has(r, "No space left"));
  CHECK(r->files_truncated && r->nfiles == 0); /* big is past files_cap */
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_12_secrets_on_disk(void) {
  host_state before;
  setup();
  snapshot(&before);
  mrl_sandbox_result *r =
      sh("for f in /etc/shadow /root /home /proc/1/environ /proc/1/cmdline /proc/1/mem; do "
         "cat $f >/dev/null 2>&1 && echo read $f; ls $f >/dev/null 2>&1 && echo listed $f; done; "
         "echo end",
         NULL);
  CHECKF(!strcmp(r->out, "end\n"), "out: %s", r->out);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_13_secrets_in_environment(void) {
  host_state before;
  setup();
  snapshot(&before);
  setenv("OPENAI_API_KEY", "sk-moonrl-test-secret", 1);
  mrl_sandbox_result *r = sh("env; cat /proc/*/environ 2>/dev/null", NULL);
  CHECKF(!has(r, "sk-moonrl-test-secret") && !has(r, "OPENAI"), "out: %s", r->out);
  mrl_sandbox_result_free(r);
  unsetenv("OPENAI_API_KEY");
  check_host_unchanged(&before);
}

static void test_bad_14_inherited_fds(void) {
  setup();
  int leaky = open("/etc/hostname", O_RDONLY); /* not close-on-exec */
  int leaky2 = dup(1);
  host_state before;
  snapshot(&before);
  mrl_sandbox_result *r = run_helper("fds", NULL, NULL);
  CHECKF(!strcmp(r->out, "0 1 2 \n"), "fds: %s", r->out);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
  close(leaky);
  close(leaky2);
}

static void test_bad_15_proc_shows_only_the_sandbox(void) {
  host_state before;
  setup();
  snapshot(&before);
  char script[256];
  snprintf(script, sizeof script,
           "ls /proc | grep -c '^[0-9]'; test -e /proc/%d && echo host-visible; echo end",
           (int)getpid());
  mrl_sandbox_result *r = sh(script, NULL);
  int n = atoi(r->out);
  CHECKF(n >= 1 && n <= 3 && strstr(r->out, "end") && !strstr(r->out, "host-visible"), "%s",
         r->out);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_16_network(void) {
  setup();
  if (!(mrl_sandbox_protections(pool) & MRL_SANDBOX_PROT_NET)) {
    check_skip("no network namespace: %s", mrl_sandbox_protection_note(pool, MRL_SANDBOX_PROT_NET));
    return;
  }
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t len = sizeof a;
  CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0 && listen(s, 4) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0);
  char port[16];
  snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
  host_state before;
  snapshot(&before);
  mrl_sandbox_result *r = run_helper("connect", port, NULL);
  CHECKF(strstr(r->out, "127.0.0.1=ENETUNREACH") && strstr(r->out, "8.8.8.8=ENETUNREACH"), "%s",
         r->out);
  mrl_sandbox_result_free(r);
  CHECK(accept(s, NULL, NULL) < 0 && errno == EAGAIN); /* nothing came through */
  check_host_unchanged(&before);
  close(s);
}

static void test_bad_17_daemon(void) {
  host_state before;
  setup();
  snapshot(&before);
  mrl_sandbox_result *r = sh("setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo started", NULL);
  CHECK(r->exit_code == 0 && !strcmp(r->out, "started\n") && r->wall_ms < 5000);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before); /* no process of the tool's uid is left */
}

/* The engine is a forked copy of this test with its own pool; it dies (SIGKILL) while its call
 * runs, and the tool must die with it. */
static void test_bad_18_engine_dies(void) {
  setup();
  host_state before;
  snapshot(&before);
  int sync[2];
  CHECK(pipe(sync) == 0);
  pid_t engine_pid = fork();
  if (engine_pid == 0) {
    mrl_engine *e = NULL;
    mrl_sandbox *p = NULL;
    mrl_sandbox_job *j = NULL;
    mrl_sandbox_config c;
    memset(&c, 0, sizeof c);
    c.host_uid = c.host_gid = test_uid;
    const char *argv[] = {"sleep", "1000", NULL};
    mrl_sandbox_call call;
    memset(&call, 0, sizeof call);
    call.argv = argv;
    if (mrl_engine_new(&e) || mrl_sandbox_new(e, &c, &p) || mrl_sandbox_start(p, &call, &j))
      _exit(1);
    for (int i = 0; i < 100; i++) { /* until the tool runs */
      int d;
      mrl_sandbox_job_poll(j, &d);
      usleep(10000);
      if (count_procs() >= 1) break;
    }
    if (write(sync[1], "x", 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char c;
  close(sync[1]);
  CHECK(read(sync[0], &c, 1) == 1);
  close(sync[0]);
  CHECK(count_procs() >= 1);
  kill(engine_pid, SIGKILL);
  waitpid(engine_pid, NULL, 0);
  int left = -1;
  for (int i = 0; i < 200 && left != 0; i++) { /* the kernel delivers the death signal at once */
    left = count_procs();
    if (left) usleep(10000);
  }
  CHECKF(left == 0, "%d processes outlived the engine", left);
  check_host_unchanged(&before);
}

static void test_bad_19_signal_or_trace_the_host(void) {
  host_state before;
  setup();
  snapshot(&before);
  char pid[16];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  mrl_sandbox_result *r = run_helper("kill", pid, NULL);
  CHECKF(strstr(r->out, "kill=ESRCH"), "%s", r->out);
  mrl_sandbox_result_free(r);
  r = run_helper("probe", NULL, NULL);
  CHECKF(strstr(r->out, "ptrace=EPERM"), "%s", r->out); /* pid 1 of the sandbox, or any */
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_20_forbidden_system_calls(void) {
  setup();
  if (!(mrl_sandbox_protections(pool) & MRL_SANDBOX_PROT_SECCOMP)) {
    check_skip("no seccomp: %s", mrl_sandbox_protection_note(pool, MRL_SANDBOX_PROT_SECCOMP));
    return;
  }
  host_state before;
  snapshot(&before);
  mrl_sandbox_result *r = run_helper("probe", NULL, NULL);
  const char *want[] = {
      "ptrace=EPERM\n", "perf_event_open=EPERM\n",  "bpf=EPERM\n",   "userfaultfd=EPERM\n",
      "keyctl=EPERM\n", "process_vm_readv=EPERM\n", "mount=EPERM\n", "setns=EPERM\n"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    CHECKF(strstr(r->out, want[i]), "%s missing in:\n%s", want[i], r->out);
  mrl_sandbox_result_free(r);
  r = run_helper("kexec", NULL, NULL); /* the calls no tool needs kill the process */
  CHECK_STATUS(r, MRL_SANDBOX_SECCOMP);
  CHECK(r->signal == SIGSYS);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_21_nested_user_namespace(void) {
  host_state before;
  setup();
  snapshot(&before);
  const char *argv[] = {"unshare", "-r", "id", NULL};
  mrl_sandbox_result *r = run(argv, NULL);
  CHECK(r->status == MRL_SANDBOX_EXITED && r->exit_code != 0);
  CHECKF(has(r, "Operation not permitted"), "%s %s", r->out, r->err);
  mrl_sandbox_result_free(r);
  r = run_helper("probe", NULL, NULL);
  CHECKF(strstr(r->out, "unshare_user=EPERM") && strstr(r->out, "clone_newuser=EPERM"), "%s",
         r->out);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_22_setuid_binary(void) {
  setup();
  struct stat st;
  if (stat(setuid_id_path, &st) != 0 || !(st.st_mode & S_ISUID) || st.st_uid != 0) {
    check_skip("the test cannot make a setuid-root binary (not run as root)");
    return;
  }
  host_state before;
  snapshot(&before);
  const char *argv[] = {setuid_id_path, NULL};
  mrl_sandbox_result *r = run(argv, NULL);
  CHECKF(r->exit_code == 0 && strstr(r->out, "uid=1000") && !strstr(r->out, "euid"), "%s", r->out);
  mrl_sandbox_result_free(r);
  r = sh("grep NoNewPrivs /proc/self/status", NULL);
  CHECK(!strcmp(r->out, "NoNewPrivs:\t1\n"));
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_bad_23_huge_argv(void) {
  host_state before;
  setup();
  snapshot(&before);
  size_t n = 10 << 20;
  char *big = malloc(n + 1);
  memset(big, 'a', n);
  big[n] = '\0';
  const char *argv[] = {"echo", big, NULL};
  mrl_sandbox_result *r = run(argv, NULL);
  CHECK_STATUS(r, MRL_SANDBOX_SETUP_ERROR);
  CHECKF(strstr(r->message, "Argument list too long"), "%s", r->message);
  mrl_sandbox_result_free(r);
  enum { MANY = 200000 };
  const char **many = malloc((MANY + 2) * sizeof *many);
  many[0] = "true";
  for (int i = 1; i <= MANY; i++) many[i] = big + n - 100; /* 100 bytes each: 20 MB */
  many[MANY + 1] = NULL;
  r = run(many, NULL);
  CHECK_STATUS(r, MRL_SANDBOX_SETUP_ERROR);
  mrl_sandbox_result_free(r);
  free(many);
  free(big);
  check_host_unchanged(&before);
}

static void test_bad_24_zombies_and_core_dumps(void) {
  host_state before;
  setup();
  snapshot(&before);
  /* children that are never waited for */
  mrl_sandbox_result *r = sh("for i in 1 2 3 4 5; do sh -c 'exit 0' & done; exec sleep 0.1", NULL);
  CHECK(r->exit_code == 0);
  mrl_sandbox_result_free(r);
  r = run_helper("segv", NULL, NULL);
  CHECK_STATUS(r, MRL_SANDBOX_SIGNALED);
  CHECK(r->signal == SIGSEGV);
  for (size_t i = 0; i < r->nfiles; i++)
    CHECKF(strncmp(r->files[i].name, "core", 4) != 0, "%s", r->files[i].name);
  mrl_sandbox_result_free(r);
  CHECK(access("core", F_OK) != 0);
  check_host_unchanged(&before); /* includes: no zombie children of ours */
}

static void test_bad_25_stopped_process(void) {
  host_state before;
  setup();
  snapshot(&before);
  call_opts o = {.limits = {.wall_ms = 300}};
  mrl_sandbox_result *r = sh("kill -STOP $$", &o);
  CHECK_STATUS(r, MRL_SANDBOX_TIMEOUT);
  mrl_sandbox_result_free(r);
  r = sh("sleep 1000 & kill -STOP $!; echo stopped", NULL);
  CHECK(r->exit_code == 0 && !strcmp(r->out, "stopped\n") && r->wall_ms < 5000);
  mrl_sandbox_result_free(r);
  check_host_unchanged(&before);
}

static void test_everything_released(void) {
  setup();
  mrl_sandbox_free(pool);
  pool = NULL;
  CHECKF(mrl_engine_memory_used(engine) == 0, "%zu bytes still held",
         mrl_engine_memory_used(engine));
  mrl_engine_free(engine);
  engine = NULL;
  CHECK(count_procs() == 0);
  /* the pool's cgroups are gone */
  char line[512];
  FILE *f = popen("find /sys/fs/cgroup -maxdepth 4 -name 'moonrl-*' -type d 2>/dev/null", "r");
  char mine[32];
  snprintf(mine, sizeof mine, "moonrl-%d-", (int)getpid());
  while (f && fgets(line, sizeof line, f)) CHECKF(!strstr(line, mine), "left: %s", line);
  if (f) pclose(f);
  cleanup();
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "--helper")) return helper(argc - 2, argv + 2);
  static const test_case tests[] = {
      {"pool probes the host and notes every protection", test_pool_reports_protections},
      {"exit codes and signals", test_exit_codes},
      {"stdin is the given bytes, else empty", test_stdin},
      {"stdout and stderr byte-exact (all 256 byte values)", test_output_byte_exact},
      {"files in /work; new and changed files come back", test_files_in_and_out},
      {"environment: PATH, HOME, LANG and the caller's extras only", test_environment},
      {"argv[0] is searched in PATH; a missing program is a setup error", test_program_lookup},
      {"output: head and tail kept at out_cap", test_output_head_and_tail},
      {"32 concurrent jobs driven by poll(2) on their fds", test_concurrent_jobs},
      {"a full pool queues jobs (FIFO); kill of running and queued jobs", test_queue_and_kill},
      {"bad arguments fail with messages", test_bad_arguments},
      {"require refuses missing protections; disable turns them off", test_require_and_disable},
      {"without a user namespace (root): host uid, mounts stay inside", test_without_user_namespace},
      {"bad input 1: fork bomb and thread bomb -> pids_limit", test_bad_01_fork_and_thread_bombs},
      {"bad input 2: memory bomb -> oom", test_bad_02_memory_bomb},
      {"bad input 3: huge untouched mmap -> refused or oom", test_bad_03_huge_mmap},
      {"bad input 4: busy loop -> cpu_limit", test_bad_04_busy_loop},
      {"bad input 5: sleep and blocked read -> timeout", test_bad_05_sleep_and_blocked_read},
      {"bad input 6: output flood -> output_limit, truncated", test_bad_06_output_flood},
      {"bad input 7: a grandchild holding stdout does not delay the call",
       test_bad_07_grandchild_keeps_stdout},
      {"bad input 8: reading stdin forever ends at EOF", test_bad_08_reads_stdin_forever},
      {"bad input 9: binary and invalid UTF-8 output byte-exact", test_bad_09_binary_output},
      {"bad input 10: writes outside /work fail, host files unchanged",
       test_bad_10_write_outside_workdir},
      {"bad input 11: filling the disk hits the file-size limit or a full tmpfs",
       test_bad_11_fill_the_disk},
      {"bad input 12: /etc/shadow, the engine's environ and homes are absent",
       test_bad_12_secrets_on_disk},
      {"bad input 13: secrets in the parent environment are invisible",
       test_bad_13_secrets_in_environment},
      {"bad input 14: no inherited fds beyond 0-2", test_bad_14_inherited_fds},
      {"bad input 15: /proc shows only the sandbox", test_bad_15_proc_shows_only_the_sandbox},
      {"bad input 16: network connects fail (no route)", test_bad_16_network},
      {"bad input 17: a setsid daemon is gone when the call returns", test_bad_17_daemon},
      {"bad input 18: the tool dies with the engine", test_bad_18_engine_dies},
      {"bad input 19: host processes cannot be signalled or traced",
       test_bad_19_signal_or_trace_the_host},
      {"bad input 20: ptrace, perf, bpf, userfaultfd, keyctl denied; kexec killed",
       test_bad_20_forbidden_system_calls},
      {"bad input 21: nested user namespaces are refused", test_bad_21_nested_user_namespace},
      {"bad input 22: a setuid binary gains nothing", test_bad_22_setuid_binary},
      {"bad input 23: huge argv is a setup error", test_bad_23_huge_argv},
      {"bad input 24: no zombies, no core dumps", test_bad_24_zombies_and_core_dumps},
      {"bad input 25: stopped processes are still killed and reaped", test_bad_25_stopped_process},
      {"pool free releases memory, processes and cgroups", test_everything_released},
      {NULL, NULL}};
  return check_main(argc, argv, tests);
}
