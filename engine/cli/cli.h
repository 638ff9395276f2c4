/* cli.h - pieces of the moonrl command shared between its files. */
#ifndef MRL_CLI_H
#define MRL_CLI_H

#include "script.h"

/* Runs the interactive prompt until end of input; returns the process exit status. */
int mrl_cli_repl(mrl_script *s);

/* Installs the SIGINT handler that interrupts running Lua code (lua.c's technique: the handler
 * only sets a hook, and the hook raises "interrupted!" inside Lua). */
void mrl_cli_catch_sigint(lua_State *L);
void mrl_cli_release_sigint(void);

/* `moonrl serve` with its arguments (after "serve"); returns the process exit status. */
int mrl_cli_serve(int argc, char **argv);

#endif /* MRL_CLI_H */
