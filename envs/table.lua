-- table.lua - a 5 x 3 table of digits and one query over it, answered with a few table ops: the
-- miniature of DataPRM's environment-aware process rewards (spec reproductions.md, section 3.8).
-- The query "sum b a>3" asks for the sum of column b over the rows where a > 3; the gold plan is
-- `filt a>3`, `sum b`, `ans <the value>`.
--
--   observation  "sum b a>3"          action  "filt a>3"
--   observation  "kept 2"             action  "sum b"
--   observation  "= 17"               action  "ans 17"      -> done, reward 1
--
-- Ops: filt <col><op><n> (op one of > < >= <=; filters stack), sum|max|min <col> (over the rows
-- kept; "= 0" over none), show (the kept rows, column by column: "a:57 b:89 c:12"), undo (drops
-- the last filt), ans <n> (ends the episode: reward 1 when n is the query's answer, else 0).
-- Anything else is "invalid" (reward 0, the turn spent); an episode that never answers within
-- M.max_turns gets 0. A *silent error* is an op that runs but is wrong: `filt a>=3` for the
-- query's a>3 keeps a row too many and reports it like any other filt; with max and min the
-- answer is sometimes right all the same (a lucky error, which the outcome reward cannot see).
--
-- Tasks are {cols = {a = {5 digits}, b =, c =}, agg = "sum" | "max" | "min", col =, fcol =,
-- cmp = ">" | "<", thr =, answer =}; fcol ~= col, thr is one of fcol's values (so a comparator
-- slip always changes the rows kept), and the gold filter keeps 1 to 4 rows. Splits by
-- construction: a task whose hash says so (about one in five) is held out ("test"), the rest are
-- "train". M.gen(split, rng), M.tasks(split, n, seed).
--
-- Oracles: M.oracle(task, rng), the SFT warm start's, is imperfect on purpose: it begins with an
-- exploratory show 20% of the time, makes a silent error in its filter 40% of the time (a
-- comparator slip, > for >=, or a threshold one step too lenient, a>2 for a>3), repairs half of
-- those (an optional show, then undo and the right filt), and answers what its last aggregate
-- said. M.solve(task) is the perfect oracle (the gold plan).
--
-- Two scripted process reward models score each turn of an episode (a list of its actions, and
-- of the observations it got, one per turn):
--   M.prm_aware(task, actions): the active verifier; it re-executes every op against the gold
--     plan, comparing filters by running them on every digit 0..9 (so a>=4 is a>3, and a>=3 is
--     a silent error even on a table without a 3): 1 for progress (the right filter, the right
--     aggregate over the right rows, the right answer, an undo that removes a wrong filter), 0.5
--     for an exploratory show, a redundant op or a mistake later undone, 0 for an unrepaired
--     silent error, an invalid op, a wrong answer, and for the last turn of an episode that
--     never answered.
--   M.prm_naive(actions, observations): reads the text only: show and undo 0, an op the
--     environment called invalid 0, any other op that ran 1 (it cannot see a silent error), an
--     answer 1 when it repeats the last aggregate's value.
-- M.check(task, actions) runs the actions in a fresh episode: {success =, observations =,
-- silent = (a wrong filter was live at the last aggregate), lucky = (success despite that)}.
-- Instances have clone(); everything is a function of the task and the seeds given.
local rl = require "moonrl"

local COLS = { "a", "b", "c" }
local ROWS = 5
local M = { name = "table", format = "line", max_turns = 7, cols = COLS, rows = ROWS }

local AGG = {
  sum = function(vs) local s = 0 for _, v in ipairs(vs) do s = s + v end return s end,
  max = function(vs) local m = 0 for _, v in ipairs(vs) do if v > m then m = v end end return m end,
  min = function(vs)
    if #vs == 0 then return 0 end
    local m = vs[1]
    for _, v in ipairs(vs) do if v < m then m = v end end
    return m
  end,
}
local AGG_NAMES = { "sum", "max", "min" }

local function passes(v, cmp, n)
  if cmp == ">" then return v > n elseif cmp == "<" then return v < n
  elseif cmp == ">=" then return v >= n else return v <= n end
end

