-- moonrl.curriculum.sources: where a curriculum's tasks come from: a finite pool, or a grid of
-- difficulty levels (procedural generators, max_turns horizons, backward starts from
-- demonstrations), and the parameter levels themselves.
--
-- A pool has arms = its tasks (by key). A grid has one list of level values per parameter; a
-- cell is one level of each, named "name=value,name=value" in parameter order; its arms are its
-- cells, and make(cells, rng) generates one task per cell. Sources hold no state of their own:
-- the curriculum (moonrl.curriculum) keeps the pool's membership and every statistic. A grid's
-- make(cells, rng) returns one tagged task per entry of cells (lists of level indices).
local core = require "moonrl.core"
local envlib = require "moonrl.env"
local check = require "moonrl.curriculum.check"
local seedlib = require "moonrl.train.seed"

local json, mix = core.json, seedlib.mix
local M = {}

-- ---------------------------------------------------------------- levels

local Levels = { __name = "moonrl.curriculum.levels" }
Levels.__index = Levels
M.Levels = Levels

local function is_levels(v) return getmetatable(v) == Levels end
M.is_levels = is_levels

local MAX_LEVELS = 10000

local function value_ok(v)
  return (math.type(v) == "integer") or check.finite(v) or type(v) == "string" or type(v) == "boolean"
end

-- A level value as it appears in a cell name.
local function show(v)
  if math.type(v) == "float" then return string.format("%.14g", v) end
  return tostring(v)
end
M.show = show

-- rl.curriculum.levels{v1, v2, ...}: the levels of a parameter, easiest first.
function M.levels(list)
  local who = "rl.curriculum.levels"
  if type(list) ~= "table" or not check.is_list(list) or #list == 0 then
    check.fail(who, "a non-empty list of level values {v1, v2, ...} (easiest first) expected, got "
      .. check.describe(list), 2)
  end
  if #list > MAX_LEVELS then check.fail(who, "at most " .. MAX_LEVELS .. " levels", 2) end
  local seen, values = {}, {}
  for i, v in ipairs(list) do
    if not value_ok(v) then
      check.fail(who, string.format("[%d]: a number, string or boolean expected, got %s", i,
        check.describe(v)), 2)
    end
    local name = type(v) .. ":" .. show(v)
    if seen[name] then check.fail(who, string.format("[%d]: %s appears twice", i, show(v)), 2) end
    seen[name] = true
    values[i] = v
  end
  return setmetatable({ values = values }, Levels)
end

-- The values lo, lo + step, ... up to hi (hi itself is always the last one).
local function stepped(who, lo, hi, step, level)
  local n = math.floor((hi - lo) / step + 1e-9) + 1
  if n > MAX_LEVELS then check.fail(who, "more than " .. MAX_LEVELS .. " levels", level + 1) end
  local values = {}
  for i = 1, n do values[i] = lo + (i - 1) * step end
  if values[n] ~= hi then values[n + 1] = hi end
  return values
end

-- rl.curriculum.range{lo, hi, step} (or {lo =, hi =, step =}; step 1): numeric levels from lo up
-- to hi; integers when lo, hi and step are.
function M.range(t)
  local who = "rl.curriculum.range"
  if type(t) ~= "table" then check.fail(who, "a table {lo, hi, step} expected, got " .. check.describe(t), 2) end
  local named = {}
  for k, v in pairs(t) do
    if k == 1 then named.lo = v elseif k == 2 then named.hi = v elseif k == 3 then named.step = v
    elseif math.type(k) == "integer" then check.fail(who, "at most three values {lo, hi, step}", 2)
    else named[k] = v end
  end
  local o = check.fields(who, named, {
    { "lo", check.number(), nil, required = true }, { "hi", check.number(), nil, required = true },
    { "step", check.number(0, nil, true), 1 },
  }, 2)
  if o.hi < o.lo then check.fail(who, string.format("hi (%s) is below lo (%s)", show(o.hi), show(o.lo)), 2) end
  return setmetatable({ values = stepped(who, o.lo, o.hi, o.step, 2) }, Levels)
end

-- ---------------------------------------------------------------- the env's tasks

