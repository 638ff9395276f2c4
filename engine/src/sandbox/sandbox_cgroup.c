/* sandbox_cgroup.c - the sandbox's cgroups: finds the pids, memory and CPU controllers this
 * process may use (cgroup v1 hierarchies, or a v2 hierarchy whose controllers are delegated to
 * our cgroup), makes one directory per pool and one cgroup per job slot, writes limits, moves
 * processes in, reads the counters that classify a call (pids.max hits, OOM kills, CPU time),
 * and removes it all again.
 *
 * Layout. v1: <hierarchy>/<our cgroup>/moonrl-<pid>-<pool>/s<i> in each of the pids, memory and
 * cpuacct hierarchies. v2: the same slot directory with two children, r (the reaper) and t (the
 * tool, holding memory.max), since v2 processes live in leaves and the reaper must stay out of
 * the memory cgroup: it shares the engine's memory, so an OOM kill that picked it would kill the
 * engine too. In v1 the reaper likewise joins only the pids and cpuacct cgroups; the tool joins
 * the memory cgroup itself, before exec. Slots are reused from job to job: counters are read
 * before and after each job. */
#define _GNU_SOURCE
#include "sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CG_PATH 4096

static char *dup_str(mrl_sandbox *p, const char *s) {
  size_t n = strlen(s) + 1;
  char *c = mrl__alloc(p->engine, n);
  if (c) memcpy(c, s, n);
  return c;
}

static void free_str(mrl_sandbox *p, char *s) {
  if (s) mrl__free(p->engine, s, strlen(s) + 1);
}

/* Writes text into an existing file; 0 or -errno. */
static int write_text(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = write(fd, text, strlen(text));
  int err = n < 0 ? -errno : 0;
  close(fd);
  return err;
}

/* Reads at most cap-1 bytes of a small file into buf (NUL-terminated); false on failure. */
static bool read_text(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, buf, cap - 1);
  close(fd);
  if (n < 0) return false;
  buf[n] = '\0';
  return true;
}

/* The number after "key " at the start of a line of text (0 when absent). */
static uint64_t keyed_value(const char *text, const char *key) {
  size_t k = strlen(key);
  for (const char *line = text; line && *line;
       line = strchr(line, '\n'), line = line ? line + 1 : 0)
    if (strncmp(line, key, k) == 0 && line[k] == ' ') return strtoull(line + k + 1, NULL, 10);
  return 0;
}

/* Whether comma-separated list has item. */
static bool has_item(const char *list, const char *item) {
  size_t n = strlen(item);
  for (const char *s = list; s; s = strchr(s, ','), s = s ? s + 1 : 0)
    if (strncmp(s, item, n) == 0 && (s[n] == ',' || s[n] == '\0' || s[n] == ' ')) return true;
  return false;
}

/* Mount point of the cgroup v1 hierarchy with `controller` (or of the v2 hierarchy when
 * controller is NULL), and the cgroup of this process in it as a directory; false if none. */
static bool own_cgroup_dir(const char *controller, char *dir, size_t cap) {
  char mnt[CG_PATH] = "", root[CG_PATH] = "", line[8192];
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f) return false;
  while (fgets(line, sizeof line, f)) {
    /* id parent major:minor root mountpoint options ... - fstype source superoptions */
    char r[CG_PATH], m[CG_PATH], fstype[64], super[1024];
    const char *dash = strstr(line, " - ");
    if (!dash || sscanf(line, "%*s %*s %*s %4095s %4095s", r, m) != 2 ||
        sscanf(dash + 3, "%63s %*s %1023s", fstype, super) != 2)
      continue;
    bool match = controller ? strcmp(fstype, "cgroup") == 0 && has_item(super, controller)
                            : strcmp(fstype, "cgroup2") == 0;
    if (match) {
      snprintf(mnt, sizeof mnt, "%s", m);
      snprintf(root, sizeof root, "%s", r);
      break;
    }
  }
  fclose(f);
  if (!*mnt) return false;
  f = fopen("/proc/self/cgroup", "re");
  if (!f) return false;
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    /* hierarchy-id:controllers:path */
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    c2[1 + strcspn(c2 + 1, "\n")] = '\0';
    const char *controllers = c1 + 1, *path = c2 + 1;
    if (controller ? !has_item(controllers, controller) : *controllers != '\0') continue;
    /* the mount may show a subtree (a container's): the path must lie inside it */
    size_t rl = strcmp(root, "/") == 0 ? 0 : strlen(root);
    if (strncmp(path, root, rl) != 0 || (path[rl] != '/' && path[rl] != '\0')) break;
    const char *rest = path + rl;
    found = (size_t)snprintf(dir, cap, "%s%s", mnt, strcmp(rest, "/") ? rest : "") < cap;
  }
  fclose(f);
  return found;
}

