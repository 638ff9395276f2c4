-- orchestra.lua - Uno-Orchestra in miniature (shared/spec/reproductions.md §3.5): an orchestration
-- policy routes arithmetic problems to frozen scripted workers. Per problem it decides whether to
-- decompose it and, for each (sub)task, which worker runs it with which primitive:
--
--   given "q 7+5*3"     returns "solve strong direct"     one dispatch, done
--   given "q 7+5*3"     returns "split"                   the environment decomposes it:
--   given "s1 5*3"      returns "cheap direct"            the first subtask (the higher-
--   given "s2 7+15"     returns "cheap tool"              precedence step), then the rest with
--                                                          the result the first worker returned
--
-- A problem has one operation ("12*3") or two ("7+5*3"); split is for two only. Operands are
-- 1..9 (small) or 10..19 (large), each large with probability 0.4. The workers and primitives,
-- p(right) by what they are given (a (sub)task is large when one of its numbers has two digits
-- or more, its sign aside):
--
--   worker primitive  cost   one op, small   one op, large   two ops
--   cheap  direct        1            0.95            0.75      0.55
--   cheap  tool          3            0.95            0.95      0.60
--   strong direct       10            0.95            0.95      0.95
--   strong tool         12            0.99            0.99      0.99
--
-- direct: the worker answers from its own head (the cheap one slips on two-digit numbers and on
-- precedence); tool: it writes the expression for a calculator (2 more cost units), so only
-- transcription slips remain, and precedence ones on two operations. On this task distribution
-- the cheap worker alone is right about 70% of the time and the strong one 95% (the spec's
-- figures). A wrong worker returns the right value off by 1, 2 or 10 (either sign).
--
-- Reward = correct - 0.02 x cost (cost: the dispatches' summed costs), as per-turn rewards: each
-- dispatch turn -0.02 x its cost, the last turn + 1 when the final value is right. Anything that
-- is not a valid action ends the episode as invalid: -0.1, not correct. Worker outcomes are
-- deterministic from the task: each task carries a seed and its three dispatch slots (solve, s1,
-- s2) draw their uniforms from it, the same in every episode of the task and in every arm
-- (common random numbers), whatever the policy routes there.
--
-- Each dispatch turn's info has dispatch = {by = "orchestrator", to = worker, primitive =,
-- given = the (sub)task, returned = the worker's value, cost =, right =} and costs = {cost =}
-- (ep.costs.cost is the episode's cost); the last turn's info has success, cost, answer.
-- M.trace_record(step, index, ep) writes an episode as rl.multi's trace.jsonl record.
--
-- Splits: "train" and "test" (held out: one problem text in four, by a hash). Oracles (policies
-- of the observation, for M.play): M.random_router (the SFT demonstrator: uniform over the valid
-- actions), M.always{worker, primitive}, M.best_router (the routing that maximises the expected
-- reward under the table above: the upper bound).
local rl = require "moonrl"

local M = { name = "orchestra", format = "line", max_turns = 3, cost_weight = 0.02, invalid_reward = -0.1,
  large_rate = 0.4, two_op_rate = 0.5 }

-- ACCURACY[worker][primitive] = {one op small, one op large, two ops}; COST likewise.
M.ACCURACY = {
  cheap = { direct = { 0.95, 0.75, 0.55 }, tool = { 0.95, 0.95, 0.60 } },
  strong = { direct = { 0.95, 0.95, 0.95 }, tool = { 0.99, 0.99, 0.99 } },
}
M.COST = { cheap = { direct = 1, tool = 3 }, strong = { direct = 10, tool = 12 } }
M.WORKERS, M.PRIMITIVES = { "cheap", "strong" }, { "direct", "tool" }
local OFFSETS = { 1, -1, 2, -2, 10, -10 }

local function hash(s)
  local h = 0xcbf29ce484222325
  for i = 1, #s do h = (h ~ s:byte(i)) * 0x100000001b3 end
  return h & 0x7FFFFFFF
end

local function apply(op, a, b)
  if op == "+" then return a + b elseif op == "-" then return a - b end
  return a * b
end

-- The subtask's text "a<op>b" and whether it is large.
local function text_of(a, op, b) return string.format("%d%s%d", a, op, b) end
local function is_large(...)
  for _, x in ipairs { ... } do
    if math.abs(x) >= 10 then return true end
  end
  return false
end

-- p(right) of worker w with primitive p on a (sub)task of `ops` operations, large or not.
function M.accuracy(w, p, ops, large)
  local row = M.ACCURACY[w][p]
  if ops == 2 then return row[3] end
  return large and row[2] or row[1]
end

-- ---------------------------------------------------------------- problems

-- make(a, op1, b [, op2, c], seed) -> a task: {text =, a, op1, b, op2, c, ops =, answer =, seed =}.
function M.make(a, op1, b, op2, c, seed)
  local t = { a = a, op1 = op1, b = b, op2 = op2, c = c, seed = seed or 0 }
  if op2 then
    t.ops, t.text = 2, string.format("%d%s%d%s%d", a, op1, b, op2, c)
    if op2 == "*" and op1 ~= "*" then t.answer = apply(op1, a, b * c) else t.answer = apply(op2, apply(op1, a, b), c) end
  else
    t.ops, t.text, t.answer = 1, text_of(a, op1, b), apply(op1, a, b)
  end
  return t
end

-- The first subtask of a two-op task: {a, op, b}, and a function of its value giving the second.
function M.decompose(t)
  if t.op2 == "*" and t.op1 ~= "*" then
    return { t.b, "*", t.c }, function(v) return { t.a, t.op1, v } end
  end
  return { t.a, t.op1, t.b }, function(v) return { v, t.op2, t.c } end
end

function M.is_held_out(task) return hash("held " .. task.text) % 4 == 0 end

local OPS = { "+", "-", "*" }
local function operand(rng) return rng:random() < M.large_rate and rng:random(10, 19) or rng:random(1, 9) end

-- gen(split, rng) -> one task of the split ("train" or "test").
function M.gen(split, rng)
  while true do
    local a, op1, b = operand(rng), OPS[rng:random(3)], operand(rng)
    local op2, c
    if rng:random() < M.two_op_rate then op2, c = OPS[rng:random(3)], operand(rng) end
    local t = M.make(a, op1, b, op2, c, rng:random(1, 0x3FFFFFFF))
    if M.is_held_out(t) == (split == "test") then return t end
  end
end

function M.tasks(split, n, seed)
  if split ~= "train" and split ~= "test" then
    error("orchestra: split: \"train\" or \"test\" expected, got " .. tostring(split), 2)
  end
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen(split, rng) end
  return out
end

-- ---------------------------------------------------------------- workers

-- The frozen scripted worker w with primitive p on a (sub)task whose right value is `value`, of
-- `ops` operations, large or not: its value, from the slot's two uniforms u (right when u[1] <
-- p(right)) and u[2] (which offset when wrong), and whether it is right.
function M.work(w, p, value, ops, large, u)
  if u[1] < M.accuracy(w, p, ops, large) then return value, true end
  return value + OFFSETS[math.floor(u[2] * #OFFSETS) + 1], false
end

-- ---------------------------------------------------------------- episodes

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

local SLOTS = { "solve", "s1", "s2" }

function Episode:reset(task)
  self.task, self.stage, self.cost = task, "top", 0
  local rng = rl.rng(rl.envkit.seed(task.seed, "orchestra workers"))
  self.u = {}
  for _, s in ipairs(SLOTS) do self.u[s] = { rng:random(), rng:random() } end
  return "q " .. task.text
end

local function route_of(text)
  local w, p = text:match("^%s*(%l+) (%l+)%s*$")
  if w and M.COST[w] and M.COST[w][p] then return w, p end
  return nil
end

-- One dispatch of a (sub)task (a list {a, op, b}, or the whole two-op task): the worker's
-- value, the turn's reward share and its info.
function Episode:dispatch(slot, w, p, sub, given)
  local value, large, ops
  if sub.ops == 2 then
    value, large, ops = sub.answer, is_large(sub.a, sub.b, sub.c), 2
  else
    value, large, ops = apply(sub[2], sub[1], sub[3]), is_large(sub[1], sub[3]), 1
  end
  local got, right = M.work(w, p, value, ops, large, self.u[slot])
  local cost = M.COST[w][p]
  self.cost = self.cost + cost
  return got, -M.cost_weight * cost, { dispatch = { by = "orchestrator", to = w, primitive = p, slot = slot,
    given = given, returned = tostring(got), cost = cost, right = right }, costs = { cost = cost } }
end

function Episode:finish(value, reward, info)
  local ok = value == self.task.answer
  info.success, info.cost, info.answer = ok, self.cost, tostring(value)
  return nil, reward + (ok and 1 or 0), true, info
end

function Episode:invalid(why)
  return nil, M.invalid_reward, true, { success = false, invalid = why, cost = self.cost }
end

function Episode:step(action, parsed)
  local text = (parsed and parsed.kind == "answer" and parsed.text or action or "")
  local t = self.task
  if self.stage == "top" then
    if text:match("^%s*split%s*$") then
      if t.ops ~= 2 then return self:invalid("split of one operation") end
      self.stage = "s1"
      local first, rest = M.decompose(t)
      self.first, self.rest = first, rest
      return "s1 " .. text_of(first[1], first[2], first[3]), 0, false, {}
    end
    local w, p = route_of(text:match("^%s*solve (.*)$") or "")
    if not w then return self:invalid("not solve <worker> <primitive> or split") end
    local value, r, info = self:dispatch("solve", w, p, t.ops == 2 and t or { t.a, t.op1, t.b }, t.text)
    return self:finish(value, r, info)
  end
  local w, p = route_of(text)
  if not w then return self:invalid("not <worker> <primitive>") end
  if self.stage == "s1" then
    local sub = self.first
    local value, r, info = self:dispatch("s1", w, p, sub, text_of(sub[1], sub[2], sub[3]))
    self.second = self.rest(value)
    self.stage = "s2"
    return "s2 " .. text_of(self.second[1], self.second[2], self.second[3]), r, false, info
  end
  local sub = self.second
  local value, r, info = self:dispatch("s2", w, p, sub, text_of(sub[1], sub[2], sub[3]))
  return self:finish(value, r, info)
end

function Episode:clone()
  local c = setmetatable({}, Episode)
  for k, v in pairs(self) do c[k] = v end
  return c
end

-- ---------------------------------------------------------------- scripted policies

-- play(task, policy) -> {success =, cost =, reward =, turns =, invalid =}: the task played by
-- policy(observation) -> action.
function M.play(task, policy)
  local inst = M.new()
  local obs, total, turns = inst:reset(task), 0, 0
  while true do
    turns = turns + 1
    local o, r, done, info = inst:step(policy(obs), nil)
    total = total + r
    if done or turns >= M.max_turns then
      return { success = info.success == true, cost = inst.cost, reward = total, turns = turns,
        invalid = info.invalid ~= nil }
    end
    obs = o
  end
end

-- The numbers of an observation ("q 7+5*3", "s2 -6*4") and its number of operations.
local function read(obs)
  local nums, ops = {}, 0
  local body = obs:match("^%S+ (.*)$") or ""
  for n in body:gmatch("%-?%d+") do nums[#nums + 1] = tonumber(n) end
  ops = #nums - 1
  return nums, ops, obs:match("^q ") ~= nil
end

function M.always(w, p)
  return function(obs)
    return (obs:match("^q ") and "solve " or "") .. w .. " " .. p
  end
end

-- The SFT demonstrator's routing: uniform over the valid actions (on a two-op problem split is
-- one of five), drawn from rng.
function M.random_router(rng)
  return function(obs)
    local _, ops, top = read(obs)
    local k = rng:random(top and ops == 2 and 5 or 4)
    if k == 5 then return "split" end
    local w, p = M.WORKERS[(k - 1) // 2 + 1], M.PRIMITIVES[(k - 1) % 2 + 1]
    return (top and "solve " or "") .. w .. " " .. p
  end
end

-- The expected-reward-maximising route of a one-op (sub)task of these numbers: worker, primitive,
-- expected value (p(right) x the rest's value - 0.02 x cost).
local function best_route(large, ops, after)
  local best, bw, bp = -math.huge, nil, nil
  for _, w in ipairs(M.WORKERS) do
    for _, p in ipairs(M.PRIMITIVES) do
      local v = M.accuracy(w, p, ops, large) * after - M.cost_weight * M.COST[w][p]
      if v > best then best, bw, bp = v, w, p end
    end
  end
  return bw, bp, best
end

-- The upper bound: for a two-op problem, split when the expected value of the best routes of
-- both subtasks (the second taken as large when the first's value would be) beats the best
-- direct solve; each subtask routed by its own size.
function M.best_router()
  return function(obs)
    local nums, ops, top = read(obs)
    local large = is_large(table.unpack(nums))
    if not top then
      local w, p = best_route(large, 1, 1)
      return w .. " " .. p
    end
    local w, p, solve = best_route(large, ops, 1)
    if ops == 2 then
      local t = M.make(nums[1], obs:match("^q %-?%d+(%p)"), nums[2], obs:match("^q %-?%d+%p%-?%d+(%p)"), nums[3])
      local first, rest = M.decompose(t)
      local v1 = apply(first[2], first[1], first[3])
      local second = rest(v1)
      local _, _, v2 = best_route(is_large(second[1], second[3]), 1, 1)
      local _, _, split = best_route(is_large(first[1], first[3]), 1, v2)
      if split > solve then return "split" end
    end
    return "solve " .. w .. " " .. p
  end
end

-- The SFT demonstrations: the random router's actions on the task (rl.train's env.oracle).
function M.oracle(task, rng)
  local policy, actions = M.random_router(rng), {}
  local inst = M.new()
  local obs = inst:reset(task)
  for _ = 1, M.max_turns do
    local a = policy(obs)
    actions[#actions + 1] = a
    local o, _, done = inst:step(a, nil)
    if done then break end
    obs = o
  end
  return actions
end

-- ---------------------------------------------------------------- the orchestration trace

-- trace_record(step, index, ep) -> a trace.jsonl record in rl.multi's schema for a batch episode
-- (its task, record, group, success, reward): the orchestrator's turns (agent "orchestrator")
-- and after each dispatch turn the worker's (agent "cheap" or "strong", called_by
-- "orchestrator", given the (sub)task and the primitive, returned its value, with its cost and
-- reward -0.02 x cost). rewards: the orchestrator's return and each worker's summed rewards.
function M.trace_record(step, index, ep)
  local turns, rewards, n, given = {}, { orchestrator = ep.reward }, 0, "q " .. ep.task.text
  local invocation = 1
  for k, rec in ipairs(ep.record) do
    n = n + 1
    local d = type(rec.info) == "table" and rec.info.dispatch or nil
    turns[n] = { turn = n, round = k, agent = "orchestrator", invocation = 1, k = k, given = given,
      returned = rec.action, reward = rec.reward, done = rec.done, ["end"] = rec.done and ep["end"] or nil }
    if d then
      invocation = invocation + 1
      n = n + 1
      local r = -M.cost_weight * d.cost
      turns[n] = { turn = n, round = k, agent = d.to, called_by = d.by, invocation = invocation, k = 1,
        given = d.given .. " " .. d.primitive, returned = d.returned, cost = d.cost, right = d.right, reward = r,
        done = true, ["end"] = "done" }
      rewards[d.to] = (rewards[d.to] or 0) + r
    end
    given = rec.observation
  end
  return { step = step, episode = index, group = ep.group, task = ep.task, success = ep.success == true,
    rewards = rewards, turns = turns }
end

return M