-- The rows of cols that pass every filter {col =, cmp =, n =} of the list.
local function kept_rows(cols, filters)
  local out = {}
  for r = 1, ROWS do
    local ok = true
    for _, f in ipairs(filters) do ok = ok and passes(cols[f.col][r], f.cmp, f.n) end
    if ok then out[#out + 1] = r end
  end
  return out
end

local function column(cols, col, rows)
  local vs = {}
  for i, r in ipairs(rows) do vs[i] = cols[col][r] end
  return vs
end

local function answer_of(task)
  local rows = kept_rows(task.cols, { { col = task.fcol, cmp = task.cmp, n = task.thr } })
  return AGG[task.agg](column(task.cols, task.col, rows)), #rows
end

local function held_out(task)
  local h = rl.train.mix(task.thr, task.agg:byte(), task.col:byte(), task.fcol:byte(), task.cmp:byte())
  for _, c in ipairs(COLS) do
    for r = 1, ROWS do h = rl.train.mix(h, task.cols[c][r]) end
  end
  return h % 5 == 0
end
M.held_out = held_out

-- gen(split, rng) -> one task of split ("train" or "test") drawn with rng.
function M.gen(split, rng)
  assert(split == "train" or split == "test", "table.gen: split must be \"train\" or \"test\"")
  while true do
    local cols = {}
    for _, c in ipairs(COLS) do
      cols[c] = {}
      for r = 1, ROWS do cols[c][r] = rng:random(1, 9) end
    end
    local col = COLS[rng:random(3)]
    local fcol = COLS[rng:random(2)]
    if fcol == col then fcol = "c" end
    local task = { cols = cols, agg = AGG_NAMES[rng:random(3)], col = col, fcol = fcol,
      cmp = rng:random(2) == 1 and ">" or "<", thr = cols[fcol][rng:random(ROWS)] }
    local answer, kept = answer_of(task)
    task.answer = answer
    if kept >= 1 and kept <= 4 and held_out(task) == (split == "test") then return task end
  end
end

function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen(split, rng) end
  return out
end

-- The query as the first observation shows it: "sum b a>3".
function M.query(task)
  return string.format("%s %s %s%s%d", task.agg, task.col, task.fcol, task.cmp, task.thr)
end

-- parse_op(text) -> {op = "filt", col =, cmp =, n =} | {op = "agg", agg =, col =} |
-- {op = "show"} | {op = "undo"} | {op = "ans", n =} | nil (not an op).
local function parse_op(text)
  text = text:match("^%s*(.-)%s*$")
  local c, cmp, n = text:match("^filt%s+([abc])%s*([<>]=?)%s*(%d+)$")
  if c then return { op = "filt", col = c, cmp = cmp, n = tonumber(n) } end
  local agg, col = text:match("^(%a+)%s+([abc])$")
  if agg and AGG[agg] then return { op = "agg", agg = agg, col = col } end
  if text == "show" then return { op = "show" } end
  if text == "undo" then return { op = "undo" } end
  local a = text:match("^ans%s+(%-?%d+)$")
  if a then return { op = "ans", n = tonumber(a) } end
  return nil
end
M.parse_op = parse_op

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.filters, self.steps = task, {}, 0
  return M.query(task)
end

function Episode:show()
  local rows, parts = kept_rows(self.task.cols, self.filters), {}
  for _, c in ipairs(COLS) do
    parts[#parts + 1] = c .. ":" .. table.concat(column(self.task.cols, c, rows))
  end
  return table.concat(parts, " ")
end

-- One op's observation, reward and whether it ended the episode.
function Episode:act(text)
  local op = parse_op(text)
  if not op then return "invalid", 0, false end
  if op.op == "filt" then
    self.filters[#self.filters + 1] = { col = op.col, cmp = op.cmp, n = op.n }
    return "kept " .. #kept_rows(self.task.cols, self.filters), 0, false
  elseif op.op == "agg" then
    return "= " .. AGG[op.agg](column(self.task.cols, op.col, kept_rows(self.task.cols, self.filters))), 0, false
  elseif op.op == "show" then
    return self:show(), 0, false
  elseif op.op == "undo" then
    if #self.filters == 0 then return "invalid", 0, false end
    self.filters[#self.filters] = nil
    return "undone kept " .. #kept_rows(self.task.cols, self.filters), 0, false
  end
  local right = op.n == self.task.answer
  return nil, right and 1 or 0, true, right
end

function Episode:step(action, parsed)
  self.steps = self.steps + 1
  local obs, reward, finished, right = self:act((parsed and parsed.text) or action)
  if finished then return nil, reward, true, { success = right } end
  if self.steps >= M.max_turns then return nil, 0, true, { success = false, budget = true } end
  return obs, 0, false, { success = false, invalid = obs == "invalid" or nil }
end

function Episode:clone()
  local f = {}
  for i, x in ipairs(self.filters) do f[i] = x end
  return setmetatable({ task = self.task, filters = f, steps = self.steps }, Episode)
end

-- ---------------------------------------------------------------- oracles

local function filt_text(col, cmp, n) return string.format("filt %s%s%d", col, cmp, n) end

-- solve(task) -> the gold plan.
function M.solve(task)
  return { filt_text(task.fcol, task.cmp, task.thr), task.agg .. " " .. task.col, "ans " .. task.answer }
end

-- A silent error in the query's filter: a comparator slip (> for >=) or a threshold one step too
-- lenient (a>2 for a>3); both keep at least one row too many.
local function slip(task, rng)
  if rng:random(2) == 1 then return filt_text(task.fcol, task.cmp .. "=", task.thr) end
  return filt_text(task.fcol, task.cmp, task.cmp == ">" and task.thr - 1 or task.thr + 1)
end

-- oracle(task, rng) -> the SFT oracle's actions (see the top of the file).
function M.oracle(task, rng)
  local out = {}
  if rng:random() < 0.2 then out[#out + 1] = "show" end
  local right = filt_text(task.fcol, task.cmp, task.thr)
  if rng:random() < 0.4 then
    out[#out + 1] = slip(task, rng)
    if rng:random() < 0.5 then
      if rng:random() < 0.5 then out[#out + 1] = "show" end
      out[#out + 1] = "undo"
      out[#out + 1] = right
    end
  else
    out[#out + 1] = right
  end
  out[#out + 1] = task.agg .. " " .. task.col
  -- the answer is what the aggregate says on the rows the filters left
  local inst = M.new()
  inst:reset(task)
  local obs
  for _, a in ipairs(out) do obs = inst:act(a) end
  out[#out + 1] = "ans " .. obs:match("^= (%d+)$")
  return out
end

-- ---------------------------------------------------------------- process reward models

-- Whether filter f selects exactly the digits the query's filter does (run on every digit 0..9).
local function same_filter(f, task)
  if f.col ~= task.fcol then return false end
  for v = 0, 9 do
    if passes(v, f.cmp, f.n) ~= passes(v, task.cmp, task.thr) then return false end
  end
  return true
end

-- prm_aware(task, actions) -> one score per action (0, 0.5 or 1): the active verifier.
function M.prm_aware(task, actions)
  local scores = {}
  local stack = {} -- live filters: {right =, at = the turn that pushed it}
  local undone = {} -- turns whose filter a later undo removed
  local wrong_undo = {} -- turns of undos that removed the right filter, and whether it came back
  local answered = false
  local function live_right()
    for _, f in ipairs(stack) do if f.right then return true end end
    return false
  end
  local function live_wrong()
    for _, f in ipairs(stack) do if not f.right then return true end end
    return false
  end
  for k, text in ipairs(actions) do
    local op = parse_op(text)
    if not op then
      scores[k] = 0
    elseif op.op == "show" then
      scores[k] = 0.5
    elseif op.op == "filt" then
      local right = same_filter(op, task)
      if right then
        scores[k] = live_right() and 0.5 or 1
        for t, back in pairs(wrong_undo) do if not back then wrong_undo[t] = true end end
      else
        scores[k] = 0 -- 0.5 below if an undo removes it
      end
      stack[#stack + 1] = { right = right, at = k }
    elseif op.op == "undo" then
      local top = stack[#stack]
      if not top then
        scores[k] = 0
      else
        stack[#stack] = nil
        if top.right then
          scores[k], wrong_undo[k] = 0, live_right()
        else
          scores[k], undone[top.at] = 1, true
        end
      end
    elseif op.op == "agg" then
      local ok = op.agg == task.agg and op.col == task.col and live_right() and not live_wrong()
      scores[k] = ok and 1 or 0
    else
      answered = true
      scores[k] = op.n == task.answer and 1 or 0
    end
  end
  for t in pairs(undone) do scores[t] = 0.5 end
  for t, back in pairs(wrong_undo) do if back then scores[t] = 0.5 end end
  if not answered and #actions > 0 then scores[#actions] = 0 end
  return scores
end

-- prm_naive(actions, observations) -> one score per action: the text-only PRM.
function M.prm_naive(actions, observations)
  local scores, last = {}, nil
  for k, text in ipairs(actions) do
    local op, obs = parse_op(text), observations[k]
    if not op or obs == "invalid" or op.op == "show" or op.op == "undo" then
      scores[k] = 0
    elseif op.op == "ans" then
      scores[k] = op.n == last and 1 or 0
    else
      if op.op == "agg" then last = tonumber(obs and obs:match("^= (%d+)$")) end
      scores[k] = 1
    end
  end
  return scores
end

-- The mean of a list of scores (0 for none).
function M.mean(scores)
  local s = 0
  for _, v in ipairs(scores) do s = s + v end
  return #scores > 0 and s / #scores or 0
end

-- check(task, actions) -> {success =, observations =, silent =, lucky =}: the actions run in a
-- fresh episode (those after its end ignored); silent: a wrong filter was live at the last
-- aggregate op (or at the answer, when none came before it).
function M.check(task, actions)
  local inst = M.new()
  inst:reset(task)
  local obs, success, silent = {}, false, false
  for k, a in ipairs(actions) do
    local o, _, done, info = inst:step(a)
    obs[k] = o
    local op = parse_op(a)
    if op and (op.op == "agg" or op.op == "ans") then
      silent = false
      for _, f in ipairs(inst.filters) do silent = silent or not same_filter(f, task) end
    end
    if done then
      success = info.success
      break
    end
  end
  return { success = success, observations = obs, silent = silent, lucky = success and silent }
end

return M
