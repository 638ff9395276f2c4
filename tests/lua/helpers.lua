-- helpers.lua: shared helpers for the moonrl busted specs: naive nested-table maths (the test
-- oracles), approximate comparison, error capture, and running shell commands.
--
-- Load it from a spec in the same folder with
--   local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
--
-- Nothing here uses moonrl. A "nested table" is a plain Lua array of arrays of numbers, row-major
-- (a number alone is rank 0); a shape is a list of sizes; dims and indices are 1-based and a
-- negative dim counts from the end. The maths is written the slow, obvious way on purpose: it is
-- the reference the engine's results are checked against.
local H = {}

-- ---- paths --------------------------------------------------------------------------------

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

-- Repository root and build folder as given by the test runner (MOONRL_ROOT, MOONRL_BUILD);
-- without them, the root is found from this file's place and the build folder is <root>/build.
H.root = os.getenv("MOONRL_ROOT") or (here .. "/../..")
H.build = os.getenv("MOONRL_BUILD") or (H.root .. "/build")
H.moonrl = H.build .. "/moonrl" -- the moonrl command of that build

-- ---- shell --------------------------------------------------------------------------------

-- s quoted for a POSIX shell.
function H.shell_quote(s)
  return "'" .. (tostring(s):gsub("'", [['\'']])) .. "'"
end

-- Runs a shell command. Returns its output (stdout and stderr together), its exit code (128 + the
-- signal number when a signal killed it) and whether it exited with status 0.
function H.run(cmd)
  local f = assert(io.popen(cmd .. " 2>&1", "r"))
  local out = f:read("a")
  local ok, how, code = f:close()
  if how == "signal" then code = 128 + code end
  return out, code, ok == true
end

-- Runs a shell command line (pipelines and `;` lists too, all output captured); returns its
-- output and exit code.
function H.sh(cmd)
  local out, code = H.run("(" .. cmd .. ")")
  return out, code
end

-- Runs recipes/<name> with the command-line args (a string, already quoted) through moonrl run;
-- returns its output and exit code.
function H.recipe(name, args)
  local out, code = H.run(H.shell_quote(H.moonrl) .. " run " .. H.shell_quote(H.root .. "/recipes/" .. name)
    .. " " .. (args or ""))
  return out, code
end

-- run(dir [, extra]) for recipes/<name> with --smoke and --dir dir (through H.recipe): output,
-- exit code.
function H.smoke_runner(name)
  return function(dir, extra)
    return H.recipe(name, "--smoke " .. (extra or "") .. " --dir " .. H.shell_quote(dir))
  end
end

-- The part of out from the line that starts with head on, each line's last number (a seconds
-- column, which differs between runs) dropped; nil when out has no such line.
function H.table_without_seconds(out, head)
  local at = out:find("\n" .. head, 1, true)
  return at and (out:sub(at):gsub("%s+[%d.]+\n", "\n"):gsub("%s+[%d.]+$", "")) or nil
end

