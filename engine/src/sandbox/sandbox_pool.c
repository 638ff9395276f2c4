/* sandbox_pool.c - the sandbox pool: settings and defaults, what the host offers (namespaces
 * probed by cloning, cgroups, seccomp), the seccomp filter compiled once with libseccomp, the
 * plan of the read-only root built once from the allow-list, one trial call, and the pool's
 * release. */
#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif

static const char FN[] = "mrl_sandbox_new";

static const char *const protection_names[SB_NPROT] = {"user", "mount",   "pid",  "net",    "ipc",
                                                       "uts",  "seccomp", "pids", "memory", "cpu"};

const char *mrl_sandbox_protection_name(unsigned bit) {
  if (bit == 0 || (bit & (bit - 1)) || bit > MRL_SANDBOX_PROT_CPU) return NULL;
  return protection_names[__builtin_ctz(bit)];
}

unsigned mrl_sandbox_protections(const mrl_sandbox *p) { return p ? p->prot : 0; }

const char *mrl_sandbox_protection_note(const mrl_sandbox *p, unsigned bit) {
  if (!p || !mrl_sandbox_protection_name(bit)) return NULL;
  const char *n = p->notes[__builtin_ctz(bit)];
  return n ? n : "";
}

void mrl__sb_note(mrl_sandbox *p, unsigned bit, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  size_t len = strlen(buf) + 1;
  char *s = mrl__alloc(p->engine, len);
  if (!s) return;
  memcpy(s, buf, len);
  int i = __builtin_ctz(bit);
  if (p->notes[i]) mrl__free(p->engine, p->notes[i], strlen(p->notes[i]) + 1);
  p->notes[i] = s;
}

/* ---- limits ---- */
static const mrl_sandbox_limits default_limits = {
    .wall_ms = 10000,
    .cpu_ms = 10000,
    .mem_bytes = (int64_t)1 << 30,
    .pids = 64,
    .out_cap = (int64_t)1 << 20,
    .out_kill = (int64_t)64 << 20,
    .fsize = (int64_t)16 << 20,
    .nofile = 64,
    .disk_bytes = (int64_t)64 << 20,
    .files_cap = (int64_t)16 << 20,
};

/* Fills the zero fields of l from dflt; fails on a negative or absurd value. */
mrl_status mrl__sb_resolve_limits(mrl_engine *e, const char *fn, mrl_sandbox_limits *l,
                                  const mrl_sandbox_limits *dflt) {
  struct {
    int64_t *v;
    int64_t d, max;
    const char *name;
  } f[] = {{&l->wall_ms, dflt->wall_ms, (int64_t)86400000, "wall_ms"},
           {&l->cpu_ms, dflt->cpu_ms, (int64_t)86400000, "cpu_ms"},
           {&l->mem_bytes, dflt->mem_bytes, (int64_t)1 << 50, "mem_bytes"},
           {&l->pids, dflt->pids, 1 << 20, "pids"},
           {&l->out_cap, dflt->out_cap, (int64_t)1 << 40, "out_cap"},
           {&l->out_kill, dflt->out_kill, (int64_t)1 << 50, "out_kill"},
           {&l->fsize, dflt->fsize, (int64_t)1 << 50, "fsize"},
           {&l->nofile, dflt->nofile, 1 << 20, "nofile"},
           {&l->disk_bytes, dflt->disk_bytes, (int64_t)1 << 50, "disk_bytes"},
           {&l->files_cap, dflt->files_cap, (int64_t)1 << 40, "files_cap"}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    if (*f[i].v < 0 || *f[i].v > f[i].max)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "limits.%s = %lld: expected 0 (default) to %lld",
                       f[i].name, (long long)*f[i].v, (long long)f[i].max);
    if (*f[i].v == 0) *f[i].v = f[i].d;
  }
  if (l->nofile < 4) l->nofile = 4; /* stdio plus one */
  return MRL_OK;
}

/* ---- strings owned by the pool: a chain of chunks, so pointers into them stay put ---- */
enum { CHUNK = 16384 };

