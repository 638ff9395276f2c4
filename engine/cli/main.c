/* main.c - the moonrl command: run a recipe, evaluate a chunk, start the REPL, print versions and
 * the environment that lets stock lua5.4 and luajit find the installed or built module. */
#define _DEFAULT_SOURCE
#include "cli.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MRL_PREFIX
#define MRL_PREFIX "/usr/local"
#endif

static const char usage[] =
    "usage: moonrl <command> [arguments]\n"
    "\n"
    "  run FILE [ARGS...]  run a Lua script; ARGS are in the global `arg` (arg[0] = FILE)\n"
    "  -e CODE [ARGS...]   run a chunk of Lua code\n"
    "  repl                interactive prompt (readline, history, tab completion, Ctrl-C)\n"
    "  serve --model DIR   OpenAI-compatible HTTP server for a model (moonrl serve --help)\n"
    "  report RUN_DIR...   write RUN_DIR/report.html: plots of every metric, the options and\n"
    "                      an episode browser, one self-contained page\n"
    "  runs [DIR]          a table of the runs in DIR (default runs): steps, held-out success\n"
    "                      before and after, time, reward; runs --compare A B: two side by side\n"
    "  version             print the versions of moonrl, Lua and OpenBLAS\n"
    "  env                 print shell exports so that lua5.4 and luajit find moonrl:\n"
    "                        eval \"$(moonrl env)\"\n"
    "  help                this text\n"
    "\n"
    "`moonrl FILE` runs FILE like `moonrl run FILE`. With no arguments, moonrl starts the REPL\n"
    "when standard input is a terminal and otherwise runs standard input as a script.\n"
    "A build with MPI (make MPI=1) runs data-parallel under mpirun -np N or srun: only rank 0\n"
    "writes to standard output (MOONRL_RANK_STDOUT=all: every rank), and a failure on one rank\n"
    "ends the whole job.\n"
    "Inside scripts: local rl = require \"moonrl\"\n";

/* ---- Ctrl-C while Lua code runs ---- */

static lua_State *volatile sigint_state;

static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}

static void on_sigint(int sig) {
  (void)sig;
  lua_State *L = sigint_state;
  if (L) lua_sethook(L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT, 1);
}

