-- moonrl.recipe (rl.recipe): what recipes share around rl.train: command-line options
-- (`--name value`) checked against the recipe's defaults, the same recipe over several seeds
-- (`--seeds 3`), and the mean and spread of a table's numbers over those seeds.
--
--   local o = assert(rl.recipe.args(arg, { seed = 1, seeds = 1, steps = 60, arms = "a,b", quick = false }))
--   local runs = rl.recipe.over_seeds(o.seed, o.seeds, function(seed) return table_rows(seed) end)
--   for _, row in ipairs(rl.recipe.summarise(runs, "arm")) do print(row.arm, rl.recipe.pm(row.success)) end
--   rl.recipe.report(o.seed, o.seeds, one_seed, print_table)   -- per-seed tables, then the summary
local argcheck = require "moonrl.argcheck"
local core = require "moonrl.core"
local sftlib = require "moonrl.sft"
local seedlib = require "moonrl.train.seed"
local warmstart = require "moonrl.train.warmstart"

local M = {}

local function parse_value(name, text, default)
  if math.type(default) == "integer" then
    local v = math.tointeger(tonumber(text))
    if not v then return nil, string.format("--%s: an integer expected, got %q", name, text) end
    return v
  elseif type(default) == "number" then
    local v = tonumber(text)
    if not argcheck.finite(v) then return nil, string.format("--%s: a number expected, got %q", name, text) end
    return v
  elseif type(default) == "boolean" then
    if text == "true" then return true elseif text == "false" then return false end
    return nil, string.format("--%s: true or false expected, got %q", name, text)
  end
  return text
end