static const char *pool_str(mrl_sandbox *p, const char *s, size_t n) {
  /* a chunk begins with a pointer to the previous chunk and its size */
  if (!p->strings || p->strings_size + n + 1 > CHUNK) {
    size_t size = n + 1 + 2 * sizeof(size_t) > CHUNK ? n + 1 + 2 * sizeof(size_t) : CHUNK;
    char *c = mrl__alloc(p->engine, size);
    if (!c) return NULL;
    memcpy(c, &p->strings, sizeof p->strings);
    memcpy(c + sizeof(char *), &size, sizeof size);
    p->strings = c;
    p->strings_size = 2 * sizeof(size_t);
    if (size > CHUNK) p->strings_size = size - n - 1;
  }
  char *d = p->strings + p->strings_size;
  memcpy(d, s, n);
  d[n] = '\0';
  p->strings_size += n + 1;
  return d;
}

static void free_strings(mrl_sandbox *p) {
  while (p->strings) {
    char *prev;
    size_t size;
    memcpy(&prev, p->strings, sizeof prev);
    memcpy(&size, p->strings + sizeof(char *), sizeof size);
    mrl__free(p->engine, p->strings, size);
    p->strings = prev;
  }
}

/* ---- the plan of the root ---- */
typedef struct root_builder {
  mrl_sandbox *p;
  const char *dirs[SB_MAX_STEPS]; /* directories made so far (inside paths) */
  size_t ndirs;
  const char *covered[SB_MAX_STEPS]; /* binds and symlinks: nothing goes beneath them */
  size_t ncovered;
  mrl_status st;
} root_builder;

static sb_step *add_step(root_builder *b, int kind, const char *src, size_t src_len,
                         const char *inside) {
  mrl_sandbox *p = b->p;
  if (b->st) return NULL;
  if (p->nsteps == SB_MAX_STEPS) {
    b->st = mrl__fail(p->engine, MRL_ERR_INVALID, FN, "more than %d read-only paths", SB_MAX_STEPS);
    return NULL;
  }
  char dst[PATH_MAX + 8];
  snprintf(dst, sizeof dst, "%s%s", SB_BASE, inside);
  sb_step *s = &p->steps[p->nsteps];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->src = src ? pool_str(p, src, src_len) : NULL;
  s->src_len = src_len;
  s->dst = pool_str(p, dst, strlen(dst));
  if ((src && !s->src) || !s->dst) {
    b->st = mrl__fail(p->engine, MRL_ERR_NOMEM, FN, "out of memory");
    return NULL;
  }
  p->nsteps++;
  return s;
}

/* Whether inside path `path` lies at or beneath one of list[0..n). */
static bool beneath(const char *path, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++) {
    size_t k = strlen(list[i]);
    if (strncmp(path, list[i], k) == 0 && (path[k] == '/' || path[k] == '\0')) return true;
  }
  return false;
}

/* Makes the directories leading to inside path `path` (not path itself). */
static void add_parents(root_builder *b, const char *path) {
  char dir[PATH_MAX];
  for (const char *slash = strchr(path + 1, '/'); slash && !b->st; slash = strchr(slash + 1, '/')) {
    size_t n = (size_t)(slash - path);
    memcpy(dir, path, n);
    dir[n] = '\0';
    bool made = false;
    for (size_t i = 0; i < b->ndirs && !made; i++) made = strcmp(b->dirs[i], dir) == 0;
    if (made) continue;
    sb_step *s = add_step(b, SB_STEP_DIR, NULL, 0, dir);
    if (s) b->dirs[b->ndirs++] = s->dst + strlen(SB_BASE);
  }
}

static const char *const reserved[] = {"/work", "/tmp", "/proc", "/dev"};

/* Adds one host path (absolute, canonical parent). A missing default is skipped. */
static void add_host_path(root_builder *b, const char *path, bool user) {
  mrl_sandbox *p = b->p;
  struct stat st;
  if (beneath(path, b->covered, b->ncovered)) return;
  if (lstat(path, &st) < 0) {
    if (user)
      b->st = mrl__fail(p->engine, MRL_ERR_INVALID, FN, "ro_paths: %s: %s", path, strerror(errno));
    return;
  }
  add_parents(b, path);
  sb_step *s;
  if (S_ISLNK(st.st_mode)) {
    char target[PATH_MAX];
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) return;
    s = add_step(b, SB_STEP_SYMLINK, target, (size_t)n, path);
  } else if (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)) {
    s = add_step(b, SB_STEP_BIND, path, strlen(path), path);
    if (s) s->is_dir = S_ISDIR(st.st_mode);
  } else {
    if (user)
      b->st = mrl__fail(p->engine, MRL_ERR_INVALID, FN,
                        "ro_paths: %s is neither a directory, a file nor a symlink", path);
    return;
  }
  if (s) b->covered[b->ncovered++] = s->dst + strlen(SB_BASE);
}

