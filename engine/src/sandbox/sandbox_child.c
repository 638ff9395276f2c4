/* sandbox_child.c - what runs inside a sandbox: the reaper (pid 1 of the new namespaces), which
 * builds the root, starts the tool, reaps every process and reports through a pipe; and the
 * tool's last steps before exec (or before the function of a function call).
 *
 * The reaper is cloned with CLONE_VM: it shares the engine's memory and the engine thread's
 * thread-local storage, errno included. So this file makes raw system calls that return -errno
 * (sb_sys, never a libc wrapper), allocates nothing, and only reads the plan. */
#define _GNU_SOURCE
#include "sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

/* ---- raw system calls ---- */
#if defined(__x86_64__)
static inline long sb_sys(long n, long a, long b, long c, long d, long e, long f) {
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
}

long mrl__sb_clone(unsigned long flags, char *stack_top, int *pidfd, int (*fn)(void *), void *arg) {
  register long r10 __asm__("r10") = 0; /* child_tid */
  register long r8 __asm__("r8") = 0;   /* tls */
  register long r12 __asm__("r12") = (long)fn;
  register long r13 __asm__("r13") = (long)arg;
  long ret;
  /* The child resumes after `syscall` on its own stack with the registers it had: r12 and r13
   * carry fn and arg, and it never returns into C. */
  __asm__ volatile("syscall\n\t"
                   "test %%rax, %%rax\n\t"
                   "jnz 1f\n\t"
                   "xor %%ebp, %%ebp\n\t"
                   "and $-16, %%rsp\n\t"
                   "mov %%r13, %%rdi\n\t"
                   "call *%%r12\n\t"
                   "mov %%eax, %%edi\n\t"
                   "mov %[nr_exit], %%eax\n\t"
                   "syscall\n\t"
                   "hlt\n"
                   "1:"
                   : "=a"(ret)
                   : "0"((long)SYS_clone), "D"(flags), "S"(stack_top), "d"(pidfd), "r"(r10),
                     "r"(r8), "r"(r12), "r"(r13), [nr_exit] "i"(SYS_exit)
                   : "rcx", "r11", "memory");
  return ret;
}
#elif defined(__aarch64__)
static inline long sb_sys(long n, long a, long b, long c, long d, long e, long f) {
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  register long x4 __asm__("x4") = e;
  register long x5 __asm__("x5") = f;
  __asm__ volatile("svc #0"
                   : "+r"(x0)
                   : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                   : "memory");
  return x0;
}

long mrl__sb_clone(unsigned long flags, char *stack_top, int *pidfd, int (*fn)(void *), void *arg) {
  register long x8 __asm__("x8") = SYS_clone;
  register long x0 __asm__("x0") = (long)flags;
  register long x1 __asm__("x1") = (long)stack_top;
  register long x2 __asm__("x2") = (long)pidfd; /* parent_tid */
  register long x3 __asm__("x3") = 0;           /* tls */
  register long x4 __asm__("x4") = 0;           /* child_tid */
  register long x19 __asm__("x19") = (long)fn;
  register long x20 __asm__("x20") = (long)arg;
  __asm__ volatile("svc #0\n\t"
                   "cbnz x0, 1f\n\t"
                   "mov x29, xzr\n\t"
                   "mov x0, x20\n\t"
                   "blr x19\n\t"
                   "mov x8, %[nr_exit]\n\t"
                   "svc #0\n"
                   "1:"
                   : "+r"(x0)
                   : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x19),
                     "r"(x20), [nr_exit] "i"(SYS_exit)
                   : "x30", "memory");
  return x0;
}
#else
#error "the sandbox's raw system calls exist for x86_64 and aarch64 only"
#endif

#define L(x) ((long)(x))
#define sys1(n, a) sb_sys(n, L(a), 0, 0, 0, 0, 0)
#define sys2(n, a, b) sb_sys(n, L(a), L(b), 0, 0, 0, 0)
#define sys3(n, a, b, c) sb_sys(n, L(a), L(b), L(c), 0, 0, 0)
#define sys4(n, a, b, c, d) sb_sys(n, L(a), L(b), L(c), L(d), 0, 0)
#define sys5(n, a, b, c, d, e) sb_sys(n, L(a), L(b), L(c), L(d), L(e), 0)