-- args(argv, defaults) -> options, or nil and a message. argv is a recipe's `arg` (a list of
-- strings; nil is none); defaults {name = value} names every option and gives its type: an
-- integer, a number, a string or a boolean (a flag: `--name` alone is true, `--name=false`
-- too). Each option is `--name value` or `--name=value`; an unknown name (with the nearest known
-- one), a value of the wrong type, a missing value or a bare word is an error.
function M.args(argv, defaults)
  if type(defaults) ~= "table" then
    error("rl.recipe.args: defaults: a table {name = default} expected, got " .. argcheck.describe(defaults), 2)
  end
  local known, out = {}, {}
  for k, v in pairs(defaults) do
    if type(k) ~= "string" or not ({ number = true, string = true, boolean = true })[type(v)] then
      error("rl.recipe.args: defaults: {name = number | string | boolean} expected, got a value at "
        .. argcheck.describe(k), 2)
    end
    known[#known + 1] = k
    out[k] = v
  end
  table.sort(known)
  argv = argv or {}
  local i = 1
  while i <= #argv do
    local word = argv[i]
    local name, value = tostring(word):match("^%-%-([%w_%-]+)=(.*)$")
    if not name then name = tostring(word):match("^%-%-([%w_%-]+)$") end
    if not name then
      return nil, string.format("%q: options are --name value (known: --%s)", tostring(word),
        table.concat(known, ", --"))
    end
    name = name:gsub("%-", "_")
    local default = defaults[name]
    if default == nil then
      local near = argcheck.nearest(name, known)
      return nil, string.format("unknown option --%s%s", name,
        near and string.format(" (did you mean --%s?)", near) or " (known: --" .. table.concat(known, ", --") .. ")")
    end
    if value == nil then
      if type(default) == "boolean" then
        value = "true"
      else
        i = i + 1
        value = argv[i]
        if value == nil then return nil, string.format("--%s: a value expected", name) end
      end
    end
    local v, err = parse_value(name, value, default)
    if err then return nil, err end
    out[name] = v
    i = i + 1
  end
  return out
end

-- over_seeds(first, n, fn) -> {fn(first), fn(first + 1), ..., fn(first + n - 1)}: the same
-- recipe body once per seed, in order.
function M.over_seeds(first, n, fn)
  if math.type(first) ~= "integer" then error("rl.recipe.over_seeds: first: an integer expected", 2) end
  if math.type(n) ~= "integer" or n < 1 then error("rl.recipe.over_seeds: n: a positive integer expected", 2) end
  local out = {}
  for k = 1, n do out[k] = fn(first + k - 1) end
  return out
end

-- warm_start{model =, data =, path =, seed =, epochs = 2, batch_size = 16, lr = 3e-3, warmup =
-- 10} -> the rl.sft result: the SFT start every arm of a recipe shares: rl.sft of model on data,
-- the optimizer state reset (each arm's AdamW starts afresh), and the weights saved to path
-- (model:save_checkpoint, its folder made) for each arm to load. Raises when the file cannot be
-- written.
local WARM = { model = true, data = true, path = true, seed = true, epochs = true, batch_size = true,
  lr = true, warmup = true }
function M.warm_start(o)
  if type(o) ~= "table" then error("rl.recipe.warm_start: a table {model =, data =, path =, ...} expected", 2) end
  for k in pairs(o) do
    if not WARM[k] then error("rl.recipe.warm_start: unknown option '" .. tostring(k) .. "'", 2) end
  end
  if type(o.path) ~= "string" or o.path == "" then error("rl.recipe.warm_start: path: a file name expected", 2) end
  local r = sftlib.sft { model = o.model, data = o.data, epochs = o.epochs or 2, batch_size = o.batch_size or 16,
    lr = o.lr or 3e-3, warmup = o.warmup or 10, seed = o.seed }
  o.model:reset_optimizer()
  local dir = o.path:match("^(.*)/[^/]*$")
  if dir and dir ~= "" then
    local ok, err = core.fs.mkdir(dir)
    if not ok then error("rl.recipe.warm_start: " .. tostring(err), 2) end
  end
  local ok, err = o.model:save_checkpoint(o.path)
  if not ok then error("rl.recipe.warm_start: " .. tostring(err), 2) end
  return r
end

-- oracle_start{env =, path =, new_model =, seed =, examples =, epochs =, reuse = false,
-- max_turns = env.max_turns} -> path, {seconds =, loss =, examples =}: the SFT start on an
-- environment's oracle that recipes share (a `start` for announced_start): with reuse and a file
-- at path, that file (examples 0, loss NaN: nothing trained); else new_model(seed) -> model,
-- tokenizer, trained on `examples` oracle demonstrations of env's training split
-- (rl.train.oracle_examples, drawn with mix(seed, 0x5EA)) by M.warm_start (seed mix(seed, 0x5F7))
-- and saved at path.
local ORACLE = { env = true, path = true, new_model = true, seed = true, examples = true, epochs = true,
  reuse = true, max_turns = true }
function M.oracle_start(o)
  if type(o) ~= "table" then error("rl.recipe.oracle_start: a table {env =, path =, ...} expected", 2) end
  for k in pairs(o) do
    if not ORACLE[k] then error("rl.recipe.oracle_start: unknown option '" .. tostring(k) .. "'", 2) end
  end
  if type(o.path) ~= "string" or o.path == "" then error("rl.recipe.oracle_start: path: a file name expected", 2) end
  if type(o.env) ~= "table" then error("rl.recipe.oracle_start: env: an environment module expected", 2) end
  if type(o.new_model) ~= "function" then error("rl.recipe.oracle_start: new_model: a function(seed) -> model, tokenizer expected", 2) end
  if math.type(o.seed) ~= "integer" then error("rl.recipe.oracle_start: seed: an integer expected", 2) end
  if math.type(o.examples) ~= "integer" or o.examples < 1 then error("rl.recipe.oracle_start: examples: a positive integer expected", 2) end
  local f = o.reuse and io.open(o.path, "rb")
  if f then
    f:close()
    return o.path, { seconds = 0, loss = 0 / 0, examples = 0 }
  end
  local m, tok = o.new_model(o.seed)
  local t0 = core.clock()
  local ctx = { cfg = { env = o.env, max_turns = o.max_turns or o.env.max_turns or 4 }, tokenizer = tok }
  local data = warmstart.oracle_examples(ctx, o.examples, seedlib.mix(o.seed, 0x5EA))
  local r = M.warm_start { model = m, data = data, epochs = o.epochs, path = o.path,
    seed = seedlib.mix(o.seed, 0x5F7) }
  return o.path, { seconds = core.clock() - t0, loss = r.final_loss, examples = #data }
end

-- announced_start(seed, start, epochs) -> path, sft: the warm start of one seed with its lines on
-- stdout: "seed <s>: SFT warm start ...", then start(seed) -> path, {examples =, loss =,
-- seconds =} (examples 0: a file reused), then "  SFT: reused <path>" or "  SFT: <examples>
-- examples x <epochs> epochs, final loss <loss>, <seconds> s".
function M.announced_start(seed, start, epochs)
  if math.type(seed) ~= "integer" then error("rl.recipe.announced_start: seed: an integer expected", 2) end
  if type(start) ~= "function" then error("rl.recipe.announced_start: start: a function(seed) -> path, sft expected", 2) end
  if math.type(epochs) ~= "integer" then error("rl.recipe.announced_start: epochs: an integer expected", 2) end
  print(string.format("seed %d: SFT warm start ...", seed))
  io.stdout:flush()
  local path, sft = start(seed)
  if type(path) ~= "string" or type(sft) ~= "table" then
    error("rl.recipe.announced_start: start must return a path and {examples =, loss =, seconds =}", 2)
  end
  if sft.examples == 0 then
    print("  SFT: reused " .. path)
  else
    print(string.format("  SFT: %d examples x %d epochs, final loss %.3f, %.0f s", sft.examples, epochs,
      sft.loss, sft.seconds))
  end
  io.stdout:flush()
  return path, sft
end

-- arms_of_seed(seed, start, epochs, arms, run_arm) -> rows: one seed of a recipe whose arms share a
-- warm start: announced_start(seed, start, epochs), then run_arm(seed, path, arm) -> row [,
-- start_row] for each arm in order; rows are the arms' rows, then the start rows they returned
-- (in arm order), and the line "seed <s>: <seconds> s" is printed at the end.
function M.arms_of_seed(seed, start, epochs, arms, run_arm)
  if type(arms) ~= "table" or #arms == 0 then error("rl.recipe.arms_of_seed: arms: a list of arm names expected", 2) end
  if type(run_arm) ~= "function" then
    error("rl.recipe.arms_of_seed: run_arm: a function(seed, path, arm) -> row [, start_row] expected", 2)
  end
  local t0 = core.clock()
  local path = M.announced_start(seed, start, epochs)
  local rows, starts = {}, {}
  for _, arm in ipairs(arms) do
    local row, first = run_arm(seed, path, arm)
    if type(row) ~= "table" then error("rl.recipe.arms_of_seed: run_arm returned no row for arm " .. tostring(arm), 2) end
    rows[#rows + 1] = row
    if first ~= nil then starts[#starts + 1] = first end
  end
  for _, r in ipairs(starts) do rows[#rows + 1] = r end
  print(string.format("seed %d: %.0f s", seed, core.clock() - t0))
  return rows
end

-- report(first, n, run, print_table) -> runs: over_seeds(first, n, run), run(seed) returning one
-- seed's rows; with n > 1 each seed's table is printed as it ends (print_table({rows},
-- "seed <s>")); then the table over all of them, print_table(runs, title), title "seed <first>"
-- or "seeds <first>-<last> (mean ± spread over <n>)".
function M.report(first, n, run, print_table)
  if type(run) ~= "function" then error("rl.recipe.report: run: a function(seed) -> rows expected", 2) end
  if type(print_table) ~= "function" then
    error("rl.recipe.report: print_table: a function(runs, title) expected", 2)
  end
  if math.type(first) ~= "integer" then error("rl.recipe.report: first: an integer expected", 2) end
  if math.type(n) ~= "integer" or n < 1 then error("rl.recipe.report: n: a positive integer expected", 2) end
  local runs = M.over_seeds(first, n, function(seed)
    local rows = run(seed)
    if n > 1 then print_table({ rows }, "seed " .. seed) end
    return rows
  end)
  print_table(runs, n > 1 and string.format("seeds %d-%d (mean ± spread over %d)", first, first + n - 1, n)
    or string.format("seed %d", first))
  return runs
end

-- spread_table{runs =, rows =, headers =, value =, fmt = "%.2f", label = "policy", label_width =
-- 16, cell_width = 15} -> lines: a table over seeds, its header (label, then headers[k] right
-- aligned) and one line per row of rows (row.label, then for each column k the mean ± sample sd
-- over the runs of value(run, row, k), M.pm with scale 1 and fmt, or fmt(k) when fmt is a
-- function).
function M.spread_table(o)
  if type(o) ~= "table" or type(o.runs) ~= "table" or type(o.rows) ~= "table"
    or type(o.headers) ~= "table" or type(o.value) ~= "function" then
    error("rl.recipe.spread_table: {runs =, rows =, headers =, value = function(run, row, k)} expected", 2)
  end
  local lw, cw = o.label_width or 16, o.cell_width or 15
  local head = { string.format("%-" .. lw .. "s", o.label or "policy") }
  for _, h in ipairs(o.headers) do head[#head + 1] = string.format("%" .. cw .. "s", h) end
  local lines = { table.concat(head, " ") }
  for _, row in ipairs(o.rows) do
    local line = { string.format("%-" .. lw .. "s", row.label) }
    for k = 1, #o.headers do
      local vals = {}
      for i, run in ipairs(o.runs) do vals[i] = o.value(run, row, k) end
      local mean, spread, n = M.mean_spread(vals)
      local fmt = type(o.fmt) == "function" and o.fmt(k) or o.fmt or "%.2f"
      line[#line + 1] = string.format("%" .. cw .. "s", M.pm({ mean = mean, spread = spread, n = n }, 1, fmt))
    end
    lines[#lines + 1] = table.concat(line, " ")
  end
  return lines
end

-- mean_spread(values) -> mean, spread (the sample standard deviation; 0 for one value), n. nil
-- values are left out; mean is nil when none is left.
function M.mean_spread(values)
  local sum, n = 0, 0
  for _, v in pairs(values) do
    if type(v) == "number" then sum, n = sum + v, n + 1 end
  end
  if n == 0 then return nil, nil, 0 end
  local mean, sq = sum / n, 0
  for _, v in pairs(values) do
    if type(v) == "number" then sq = sq + (v - mean) ^ 2 end
  end
  return mean, n > 1 and math.sqrt(sq / (n - 1)) or 0, n
end

-- summarise(runs, key) -> rows: runs is a list (one per seed) of lists of rows (tables); rows
-- with the same row[key] are one row of the result, in the order of their first appearance,
-- whose every numeric field is {mean =, spread =, n =} (M.mean_spread over the seeds) and whose
-- other fields are the first run's.
function M.summarise(runs, key)
  local order, by = {}, {}
  for _, rows in ipairs(runs) do
    for _, row in ipairs(rows) do
      local id = row[key]
      if by[id] == nil then
        by[id] = {}
        order[#order + 1] = id
      end
      local list = by[id]
      list[#list + 1] = row
    end
  end
  local out = {}
  for k, id in ipairs(order) do
    local rows, s = by[id], {}
    local fields = {}
    for _, row in ipairs(rows) do
      for f, v in pairs(row) do
        if fields[f] == nil then fields[f] = v end
      end
    end
    for f, first in pairs(fields) do
      if type(first) == "number" and f ~= key then
        local values = {}
        for i, row in ipairs(rows) do values[i] = row[f] end
        local mean, spread, n = M.mean_spread(values)
        s[f] = { mean = mean, spread = spread, n = n }
      else
        s[f] = first
      end
    end
    out[k] = s
  end
  return out
end

-- pm(cell [, scale = 100, fmt = "%.1f"]) -> "55.0 ± 3.2" for a summarised cell {mean =, spread =,
-- n =} of several seeds, the mean alone for one seed's (n = 1) and for a plain number, "-" for
-- nil; values are multiplied by scale.
function M.pm(cell, scale, fmt)
  scale, fmt = scale or 100, fmt or "%.1f"
  if type(cell) == "number" then return string.format(fmt, scale * cell) end
  if type(cell) ~= "table" or cell.mean == nil then return "-" end
  if cell.n == 1 then return string.format(fmt, scale * cell.mean) end
  return string.format(fmt .. " ± " .. fmt, scale * cell.mean, scale * cell.spread)
end

return M