static int compare_paths(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks a user path and gives its canonical form (the parent resolved) in out. */
/* Whether path is absolute, not "/", and has no empty, "." or ".." component. */
static bool normalized(const char *path) {
  if (path[0] != '/' || !path[1] || strlen(path) >= PATH_MAX) return false;
  for (const char *c = path + 1;; c++) {
    size_t k = strcspn(c, "/");
    if (k == 0 || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.')) return false;
    c += k;
    if (!*c) return true;
  }
}

static mrl_status canonical_user_path(mrl_sandbox *p, const char *path, char *out) {
  if (!normalized(path))
    return mrl__fail(p->engine, MRL_ERR_INVALID, FN,
                     "ro_paths: '%s' is not an absolute, normalized path other than /", path);
  char parent[PATH_MAX], real[PATH_MAX];
  const char *base = strrchr(path, '/');
  memcpy(parent, path, (size_t)(base - path));
  parent[base - path] = '\0';
  if (!realpath(*parent ? parent : "/", real))
    return mrl__fail(p->engine, MRL_ERR_INVALID, FN, "ro_paths: %s: %s", path, strerror(errno));
  if ((size_t)snprintf(out, PATH_MAX, "%s%s", strcmp(real, "/") ? real : "", base) >= PATH_MAX)
    return mrl__fail(p->engine, MRL_ERR_INVALID, FN, "ro_paths: %s: too long", path);
  if (beneath(out, reserved, sizeof reserved / sizeof reserved[0]))
    return mrl__fail(p->engine, MRL_ERR_INVALID, FN,
                     "ro_paths: %s would be hidden by the sandbox's own /work, /tmp, /proc or "
                     "/dev",
                     path);
  return MRL_OK;
}

static mrl_status build_root_plan(mrl_sandbox *p, const char *const *user_paths) {
  /* what programs in /usr need of /etc: the loader's cache, the alternatives' links, the time
   * zone, certificates (when the network is on); every bind costs each call */
  static const char *const defaults[] = {"/usr",
                                         "/bin",
                                         "/sbin",
                                         "/lib",
                                         "/lib32",
                                         "/lib64",
                                         "/libx32",
                                         "/etc/alternatives",
                                         "/etc/ld.so.cache",
                                         "/etc/localtime",
                                         "/etc/ssl",
                                         "/etc/os-release"};
  size_t nuser = 0;
  while (user_paths && user_paths[nuser]) nuser++;
  size_t total = nuser + sizeof defaults / sizeof defaults[0];
  p->steps = mrl__alloc(p->engine, SB_MAX_STEPS * sizeof *p->steps);
  root_builder *b = mrl__alloc(p->engine, sizeof *b);
  char **paths = mrl__alloc(p->engine, total * sizeof *paths);
  bool *is_user = mrl__alloc(p->engine, total * sizeof *is_user);
  mrl_status st = MRL_OK;
  size_t n = 0;
  if (!p->steps || !b || !paths || !is_user)
    st = mrl__fail(p->engine, MRL_ERR_NOMEM, FN, "out of memory");
  for (size_t i = 0; i < total && !st; i++) {
    char canon[PATH_MAX];
    const char *src = i < nuser ? user_paths[i] : defaults[i - nuser];
    if (i < nuser)
      st = canonical_user_path(p, src, canon);
    else
      snprintf(canon, sizeof canon, "%s", src);
    if (st) break;
    paths[n] = (char *)pool_str(p, canon, strlen(canon));
    is_user[n] = i < nuser;
    if (!paths[n]) st = mrl__fail(p->engine, MRL_ERR_NOMEM, FN, "out of memory");
    n++;
  }
  if (!st) {
    /* parents before children: a bind covers whatever was listed beneath it */
    for (size_t i = 1; i < n; i++) /* insertion sort keeps is_user with its path */
      for (size_t j = i; j > 0 && compare_paths(&paths[j - 1], &paths[j]) > 0; j--) {
        char *t = paths[j];
        paths[j] = paths[j - 1];
        paths[j - 1] = t;
        bool u = is_user[j];
        is_user[j] = is_user[j - 1];
        is_user[j - 1] = u;
      }
    memset(b, 0, sizeof *b);
    b->p = p;
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++) {
      sb_step *s = add_step(b, SB_STEP_DIR, NULL, 0, reserved[i]);
      if (s) b->dirs[b->ndirs++] = s->dst + strlen(SB_BASE);
    }
    for (size_t i = 0; i < n && !b->st; i++)
      if (i == 0 || strcmp(paths[i], paths[i - 1]) != 0) add_host_path(b, paths[i], is_user[i]);
    /* generated files: the tool's own user and host names */
    char passwd[256], group[256];
    snprintf(passwd, sizeof passwd,
             "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:%u:%u:sandbox:/work:/bin/sh\n"
             "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
             p->userns ? SB_INSIDE_ID : p->host_uid, p->userns ? SB_INSIDE_ID : p->host_gid);
    snprintf(group, sizeof group, "root:x:0:\nsandbox:x:%u:\nnogroup:x:65534:\n",
             p->userns ? SB_INSIDE_ID : p->host_gid);
    const struct {
      const char *path, *text;
    } gen[] = {{"/etc/passwd", passwd},
               {"/etc/group", group},
               {"/etc/hostname", "sandbox\n"},
               {"/etc/hosts", "127.0.0.1 localhost sandbox\n::1 localhost sandbox\n"}};
    for (size_t i = 0; i < sizeof gen / sizeof gen[0] && !b->st; i++) {
      if (beneath(gen[i].path, b->covered, b->ncovered)) continue;
      add_parents(b, gen[i].path);
      add_step(b, SB_STEP_FILE, gen[i].text, strlen(gen[i].text), gen[i].path);
    }
    static const char *const devs[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random",
                                       "/dev/urandom"};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0] && !b->st; i++) {
      struct stat ds;
      if (stat(devs[i], &ds) < 0 || !S_ISCHR(ds.st_mode)) continue;
      add_step(b, SB_STEP_DEV, devs[i], strlen(devs[i]), devs[i]);
    }
    static const char *const links[][2] = {{"/proc/self/fd", "/dev/fd"},
                                           {"/proc/self/fd/0", "/dev/stdin"},
                                           {"/proc/self/fd/1", "/dev/stdout"},
                                           {"/proc/self/fd/2", "/dev/stderr"}};
    for (size_t i = 0; i < sizeof links / sizeof links[0] && !b->st; i++)
      add_step(b, SB_STEP_SYMLINK, links[i][0], strlen(links[i][0]), links[i][1]);
    st = b->st;
  }
  if (b) mrl__free(p->engine, b, sizeof *b);
  if (paths) mrl__free(p->engine, paths, total * sizeof *paths);
  if (is_user) mrl__free(p->engine, is_user, total * sizeof *is_user);
  return st;
}

