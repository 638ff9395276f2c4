/* script.h - internals of mrl_script shared with the moonrl command; not installed. */
#ifndef MRL_SCRIPT_H
#define MRL_SCRIPT_H

#include "lua_internal.h"

lua_State *mrl__script_lua(mrl_script *s);
mrl_engine *mrl__script_engine(mrl_script *s);
/* Calls the function below nargs arguments with a traceback handler; on error records the
 * message as the engine's last error (prefixed by fn) and pops it. */
mrl_status mrl__script_pcall(mrl_script *s, const char *fn, int nargs, int nresults);

#endif /* MRL_SCRIPT_H */