static void sb_exit(int code) {
  for (;;) sys1(SYS_exit_group, code);
}

/* ---- strings without libc ---- */
static size_t sb_len(const char *s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}

static int sb_equal(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}

/* Appends s to buf (capacity cap, length *n), keeping a terminating NUL; cuts what does not
 * fit. */
static void sb_append(char *buf, size_t cap, size_t *n, const char *s) {
  while (*s && *n + 1 < cap) buf[(*n)++] = *s++;
  buf[*n] = '\0';
}

/* ---- reporting ---- */
static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    long w = sys3(SYS_write, fd, c, n);
    if (w == -EINTR) continue;
    if (w <= 0) return 0;
    c += w;
    n -= (size_t)w;
  }
  return 1;
}

static void report(const sb_plan *pl, uint32_t type, const char *name, size_t name_len,
                   uint64_t data_len) {
  sb_record r = {type, (uint32_t)name_len, data_len};
  write_all(pl->report_fd, &r, sizeof r);
  write_all(pl->report_fd, name, name_len);
}

/* Reports "what path" with the error err (negative) and returns err. */
static long fail(const sb_plan *pl, const char *what, const char *path, long err) {
  char msg[SB_NAME_MAX + 64];
  size_t n = 0;
  sb_append(msg, sizeof msg, &n, what);
  if (path) {
    sb_append(msg, sizeof msg, &n, " ");
    sb_append(msg, sizeof msg, &n, path);
  }
  report(pl, SB_REC_ERROR, msg, n, (uint64_t)-err);
  return err;
}

/* ---- the reaper's own setup ---- */

