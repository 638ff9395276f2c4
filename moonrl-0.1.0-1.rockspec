-- moonrl-0.1.0-1.rockspec - `luarocks --lua-version 5.4 make` from the source tree: builds the
-- Lua C module moonrl.core with the system's Lua 5.4 headers (OpenBLAS, libcurl, libseccomp and
-- libmicrohttpd from the system too: `make deps` installs them on Debian) and installs it with
-- the Lua modules (moonrl, moonrl.train, moonrl.report, ...) into the luarocks tree. The build
-- reuses the build/ folder of `make`. lpeg comes from the system (Debian's lua-lpeg) and is not
-- declared, so that the install needs no rocks server. The `moonrl` command is `make install`'s.
rockspec_format = "3.0"
package = "moonrl"
version = "0.1.0-1"
source = {
  url = "git+file:///dev/null", -- `luarocks make` builds the tree it is run in
}
description = {
  summary = "Reinforcement learning for language-model agents: a C11 engine under Lua 5.4",
  detailed = [[
moonrl trains language-model agents with reinforcement learning: tensors, a Llama-family policy,
batched multi-turn rollouts, advantages, losses and optimizers, a tool sandbox and an HTTP client
in C; environments, reward graphs, curricula and the trainer in Lua.]],
  labels = { "reinforcement-learning", "llm", "agents" },
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
build = {
  type = "make",
  build_target = "rock",
  build_variables = {
    LUA_INC = "$(LUA_INCDIR)",
    LUA = "$(LUA)",
  },
  install_target = "rock-install",
  install_variables = {
    INST_LIBDIR = "$(LIBDIR)",
    INST_LUADIR = "$(LUADIR)",
  },
}
