-- build_spec.lua - how the Makefile finds Lua 5.4 (`make print-lua`): through pkg-config under
-- Debian's name (lua5.4) or Fedora's and Arch's (lua), only at version 5.4; Debian's paths when
-- pkg-config has no Lua 5.4 or is missing; LUA_INC and LUA_LIBS given by the user win. Each case
-- runs make against pkg-config files written here (PKG_CONFIG_LIBDIR), not the host's.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local function pc_dir(files)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir " .. H.shell_quote(dir)))
  for name, pc in pairs(files) do
    local f = assert(io.open(dir .. "/" .. name .. ".pc", "w"))
    f:write(("Name: Lua\nDescription: Lua language engine\nVersion: %s\nCflags: %s\nLibs: %s\n")
      :format(pc.version, pc.cflags, pc.libs))
    f:close()
  end
  return dir
end

-- The variables make settles on, as a table, with pkg-config reading only dir (nil: none at all).
local function found(dir, args)
  local env = dir and ("PKG_CONFIG_LIBDIR=" .. H.shell_quote(dir) .. " PKG_CONFIG_PATH= ")
    or "PKG_CONFIG=/nonexistent/pkg-config "
  local out, code = H.run("env -u MAKEFLAGS -u MAKELEVEL -u LUA_INC -u LUA_CFLAGS -u LUA_LIBS "
    .. env .. "make -s -C " .. H.shell_quote(H.root) .. " print-lua " .. (args or ""))
  assert.are.equal(0, code, out)
  local t = {}
  for k, v in out:gmatch("(LUA[%w_]*)=([^\n]*)") do t[k] = v:gsub("%s+$", "") end
  if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
  return t
end

local DEBIAN = { version = "5.4.4", cflags = "-I/usr/include/lua5.4", libs = "-llua5.4" }
local FEDORA = { version = "5.4.6", cflags = "", libs = "-llua" }
local OLD = { version = "5.3.6", cflags = "-I/usr/include/lua5.3", libs = "-llua5.3" }

describe("the Makefile's Lua", function()
  it("is Debian's lua5.4 through pkg-config, before a lua of another version", function()
    local t = found(pc_dir { ["lua5.4"] = DEBIAN, lua = OLD })
    assert.are.equal("lua5.4", t.LUA_PC)
    assert.are.equal("-I/usr/include/lua5.4", t.LUA_CFLAGS)
    assert.are.equal("-llua5.4", t.LUA_LIBS)
  end)

  it("is Fedora's and Arch's lua when that one is 5.4", function()
    local t = found(pc_dir { lua = FEDORA })
    assert.are.equal("lua", t.LUA_PC)
    assert.are.equal("", t.LUA_CFLAGS)
    assert.are.equal("-llua", t.LUA_LIBS)
  end)

  it("falls back to Debian's paths without a Lua 5.4 in pkg-config, or without pkg-config", function()
    for _, t in ipairs { found(pc_dir { lua = OLD }), found(nil) } do
      assert.are.equal("", t.LUA_PC)
      assert.are.equal("-I/usr/include/lua5.4", t.LUA_CFLAGS)
      assert.are.equal("-llua5.4", t.LUA_LIBS)
    end
  end)

  it("takes LUA_INC and LUA_LIBS from the user over pkg-config", function()
    local t = found(pc_dir { lua = FEDORA }, "LUA_INC=/opt/lua54/include LUA_LIBS=-llua54")
    assert.are.equal("-I/opt/lua54/include", t.LUA_CFLAGS)
    assert.are.equal("-llua54", t.LUA_LIBS)
  end)

  it("runs the build's scripts with a Lua 5.4 interpreter", function()
    local t = found(nil)
    local out = H.run(H.shell_quote(t.LUA) .. " -v")
    assert.truthy(out:find("^Lua 5%.4"), out)
  end)
end)