/* ---- seccomp ---- */
static mrl_status compile_filter(mrl_sandbox *p) {
  /* Denied with EPERM, so that programs see "Operation not permitted" and carry on: tracing
   * and reading other processes, kernel keyrings, BPF, userfaultfd, namespaces and mounts. */
  static const char *const eperm[] = {"ptrace",
                                      "process_vm_readv",
                                      "process_vm_writev",
                                      "process_madvise",
                                      "pidfd_getfd",
                                      "perf_event_open",
                                      "bpf",
                                      "userfaultfd",
                                      "keyctl",
                                      "add_key",
                                      "request_key",
                                      "mount",
                                      "umount",
                                      "umount2",
                                      "pivot_root",
                                      "chroot",
                                      "move_mount",
                                      "open_tree",
                                      "fsopen",
                                      "fsconfig",
                                      "fsmount",
                                      "fspick",
                                      "mount_setattr",
                                      "unshare",
                                      "setns",
                                      "open_by_handle_at",
                                      "fanotify_init",
                                      "quotactl",
                                      "quotactl_fd",
                                      "syslog",
                                      "io_uring_setup",
                                      "io_uring_enter",
                                      "io_uring_register",
                                      "uselib",
                                      "vm86",
                                      "vm86old",
                                      "lookup_dcookie",
                                      "nfsservctl"};
  /* Killing the process (status "seccomp"): calls no tool has a reason to make. */
  static const char *const kill[] = {
      "kexec_load",    "kexec_file_load", "init_module", "finit_module", "delete_module",
      "create_module", "reboot",          "swapon",      "swapoff",      "acct",
      "iopl",          "ioperm"};
  static const unsigned long ns_flags[] = {CLONE_NEWUSER,  CLONE_NEWNS,  CLONE_NEWPID,
                                           CLONE_NEWNET,   CLONE_NEWIPC, CLONE_NEWUTS,
                                           CLONE_NEWCGROUP};
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return mrl__fail(p->engine, MRL_ERR_NOMEM, FN, "seccomp_init failed");
  int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  for (size_t i = 0; i < sizeof eperm / sizeof eperm[0] && rc == 0; i++) {
    int nr = seccomp_syscall_resolve_name(eperm[i]);
    if (nr != __NR_SCMP_ERROR) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
  }
  for (size_t i = 0; i < sizeof kill / sizeof kill[0] && rc == 0; i++) {
    int nr = seccomp_syscall_resolve_name(kill[i]);
    if (nr != __NR_SCMP_ERROR) rc = seccomp_rule_add(ctx, SCMP_ACT_KILL_PROCESS, nr, 0);
  }
  /* clone3 passes its flags in memory, out of the filter's sight: ENOSYS makes libc fall back
   * to clone, whose flags it can see */
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  for (size_t i = 0; i < sizeof ns_flags / sizeof ns_flags[0] && rc == 0; i++)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
  /* pushing input into a terminal the tool shares with someone */
  if (rc == 0)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI));
  int fd = rc == 0 ? memfd_create("moonrl-seccomp", MFD_CLOEXEC) : -1;
  if (fd >= 0) rc = seccomp_export_bpf(ctx, fd);
  seccomp_release(ctx);
  off_t size = fd >= 0 && rc == 0 ? lseek(fd, 0, SEEK_END) : -1;
  if (size <= 0 || size % (off_t)sizeof(struct sock_filter) || size > 65536) {
    if (fd >= 0) close(fd);
    return mrl__fail(p->engine, MRL_ERR_UNSUPPORTED, FN, "cannot compile the seccomp filter (%d)",
                     rc);
  }
  p->filter_code = mrl__alloc(p->engine, (size_t)size);
  if (!p->filter_code) {
    close(fd);
    return mrl__fail(p->engine, MRL_ERR_NOMEM, FN, "out of memory");
  }
  ssize_t got = pread(fd, p->filter_code, (size_t)size, 0);
  close(fd);
  if (got != size) return mrl__fail(p->engine, MRL_ERR_IO, FN, "cannot read the seccomp filter");
  p->filter.len = (unsigned short)(size / (off_t)sizeof(struct sock_filter));
  p->filter.filter = p->filter_code;
  return MRL_OK;
}

