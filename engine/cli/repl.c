/* repl.c - `moonrl repl`: a Lua prompt with readline editing, a history file, multi-line
 * statements, printing of bare expressions, tab completion of globals and fields, and Ctrl-C that
 * interrupts running code (or clears the line being typed) and returns to the prompt. */
#define _DEFAULT_SOURCE
#include "cli.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#define PROMPT "> "
#define PROMPT_MORE ">> "
#define HISTORY_LINES 1000

static lua_State *repl_L;

/* ---- evaluation ---- */

/* Calls moonrl.repl.<fn> with the values on top of the stack. */
static bool repl_helper(lua_State *L, const char *fn) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "moonrl.repl");
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    lua_pop(L, 1);
    return false;
  }
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  return lua_isfunction(L, -1);
}

static void print_results(lua_State *L, int base) {
  int n = lua_gettop(L) - base;
  if (n == 0) return;
  if (repl_helper(L, "format_results")) {
    lua_insert(L, base + 1);
    if (lua_pcall(L, n, 1, 0) == LUA_OK) {
      puts(lua_tostring(L, -1) ? lua_tostring(L, -1) : "");
    } else {
      fprintf(stderr, "%s\n", lua_tostring(L, -1));
    }
  } else {
    lua_pop(L, 1);
    for (int i = base + 1; i <= base + n; i++) {
      fputs(luaL_tolstring(L, i, NULL), stdout);
      lua_pop(L, 1);
      fputs(i < base + n ? "\t" : "\n", stdout);
    }
  }
  lua_settop(L, base);
}

/* Compiles `line` as an expression ("return ..."), else as a statement. Returns LUA_OK with the
 * chunk pushed, or the load error with the message pushed. */
static int compile(lua_State *L, const char *code) {
  const char *ret = lua_pushfstring(L, "return %s;", code);
  int rc = luaL_loadbuffer(L, ret, strlen(ret), "=stdin");
  lua_remove(L, -2);
  if (rc == LUA_OK) return rc;
  lua_pop(L, 1);
  return luaL_loadbuffer(L, code, strlen(code), "=stdin");
}

static bool incomplete(lua_State *L, int rc) {
  if (rc != LUA_ERRSYNTAX) return false;
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  static const char eof[] = "<eof>";
  return len >= sizeof eof - 1 && strcmp(msg + len - (sizeof eof - 1), eof) == 0;
}

