-- toolbox.lua - short compositional tool tasks, each tagged with the capabilities it needs, for
-- failure-targeted task synthesis (shared/spec/reproductions.md §2.3: TRACE, CoEvolve,
-- Agent-World). A task is one to three dependent tool calls and an answer:
--
--   observation "get k3,add 5,mul 3"   action "CALL get k3"
--   observation "=7"                   action "CALL add 7 5"
--   observation "err busy"             action "CALL add 7 5"     (recover: call again)
--   observation "k2=9 =12"             action "CALL mul 12 3"    (distract: the last "=" counts)
--   observation "k6=4 =36"             action "ANSWER 36"        -> reward 1
--
-- Tools: `get <key>` reads the task's hidden key-value table, `add a b`, `mul a b`. The first
-- op is `get k` or `add a b`; each later op (`add n`, `mul n`) applies to the previous result,
-- which the agent must copy into the call. Capability tags: lookup (the first op is a get),
-- arith (an add or mul is called), chain2 / chain3 (two / three dependent calls), recover (a
-- call answers "err busy" the first time it is made and must be made again), distract (every
-- result comes after irrelevant "k=v" items). Difficulty knobs: chain length, operand digits,
-- busy errors (1 or 2), distractors (1 or 2); gen's level (1..3) turns them up together.
--
-- Rules: each turn has one right action (the solver's); any other ends the episode with reward
-- 0, and info.wrong names the turn type it failed at (state_key: "call1", "call2", "call3",
-- "retry", "answer"); the right answer ends it with reward 1. An answer is right when it equals
-- task.answer, so a task whose stated answer the tools do not give can never be solved.
--
-- M.solve(task) is the scripted solver: it plays the episode from the observations alone (it
-- reads the prompt, makes each call, repeats a busy one, copies the last "=" value) and returns
-- success and its actions. It is the verifier of synthesised tasks (M.verify, an rl.synth
-- verifier function): a task it cannot solve is discarded. M.oracle (for SFT) demonstrates the
-- solver's actions; the split "sft" under-represents recover and chain3 (4% each instead of
-- about a third), so the warm-started agent has gaps a diagnosis can find.
--
-- Splits: "train" and "test" draw from the target distribution (every tag at mixed difficulty);
-- a task is held out ("test") when a hash of its key says so (one in four), and no other split
-- or gen returns one. M.suite(n) is the fixed held-out suite. gen(params, rng) synthesises a
-- task that has every tag of params.focus at params.level (the synthesis loop's generator).
local rl = require "moonrl"

local M = { name = "toolbox", format = "line", max_turns = 6 }

M.tags = { "lookup", "arith", "chain2", "chain3", "recover", "distract" }
local TAG_SET = {}
for _, t in ipairs(M.tags) do TAG_SET[t] = true end
M.levels = { 1, 2, 3 }

local function hash(s)
  local h = 0xcbf29ce484222325
  for i = 1, #s do h = (h ~ s:byte(i)) * 0x100000001b3 end
  return h & 0x7FFFFFFF
end

-- ---------------------------------------------------------------- tasks

-- The capability tags of a task's structure.
local function tags_of(t)
  local out = {}
  if t.ops[1][1] == "get" then out[#out + 1] = "lookup" end
  if t.ops[1][1] ~= "get" or #t.ops > 1 then out[#out + 1] = "arith" end
  if #t.ops == 2 then out[#out + 1] = "chain2" end
  if #t.ops == 3 then out[#out + 1] = "chain3" end
  if t.busy and #t.busy > 0 then out[#out + 1] = "recover" end
  if (t.noise or 0) > 0 then out[#out + 1] = "distract" end
  return out
end

-- The prompt of a task: its ops joined with ",".
local function prompt_of(ops)
  local parts = {}
  for i, op in ipairs(ops) do parts[i] = table.concat(op, " ") end
  return table.concat(parts, ",")
end

-- What the tools give: op applied to v (the previous result; nil for the first op), or nil,
-- the error text.
local function apply(tab, op, v)
  local name = op[1]
  if name == "get" then
    local x = tab[op[2]]
    if x == nil then return nil, "err nokey" end
    return x
  end
  local a, b
  if v == nil then a, b = tonumber(op[2]), tonumber(op[3]) else a, b = v, tonumber(op[2]) end
  if not (a and b) then return nil, "err args" end
  if name == "add" then return math.tointeger(a + b) end
  if name == "mul" then return math.tointeger(a * b) end
  return nil, "err notool"
end

-- M.make{ops =, tab =, busy =, noise =, answer =, level =}: a task. ops is a list of ops
-- ({"get", "k3"}, {"add", "17", "25"}, then {"add", "5"} or {"mul", "3"}); tab the lookup table
-- (key -> integer); busy a list of call indices whose first attempt answers "err busy" (an index
-- twice: two busy answers); noise the distractors per result. answer defaults to what the tools
-- give. The task's prompt, tags and key are filled in.
function M.make(spec)
  local t = { ops = spec.ops, tab = spec.tab or {}, busy = spec.busy or {}, noise = spec.noise or 0,
    level = spec.level, seed = spec.seed }
  local v = nil
  for _, op in ipairs(t.ops) do
    v = apply(t.tab, op, v)
    if v == nil then break end
  end
  t.answer = spec.answer or (v and tostring(v)) or "?"
  t.prompt = prompt_of(t.ops)
  t.tags = tags_of(t)
  t.key = M.key(t)
  return t
end

-- The key of a task (for pools and novelty), from its fields: prompt, answer, busy calls,
-- distractors, distractor seed.
function M.key(task)
  local busy = {}
  for i, b in ipairs(task.busy or {}) do busy[i] = tostring(b) end
  return string.format("%s|%s|b%s|n%d|s%d", task.prompt, tostring(task.answer), table.concat(busy, "."),
    task.noise or 0, task.seed or 0)
end

-- Whether a task is held out (one key in four).
function M.is_held_out(task) return hash("held " .. M.key(task)) % 4 == 0 end

-- Draws a task of the given structure: n ops, the first a get (lookup) or not, busy errors
-- (0, 1 or 2), noise items, operand digits (1 or 2).
local function draw(rng, n, lookup, errors, noise, digits)
  local function operand() if digits == 2 then return rng:random(10, 49) end return rng:random(1, 9) end
  local tab, keys = {}, {}
  for k = 1, 9 do keys[k] = "k" .. k end
  for i = 9, 2, -1 do
    local j = rng:random(1, i)
    keys[i], keys[j] = keys[j], keys[i]
  end
  for i = 1, 4 do tab[keys[i]] = digits == 2 and rng:random(10, 49) or rng:random(1, 9) end
  local ops = {}
  if lookup then ops[1] = { "get", keys[rng:random(1, 4)] }
  else ops[1] = { "add", tostring(operand()), tostring(operand()) } end
  for i = 2, n do
    if rng:random() < 0.5 then ops[i] = { "add", tostring(operand()) }
    else ops[i] = { "mul", tostring(rng:random(2, digits == 2 and 5 or 4)) } end
  end
  local busy = {}
  for i = 1, errors do busy[i] = rng:random(1, n) end
  table.sort(busy)
  return { ops = ops, tab = tab, busy = busy, noise = noise, seed = rng:random(0, 999) }
end

-- The knobs of a level: operand digits, busy errors, distractors.
local LEVEL = {
  { digits = 1, errors = 1, noise = 1 },
  { digits = 1, errors = 1, noise = 2 },
  { digits = 2, errors = 2, noise = 2 },
}

-- gen(params, rng) -> a task that has every tag of params.focus (a list of tags; chain2 and
-- chain3 together: one of them, at random) at params.level (1..3: operand digits, busy errors,
-- distractors), its other tags at the target distribution's rates; never a held-out task
-- unless params.split == "test". The task records focus and level.
function M.gen(params, rng)
  local focus = {}
  for _, tag in ipairs(params.focus or {}) do
    if not TAG_SET[tag] then error("toolbox.gen: focus: unknown tag " .. tostring(tag), 2) end
    focus[tag] = true
  end
  local level = params.level or rng:random(1, 3)
  if not LEVEL[level] then error("toolbox.gen: level: 1, 2 or 3 expected, got " .. tostring(level), 2) end
  local k = LEVEL[level]
  local test = params.split == "test"
  while true do
    local n
    if focus.chain2 and focus.chain3 then n = rng:random(2, 3)
    elseif focus.chain3 then n = 3
    elseif focus.chain2 then n = 2
    else n = rng:random(1, 3) end
    local lookup = rng:random() < 0.5
    if focus.lookup then lookup = true end
    if focus.arith and n == 1 and lookup then
      if focus.lookup then n = 2 else lookup = false end
    end
    local errors = (focus.recover or rng:random() < 0.35) and k.errors or 0
    local noise = (focus.distract or rng:random() < 0.35) and rng:random(1, k.noise) or 0
    local spec = draw(rng, n, lookup, errors, noise, rng:random() < 0.5 and k.digits or 1)
    spec.level = level
    local t = M.make(spec)
    t.focus = params.focus
    if M.is_held_out(t) == test then return t end
  end
end

-- The target distribution: chain length 1..3 uniformly, lookup or arith first, recover and
-- distract each about one task in three, level 1..3; "sft": the same with three ops and busy
-- errors 4% each (the oracle's gaps).
local function target_task(rng, split)
  while true do
    local n, errors_p = rng:random(1, 3), 0.35
    if split == "sft" then
      n = rng:random() < 0.04 and 3 or rng:random(1, 2)
      errors_p = 0.04
    end
    local k = LEVEL[rng:random(1, 3)]
    local errors = rng:random() < errors_p and k.errors or 0
    local noise = rng:random() < 0.35 and rng:random(1, k.noise) or 0
    local t = M.make(draw(rng, n, rng:random() < 0.5, errors, noise, rng:random() < 0.5 and k.digits or 1))
    if M.is_held_out(t) == (split == "test") then return t end
  end
end

-- tasks(split, n, seed): "train" (the target distribution), "test" (held out), "sft" (the
-- oracle's skewed one), "random" (gen with two random focus tags at a random level: untargeted
-- synthetic tasks).
function M.tasks(split, n, seed)
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do
    if split == "train" or split == "test" or split == "sft" then out[i] = target_task(rng, split)
    elseif split == "random" then
      local a = M.tags[rng:random(#M.tags)]
      local b = M.tags[rng:random(#M.tags)]
      out[i] = M.gen({ focus = { a, b }, level = rng:random(1, 3) }, rng)
    else
      error("toolbox.tasks: split: \"train\", \"test\", \"sft\" or \"random\" expected, got " .. tostring(split), 2)
    end
  end
  return out
end

-- The held-out suite: n tasks of split "test" from a fixed seed, the same for every run.
M.SUITE_SEED = 400400
function M.suite(n) return M.tasks("test", n or 400, M.SUITE_SEED) end

-- ---------------------------------------------------------------- episodes

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.call, self.v, self.tries = task, 1, nil, 0
  self.busy_left = {}
  for _, b in ipairs(task.busy or {}) do self.busy_left[b] = (self.busy_left[b] or 0) + 1 end
  self.rng = rl.rng(hash(M.key(task)))
  self.retry = false
  return task.prompt
end

-- The call the solver makes for op i with the previous result v.
local function call_text(op, v)
  if v == nil then return "CALL " .. table.concat(op, " ") end
  return string.format("CALL %s %d %s", op[1], v, op[2])
end

-- The turn type the agent faces.
function Episode:state_key()
  if self.call > #self.task.ops then return "answer" end
  if self.retry then return "retry" end
  return "call" .. self.call
end

-- A result as the agent sees it: the value after "=", distractors first.
function Episode:result(v)
  local parts = {}
  for _ = 1, self.task.noise or 0 do
    parts[#parts + 1] = string.format("k%d=%d", self.rng:random(1, 9), self.rng:random(1, 49))
  end
  parts[#parts + 1] = "=" .. tostring(v)
  return table.concat(parts, " ")
end

function Episode:step(action, parsed)
  local kind = self:state_key()
  local text = (action or ""):match("^%s*(.-)%s*$")
  if kind == "answer" then
    local right = parsed and parsed.kind == "answer" and parsed.text and parsed.text:match("^%s*(.-)%s*$") == self.task.answer
    return nil, right and 1 or 0, true, { success = right and true or false, wrong = not right and kind or nil }
  end
  local op = self.task.ops[self.call]
  if text ~= call_text(op, self.v) then
    return nil, 0, true, { success = false, wrong = kind, tool_call = parsed and parsed.kind == "call" or nil }
  end
  if (self.busy_left[self.call] or 0) > 0 then
    self.busy_left[self.call] = self.busy_left[self.call] - 1
    self.retry = true
    return "err busy", 0, false, { success = false, tool_call = true }
  end
  local v, err = apply(self.task.tab, op, self.v)
  self.retry = false
  if v == nil then return err, 0, false, { success = false, tool_call = true } end
  self.v, self.call = v, self.call + 1
  return self:result(v), 0, false, { success = false, tool_call = true }
end

function Episode:clone()
  local c = setmetatable({}, Episode)
  for k, v in pairs(self) do c[k] = v end
  c.busy_left = {}
  for k, v in pairs(self.busy_left) do c.busy_left[k] = v end
  c.rng = rl.rng(hash(M.key(self.task) .. self.call .. tostring(self.v)))
  return c
end

-- ---------------------------------------------------------------- solver, oracle, verifier

-- M.solve(task) -> success, actions: the scripted solver plays the episode from what it sees.
-- It reads the ops from the prompt, calls each (the previous result copied in), calls again
-- after "err busy" (up to max_turns), takes the last "=" value of a result, and answers it.
function M.solve(task)
  local inst = M.new()
  local obs = inst:reset(task)
  local ops = {}
  for part in (obs .. ","):gmatch("([^,]*),") do
    local op = {}
    for w in part:gmatch("%S+") do op[#op + 1] = w end
    ops[#ops + 1] = op
  end
  local actions, v, i = {}, nil, 1
  for _ = 1, M.max_turns do
    local action
    if i > #ops then action = "ANSWER " .. tostring(v)
    else action = call_text(ops[i], v) end
    actions[#actions + 1] = action
    local nxt, reward, done, info = inst:step(action, rl.parse.parse(action, "line"))
    if done then return reward == 1 and info.success == true, actions end
    if nxt ~= "err busy" then
      local x = nxt and nxt:match("=(%-?%d+)$")
      if not x then return false, actions end
      v, i = math.tointeger(tonumber(x)), i + 1
    end
  end
  return false, actions
end

-- The verifier of synthesised tasks (an rl.synth.loop verifier function): the solver must
-- solve the task within max_turns.
function M.verify(task)
  if type(task) ~= "table" or type(task.ops) ~= "table" or type(task.prompt) ~= "string" then
    return false, "malformed", "a toolbox task (ops, prompt) expected"
  end
  local ok, solved = pcall(M.solve, task)
  if not ok then return false, "solver_error", tostring(solved) end
  if not solved then return false, "unsolvable", "the scripted solver cannot solve " .. M.key(task) end
  return true
end

-- The SFT oracle: the solver's actions (its gaps come from the "sft" split's skew).
function M.oracle(task)
  local _, actions = M.solve(task)
  return actions
end

return M
