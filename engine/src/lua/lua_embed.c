/* lua_embed.c - registers the Lua modules compiled into the library as package.preload loaders. */
#include "lua_embed.h"
#include "lua_internal.h"

/* package.preload loader: upvalue 1 is the module's index in mrl__embedded_modules. */
static int load_embedded(lua_State *L) {
  const mrl_embedded_module *m = &mrl__embedded_modules[lua_tointeger(L, lua_upvalueindex(1))];
  if (luaL_loadbufferx(L, m->source, m->length, m->chunkname, "t") != LUA_OK) return lua_error(L);
  lua_pushstring(L, m->name);
  lua_call(L, 1, 1);
  return 1;
}

void mrl__lua_preload_embedded(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  for (lua_Integer i = 0; mrl__embedded_modules[i].name; i++) {
    lua_pushinteger(L, i);
    lua_pushcclosure(L, load_embedded, 1);
    lua_setfield(L, -2, mrl__embedded_modules[i].name);
  }
  lua_pop(L, 1);
}