local function env_check(who, env, level)
  local ok, err = pcall(envlib.check, env)
  if not ok then check.fail(who, "env: " .. tostring(err):gsub("^[^:]*:%d+: ", ""), level + 1) end
end

-- n tasks of env's split, drawn with rng.
local function env_tasks(who, env, split, n, rng)
  local list = env.tasks(split, n, rng:random(0, 0x7FFFFFFF))
  if type(list) ~= "table" or #list ~= n then
    error(string.format("%s: env.tasks(%q, %d) returned %s", who, split, n,
      type(list) == "table" and #list .. " tasks" or check.describe(list)), 0)
  end
  for i, t in ipairs(list) do
    if type(t) ~= "table" then
      error(string.format("%s: env.tasks(%q)[%d] is %s, not a task table", who, split, i, check.describe(t)), 0)
    end
  end
  return list
end

local function copy(t)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  return out
end
M.copy = copy

-- A task's JSON text, the default key (its content, keys sorted).
local function content_key(task)
  local ok, text = pcall(json.encode, task)
  if not ok then return nil, tostring(text):gsub("^json%.encode: ", "") end
  return text
end
M.content_key = content_key

-- ---------------------------------------------------------------- grids

local Grid = { __name = "moonrl.curriculum.source" }
Grid.__index = Grid
M.Grid = Grid

-- The cell name of the level indices idx.
function Grid:cell(idx)
  local parts = {}
  for i, name in ipairs(self.names) do parts[i] = name .. "=" .. show(self.values[i][idx[i]]) end
  return table.concat(parts, ",")
end

-- The parameter values of idx, by name.
function Grid:params(idx)
  local p = {}
  for i, name in ipairs(self.names) do p[name] = self.values[i][idx[i]] end
  return p
end

-- The number of cells.
function Grid:size()
  local n = 1
  for _, v in ipairs(self.values) do n = n * #v end
  return n
end

-- The level indices of cell number k (1-based, the last parameter varying fastest).
function Grid:cell_at(k)
  local idx, rest = {}, k - 1
  for i = #self.values, 1, -1 do
    local n = #self.values[i]
    idx[i] = rest % n + 1
    rest = rest // n
  end
  return idx
end

-- Tags a generated task with its cell, parameters, key and (for a horizon parameter) max_turns.
function Grid:tag(task, idx, key)
  task.params = self:params(idx)
  task.cell = self:cell(idx)
  task.key = key
  if self.horizon then task.max_turns = self.values[self.horizon][idx[self.horizon]] end
  return task
end

local function grid(kind, who, names, levels, fields)
  local g = setmetatable(fields, Grid)
  g.kind, g.who, g.names, g.values = kind, who, names, {}
  for i, name in ipairs(names) do
    g.values[i] = levels[name].values
    if levels[name].horizon then
      if g.horizon then check.fail(who, "params: only one horizon parameter", 4) end
      g.horizon = i
    end
  end
  return g
end

local function config_levels(src)
  local out = {}
  for i, name in ipairs(src.names) do
    out[i] = { name = name, values = json.array(src.values[i]), horizon = src.horizon == i or nil }
  end
  return json.array(out)
end

-- rl.curriculum.procedural{gen = fn(params, rng) -> task, params = {name = levels | range |
-- horizon, ...}, order = {names...}, key = fn(task) -> string}: a task per cell from gen. order
-- is the parameters' order (cell names, round-robin moves); by default their names sorted.
function M.procedural(opts)
  local who = "rl.curriculum.procedural"
  local o = check.fields(who, opts, {
    { "gen", check.func, nil, required = true },
    { "params", check.kind("table", "a table {name = rl.curriculum.levels{...} | range{...} | horizon{...}}"),
      nil, required = true },
    { "order", check.kind("table", "a list of the parameters' names"), nil },
    { "key", check.func, nil },
  }, 2)
  local names = {}
  for name, lv in pairs(o.params) do
    if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
      check.fail(who, "params: names are identifiers (letters, digits, '_'), got " .. check.describe(name), 2)
    end
    if not is_levels(lv) then
      check.fail(who, string.format("params.%s: rl.curriculum.levels{...}, range{...} or horizon{...} "
        .. "expected, got %s", name, check.describe(lv)), 2)
    end
    if lv.env then check.fail(who, string.format("params.%s: a horizon parameter takes no env", name), 2) end
    names[#names + 1] = name
  end
  if #names == 0 then check.fail(who, "params: at least one parameter expected", 2) end
  table.sort(names)
  if o.order then
    if not check.is_list(o.order) or #o.order ~= #names then
      check.fail(who, "order: a list of every parameter's name (" .. table.concat(names, ", ") .. ") expected", 2)
    end
    local seen = {}
    for i, name in ipairs(o.order) do
      if o.params[name] == nil or seen[name] then
        check.fail(who, string.format("order[%d]: %s is not a parameter, or appears twice", i, check.describe(name)), 2)
      end
      seen[name] = true
    end
    names = copy(o.order)
  end
  local g = grid("procedural", who, names, o.params, { gen = o.gen, key_fn = o.key })
  function g:make(cells, rng)
    local out = {}
    for i, idx in ipairs(cells) do
      local params = self:params(idx)
      local task = self.gen(params, rng)
      if type(task) ~= "table" then
        error(string.format("%s: gen returned %s for %s (a task table expected)", who,
          check.describe(task), self:cell(idx)), 0)
      end
      local key, why
      if self.key_fn then key = self.key_fn(task) else key, why = content_key(task) end
      if type(key) ~= "string" then
        error(string.format("%s: %s", who, why and "the task of " .. self:cell(idx)
          .. " is not JSON data (" .. why .. "): pass key = fn(task)" or "key returned "
          .. check.describe(key) .. " (a string expected)"), 0)
      end
      out[i] = self:tag(task, idx, self:cell(idx) .. "|" .. key)
    end
    return out
  end
  function g:config() return { kind = "procedural", params = config_levels(self) } end
  return g
end

-- rl.curriculum.horizon{start =, stop =, step = 1 [, env =, split = "train"]}: max_turns levels
-- start, start + step, ..., stop. In procedural's params it is a parameter whose value becomes
-- each task's max_turns; with env it is a source of its own: the env's tasks of split, each with
-- max_turns set to the cell's level.
function M.horizon(opts)
  local who = "rl.curriculum.horizon"
  local o = check.fields(who, opts, {
    { "start", check.integer(1), nil, required = true }, { "stop", check.integer(1), nil, required = true },
    { "step", check.integer(1), 1 }, { "env", check.kind("table", "an environment module"), nil },
    { "split", check.string, "train" },
  }, 2)
  if o.stop < o.start then check.fail(who, string.format("stop (%d) is below start (%d)", o.stop, o.start), 2) end
  if o.env then env_check(who, o.env, 2) end
  local lv = setmetatable({ values = stepped(who, o.start, o.stop, o.step, 2), horizon = true,
    env = o.env, split = o.split }, Levels)
  return lv
end

-- A horizon with env as a source.
function M.horizon_source(lv)
  local who = "rl.curriculum.horizon"
  local g = grid("horizon", who, { "max_turns" }, { max_turns = lv }, { env = lv.env, split = lv.split })
  function g:make(cells, rng)
    local base = env_tasks(who, self.env, self.split, #cells, rng)
    local out = {}
    for i, idx in ipairs(cells) do
      local task = copy(base[i])
      local key, why = content_key(base[i])
      if not key then error(who .. ": env.tasks gave a task that is not JSON data (" .. why .. ")", 0) end
      out[i] = self:tag(task, idx, self:cell(idx) .. "|" .. key)
    end
    return out
  end
  function g:config() return { kind = "horizon", env = self.env.name, split = self.split, params = config_levels(self) } end
  return g
end

-- ---------------------------------------------------------------- backward starts

-- Episodes of a backward source start from a snapshot: its instance (cloned for each episode) and
-- the observation at that turn. They are found by the task table itself (weak keys: a snapshot
-- lives as long as its task).
local Wrapped = {}
Wrapped.__index = Wrapped

function Wrapped:reset(task, rng)
  local snap = self.snapshots[task]
  if snap then
    self.inner = snap.instance:clone()
    self.handles_calls = self.inner.handles_calls
    return snap.observation
  end
  self.inner = self.base.new()
  self.handles_calls = self.inner.handles_calls
  return self.inner:reset(task, rng)
end

function Wrapped:step(action, parsed) return self.inner:step(action, parsed) end

function Wrapped:clone()
  return setmetatable({ inner = self.inner:clone(), handles_calls = self.handles_calls,
    base = self.base, snapshots = self.snapshots }, Wrapped)
end

function Wrapped:state_key()
  if self.inner and self.inner.state_key then return self.inner:state_key() end
  return nil
end

-- rl.curriculum.backward{demos = fn(task, rng) -> actions, env =, split = "train", k = levels |
-- range (default range{1, env.max_turns})}: the env's tasks, each started k turns before the end
-- of its demonstration (replayed through the env, then the instance cloned for every episode);
-- k is the level. task.start_turn says how many demonstration turns were replayed (rl.train
-- gives the episode max_turns minus that many turns). A demonstration shorter than k starts
-- from the beginning.
function M.backward(opts)
  local who = "rl.curriculum.backward"
  local o = check.fields(who, opts, {
    { "demos", check.func, nil, required = true },
    { "env", check.kind("table", "an environment module"), nil, required = true },
    { "split", check.string, "train" },
    { "k", function(v) if is_levels(v) and not v.horizon then return nil end
      return "rl.curriculum.levels{...} or range{...} of positive integers" end, nil },
  }, 2)
  env_check(who, o.env, 2)
  local probe = o.env.new()
  if type(probe) ~= "table" or type(probe.clone) ~= "function" then
    check.fail(who, "env: the environment's instances need a clone() method", 2)
  end
  local k = o.k
  if not k then
    if math.type(o.env.max_turns) ~= "integer" or o.env.max_turns < 1 then
      check.fail(who, "k: required when the env has no max_turns", 2)
    end
    k = setmetatable({ values = stepped(who, 1, o.env.max_turns, 1, 2) }, Levels)
  end
  for i, v in ipairs(k.values) do
    if math.type(v) ~= "integer" or v < 1 then
      check.fail(who, string.format("k[%d]: a positive integer expected, got %s", i, check.describe(v)), 2)
    end
  end
  local g = grid("backward", who, { "k" }, { k = k }, { env = o.env, split = o.split, demos = o.demos,
    snapshots = setmetatable({}, { __mode = "k" }) })
  -- Replays actions in a fresh instance; stops after `upto` actions or when the episode ends.
  -- Returns the instance, the observation then, the number of actions applied, whether done.
  local function replay(task, actions, upto, seed)
    local inst = g.env.new()
    local obs = inst:reset(task, core.rng(seed))
    local record, applied, done = {}, 0, false
    for j = 1, math.min(upto, #actions) do
      local o2, _, d = envlib.step(g.env, inst, actions[j], record)
      applied, obs = j, o2
      if d then done = true break end
    end
    return inst, obs, applied, done
  end
  function g:make(cells, rng)
    local base = env_tasks(who, self.env, self.split, #cells, rng)
    local out = {}
    for i, idx in ipairs(cells) do
      local task = copy(base[i])
      local seed = rng:random(0, 0x7FFFFFFF)
      local key, why = content_key(base[i])
      if not key then error(who .. ": env.tasks gave a task that is not JSON data (" .. why .. ")", 0) end
      local ok, actions = pcall(self.demos, base[i], core.rng(mix(seed, 1)))
      if not ok or not check.is_list(actions) then
        error(string.format("%s: demos(task) %s", who, ok and "returned " .. check.describe(actions)
          .. " (a list of actions expected)" or "failed: " .. tostring(actions)), 0)
      end
      for j, a in ipairs(actions) do
        if type(a) ~= "string" then
          error(string.format("%s: demos(task)[%d] is %s, not an action string", who, j, check.describe(a)), 0)
        end
      end
      local want = self.values[1][idx[1]]
      local ok2, inst_or_err, _, length = pcall(replay, base[i], actions, #actions, mix(seed, 2))
      if not ok2 then error(who .. ": replaying the demonstration failed: " .. tostring(inst_or_err), 0) end
      local start = math.max(0, length - want)
      if start > 0 then
        local inst, obs, applied, done = replay(task, actions, start, mix(seed, 2))
        if done or applied < start or type(obs) ~= "string" then start = 0 else
          self.snapshots[task] = { instance = inst, observation = obs }
        end
      end
      task.start_turn = start
      out[i] = self:tag(task, idx, self:cell(idx) .. "|" .. key .. "@" .. start)
    end
    return out
  end
  -- The environment rl.train rolls out: env itself for tasks without a snapshot.
  function g:wrap(env)
    local snapshots, inner = self.snapshots, env
    return setmetatable({ new = function()
      return setmetatable({ base = inner, snapshots = snapshots }, Wrapped)
    end }, { __index = env })
  end
  function g:config() return { kind = "backward", env = self.env.name, split = self.split, params = config_levels(self) } end
  return g
end

-- ---------------------------------------------------------------- pools

local Pool = { __name = "moonrl.curriculum.source" }
Pool.__index = Pool
M.Pool = Pool

-- The key and cell of a task given to a pool; nil, message when the key is not a string.
function Pool:key_of(task)
  local key, why
  if self.key_fn then key = self.key_fn(task)
  elseif type(task.key) == "string" then key = task.key
  else key, why = content_key(task) end
  if type(key) ~= "string" then
    return nil, why and "the task is not JSON data (" .. why .. "): pass key = fn(task)"
      or "key returned " .. check.describe(key) .. " (a string expected)"
  end
  local cell = self.cell_fn and self.cell_fn(task) or "pool"
  if type(cell) ~= "string" then return nil, "cell returned " .. check.describe(cell) .. " (a string expected)" end
  return key, cell
end

-- A copy of task tagged with its key and cell (and params = {} when it has none).
function Pool:tagged(task, key, cell)
  local t = copy(task)
  t.key, t.cell = key, cell
  if t.params == nil then t.params = {} end
  return t
end

-- rl.curriculum.pool{tasks = list | env =, split = "train", size = 1000, seed = 0, key =
-- fn(task) -> string, cell = fn(task) -> string}: a finite set of tasks with unique keys (by
-- default task.key, else the task's JSON text). From env: env.tasks(split, size, seed), repeats
-- dropped. cell groups tasks for the statistics (default: one cell, "pool"). Tasks synthesised
-- later join it with cur:admit.
function M.pool(opts)
  local who = "rl.curriculum.pool"
  local o = check.fields(who, opts, {
    { "tasks", function(v) if check.is_list(v) then return nil end return "a list of task tables" end, nil },
    { "env", check.kind("table", "an environment module"), nil },
    { "split", check.string, "train" },
    { "size", check.integer(1), 1000 }, { "seed", check.integer(), 0 },
    { "key", check.func, nil }, { "cell", check.func, nil },
  }, 2)
  if (o.tasks == nil) == (o.env == nil) then check.fail(who, "give tasks (a list) or env, not both, not neither", 2) end
  local p = setmetatable({ kind = "pool", who = who, key_fn = o.key, cell_fn = o.cell, env = o.env,
    split = o.split, initial = {} }, Pool)
  local list = o.tasks
  if o.env then
    env_check(who, o.env, 2)
    list = env_tasks(who, o.env, o.split, o.size, core.rng(o.seed))
  end
  local seen = {}
  for i, task in ipairs(list) do
    if type(task) ~= "table" then check.fail(who, string.format("tasks[%d]: a task table expected, got %s", i, check.describe(task)), 2) end
    local key, cell = p:key_of(task)
    if not key then check.fail(who, string.format("tasks[%d]: %s", i, cell), 2) end
    if seen[key] then
      if not o.env then
        check.fail(who, string.format("tasks[%d] has the key of tasks[%d] (%s): keys must be unique",
          i, seen[key], #key > 60 and key:sub(1, 60) .. "..." or key), 2)
      end
    else
      seen[key] = i
      p.initial[#p.initial + 1] = p:tagged(task, key, cell)
    end
  end
  function p:config()
    return { kind = "pool", env = self.env and self.env.name or nil, split = self.env and self.split or nil,
      size = #self.initial }
  end
  return p
end

return M