static void execute(lua_State *L) {
  int base = lua_gettop(L) - 1; /* below the chunk */
  lua_pushcfunction(L, mrl__lua_traceback);
  lua_insert(L, base + 1);
  mrl_cli_catch_sigint(L);
  int rc = lua_pcall(L, 0, LUA_MULTRET, base + 1);
  mrl_cli_release_sigint();
  lua_remove(L, base + 1);
  if (rc != LUA_OK) {
    fprintf(stderr, "%s\n", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(error)");
    lua_settop(L, base);
    return;
  }
  fflush(stderr);
  print_results(L, base);
  fflush(stdout);
}

/* Feeds one line. Returns true when the buffer holds an unfinished statement. */
static bool feed(lua_State *L, char **buffered, const char *line) {
  char *code;
  if (*buffered) {
    size_t n = strlen(*buffered) + strlen(line) + 2;
    code = malloc(n);
    if (!code) return false;
    snprintf(code, n, "%s\n%s", *buffered, line);
    free(*buffered);
    *buffered = NULL;
  } else {
    code = strdup(line);
    if (!code) return false;
  }
  int top = lua_gettop(L);
  int rc = compile(L, code);
  if (incomplete(L, rc)) {
    lua_settop(L, top);
    *buffered = code;
    return true;
  }
  free(code);
  if (rc != LUA_OK) {
    fprintf(stderr, "%s\n", lua_tostring(L, -1));
    lua_settop(L, top);
    return false;
  }
  execute(L);
  lua_settop(L, top);
  return false;
}

/* ---- tab completion ---- */

static char **candidates;
static size_t n_candidates, next_candidate;

static void clear_candidates(void) {
  for (size_t i = 0; i < n_candidates; i++) free(candidates[i]);
  free(candidates);
  candidates = NULL;
  n_candidates = next_candidate = 0;
}

static char *candidate_generator(const char *text, int state) {
  (void)text;
  if (state == 0) next_candidate = 0;
  if (next_candidate < n_candidates) return strdup(candidates[next_candidate++]);
  return NULL;
}

static char **complete(const char *text, int start, int end) {
  (void)start;
  (void)end;
  rl_attempted_completion_over = 1; /* never fall back to file names */
  clear_candidates();
  lua_State *L = repl_L;
  int top = lua_gettop(L);
  if (!repl_helper(L, "complete")) {
    lua_settop(L, top);
    return NULL;
  }
  lua_pushstring(L, text);
  if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_istable(L, -1)) {
    size_t n = (size_t)luaL_len(L, -1);
    candidates = calloc(n ? n : 1, sizeof *candidates);
    for (size_t i = 0; candidates && i < n; i++) {
      lua_geti(L, -1, (lua_Integer)i + 1);
      const char *c = lua_tostring(L, -1);
      if (c && (candidates[n_candidates] = strdup(c)) != NULL) n_candidates++;
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top);
  rl_completion_append_character = '\0';
  return rl_completion_matches(text, candidate_generator);
}

/* ---- the terminal loop (readline's callback interface, so Ctrl-C is handled in the loop and
 * never inside a signal handler) ---- */

static volatile sig_atomic_t prompt_interrupted;
static char *pending;
static bool line_ready, at_eof;
static char *ready_line;

static void on_line(char *line) {
  if (!line) {
    at_eof = true;
  } else {
    ready_line = line;
    line_ready = true;
  }
}

static void on_prompt_sigint(int sig) {
  (void)sig;
  prompt_interrupted = 1;
}

static void catch_prompt_sigint(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_prompt_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

static const char *history_path(char *buf, size_t cap) {
  const char *env = getenv("MOONRL_HISTORY");
  if (env) return *env ? env : NULL;
  const char *home = getenv("HOME");
  if (!home || !*home) return NULL;
  snprintf(buf, cap, "%s/.moonrl_history", home);
  return buf;
}

static int terminal_loop(lua_State *L) {
  char hbuf[4096];
  const char *hist = history_path(hbuf, sizeof hbuf);
  using_history();
  if (hist) read_history(hist);
  rl_catch_signals = 0;
  rl_readline_name = "moonrl";
  rl_attempted_completion_function = complete;
  rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,+-*/%^#[]~";
  rl_completer_word_break_characters = rl_basic_word_break_characters;

  rl_callback_handler_install(PROMPT, on_line);
  catch_prompt_sigint();
  while (!at_eof) {
    fd_set fds;
    FD_ZERO(&fds);
    FD_SET(STDIN_FILENO, &fds);
    int r = select(STDIN_FILENO + 1, &fds, NULL, NULL, NULL);
    if (prompt_interrupted) {
      prompt_interrupted = 0;
      rl_free_line_state();
      rl_callback_sigcleanup();
      rl_callback_handler_remove();
      free(pending);
      pending = NULL;
      fputs("^C\n", stdout);
      rl_callback_handler_install(PROMPT, on_line);
      continue;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    rl_callback_read_char();
    if (!line_ready) continue;
    line_ready = false;
    char *line = ready_line;
    ready_line = NULL;
    if (*line) {
      add_history(line);
      if (hist) append_history(1, hist);
    }
    rl_callback_handler_remove(); /* restore the terminal while code runs */
    bool more = feed(L, &pending, line);
    free(line);
    catch_prompt_sigint();
    rl_callback_handler_install(more ? PROMPT_MORE : PROMPT, on_line);
  }
  rl_callback_handler_remove();
  if (hist) history_truncate_file(hist, HISTORY_LINES);
  fputs("\n", stdout);
  return 0;
}

/* ---- non-terminal input: the same evaluation, lines read with fgets ---- */

static int pipe_loop(lua_State *L) {
  char line[65536];
  fputs(PROMPT, stdout);
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    size_t n = strlen(line);
    if (n && line[n - 1] == '\n') line[n - 1] = '\0';
    bool more = feed(L, &pending, line);
    fputs(more ? PROMPT_MORE : PROMPT, stdout);
    fflush(stdout);
  }
  fputs("\n", stdout);
  return 0;
}

int mrl_cli_repl(mrl_script *s) {
  lua_State *L = mrl__script_lua(s);
  repl_L = L;
  if (isatty(STDIN_FILENO)) {
    const char *core;
    mrl_blas_info(&core, NULL, NULL, NULL);
    printf("moonrl %s (%s, OpenBLAS %s). rl = require \"moonrl\" is loaded. Ctrl-D exits.\n",
           mrl_version(), LUA_RELEASE, core);
  }
  /* the prompt starts with `rl` loaded */
  lua_getglobal(L, "require");
  lua_pushstring(L, "moonrl");
  if (lua_pcall(L, 1, 1, 0) == LUA_OK)
    lua_setglobal(L, "rl");
  else
    lua_pop(L, 1);
  int rc = isatty(STDIN_FILENO) ? terminal_loop(L) : pipe_loop(L);
  free(pending);
  pending = NULL;
  clear_candidates();
  signal(SIGINT, SIG_DFL);
  return rc;
}
