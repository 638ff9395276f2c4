-- blas_spec.lua - when no BLAS library loads (MOONRL_BLAS naming a missing file makes the loader
-- miss it), matmul still gives the right products through the naive kernel, one line on stderr
-- says so once per process, and rl.blas_info() reports it; each case is a child process, since
-- the library is loaded once per process.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

-- Runs code in a fresh `moonrl` process with env prefixed; returns its stdout and its stderr.
local function child(env, code)
  local err_path = os.tmpname()
  local out, status = H.run("(" .. env .. " " .. H.shell_quote(H.moonrl) .. " -e "
    .. H.shell_quote(code) .. " 2>" .. H.shell_quote(err_path) .. ")")
  local f = assert(io.open(err_path))
  local err = f:read("a")
  f:close()
  os.remove(err_path)
  assert.are.equal(0, status, out .. err)
  return out, err
end

-- two products (the second must not warn again), checked against the sum written out, then the
-- report
local PROBE = [[
local rl = require "moonrl"
local a = rl.tensor.from { { 1, 2, 3 }, { 4, 5, 6 } }
local b = rl.tensor.from { { 1, -1 }, { 0, 2 }, { 3, 1 } }
for _ = 1, 2 do
  local c = rl.tensor.matmul(a, b)
  for i = 1, 2 do
    for j = 1, 2 do
      local want = 0
      for k = 1, 3 do want = want + a:get(i, k) * b:get(k, j) end
      assert(c:get(i, j) == want, "product entry " .. i .. "," .. j)
    end
  end
end
local info = rl.blas_info()
print(info.core .. "|" .. info.source .. "|" .. info.config)
]]

local function count(text, pattern)
  local n = 0
  for _ in text:gmatch(pattern) do n = n + 1 end
  return n
end

describe("without a BLAS library", function()
  it("multiplies with the naive kernel, says so once on stderr and in rl.blas_info()", function()
    local out, err = child("MOONRL_BLAS=/nonexistent/libopenblas.so.0", PROBE)
    local core, source, config = out:match("^([^|]*)|([^|]*)|([^\n]*)\n$")
    assert.are.equal("none", core)
    assert.are.equal("none", source)
    assert.truthy(config:find("naive reference kernel", 1, true), config)
    assert.truthy(config:find("/nonexistent/libopenblas.so.0", 1, true), config)
    assert.are.equal(1, count(err, "moonrl: [^\n]*naive reference kernel[^\n]*\n"), err)
    assert.truthy(err:find("/nonexistent/libopenblas.so.0", 1, true), err)
    assert.truthy(err:find("MOONRL_BLAS", 1, true), err)
  end)

  it("names a library that loads but has no cblas_sgemm", function()
    local out, err = child("MOONRL_BLAS=libm.so.6", PROBE)
    assert.truthy(out:find("^none|none|naive reference kernel %(no BLAS: libm%.so%.6 has no cblas_sgemm%)"), out)
    assert.are.equal(1, count(err, "libm%.so%.6 has no cblas_sgemm"), err)
  end)
end)

describe("with OpenBLAS", function()
  it("loads it (by default or named in MOONRL_BLAS) and says nothing", function()
    if rl.blas_info().source == "none" then
      pending("this host has no OpenBLAS")
      return
    end
    for _, env in ipairs { "env -u MOONRL_BLAS", "MOONRL_BLAS=libopenblas.so.0" } do
      local out, err = child(env, PROBE)
      assert.truthy(not out:find("^none|"), out)
      assert.are.equal("", err)
    end
  end)
end)