/* ---- namespaces ---- */
static int probe_child(void *arg) {
  (void)arg;
  return 0;
}

/* Clones a child with these namespace flags (it exits at once); 0 or -errno. */
static long try_clone(mrl_sandbox *p, unsigned long flags) {
  sb_slot *s = &p->slots[0];
  mrl__sb_slot_stack_reset(p, 0);
  long pid = mrl__sb_clone(CLONE_VM | flags, s->stack + s->stack_size, NULL, probe_child, NULL);
  if (pid < 0) return pid;
  while (waitpid((pid_t)pid, NULL, __WALL) < 0 && errno == EINTR) {
  }
  return 0;
}

static void read_sysctl(const char *path, char *buf, size_t cap) {
  buf[0] = '\0';
  FILE *f = fopen(path, "re");
  if (!f) return;
  if (fgets(buf, (int)cap, f)) buf[strcspn(buf, "\n")] = '\0';
  fclose(f);
}

static mrl_status probe_namespaces(mrl_sandbox *p, unsigned want) {
  static const struct {
    unsigned bit;
    unsigned long flag;
  } optional[] = {{MRL_SANDBOX_PROT_NET, CLONE_NEWNET},
                  {MRL_SANDBOX_PROT_IPC, CLONE_NEWIPC},
                  {MRL_SANDBOX_PROT_UTS, CLONE_NEWUTS}};
  unsigned long base = CLONE_NEWNS | CLONE_NEWPID;
  long r = -EPERM;
  if (want & MRL_SANDBOX_PROT_USER) {
    r = try_clone(p, base | CLONE_NEWUSER);
    if (r == 0) {
      p->userns = 1;
      base |= CLONE_NEWUSER;
      mrl__sb_note(p, MRL_SANDBOX_PROT_USER, "tools run as uid %u inside, host uid %u",
                   SB_INSIDE_ID, p->host_uid);
    } else {
      char clone_sysctl[32], max[32];
      read_sysctl("/proc/sys/kernel/unprivileged_userns_clone", clone_sysctl, sizeof clone_sysctl);
      read_sysctl("/proc/sys/user/max_user_namespaces", max, sizeof max);
      mrl__sb_note(p, MRL_SANDBOX_PROT_USER,
                   "user namespaces are not available (%s; kernel.unprivileged_userns_clone=%s, "
                   "user.max_user_namespaces=%s)%s",
                   strerror((int)-r), *clone_sysctl ? clone_sysctl : "-", *max ? max : "-",
                   p->caller_root ? "; tools run as host uid in the other namespaces" : "");
    }
  } else {
    mrl__sb_note(p, MRL_SANDBOX_PROT_USER, "disabled by the caller");
  }
  if (!p->userns && !p->caller_root)
    return mrl__fail(p->engine, MRL_ERR_UNSUPPORTED, FN,
                     "the sandbox needs user namespaces or root, and this process has neither "
                     "(%s)",
                     p->notes[0] ? p->notes[0] : "");
  if (!p->userns && (r = try_clone(p, base)) < 0)
    return mrl__fail(p->engine, MRL_ERR_UNSUPPORTED, FN, "cannot make mount and pid namespaces: %s",
                     strerror((int)-r));
  p->prot |=
      MRL_SANDBOX_PROT_MOUNT | MRL_SANDBOX_PROT_PID | (p->userns ? MRL_SANDBOX_PROT_USER : 0);
  unsigned long all = base;
  for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
    if (want & optional[i].bit) all |= optional[i].flag;
  bool all_ok = try_clone(p, all) == 0;
  for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++) {
    if (!(want & optional[i].bit)) {
      mrl__sb_note(p, optional[i].bit, "disabled by the caller");
      continue;
    }
    static const char *const what[] = {"a network namespace with only a loopback interface, down",
                                       "a private System V IPC and POSIX queue namespace",
                                       "hostname \"sandbox\""};
    r = all_ok ? 0 : try_clone(p, base | optional[i].flag);
    if (r == 0)
      p->prot |= optional[i].bit, mrl__sb_note(p, optional[i].bit, "%s", what[i]);
    else
      mrl__sb_note(p, optional[i].bit, "the kernel refused the namespace: %s", strerror((int)-r));
  }
  mrl__sb_note(p, MRL_SANDBOX_PROT_MOUNT, "read-only %s, tmpfs /work and /tmp", "allow-list");
  mrl__sb_note(p, MRL_SANDBOX_PROT_PID, "a reaper is pid 1; fresh /proc");
  return MRL_OK;
}

