/* lua_core_module.c - entry point of the Lua C module moonrl/core.so for stock interpreters. */
#include "lua_internal.h"

__attribute__((visibility("default"))) int luaopen_moonrl_core(lua_State *L);

int luaopen_moonrl_core(lua_State *L) { return mrl__lua_open_core(L); }