/* Removes the directories pools of dead processes left in dir (after a crash). */
static void remove_stale(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    int pid;
    if (sscanf(e->d_name, "moonrl-%d-", &pid) != 1 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    char pool[CG_PATH];
    snprintf(pool, sizeof pool, "%s/%s", dir, e->d_name);
    DIR *pd = opendir(pool);
    struct dirent *s;
    while (pd && (s = readdir(pd))) {
      char sub[CG_PATH * 2];
      if (s->d_name[0] != 's') continue;
      snprintf(sub, sizeof sub, "%s/%s/r", pool, s->d_name);
      rmdir(sub);
      snprintf(sub, sizeof sub, "%s/%s/t", pool, s->d_name);
      rmdir(sub);
      snprintf(sub, sizeof sub, "%s/%s", pool, s->d_name);
      rmdir(sub);
    }
    if (pd) closedir(pd);
    rmdir(pool);
  }
  closedir(d);
}

/* Makes the pool's directory under the cgroup dir `own`; its path or NULL (errno set). */
static char *make_pool_dir(mrl_sandbox *p, const char *own) {
  char dir[CG_PATH];
  remove_stale(own);
  if ((size_t)snprintf(dir, sizeof dir, "%s/moonrl-%d-%lx", own, (int)getpid(),
                       (unsigned long)(uintptr_t)p) >= sizeof dir) {
    errno = ENAMETOOLONG;
    return NULL;
  }
  if (mkdir(dir, 0755) < 0 && errno != EEXIST) return NULL;
  char *s = dup_str(p, dir);
  if (!s) {
    rmdir(dir);
    errno = ENOMEM;
  }
  return s;
}

/* v2: the pool's one directory, whichever controllers it serves. */
static const char *v2_base(const mrl_sandbox *p) {
  return p->cg.pids_dir ? p->cg.pids_dir : p->cg.mem_dir ? p->cg.mem_dir : p->cg.cpu_dir;
}

static unsigned probe_v2(mrl_sandbox *p, unsigned want) {
  char own[CG_PATH], path[CG_PATH + 32], text[512];
  if (!own_cgroup_dir(NULL, own, sizeof own)) return 0;
  snprintf(path, sizeof path, "%s/cgroup.subtree_control", own);
  if (!read_text(path, text, sizeof text)) return 0;
  /* the controllers must already be delegated to our children: enabling them here would move
   * the rule "no processes in inner cgroups" onto our own cgroup */
  bool pids = strstr(text, "pids") != NULL, mem = strstr(text, "memory") != NULL;
  unsigned got = 0;
  if (!pids && !mem) {
    if (want & MRL_SANDBOX_PROT_PIDS)
      mrl__sb_note(p, MRL_SANDBOX_PROT_PIDS,
                   "cgroup v2: the pids controller is not delegated to %s", own);
    if (want & MRL_SANDBOX_PROT_MEMORY)
      mrl__sb_note(p, MRL_SANDBOX_PROT_MEMORY,
                   "cgroup v2: the memory controller is not delegated to %s", own);
    if (want & MRL_SANDBOX_PROT_CPU)
      mrl__sb_note(p, MRL_SANDBOX_PROT_CPU, "cgroup v2: no controllers are delegated to %s", own);
    return 0;
  }
  char *dir = make_pool_dir(p, own);
  if (!dir) return 0;
  snprintf(path, sizeof path, "%s/cgroup.subtree_control", dir);
  char enable[32] = "";
  if (pids && (want & MRL_SANDBOX_PROT_PIDS)) strcat(enable, "+pids ");
  if (mem && (want & MRL_SANDBOX_PROT_MEMORY)) strcat(enable, "+memory");
  if (*enable && write_text(path, enable) < 0) {
    rmdir(dir);
    free_str(p, dir);
    return 0;
  }
  p->cg.version = 2;
  if (pids && (want & MRL_SANDBOX_PROT_PIDS)) {
    p->cg.pids_dir = dup_str(p, dir);
    if (p->cg.pids_dir) got |= MRL_SANDBOX_PROT_PIDS;
  }
  if (mem && (want & MRL_SANDBOX_PROT_MEMORY)) {
    p->cg.mem_dir = dup_str(p, dir);
    if (p->cg.mem_dir) got |= MRL_SANDBOX_PROT_MEMORY;
  }
  if (want & MRL_SANDBOX_PROT_CPU) { /* cpu.stat exists in every v2 cgroup */
    p->cg.cpu_dir = dup_str(p, dir);
    if (p->cg.cpu_dir) got |= MRL_SANDBOX_PROT_CPU;
  }
  if (!p->cg.pids_dir && !p->cg.mem_dir && !p->cg.cpu_dir) rmdir(dir);
  free_str(p, dir);
  return got;
}