/* ---- slots ---- */
enum { TOOL_STACK = 256 << 10, REAPER_STACK = 8 << 20 };

/* Maps a slot's stacks: guard page, the tool's stack, guard page, the reaper's stack (the
 * function-mode worker runs a Lua state on a copy of it). Pages are touched only when used. */
mrl_status mrl__sb_slot_stack(mrl_sandbox *p, int slot) {
  sb_slot *s = &p->slots[slot];
  if (s->stack) return MRL_OK;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t size = page + TOOL_STACK + page + REAPER_STACK;
  char *m = mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED)
    return mrl__fail(p->engine, MRL_ERR_NOMEM, "mrl_sandbox", "cannot map a stack: %s",
                     strerror(errno));
  mprotect(m, page, PROT_NONE);
  mprotect(m + page + TOOL_STACK, page, PROT_NONE);
  s->stack = m;
  s->stack_size = size;
  return MRL_OK;
}

char *mrl__sb_tool_stack_top(const mrl_sandbox *p, int slot) {
  return p->slots[slot].stack + (size_t)sysconf(_SC_PAGESIZE) + TOOL_STACK;
}

char *mrl__sb_reaper_stack(const mrl_sandbox *p, int slot, size_t *size) {
  *size = REAPER_STACK;
  return p->slots[slot].stack + p->slots[slot].stack_size - REAPER_STACK;
}

void mrl__sb_slot_stack_reset(mrl_sandbox *p, int slot) {
#if defined(__SANITIZE_ADDRESS__)
  /* AddressSanitizer poisons the red zones of a frame until it returns; the reaper's and the
   * tool's last frames never return (exit, exec) and their shadow is the engine's (CLONE_VM):
   * the stacks' used parts are cleared before the slot serves again */
  sb_slot *s = &p->slots[slot];
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  __asan_unpoison_memory_region(s->stack + page, TOOL_STACK);
  __asan_unpoison_memory_region(s->stack + s->stack_size - (256 << 10), 256 << 10);
#else
  (void)p;
  (void)slot;
#endif
}