-- A one-turn environment named name (default "letter"): reward 1 and success when the reply
-- starts with a lowercase letter; with tool_call, such a reply is also marked info.tool_call (so
-- a step's tool-call rate is its success rate). The trainer specs' smallest learnable task.
function H.letter_env(name, tool_call)
  return {
    name = name or "letter",
    max_turns = 1,
    tasks = H.numbered_tasks,
    new = function()
      return {
        reset = function() return "say a letter" end,
        step = function(_, action)
          local ok = action:match("^%l") ~= nil
          return nil, ok and 1 or 0, true, { success = ok, tool_call = tool_call and ok or nil }
        end,
      }
    end,
  }
end

-- Plays actions through a new episode of env on task (rl.env.step, until done); returns the
-- turn records, the episode and the first observation.
function H.play(env, task, actions)
  local rl = require "moonrl"
  local inst, record = env.new(), {}
  local first = inst:reset(task, rl.rng(1))
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(env, inst, a, record)
    if done then break end
  end
  return record, inst, first
end

-- Writes text to a new temporary file and returns its path (the caller removes it).
function H.write_temp(text)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

-- A new empty directory (the caller removes it, e.g. H.sh("rm -rf " .. H.shell_quote(dir))).
-- Writes text to path (a Lua script a test loads here and runs in another process); returns path.
function H.script(path, text)
  local f = assert(io.open(path, "w"))
  assert(f:write(text))
  assert(f:close())
  return path
end

-- Runs the "cut" run of the script at path (loaded with H.root; its function(dir, name, extra))
-- with resume = true in another moonrl process, and asserts the process succeeded.
function H.resume_cut(path, dir)
  local out, _, ok = H.run_lua([[
    local runner = loadfile(arg[1])(arg[2])
    runner(arg[3], "cut", { resume = true })
  ]], path, H.root, dir)
  assert(ok, out)
end

-- A clock for rate limiters ({now =, sleep =}) that moves only when slept on; c.slept sums the
-- sleeps and c.t can be set to move it.
function H.fake_clock()
  local c = { t = 0, slept = 0 }
  c.now = function() return c.t end
  c.sleep = function(s)
    c.t = c.t + s
    c.slept = c.slept + s
  end
  return c
end

function H.tmpdir()
  local path = os.tmpname()
  os.remove(path)
  local _, code = H.sh("mkdir " .. H.shell_quote(path))
  assert(code == 0, "cannot create " .. path)
  return path
end

-- The bytes of the file at path, or nil when it cannot be opened.
function H.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  return text
end

-- tasks(split, n) for test environments: n tasks {i = 1} .. {i = n}.
function H.numbered_tasks(_, n)
  local t = {}
  for i = 1, n do t[i] = { i = i } end
  return t
end

-- The JSON values of a JSON-lines file (metrics.jsonl, episodes.jsonl), in order.
function H.read_json_lines(path)
  local json = require("moonrl").json
  local out = {}
  for line in io.lines(path) do out[#out + 1] = assert(json.decode(line)) end
  return out
end

-- Runs a Lua chunk in a fresh `moonrl run` process (so it gets its own engine and its own memory
-- figures), passing args on its command line. Returns output, exit code, ok as H.run does.
function H.run_lua(code, ...)
  local path = H.write_temp(code)
  local cmd = { H.shell_quote(H.moonrl), "run", H.shell_quote(path) }
  for _, a in ipairs({ ... }) do cmd[#cmd + 1] = H.shell_quote(a) end
  local out, status, ok = H.run(table.concat(cmd, " "))
  os.remove(path)
  return out, status, ok
end

-- Starts `moonrl serve --model model_dir --port 0 <args>` in the background; returns a handle
-- {base = "http://127.0.0.1:<port>", pid =, stop = fn() -> ok, how, code (SIGTERM, then what
-- its exit looked like)}.
function H.serve(model_dir, args)
  local cmd = string.format("echo $$; exec %s serve --model %s --port 0 %s", H.shell_quote(H.moonrl),
    H.shell_quote(model_dir), args or "")
  local proc = assert(io.popen("sh -c " .. H.shell_quote(cmd), "r"))
  local pid = assert(tonumber(proc:read("l")), "no pid")
  local line = assert(proc:read("l"), "moonrl serve printed nothing")
  local s = { pid = pid, base = assert(line:match("listening on (http://127%.0%.0%.1:%d+)"), line) }
  function s.stop()
    if not proc then return end
    os.execute("kill " .. pid)
    local ok, how, code = proc:close()
    proc = nil
    return ok, how, code
  end
  return s
end

-- ---- errors -------------------------------------------------------------------------------

-- The message of the error f(...) raises, as a string. Raises if f returns normally.
function H.error_of(f, ...)
  local ok, err = pcall(f, ...)
  if ok then error("expected an error, but the call returned normally", 2) end
  return tostring(err)
end

-- Checks that f() raises an error whose message contains each string of `wanted` (a string or a
-- list; found as plain text, not as patterns). Returns the message.
function H.assert_error(f, wanted)
  local ok, err = pcall(f)
  if ok then error("expected an error, but the call returned normally", 2) end
  local msg = tostring(err)
  for _, w in ipairs(type(wanted) == "table" and wanted or { wanted }) do
    if not msg:find(w, 1, true) then
      error(("the error message lacks %q:\n  %s"):format(w, msg), 2)
    end
  end
  return msg
end

-- ---- nested tables ------------------------------------------------------------------------

function H.is_nan(x) return x ~= x end

-- Shape of a nested table, read along its first elements ({} for a number). An empty table has
-- shape {0}: sizes after an empty dimension cannot be seen.
function H.shape_of(x)
  local shape = {}
  while type(x) == "table" do
    shape[#shape + 1] = #x
    x = x[1]
  end
  return shape
end

function H.numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- Row-major list of the numbers of nested table x, and x's shape. Raises on a ragged table.
function H.flatten(x)
  local shape, flat = H.shape_of(x), {}
  local function walk(v, d)
    if d > #shape then
      assert(type(v) == "number", "flatten: a leaf is not a number")
      flat[#flat + 1] = v
      return
    end
    assert(type(v) == "table" and #v == shape[d], "flatten: ragged nested table")
    for i = 1, #v do walk(v[i], d + 1) end
  end
  walk(x, 1)
  return flat, shape
end

-- Nested table of the given shape holding flat's numbers in row-major order (a number for {}).
function H.unflatten(flat, shape)
  local k = 0
  local function build(d)
    if d > #shape then
      k = k + 1
      return flat[k]
    end
    local t = {}
    for i = 1, shape[d] do t[i] = build(d + 1) end
    return t
  end
  return build(1)
end

-- The 1-based multi-index of the k-th (1-based, row-major) element of shape, and back.
function H.unravel(k, shape)
  local idx, rest = {}, k - 1
  for d = #shape, 1, -1 do
    idx[d] = rest % shape[d] + 1
    rest = rest // shape[d]
  end
  return idx
end

function H.ravel(idx, shape)
  local k = 0
  for d = 1, #shape do k = k * shape[d] + (idx[d] - 1) end
  return k + 1
end

-- A 1-based dim, with negative dims counted from the end of a rank-r shape.
function H.norm_dim(dim, r)
  return dim < 0 and dim + r + 1 or dim
end

-- f applied to every number of x (a nested table or a number).
function H.map(x, f)
  if type(x) ~= "table" then return f(x) end
  local t = {}
  for i = 1, #x do t[i] = H.map(x[i], f) end
  return t
end

-- {first, first + step, ...} up to last inclusive, like a numeric for loop.
function H.range(first, last, step)
  local t = {}
  for v = first, last, step or 1 do t[#t + 1] = v end
  return t
end

-- ---- elementwise with broadcasting ----------------------------------------------------------

-- Shape two shapes broadcast to (aligned at the last dim; a size of 1, or a missing leading dim,
-- stretches). nil and a message when they do not broadcast.
function H.broadcast_shape(sa, sb)
  local r = math.max(#sa, #sb)
  local out = {}
  for i = 1, r do
    local a, b = sa[i - (r - #sa)] or 1, sb[i - (r - #sb)] or 1
    if a ~= b and a ~= 1 and b ~= 1 then
      return nil, ("dimension %d: %d vs %d"):format(i, a, b)
    end
    out[i] = a == 1 and b or a
  end
  return out
end

-- f(x, y) elementwise over a and b (nested tables or numbers), with broadcasting.
function H.broadcast(a, b, f)
  local fa, sa = H.flatten(a)
  local fb, sb = H.flatten(b)
  local shape = assert(H.broadcast_shape(sa, sb))
  local r = #shape
  local function source(idx, s)
    local src = {}
    for j = 1, #s do src[j] = s[j] == 1 and 1 or idx[j + r - #s] end
    return H.ravel(src, s)
  end
  local out = {}
  for k = 1, H.numel(shape) do
    local idx = H.unravel(k, shape)
    out[k] = f(fa[source(idx, sa)], fb[source(idx, sb)])
  end
  return H.unflatten(out, shape)
end

-- ---- reductions ----------------------------------------------------------------------------

-- Reduces nested table x over dim: fold(list) gets the entries along dim and returns one or two
-- values; the results drop dim (or keep it with size 1 when keepdim). Returns one nested table
-- per value fold returns (numbers when the result has rank 0).
function H.reduce(x, dim, keepdim, fold)
  local flat, shape = H.flatten(x)
  dim = H.norm_dim(dim, #shape)
  local outer, oshape = {}, {}
  for i = 1, #shape do
    if i ~= dim then outer[#outer + 1] = shape[i] end
    if i ~= dim or keepdim then oshape[#oshape + 1] = i == dim and 1 or shape[i] end
  end
  local r1, r2 = {}, {}
  for k = 1, H.numel(outer) do
    local oidx, list = H.unravel(k, outer), {}
    for j = 1, shape[dim] do
      local idx = table.move(oidx, 1, dim - 1, 1, {})
      idx[dim] = j
      table.move(oidx, dim, #oidx, dim + 1, idx)
      list[j] = flat[H.ravel(idx, shape)]
    end
    r1[k], r2[k] = fold(list)
  end
  return H.unflatten(r1, oshape), H.unflatten(r2, oshape)
end

local function list_sum(list)
  local s = 0.0
  for _, v in ipairs(list) do s = s + v end
  return s
end

-- Value and 1-based position of the first maximum of list; NaN counts as the maximum.
local function list_max(list)
  local best, at = list[1], 1
  for i = 2, #list do
    if best ~= best then break end
    local v = list[i]
    if v > best or v ~= v then best, at = v, i end
  end
  return best, at
end

function H.sum(x, dim, keepdim) return (H.reduce(x, dim, keepdim, list_sum)) end

function H.mean(x, dim, keepdim)
  return (H.reduce(x, dim, keepdim, function(l) return list_sum(l) / #l end))
end

-- Maximum over dim and the 1-based index of its first occurrence.
function H.max(x, dim, keepdim) return H.reduce(x, dim, keepdim, list_max) end

function H.sum_all(x) return list_sum((H.flatten(x))) end

-- Maximum of all entries and its 1-based row-major position.
function H.max_all(x) return list_max((H.flatten(x))) end

-- Mean and (population) standard deviation of a list of numbers.
function H.mean_std(list)
  local m = list_sum(list) / #list
  local v = 0.0
  for _, x in ipairs(list) do v = v + (x - m) ^ 2 end
  return m, math.sqrt(v / #list)
end

-- ---- softmax ------------------------------------------------------------------------------

-- Applies f(list) -> list to every innermost list of x (its last dimension).
local function on_rows(x, f)
  if type(x[1]) == "table" then
    local t = {}
    for i = 1, #x do t[i] = on_rows(x[i], f) end
    return t
  end
  return f(x)
end

local function row_max(row)
  local m = -math.huge
  for _, v in ipairs(row) do if v > m then m = v end end
  return m
end

-- softmax along the last dimension, computed in double as exp(x - max) / sum.
function H.softmax(x)
  return on_rows(x, function(row)
    local m, s, out = row_max(row), 0.0, {}
    for i, v in ipairs(row) do
      out[i] = math.exp(v - m)
      s = s + out[i]
    end
    for i = 1, #out do out[i] = out[i] / s end
    return out
  end)
end

-- log_softmax along the last dimension: x - max - log(sum(exp(x - max))).
function H.log_softmax(x)
  return on_rows(x, function(row)
    local m, s, out = row_max(row), 0.0, {}
    for _, v in ipairs(row) do s = s + math.exp(v - m) end
    for i, v in ipairs(row) do out[i] = v - m - math.log(s) end
    return out
  end)
end

-- ---- matrices and layout --------------------------------------------------------------------

-- Transpose of a 2-D nested table.
function H.transpose(m)
  local t = {}
  for j = 1, #(m[1] or {}) do
    t[j] = {}
    for i = 1, #m do t[j][i] = m[i][j] end
  end
  return t
end

-- x with its last two dimensions swapped (rank >= 2).
function H.transpose_last(x)
  if #H.shape_of(x) == 2 then return H.transpose(x) end
  local t = {}
  for i = 1, #x do t[i] = H.transpose_last(x[i]) end
  return t
end

-- Matrix product by the textbook triple loop: a (..., M, K) times b (..., K, N) -> (..., M, N);
-- the leading (batch) dimensions broadcast. Needs K > 0 (an empty dimension hides the rest of
-- the shape from shape_of).
function H.matmul(a, b)
  local ra, rb = #H.shape_of(a), #H.shape_of(b)
  assert(ra >= 2 and rb >= 2, "matmul: operands need rank >= 2")
  local out = {}
  if ra == 2 and rb == 2 then
    local k = #b
    assert(#a[1] == k, "matmul: inner dimensions differ")
    for i = 1, #a do
      out[i] = {}
      for j = 1, #b[1] do
        local s = 0.0
        for p = 1, k do s = s + a[i][p] * b[p][j] end
        out[i][j] = s
      end
    end
  elseif ra > rb then
    for i = 1, #a do out[i] = H.matmul(a[i], b) end
  elseif rb > ra then
    for i = 1, #b do out[i] = H.matmul(a, b[i]) end
  else
    assert(#a == #b or #a == 1 or #b == 1, "matmul: batch dimensions do not broadcast")
    for i = 1, math.max(#a, #b) do
      out[i] = H.matmul(a[#a == 1 and 1 or i], b[#b == 1 and 1 or i])
    end
  end
  return out
end

-- Dimensions of x reordered: dimension i of the result is dimension perm[i] of x.
function H.permute(x, perm)
  local flat, shape = H.flatten(x)
  local oshape = {}
  for i, p in ipairs(perm) do oshape[i] = shape[p] end
  local out = {}
  for k = 1, H.numel(oshape) do
    local idx, src = H.unravel(k, oshape), {}
    for i, p in ipairs(perm) do src[p] = idx[i] end
    out[k] = flat[H.ravel(src, shape)]
  end
  return H.unflatten(out, oshape)
end

-- The entries of x at positions index (a list of 1-based indices) along dim.
function H.index_select(x, dim, index)
  local flat, shape = H.flatten(x)
  dim = H.norm_dim(dim, #shape)
  local oshape = table.move(shape, 1, #shape, 1, {})
  oshape[dim] = #index
  local out = {}
  for k = 1, H.numel(oshape) do
    local idx = H.unravel(k, oshape)
    idx[dim] = index[idx[dim]]
    out[k] = flat[H.ravel(idx, shape)]
  end
  return H.unflatten(out, oshape)
end

-- torch.gather: out has index's shape and out[i..., j, k...] = x[i..., index[i..., j, k...], k...]
-- along dim (1-based indices).
function H.gather(x, dim, index)
  local flat, shape = H.flatten(x)
  local iflat, ishape = H.flatten(index)
  dim = H.norm_dim(dim, #shape)
  local out = {}
  for k = 1, #iflat do
    local idx = H.unravel(k, ishape)
    idx[dim] = iflat[k]
    out[k] = flat[H.ravel(idx, shape)]
  end
  return H.unflatten(out, ishape)
end

-- ---- approximate comparison -------------------------------------------------------------------

-- Whether a and b (numbers or nested tables) have the same structure and every pair of numbers
-- satisfies |a - b| <= atol + rtol * |b| (NaN matches NaN; infinities must be equal).
-- tol: a number (used as both atol and rtol), or {atol =, rtol =}; default 1e-5.
-- Returns true, or false and a message naming the first mismatch and the largest difference.
function H.close(a, b, tol)
  local atol, rtol
  if type(tol) == "table" then
    atol, rtol = tol.atol or 0, tol.rtol or 0
  else
    atol = tol or 1e-5
    rtol = atol
  end
  local first, worst = nil, 0
  local function cmp(x, y, path)
    if type(x) == "number" and type(y) == "number" then
      local ok
      if x ~= x or y ~= y then
        ok = x ~= x and y ~= y
      elseif x == y then
        ok = true
      else
        local d = math.abs(x - y)
        ok = d <= atol + rtol * math.abs(y)
        if d == d and d > worst then worst = d end
      end
      if not ok and not first then first = ("at %s: got %s, expected %s"):format(path, x, y) end
      return
    end
    if type(x) ~= "table" or type(y) ~= "table" or #x ~= #y then
      if not first then
        first = ("at %s: got %s (length %s), expected %s (length %s)"):format(path, type(x),
          type(x) == "table" and #x or "-", type(y), type(y) == "table" and #y or "-")
      end
      return
    end
    for i = 1, #x do cmp(x[i], y[i], path .. "[" .. i .. "]") end
  end
  cmp(a, b, "top")
  if first then return false, ("%s (largest difference %g)"):format(first, worst) end
  return true
end

-- Raises (at the caller's level) unless H.close(actual, expected, tol) holds. what names the value
-- in the message.
function H.assert_close(actual, expected, tol, what)
  local ok, msg = H.close(actual, expected, tol)
  if not ok then error((what and what .. ": " or "") .. msg, 2) end
end

return H