static bool host_has_swap(void) {
  char text[512];
  return read_text("/proc/swaps", text, sizeof text) && strchr(text, '\n') &&
         strchr(strchr(text, '\n') + 1, '/') != NULL;
}

unsigned mrl__sb_cgroup_probe(mrl_sandbox *p, unsigned want) {
  static const struct {
    unsigned bit;
    const char *controller;
  } v1[] = {{MRL_SANDBOX_PROT_PIDS, "pids"},
            {MRL_SANDBOX_PROT_MEMORY, "memory"},
            {MRL_SANDBOX_PROT_CPU, "cpuacct"}};
  unsigned got = 0;
  for (size_t i = 0; i < sizeof v1 / sizeof v1[0]; i++) {
    if (!(want & v1[i].bit)) continue;
    char own[CG_PATH];
    if (!own_cgroup_dir(v1[i].controller, own, sizeof own)) continue;
    char *dir = make_pool_dir(p, own);
    if (!dir) {
      mrl__sb_note(p, v1[i].bit, "cgroup v1 %s: cannot make a directory in %s: %s",
                   v1[i].controller, own, strerror(errno));
      continue;
    }
    p->cg.version = 1;
    *(v1[i].bit == MRL_SANDBOX_PROT_PIDS     ? &p->cg.pids_dir
      : v1[i].bit == MRL_SANDBOX_PROT_MEMORY ? &p->cg.mem_dir
                                             : &p->cg.cpu_dir) = dir;
    mrl__sb_note(p, v1[i].bit, "cgroup v1 %s", dir);
    got |= v1[i].bit;
  }
  if (p->cg.mem_dir) {
    char path[CG_PATH + 32];
    snprintf(path, sizeof path, "%s/memory.memsw.limit_in_bytes", p->cg.mem_dir);
    p->cg.swap = access(path, F_OK) == 0 && host_has_swap();
  }
  if (!got) got = probe_v2(p, want);
  if (p->cg.version == 2)
    for (unsigned bit = MRL_SANDBOX_PROT_PIDS; bit <= MRL_SANDBOX_PROT_CPU; bit <<= 1)
      if (got & bit) mrl__sb_note(p, bit, "cgroup v2 %s", v2_base(p));
  for (unsigned bit = MRL_SANDBOX_PROT_PIDS; bit <= MRL_SANDBOX_PROT_CPU; bit <<= 1)
    if ((want & bit) && !(got & bit) && !p->notes[__builtin_ctz(bit)])
      mrl__sb_note(p, bit,
                   "no cgroup controller for it is available to this process (a v1 "
                   "hierarchy, or v2 with the controller delegated)");
  return got;
}