/* ---- the trial call ---- */
static int trial_fn(void *ud) {
  (void)ud;
  return 0;
}

static mrl_status trial(mrl_sandbox *p) {
  mrl_sandbox_call call;
  memset(&call, 0, sizeof call);
  call.limits.wall_ms = 5000;
  mrl_sandbox_job *j = NULL;
  mrl_sandbox_result *r = NULL;
  mrl_status st = mrl__sandbox_start_fn(p, &call, trial_fn, NULL, &j);
  if (!st) st = mrl_sandbox_job_wait(j, &r);
  mrl_sandbox_job_free(j);
  if (st) return st;
  if (r->status != MRL_SANDBOX_EXITED || r->exit_code != 0)
    st = mrl__fail(p->engine, MRL_ERR_UNSUPPORTED, FN,
                   "the sandbox cannot be set up on this host: %s%s%s",
                   mrl_sandbox_status_name(r->status), *r->message ? ": " : "", r->message);
  mrl_sandbox_result_free(r);
  return st;
}

/* ---- the pool ---- */
static mrl_status check_config(mrl_engine *e, const mrl_sandbox_config *c) {
  if (c->max_jobs < 0 || c->max_jobs > 1024)
    return mrl__fail(e, MRL_ERR_INVALID, FN, "max_jobs = %d: expected 0 (default 32) to 1024",
                     c->max_jobs);
  if ((c->require | c->disable) & ~(unsigned)MRL_SANDBOX_PROT_ALL)
    return mrl__fail(e, MRL_ERR_INVALID, FN, "require/disable: unknown protection bits 0x%x",
                     (c->require | c->disable) & ~(unsigned)MRL_SANDBOX_PROT_ALL);
  if (c->disable & (MRL_SANDBOX_PROT_MOUNT | MRL_SANDBOX_PROT_PID))
    return mrl__fail(e, MRL_ERR_INVALID, FN,
                     "disable: mount and pid are the sandbox itself and cannot be turned off");
  if (c->require & c->disable)
    return mrl__fail(e, MRL_ERR_INVALID, FN, "a protection is both required and disabled");
  if (c->host_uid < 0 || c->host_uid > 0x7fffffff || c->host_gid < 0 || c->host_gid > 0x7fffffff)
    return mrl__fail(e, MRL_ERR_INVALID, FN,
                     "host_uid/host_gid: expected 1 to 2^31-1 (0: default)");
  return MRL_OK;
}

/* Frees what the pool holds (no job may run any more). */
static void pool_destroy(mrl_sandbox *p) {
  mrl_engine *e = p->engine;
  if (p->slots) mrl__sb_cool(p);
  mrl__sb_cgroup_free(p);
  for (int i = 0; i < p->nslots; i++)
    if (p->slots[i].stack) munmap(p->slots[i].stack, p->slots[i].stack_size);
  if (p->slots) mrl__free(e, p->slots, (size_t)p->nslots * sizeof *p->slots);
  if (p->steps) mrl__free(e, p->steps, SB_MAX_STEPS * sizeof *p->steps);
  free_strings(p);
  if (p->filter_code)
    mrl__free(e, p->filter_code, (size_t)p->filter.len * sizeof(struct sock_filter));
  for (int i = 0; i < SB_NPROT; i++)
    if (p->notes[i]) mrl__free(e, p->notes[i], strlen(p->notes[i]) + 1);
  if (p->epfd >= 0) close(p->epfd);
  if (p->ready_fd >= 0) close(p->ready_fd);
  mrl__free(e, p, sizeof *p);
  mrl__engine_release(e);
}

void mrl__sb_pool_release(mrl_sandbox *p) {
  if (--p->refs == 0) pool_destroy(p);
}