/* Closes every fd but the plan's. */
static long close_other_fds(const sb_plan *pl) {
  int keep[6] = {pl->sync_fd, pl->report_fd, pl->stdin_fd, pl->out_fd, pl->err_fd, pl->memcg_fd};
  int n = 6;
  for (int i = 1; i < n; i++) /* insertion sort, -1 first */
    for (int j = i; j > 0 && keep[j] < keep[j - 1]; j--) {
      int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  long from = 0;
  for (int i = 0; i <= n; i++) {
    long to = i < n ? keep[i] - 1L : (long)~0U;
    if (i < n && keep[i] < 0) continue;
    if (to >= from) {
      long r = sys3(SYS_close_range, from, to, 0);
      if (r == -ENOSYS) { /* before Linux 5.9: one by one, up to the fd limit */
        struct rlimit lim;
        if (sb_sys(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, L(&lim), 0, 0) < 0) return -ENOSYS;
        long end = (long)lim.rlim_cur - 1 < to ? (long)lim.rlim_cur - 1 : to;
        for (long fd = from; fd <= end; fd++) sys1(SYS_close, fd);
      } else if (r < 0) {
        return r;
      }
    }
    if (i < n) from = keep[i] + 1L;
  }
  return 0;
}

static long mount_at(const char *src, const char *dst, const char *type, unsigned long flags,
                     const char *opts) {
  return sb_sys(SYS_mount, L(src), L(dst), L(type), (long)flags, L(opts), 0);
}

static long make_empty_file(const char *path) {
  long fd = sys4(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return fd;
  sys1(SYS_close, fd);
  return 0;
}

/* Without mount_setattr (before Linux 5.12): each bind is remounted read-only, keeping the flags
 * the kernel locks (those of the source); submounts of a recursive bind stay as they were. */
static long remount_read_only(const sb_plan *pl) {
  long r =
      mount_at(NULL, SB_BASE, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);
  if (r < 0) return fail(pl, "remount read-only", SB_BASE, r);
  for (size_t i = 0; i < pl->nsteps; i++) {
    const sb_step *s = &pl->steps[i];
    if (s->kind != SB_STEP_BIND) continue;
    struct statfs sf;
    unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV;
    if (sys2(SYS_statfs, s->dst, &sf) == 0) {
      if (sf.f_flags & ST_NOEXEC) flags |= MS_NOEXEC;
      if (sf.f_flags & ST_NOATIME) flags |= MS_NOATIME;
      if (sf.f_flags & ST_NODIRATIME) flags |= MS_NODIRATIME;
      if (sf.f_flags & ST_RELATIME) flags |= MS_RELATIME;
    }
    if ((r = mount_at(NULL, s->dst, NULL, flags, NULL)) < 0)
      return fail(pl, "remount read-only", s->dst, r);
  }
  return 0;
}

/* Creates the parent directories of path[prefix..] (path is modified and restored). */
static void make_parents(char *path, size_t prefix) {
  for (size_t i = prefix; path[i]; i++) {
    if (path[i] != '/') continue;
    path[i] = '\0';
    sys3(SYS_mkdirat, AT_FDCWD, path, 0755);
    path[i] = '/';
  }
}

/* Writes the call's files into /work. */
static long write_inputs(const sb_plan *pl) {
  static const char work[] = "/work/";
  char path[SB_NAME_MAX + sizeof work];
  for (size_t i = 0; i < pl->nfiles; i++) {
    const mrl_sandbox_file *f = &pl->files[i];
    size_t n = 0;
    sb_append(path, sizeof path, &n, work);
    sb_append(path, sizeof path, &n, f->name);
    make_parents(path, sizeof work - 1);
    long fd = sys4(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                   0644);
    if (fd < 0) return fail(pl, "create the input file", f->name, fd);
    int ok = write_all((int)fd, f->data, f->len);
    sys1(SYS_close, fd);
    if (!ok) return fail(pl, "write the input file", f->name, -ENOSPC);
  }
  return 0;
}

/* Builds the read-only part of the new root on a tmpfs at SB_BASE and moves into it. */
static long build_root(const sb_plan *pl) {
  long r;
  if (pl->new_root_private && (r = mount_at(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) < 0)
    return fail(pl, "make the mounts private", NULL, r);
  if ((r = mount_at("tmpfs", SB_BASE, "tmpfs", MS_NOSUID | MS_NODEV,
                    "size=1m,nr_inodes=4096,mode=755")) < 0)
    return fail(pl, "mount the root tmpfs on", SB_BASE, r);
  for (size_t i = 0; i < pl->nsteps; i++) {
    const sb_step *s = &pl->steps[i];
    switch (s->kind) {
    case SB_STEP_DIR:
      if ((r = sys3(SYS_mkdirat, AT_FDCWD, s->dst, 0755)) < 0) return fail(pl, "mkdir", s->dst, r);
      break;
    case SB_STEP_SYMLINK:
      if ((r = sys3(SYS_symlinkat, s->src, AT_FDCWD, s->dst)) < 0)
        return fail(pl, "symlink", s->dst, r);
      break;
    case SB_STEP_FILE: {
      long fd = sys4(SYS_openat, AT_FDCWD, s->dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) return fail(pl, "create", s->dst, fd);
      int ok = write_all((int)fd, s->src, s->src_len);
      sys1(SYS_close, fd);
      if (!ok) return fail(pl, "write", s->dst, -EIO);
      break;
    }
    case SB_STEP_BIND:
    case SB_STEP_DEV: {
      r = s->is_dir ? sys3(SYS_mkdirat, AT_FDCWD, s->dst, 0755) : make_empty_file(s->dst);
      if (r < 0) return fail(pl, "make the mount point", s->dst, r);
      if (s->kind == SB_STEP_DEV) break; /* bound once the root is read-only */
      r = mount_at(s->src, s->dst, NULL, MS_BIND | MS_REC, NULL);
      if (r < 0) return fail(pl, "bind", s->src, r);
      break;
    }
    }
  }
  struct {
    uint64_t attr_set, attr_clr, propagation, userns_fd;
  } attr = {0x1 | 0x2 | 0x4 /* MOUNT_ATTR_RDONLY | NOSUID | NODEV */, 0, 0, 0};
  r = sb_sys(SYS_mount_setattr, AT_FDCWD, L(SB_BASE), AT_RECURSIVE, L(&attr), sizeof attr, 0);
  if (r == -ENOSYS)
    r = remount_read_only(pl);
  else if (r < 0)
    return fail(pl, "make the root read-only", NULL, r);
  if (r < 0) return r;
  for (size_t i = 0; i < pl->nsteps; i++) {
    const sb_step *s = &pl->steps[i];
    if (s->kind == SB_STEP_DEV && (r = mount_at(s->src, s->dst, NULL, MS_BIND, NULL)) < 0)
      return fail(pl, "bind", s->src, r);
  }
  if ((r = mount_at("tmpfs", SB_BASE "/work", "tmpfs", MS_NOSUID | MS_NODEV, pl->work_opts)) < 0)
    return fail(pl, "mount a tmpfs on", "/work", r);
  if ((r = mount_at("tmpfs", SB_BASE "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, pl->tmp_opts)) < 0)
    return fail(pl, "mount a tmpfs on", "/tmp", r);
  /* hidepid: a process the tool may not ptrace is invisible, and pid 1 is one (it keeps the
   * capabilities the tool drops); its /proc entries would show the engine's argv */
  if ((r = mount_at("proc", SB_BASE "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                    "hidepid=2")) < 0)
    return fail(pl, "mount proc on", "/proc", r);
  /* pivot_root(".", ".") stacks the old root on the new one; detaching it leaves the new */
  if ((r = sys1(SYS_chdir, SB_BASE)) < 0 || (r = sys2(SYS_pivot_root, ".", ".")) < 0 ||
      (r = sys2(SYS_umount2, ".", MNT_DETACH)) < 0)
    return fail(pl, "pivot into the new root", NULL, r);
  return 0;
}

/* The call's part of the root: the size of /work and /tmp when it is not the pool's, and the
 * input files. */
static long finish_root(const sb_plan *pl) {
  long r;
  static const char *const dirs[] = {"/work", "/tmp"};
  for (int i = 0; i < 2 && pl->resize_opts; i++)
    if ((r = mount_at(NULL, dirs[i], NULL, MS_REMOUNT | MS_NOSUID | MS_NODEV, pl->resize_opts)) < 0)
      return fail(pl, "resize the tmpfs", dirs[i], r);
  if ((r = write_inputs(pl)) < 0) return r;
  if ((r = sys1(SYS_chdir, "/work")) < 0) return fail(pl, "chdir", "/work", r);
  return 0;
}

/* ---- the tool ---- */
typedef struct tool_ctx {
  const sb_plan *pl;
  long err; /* exec mode: the failure, seen by the reaper after the vfork */
  const char *what;
} tool_ctx;

struct kernel_sigaction {
  void *handler;
  unsigned long flags;
  void *restorer;
  uint64_t mask;
};

/* Everything between the clone and the exec (or the function): signals, stdio, cgroup, session,
 * rlimits, identity, capabilities, no_new_privs, and the seccomp filter last. */
static long tool_prepare(const sb_plan *pl, const char **what) {
  long r;
  struct kernel_sigaction dfl = {SIG_DFL, 0, NULL, 0};
  for (int sig = 1; sig <= 64; sig++)
    if (sig != SIGKILL && sig != SIGSTOP) sys4(SYS_rt_sigaction, sig, &dfl, NULL, 8);
  *what = "join the memory cgroup";
  if (pl->memcg_fd >= 0 && (r = sys3(SYS_write, pl->memcg_fd, "0", 1)) < 0) return r;
  *what = "start a session";
  if ((r = sys1(SYS_setsid, 0)) < 0) return r;
  *what = "set up stdin, stdout and stderr";
  if ((r = sys3(SYS_dup3, pl->stdin_fd, 0, 0)) < 0 || (r = sys3(SYS_dup3, pl->out_fd, 1, 0)) < 0 ||
      (r = sys3(SYS_dup3, pl->err_fd, 2, 0)) < 0)
    return r;
  *what = "set the rlimits";
  for (int i = 0; i < pl->nrlimits; i++) {
    struct rlimit lim = {pl->rlimits[i].soft, pl->rlimits[i].hard};
    if ((r = sb_sys(SYS_prlimit64, 0, pl->rlimits[i].resource, L(&lim), 0, 0, 0)) < 0) return r;
  }
  if (pl->cpu_timer_us > 0) {
    struct itimerval t = {{0, 0}, {pl->cpu_timer_us / 1000000, pl->cpu_timer_us % 1000000}};
    if ((r = sys3(SYS_setitimer, ITIMER_PROF, &t, NULL)) < 0) return r;
  }
  *what = "drop privileges";
  if (pl->drop_groups && (r = sys2(SYS_setgroups, 0, NULL)) < 0) return r;
  if ((r = sys3(SYS_setresgid, pl->tool_gid, pl->tool_gid, pl->tool_gid)) < 0 ||
      (r = sys3(SYS_setresuid, pl->tool_uid, pl->tool_uid, pl->tool_uid)) < 0)
    return r;
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct caps[2] = {{0, 0, 0}, {0, 0, 0}};
  if ((r = sys2(SYS_capset, &hdr, caps)) < 0) return r;
  *what = "set no_new_privs";
  if ((r = sys5(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) < 0) return r;
  uint64_t none = 0;
  sys4(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
  *what = "install the seccomp filter";
  if (pl->filter && (r = sys3(SYS_prctl, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, pl->filter)) < 0)
    return r;
  return 0;
}

/* execve, searching PATH like execvp when argv[0] has no '/'. Returns the error. */
static long exec_argv(const sb_plan *pl) {
  const char *file = pl->argv[0];
  for (const char *c = file; *c; c++)
    if (*c == '/') return sys3(SYS_execve, file, pl->argv, pl->envp);
  char path[4096];
  long err = -ENOENT;
  const char *dir = pl->path;
  while (dir) {
    const char *end = dir;
    while (*end && *end != ':') end++;
    size_t n = 0, dlen = (size_t)(end - dir);
    if (dlen + sb_len(file) + 2 <= sizeof path) {
      for (size_t i = 0; i < dlen; i++) path[n++] = dir[i];
      if (dlen == 0) path[n++] = '.';
      path[n++] = '/';
      path[n] = '\0';
      sb_append(path, sizeof path, &n, file);
      long r = sys3(SYS_execve, path, pl->argv, pl->envp);
      if (r == -EACCES)
        err = r;
      else if (r != -ENOENT && r != -ENOTDIR)
        return r;
    }
    dir = *end ? end + 1 : NULL;
  }
  return err;
}

/* The exec-mode tool: a CLONE_VM | CLONE_VFORK child of the reaper on its own stack. */
static int tool_exec_main(void *arg) {
  tool_ctx *c = arg;
  long r = tool_prepare(c->pl, &c->what);
  if (r == 0) {
    c->what = "execute";
    r = exec_argv(c->pl);
  }
  c->err = r;
  return 127;
}

/* The function-mode tool: a forked copy (its memory is its own, so libc is usable here). */
static int tool_fn_main(void *arg) {
  tool_ctx *c = arg;
#if defined(__SANITIZE_ADDRESS__)
  /* tell AddressSanitizer which stack this is: the function may longjmp (Lua errors), and ASan
   * only cleans up after a longjmp on a stack it knows */
  void *fake = NULL;
  const void *old_lo;
  size_t old_size;
  __sanitizer_start_switch_fiber(&fake, c->pl->fn_stack_lo, c->pl->fn_stack_size);
  __sanitizer_finish_switch_fiber(fake, &old_lo, &old_size);
#endif
  const char *what;
  long r = tool_prepare(c->pl, &what);
  if (r < 0) {
    fail(c->pl, what, NULL, r);
    return 127;
  }
  sys3(SYS_close_range, 3, ~0U, 0);
  return c->pl->fn(c->pl->fn_ud);
}

/* ---- after the tool: reaping and the files of /work ---- */
static void account(sb_status *st, const struct rusage *ru) {
  st->cpu_us += (int64_t)ru->ru_utime.tv_sec * 1000000 + ru->ru_utime.tv_usec +
                (int64_t)ru->ru_stime.tv_sec * 1000000 + ru->ru_stime.tv_usec;
  if (ru->ru_maxrss > st->max_rss_kb) st->max_rss_kb = ru->ru_maxrss;
}

/* Whether the file at fd (size bytes) is an input file left as it was given. */
static int unchanged_input(const sb_plan *pl, const char *path, long fd, uint64_t size) {
  for (size_t i = 0; i < pl->nfiles; i++) {
    const mrl_sandbox_file *f = &pl->files[i];
    if (!sb_equal(f->name, path)) continue;
    if (f->len != size) return 0;
    char buf[4096];
    uint64_t off = 0;
    while (off < size) {
      long got = sys3(SYS_read, fd, buf, sizeof buf);
      if (got <= 0) return 0;
      for (long k = 0; k < got; k++)
        if (off + (uint64_t)k >= size || buf[k] != f->data[off + (uint64_t)k]) return 0;
      off += (uint64_t)got;
    }
    return 1;
  }
  return 0;
}

/* Sends one regular file under the budget; *truncated when it does not fit. */
static void send_file(const sb_plan *pl, int dirfd, const char *name, const char *path,
                      size_t path_len, uint64_t *budget, int *count, int *truncated) {
  long fd = sys4(SYS_openat, dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
  if (fd < 0) return;
  struct stat st;
  if (sys2(SYS_fstat, fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 0) {
    uint64_t size = (uint64_t)st.st_size;
    if (unchanged_input(pl, path, fd, size)) {
      sys1(SYS_close, fd);
      return;
    }
    if (*count >= SB_MAX_FILES || size > *budget) {
      *truncated = 1;
    } else if (sb_sys(SYS_lseek, fd, 0, SEEK_SET, 0, 0, 0) == 0) {
      report(pl, SB_REC_FILE, path, path_len, size);
      char buf[16384];
      uint64_t left = size;
      while (left > 0) { /* a file that shrank meanwhile is padded: the record says `size` */
        long got = sys3(SYS_read, fd, buf, left < sizeof buf ? left : sizeof buf);
        if (got <= 0) {
          for (size_t k = 0; k < sizeof buf; k++) buf[k] = 0;
          got = (long)(left < sizeof buf ? left : sizeof buf);
        }
        write_all(pl->report_fd, buf, (size_t)got);
        left -= (uint64_t)got;
      }
      *budget -= size;
      (*count)++;
    }
  }
  sys1(SYS_close, fd);
}

struct kernel_dirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

/* Walks /work depth-first and sends the regular files that are new or changed. */
static void collect_files(const sb_plan *pl) {
  struct level {
    long fd;
    size_t len; /* of the path to this directory */
    long nread, pos;
    union {
      char bytes[4096];
      uint64_t align;
    } buf;
  } lv[SB_MAX_DEPTH];
  char path[SB_NAME_MAX + 1];
  uint64_t budget = pl->files_cap;
  int count = 0, truncated = 0, depth = 0;
  lv[0].fd = sys4(SYS_openat, AT_FDCWD, "/work", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (lv[0].fd < 0) return;
  lv[0].len = 0;
  lv[0].nread = lv[0].pos = 0;
  for (;;) {
    struct level *d = &lv[depth];
    if (d->pos >= d->nread) {
      d->nread = sys3(SYS_getdents64, d->fd, d->buf.bytes, sizeof d->buf.bytes);
      d->pos = 0;
      if (d->nread <= 0) {
        sys1(SYS_close, d->fd);
        if (depth == 0) break;
        depth--;
        continue;
      }
    }
    struct kernel_dirent64 *e = (struct kernel_dirent64 *)(d->buf.bytes + d->pos);
    d->pos += e->d_reclen;
    const char *name = e->d_name;
    if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'))) continue;
    size_t n = d->len;
    path[n] = '\0';
    if (n > 0) sb_append(path, sizeof path, &n, "/");
    sb_append(path, sizeof path, &n, name);
    if (n + 1 >= sizeof path) { /* the path does not fit */
      truncated = 1;
      continue;
    }
    unsigned type = e->d_type;
    if (type == DT_UNKNOWN) {
      struct stat st;
      if (sb_sys(SYS_newfstatat, d->fd, L(name), L(&st), AT_SYMLINK_NOFOLLOW, 0, 0) < 0) continue;
      type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
    }
    if (type == DT_DIR) {
      long fd = sys4(SYS_openat, d->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
      if (fd < 0) continue;
      if (depth + 1 >= SB_MAX_DEPTH) {
        truncated = 1;
        sys1(SYS_close, fd);
        continue;
      }
      depth++;
      lv[depth].fd = fd;
      lv[depth].len = n;
      lv[depth].nread = lv[depth].pos = 0;
    } else if (type == DT_REG) {
      send_file(pl, (int)d->fd, name, path, n, &budget, &count, &truncated);
    }
  }
  if (truncated) report(pl, SB_REC_FILES_TRUNCATED, "", 0, 0);
}

/* ---- the reaper ---- */
/* Reads the next byte from the parent; 0 when it hung up. */
static char next_word(const sb_plan *pl) {
  char c;
  long r;
  while ((r = sys3(SYS_read, pl->sync_fd, &c, 1)) == -EINTR) {
  }
  return r == 1 ? c : 0;
}

int mrl__sb_reaper(void *arg) {
  const sb_plan *pl = arg;
  /* "w": the parent has written the id maps and joined us to the cgroups */
  if (next_word(pl) != 'w') sb_exit(1);
  sys1(SYS_setfsgid, pl->fs_gid);
  sys1(SYS_setfsuid, pl->fs_uid);
  /* set after the fs ids, whose change would clear it; a parent that died before this line has
   * hung up the sync socket */
  sys2(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL);
  struct pollfd pfd = {pl->sync_fd, POLLIN | POLLRDHUP, 0};
  struct timespec zero = {0, 0};
  if (sys5(SYS_ppoll, &pfd, 1, &zero, NULL, 8) > 0 &&
      (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR)))
    sb_exit(1);
  long r = close_other_fds(pl);
  if (r < 0) {
    fail(pl, "close the inherited fds", NULL, r);
    sb_exit(1);
  }
  /* the namespaces that need not exist at the clone are made here, off the parent's path */
  if ((r = sys1(SYS_unshare, pl->unshare_flags)) < 0) {
    fail(pl, "unshare the namespaces", NULL, r);
    sb_exit(1);
  }
  if (build_root(pl) < 0) sb_exit(1);
  if (pl->set_hostname) sys2(SYS_sethostname, "sandbox", 7);
  /* warm: ready for a call. "g": the call's part of the plan is in place */
  if (next_word(pl) != 'g') sb_exit(1);
  if (finish_root(pl) < 0) sb_exit(1);

  tool_ctx ctx = {pl, 0, ""};
  long tool = pl->fn ? mrl__sb_clone(SIGCHLD, NULL, NULL, tool_fn_main, &ctx)
                     : mrl__sb_clone(CLONE_VM | CLONE_VFORK | SIGCHLD, pl->tool_stack_top, NULL,
                                     tool_exec_main, &ctx);
  if (tool < 0) {
    fail(pl, "start the tool", NULL, tool);
    sb_exit(1);
  }
  if (ctx.err) fail(pl, ctx.what, sb_equal(ctx.what, "execute") ? pl->argv[0] : NULL, ctx.err);
  sys1(SYS_close, pl->stdin_fd);
  sys1(SYS_close, pl->out_fd);
  sys1(SYS_close, pl->err_fd);
  if (pl->memcg_fd >= 0) sys1(SYS_close, pl->memcg_fd);

  sb_status st = {0, 0, 0, 0};
  struct rusage ru;
  int ws = 0;
  for (;;) { /* orphans are reaped on the way */
    r = sb_sys(SYS_wait4, -1, L(&ws), __WALL, L(&ru), 0, 0);
    if (r == -EINTR) continue;
    if (r < 0) break;
    account(&st, &ru);
    if (r == tool) {
      st.wait_status = ws;
      break;
    }
  }
  /* the tool is gone: so is everything it left running */
  sys2(SYS_kill, -1, SIGKILL);
  while ((r = sb_sys(SYS_wait4, -1, L(&ws), __WALL, L(&ru), 0, 0)) > 0 || r == -EINTR)
    if (r > 0) account(&st, &ru);
  if (!ctx.err) collect_files(pl);
  report(pl, SB_REC_STATUS, "", 0, sizeof st);
  write_all(pl->report_fd, &st, sizeof st);
  return 0;
}