/* The slot's directory in a pool directory (v2: with a child r or t). */
static void slot_dir(char *buf, size_t cap, const char *pool_dir, int slot, const char *child) {
  snprintf(buf, cap, "%s/s%d%s%s", pool_dir, slot, child ? "/" : "", child ? child : "");
}

static int make_slot(mrl_sandbox *p, int slot) {
  char dir[CG_PATH + 64], path[CG_PATH + 128];
  if (p->cg.version == 2) {
    int err;
    slot_dir(dir, sizeof dir, v2_base(p), slot, NULL);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return -errno;
    snprintf(path, sizeof path, "%s/cgroup.subtree_control", dir);
    if (p->cg.mem_dir && (err = write_text(path, "+memory")) < 0) return err;
    slot_dir(dir, sizeof dir, v2_base(p), slot, "r");
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return -errno;
    slot_dir(dir, sizeof dir, v2_base(p), slot, "t");
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return -errno;
    return 0;
  }
  const char *dirs[3] = {p->cg.pids_dir, p->cg.mem_dir, p->cg.cpu_dir};
  for (int i = 0; i < 3; i++) {
    if (!dirs[i]) continue;
    slot_dir(dir, sizeof dir, dirs[i], slot, NULL);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return -errno;
  }
  return 0;
}

static int write_number(const char *dir, const char *file, int64_t v) {
  char path[CG_PATH + 128], text[32];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  snprintf(text, sizeof text, "%lld", (long long)v);
  return write_text(path, text);
}

static int write_memory_limit(mrl_sandbox *p, const char *dir, int64_t old, int64_t bytes) {
  int err;
  if (p->cg.version == 2) {
    if ((err = write_number(dir, "memory.max", bytes)) < 0) return err;
    write_number(dir, "memory.swap.max", 0); /* absent without swap accounting */
    return 0;
  }
  /* v1 wants memsw >= limit at every moment */
  if (p->cg.swap && bytes > old &&
      (err = write_number(dir, "memory.memsw.limit_in_bytes", bytes)) < 0)
    return err;
  if ((err = write_number(dir, "memory.limit_in_bytes", bytes)) < 0) return err;
  if (p->cg.swap && bytes <= old &&
      (err = write_number(dir, "memory.memsw.limit_in_bytes", bytes)) < 0)
    return err;
  return 0;
}

mrl_status mrl__sb_cgroup_prepare(mrl_sandbox *p, int slot, int64_t mem_bytes, int64_t pids) {
  static const char fn[] = "mrl_sandbox";
  sb_slot *s = &p->slots[slot];
  char dir[CG_PATH + 64];
  int err;
  if (!p->cg.pids_dir && !p->cg.mem_dir && !p->cg.cpu_dir) return MRL_OK;
  if (!s->cg_made) {
    if ((err = make_slot(p, slot)) < 0)
      return mrl__fail(p->engine, MRL_ERR_IO, fn, "cannot make a job cgroup: %s", strerror(-err));
    s->cg_made = 1;
  }
  if (p->cg.pids_dir && s->cg_pids != pids) {
    slot_dir(dir, sizeof dir, p->cg.pids_dir, slot, NULL);
    /* the reaper is one of the processes */
    if ((err = write_number(dir, "pids.max", pids + 1)) < 0)
      return mrl__fail(p->engine, MRL_ERR_IO, fn, "cannot set pids.max: %s", strerror(-err));
    s->cg_pids = pids;
  }
  if (p->cg.mem_dir && s->cg_mem != mem_bytes) {
    slot_dir(dir, sizeof dir, p->cg.mem_dir, slot, p->cg.version == 2 ? "t" : NULL);
    if ((err = write_memory_limit(p, dir, s->cg_mem, mem_bytes)) < 0)
      return mrl__fail(p->engine, MRL_ERR_IO, fn, "cannot set the memory limit: %s",
                       strerror(-err));
    s->cg_mem = mem_bytes;
  }
  return MRL_OK;
}

int mrl__sb_cgroup_memcg_fd(mrl_sandbox *p, int slot) {
  char dir[CG_PATH + 64], path[CG_PATH + 128];
  if (!p->cg.mem_dir) return -1;
  slot_dir(dir, sizeof dir, p->cg.mem_dir, slot, p->cg.version == 2 ? "t" : NULL);
  snprintf(path, sizeof path, "%s/cgroup.procs", dir);
  return open(path, O_WRONLY | O_CLOEXEC);
}

