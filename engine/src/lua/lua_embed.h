/* lua_embed.h - the table of Lua modules compiled into the library (see scripts/embed_lua.lua). */
#ifndef MRL_LUA_EMBED_H
#define MRL_LUA_EMBED_H

#include <stddef.h>

typedef struct {
  const char *name;      /* module name for require, e.g. "moonrl" */
  const char *chunkname; /* "@lua/moonrl/init.lua": where the source lives in the repository */
  const char *source;
  size_t length;
} mrl_embedded_module;

/* Ends with an entry whose name is NULL. */
extern const mrl_embedded_module mrl__embedded_modules[];

#endif /* MRL_LUA_EMBED_H */