void mrl_cli_catch_sigint(lua_State *L) {
  sigint_state = L;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

void mrl_cli_release_sigint(void) {
  sigint_state = NULL;
  signal(SIGINT, SIG_DFL);
}

/* ---- paths ---- */

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Directory of the running executable (without the trailing slash). */
static bool exe_dir(char *buf, size_t cap) {
  ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  char *slash = strrchr(buf, '/');
  if (!slash) return false;
  *slash = '\0';
  return true;
}

static int cmd_env(void) {
  char dir[PATH_MAX], probe[PATH_MAX + 64];
  if (!exe_dir(dir, sizeof dir)) snprintf(dir, sizeof dir, "%s/bin", MRL_PREFIX);
  /* a build tree: <repo>/<build>/moonrl with <repo>/lua/moonrl/init.lua */
  snprintf(probe, sizeof probe, "%s/../lua/moonrl/init.lua", dir);
  if (is_file(probe)) {
    char root[PATH_MAX], build[PATH_MAX];
    snprintf(probe, sizeof probe, "%s/..", dir);
    if (!realpath(probe, root) || !realpath(dir, build)) return 1;
    printf("export LUA_PATH_5_4='%s/lua/?.lua;%s/lua/?/init.lua;;'\n", root, root);
    printf("export LUA_CPATH_5_4='%s/lib/lua/5.4/?.so;;'\n", build);
    printf("export LUA_PATH='%s/lua/?.lua;%s/lua/?.lua;;'\n", root, build);
    printf("export MOONRL_LIB='%s/libmoonrl.so.0'\n", build);
    printf("export PATH='%s':\"$PATH\"\n", build);
    return 0;
  }
  char prefix[PATH_MAX];
  snprintf(probe, sizeof probe, "%s/..", dir);
  if (!realpath(probe, prefix)) snprintf(prefix, sizeof prefix, "%s", MRL_PREFIX);
  printf("export LUA_PATH_5_4='%s/share/lua/5.4/?.lua;%s/share/lua/5.4/?/init.lua;;'\n", prefix,
         prefix);
  printf("export LUA_CPATH_5_4='%s/lib/lua/5.4/?.so;;'\n", prefix);
  printf("export LUA_PATH='%s/share/lua/5.1/?.lua;;'\n", prefix);
  printf("export MOONRL_LIB='%s/lib/libmoonrl.so.0'\n", prefix);
  return 0;
}

static int cmd_version(void) {
  const char *core, *config, *source;
  int threads;
  mrl_blas_info(&core, &threads, &config, &source);
  printf("moonrl %s (%s; OpenBLAS core %s chosen by %s, %d thread%s; comm: %s)\n", mrl_version(),
         LUA_RELEASE, core, source, threads, threads == 1 ? "" : "s", mrl_comm_backends());
  return 0;
}

static int report(mrl_script *s, mrl_status st) {
  if (st == MRL_OK) return 0;
  fprintf(stderr, "moonrl: %s\n", mrl_engine_last_error(mrl__script_engine(s)));
  return 1;
}

/* Runs a chunk (file, code string, or stdin when path is NULL and code is NULL). */
static int run(mrl_script *s, const char *path, const char *code, int argc, char **argv) {
  lua_State *L = mrl__script_lua(s);
  mrl_cli_catch_sigint(L);
  mrl_status st;
  if (code) {
    lua_createtable(L, argc, 0);
    for (int i = 0; i < argc; i++) {
      lua_pushstring(L, argv[i]);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setglobal(L, "arg");
    st = mrl_script_run(s, code, "=(command line)");
  } else {
    st = mrl_script_run_file(s, path ? path : "/dev/stdin", argc, (const char *const *)argv);
  }
  mrl_cli_release_sigint();
  return report(s, st);
}

/* A command written in Lua: require(module).main({args...}), which prints its own output and
 * messages and returns true, or false for a failure it has explained; an error it raises is
 * printed as "moonrl: <message>". */
static int run_tool(mrl_script *s, const char *module, int argc, char **argv) {
  lua_State *L = mrl__script_lua(s);
  mrl_cli_catch_sigint(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, module);
  int rc = 1;
  if (lua_pcall(L, 1, 1, 0) == LUA_OK) {
    lua_getfield(L, -1, "main");
    lua_createtable(L, argc, 0);
    for (int i = 0; i < argc; i++) {
      lua_pushstring(L, argv[i]);
      lua_rawseti(L, -2, i + 1);
    }
    if (lua_pcall(L, 1, 1, 0) == LUA_OK) rc = lua_toboolean(L, -1) ? 0 : 1;
  }
  if (rc && lua_type(L, -1) == LUA_TSTRING) fprintf(stderr, "moonrl: %s\n", lua_tostring(L, -1));
  lua_settop(L, 0);
  mrl_cli_release_sigint();
  return rc;
}

int main(int argc, char **argv) {
  const char *cmd = argc > 1 ? argv[1] : NULL;
  if (cmd && (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h"))) {
    fputs(usage, stdout);
    return 0;
  }
  if (cmd && (!strcmp(cmd, "version") || !strcmp(cmd, "--version"))) return cmd_version();
  if (cmd && !strcmp(cmd, "env")) return cmd_env();
  if (cmd && !strcmp(cmd, "serve")) return mrl_cli_serve(argc - 2, argv + 2);

  bool tool = cmd && (!strcmp(cmd, "report") || !strcmp(cmd, "runs"));
  bool known = !cmd || tool || !strcmp(cmd, "run") || !strcmp(cmd, "-e") || !strcmp(cmd, "repl");
  if (!known && !is_file(cmd)) {
    fprintf(stderr, "moonrl: unknown command or file '%s'\n\n%s", cmd, usage);
    return 2;
  }
  if (cmd && (!strcmp(cmd, "run") || !strcmp(cmd, "-e")) && argc < 3) {
    fprintf(stderr, "moonrl: %s needs %s\n\n%s", cmd, cmd[0] == '-' ? "CODE" : "FILE", usage);
    return 2;
  }

  mrl_engine *e;
  mrl_script *s;
  if (mrl_engine_new(&e) != MRL_OK) {
    fputs("moonrl: cannot create the engine (out of memory)\n", stderr);
    return 1;
  }
  if (mrl_script_new(e, &s) != MRL_OK) {
    fprintf(stderr, "moonrl: %s\n", mrl_engine_last_error(e));
    mrl_engine_free(e);
    return 1;
  }
  /* A build with MPI joins the MPI world before any script runs (as a singleton without
   * mpirun): ranks other than 0 keep quiet on standard output unless asked, so that a recipe's
   * progress and tables are printed once. */
  mrl_comm *comm = NULL;
  if (strstr(mrl_comm_backends(), "mpi") && !tool) {
    if (mrl_comm_new(e, &comm) != MRL_OK) {
      fprintf(stderr, "moonrl: %s\n", mrl_engine_last_error(e));
      mrl_script_free(s);
      mrl_engine_free(e);
      return 1;
    }
    const char *all = getenv("MOONRL_RANK_STDOUT");
    if (mrl_comm_rank(comm) > 0 && !(all && !strcmp(all, "all")) && !freopen("/dev/null", "w", stdout))
      fprintf(stderr, "moonrl: rank %d: cannot silence standard output\n", mrl_comm_rank(comm));
  }
  int rc;
  if (!cmd)
    rc = isatty(STDIN_FILENO) ? mrl_cli_repl(s) : run(s, NULL, NULL, 0, NULL);
  else if (!strcmp(cmd, "repl"))
    rc = mrl_cli_repl(s);
  else if (!strcmp(cmd, "run"))
    rc = run(s, argv[2], NULL, argc - 3, argv + 3);
  else if (!strcmp(cmd, "-e"))
    rc = run(s, NULL, argv[2], argc - 3, argv + 3);
  else if (tool)
    rc = run_tool(s, !strcmp(cmd, "report") ? "moonrl.report" : "moonrl.runs", argc - 2, argv + 2);
  else
    rc = run(s, cmd, NULL, argc - 2, argv + 2);
  fflush(stdout);
  if (rc != 0) mrl_comm_abort(rc); /* the other ranks would wait for this one for ever */
  mrl_script_free(s);
  mrl_comm_free(comm);
  mrl_engine_free(e);
  return rc;
}