mrl_status mrl__sb_cgroup_attach(mrl_sandbox *p, int slot, pid_t pid) {
  char dir[CG_PATH + 64], path[CG_PATH + 128], text[32];
  const char *dirs[2] = {p->cg.pids_dir, p->cg.cpu_dir};
  if (p->cg.version == 2) { /* one hierarchy: the reaper's leaf */
    dirs[0] = p->cg.pids_dir || p->cg.cpu_dir ? v2_base(p) : NULL;
    dirs[1] = NULL;
  }
  snprintf(text, sizeof text, "%d", (int)pid);
  for (int i = 0; i < 2; i++) {
    if (!dirs[i]) continue;
    slot_dir(dir, sizeof dir, dirs[i], slot, p->cg.version == 2 ? "r" : NULL);
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    int err = write_text(path, text);
    if (err < 0)
      return mrl__fail(p->engine, MRL_ERR_IO, "mrl_sandbox", "cannot join %s: %s", path,
                       strerror(-err));
  }
  return MRL_OK;
}

void mrl__sb_cgroup_counts(mrl_sandbox *p, int slot, sb_cgroup_counts *c) {
  char dir[CG_PATH + 64], path[CG_PATH + 128], text[1024];
  c->pids_max_events = c->oom_kills = 0;
  c->cpu_us = -1;
  if (p->cg.pids_dir) {
    slot_dir(dir, sizeof dir, p->cg.pids_dir, slot, NULL);
    snprintf(path, sizeof path, "%s/pids.events", dir);
    if (read_text(path, text, sizeof text)) c->pids_max_events = keyed_value(text, "max");
  }
  if (p->cg.mem_dir) {
    slot_dir(dir, sizeof dir, p->cg.mem_dir, slot, p->cg.version == 2 ? "t" : NULL);
    snprintf(path, sizeof path, "%s/%s", dir,
             p->cg.version == 2 ? "memory.events" : "memory.oom_control");
    if (read_text(path, text, sizeof text)) c->oom_kills = keyed_value(text, "oom_kill");
  }
  if (p->cg.cpu_dir) {
    slot_dir(dir, sizeof dir, p->cg.cpu_dir, slot, NULL);
    if (p->cg.version == 2) {
      snprintf(path, sizeof path, "%s/cpu.stat", dir);
      if (read_text(path, text, sizeof text)) c->cpu_us = (int64_t)keyed_value(text, "usage_usec");
    } else {
      snprintf(path, sizeof path, "%s/cpuacct.usage", dir);
      if (read_text(path, text, sizeof text))
        c->cpu_us = (int64_t)(strtoull(text, NULL, 10) / 1000);
    }
  }
}

void mrl__sb_cgroup_free(mrl_sandbox *p) {
  char dir[CG_PATH + 64];
  char *dirs[3] = {p->cg.pids_dir, p->cg.mem_dir, p->cg.cpu_dir};
  for (int i = 0; i < 3; i++) {
    if (!dirs[i]) continue;
    bool dup = false; /* v2: the same directory serves several controllers */
    for (int k = 0; k < i; k++) dup = dup || (dirs[k] && strcmp(dirs[k], dirs[i]) == 0);
    if (!dup) {
      for (int s = 0; s < p->nslots; s++) {
        if (!p->slots[s].cg_made) continue;
        if (p->cg.version == 2) {
          slot_dir(dir, sizeof dir, dirs[i], s, "r");
          rmdir(dir);
          slot_dir(dir, sizeof dir, dirs[i], s, "t");
          rmdir(dir);
        }
        slot_dir(dir, sizeof dir, dirs[i], s, NULL);
        rmdir(dir);
      }
      rmdir(dirs[i]);
    }
  }
  for (int i = 0; i < 3; i++) free_str(p, dirs[i]);
  p->cg.pids_dir = p->cg.mem_dir = p->cg.cpu_dir = NULL;
}