mrl_status mrl_sandbox_new(mrl_engine *e, const mrl_sandbox_config *config, mrl_sandbox **out) {
  if (!e || !out) return mrl__fail(e, MRL_ERR_NULL, FN, "%s is NULL", e ? "out" : "engine");
  mrl_sandbox_config c;
  memset(&c, 0, sizeof c);
  if (config) c = *config;
  mrl_status st = check_config(e, &c);
  if (st) return st;
  mrl_sandbox *p = mrl__alloc(e, sizeof *p);
  if (!p) return mrl__fail(e, MRL_ERR_NOMEM, FN, "out of memory");
  memset(p, 0, sizeof *p);
  p->engine = e;
  mrl__engine_retain(e);
  p->refs = 1;
  p->epfd = p->ready_fd = -1;
  p->lim = c.limits;
  st = mrl__sb_resolve_limits(e, FN, &p->lim, &default_limits);
  p->nslots = c.max_jobs ? c.max_jobs : 32;
  snprintf(p->work_opts, sizeof p->work_opts, "size=%lld,nr_inodes=65536,mode=755",
           (long long)p->lim.disk_bytes);
  snprintf(p->tmp_opts, sizeof p->tmp_opts, "size=%lld,nr_inodes=65536,mode=1777",
           (long long)p->lim.disk_bytes);
  p->caller_root = geteuid() == 0;
  p->host_uid = p->caller_root ? (c.host_uid ? (unsigned)c.host_uid : 65534u) : (unsigned)getuid();
  p->host_gid = p->caller_root ? (c.host_gid ? (unsigned)c.host_gid : 65534u) : (unsigned)getgid();
  if (!st) {
    p->slots = mrl__alloc(e, (size_t)p->nslots * sizeof *p->slots);
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->ready_fd = eventfd(1, EFD_CLOEXEC); /* readable for ever: never read */
    if (!p->slots)
      st = mrl__fail(e, MRL_ERR_NOMEM, FN, "out of memory");
    else if (p->epfd < 0 || p->ready_fd < 0)
      st = mrl__fail(e, MRL_ERR_IO, FN, "epoll/eventfd: %s", strerror(errno));
    else
      memset(p->slots, 0, (size_t)p->nslots * sizeof *p->slots);
  }
  if (!st) st = mrl__sb_slot_stack(p, 0);
  unsigned want =
      (MRL_SANDBOX_PROT_ALL & ~c.disable) | MRL_SANDBOX_PROT_MOUNT | MRL_SANDBOX_PROT_PID;
  if (!st) st = probe_namespaces(p, want);
  if (!st && (want & MRL_SANDBOX_PROT_SECCOMP)) {
    if (prctl(PR_GET_SECCOMP) < 0 && errno == EINVAL) {
      mrl__sb_note(p, MRL_SANDBOX_PROT_SECCOMP, "the kernel has no seccomp filters");
    } else {
      st = compile_filter(p);
      if (!st) {
        p->prot |= MRL_SANDBOX_PROT_SECCOMP;
        mrl__sb_note(p, MRL_SANDBOX_PROT_SECCOMP, "%u BPF instructions", p->filter.len);
      }
    }
  } else if (!st) {
    mrl__sb_note(p, MRL_SANDBOX_PROT_SECCOMP, "disabled by the caller");
  }
  if (!st) {
    unsigned cg_want =
        want & (MRL_SANDBOX_PROT_PIDS | MRL_SANDBOX_PROT_MEMORY | MRL_SANDBOX_PROT_CPU);
    for (unsigned bit = MRL_SANDBOX_PROT_PIDS; bit <= MRL_SANDBOX_PROT_CPU; bit <<= 1)
      if (!(cg_want & bit)) mrl__sb_note(p, bit, "disabled by the caller");
    p->prot |= mrl__sb_cgroup_probe(p, cg_want);
    st = build_root_plan(p, c.ro_paths);
  }
  if (!st && (c.require & ~p->prot)) {
    char missing[2048] = "";
    for (unsigned bit = 1; bit <= MRL_SANDBOX_PROT_CPU; bit <<= 1)
      if (c.require & ~p->prot & bit) {
        size_t n = strlen(missing);
        snprintf(missing + n, sizeof missing - n, "%s%s (%s)", n ? "; " : "",
                 mrl_sandbox_protection_name(bit), mrl_sandbox_protection_note(p, bit));
      }
    st = mrl__fail(e, MRL_ERR_UNSUPPORTED, FN, "required protections are not available: %s",
                   missing);
  }
  if (!st) st = trial(p);
  if (st) {
    pool_destroy(p);
    return st;
  }
  *out = p;
  return MRL_OK;
}

void mrl_sandbox_free(mrl_sandbox *p) {
  if (!p || p->user_freed) return;
  p->user_freed = 1;
  mrl__sb_pool_shutdown(p);
  mrl__sb_pool_release(p);
}
