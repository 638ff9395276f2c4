-- router.lua - a router over three frozen scripted solvers, the miniature of marginal-
-- contribution policy gradients (shared/spec/reproductions.md §3.5). A problem has three parts,
-- each one arithmetic operation (+, - or *) on one-digit operands; the router sends each part to
-- a solver, one turn per part, without seeing the solvers' answers:
--
--   given "1: 7+5"   returns "ann"      given "2: 3*4"   returns "cy"      given "3: 9-2"   returns "bo"
--
-- The three solvers' outputs form the team answer, right only when all three parts are (team
-- reward 1, else 0, on the last turn). The solvers' skills, p(right) by the part's operation:
--
--   solver     +      -      *
--   ann      0.95   0.50   0.40
--   bo       0.50   0.95   0.40
--   cy       0.55   0.55   0.90
--   default  0.50   0.50   0.50    (no one routes to it: the counterfactual's stand-in)
--
-- A wrong solver returns the right value off by 1, 2 or 10 (either sign). Any other action than
-- a solver's name leaves the part without an output (wrong). Outcomes are deterministic from
-- the task: each part draws its uniforms from the task's seed (the same whichever solver is
-- chosen, in every episode of the task and in every arm), and the default's output on a part
-- uses the same ones (the counterfactual keeps the part's luck and changes only the skill).
--
-- The last turn's info has gold, outputs (each part's output, nil for none), defaults (the
-- default solver's output per part), solvers (the chosen names) and success.
-- M.team_reward(outputs, gold) is the team reward of any outputs; M.counterfactual(info, k) the
-- team reward with part k's output replaced by the default's (one exact counterfactual
-- evaluation); M.marginal(info) each part's marginal contribution, team reward minus that.
-- M.expert(op) names the best solver for an operation.
local rl = require "moonrl"

local M = { name = "router", format = "line", max_turns = 3, parts = 3 }

M.SKILL = {
  ann = { ["+"] = 0.95, ["-"] = 0.50, ["*"] = 0.40 },
  bo = { ["+"] = 0.50, ["-"] = 0.95, ["*"] = 0.40 },
  cy = { ["+"] = 0.55, ["-"] = 0.55, ["*"] = 0.90 },
}
M.DEFAULT = { ["+"] = 0.5, ["-"] = 0.5, ["*"] = 0.5 }
M.SOLVERS = { "ann", "bo", "cy" }
local OPS = { "+", "-", "*" }
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

function M.expert(op)
  local best, name = -1, nil
  for _, s in ipairs(M.SOLVERS) do
    if M.SKILL[s][op] > best then best, name = M.SKILL[s][op], s end
  end
  return name
end

-- A task: three parts {a =, op =, b =, answer =}, text "7+5 3*4 9-2", a seed for the draws.
function M.make(parts, seed)
  local texts = {}
  for k, p in ipairs(parts) do
    p.answer = apply(p.op, p.a, p.b)
    texts[k] = string.format("%d%s%d", p.a, p.op, p.b)
  end
  return { parts = parts, text = table.concat(texts, " "), seed = seed or 0 }
end

function M.is_held_out(task) return hash("held " .. task.text) % 4 == 0 end

function M.gen(split, rng)
  while true do
    local parts = {}
    for k = 1, M.parts do parts[k] = { a = rng:random(1, 9), op = OPS[rng:random(3)], b = rng:random(1, 9) } end
    local t = M.make(parts, rng:random(1, 0x3FFFFFFF))
    if M.is_held_out(t) == (split == "test") then return t end
  end
end

function M.tasks(split, n, seed)
  if split ~= "train" and split ~= "test" then
    error("router: split: \"train\" or \"test\" expected, got " .. tostring(split), 2)
  end
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do out[i] = M.gen(split, rng) end
  return out
end

-- A solver's output from a part's uniforms u (right when u[1] < p) and u[2] (the offset).
local function output(p, answer, u)
  if u[1] < p then return answer end
  return answer + OFFSETS[math.floor(u[2] * #OFFSETS) + 1]
end

-- The uniforms of a task: per part {u, offset}, for whichever solver gets it and for the
-- default (a counterfactual with the same luck: the default is right on a part exactly when
-- u < 0.5, so it differs from the routed solver only by its skill).
function M.draws(task)
  local rng = rl.rng(rl.envkit.seed(task.seed, "router solvers"))
  local u = {}
  for k = 1, #task.parts do u[k] = { rng:random(), rng:random() } end
  return u
end

-- ---------------------------------------------------------------- team reward and credit

function M.team_reward(outputs, gold)
  for k = 1, #gold do
    if outputs[k] ~= gold[k] then return 0 end
  end
  return 1
end

function M.counterfactual(info, k)
  local outs = {}
  for j = 1, #info.gold do outs[j] = info.outputs[j] end
  outs[k] = info.defaults[k]
  return M.team_reward(outs, info.gold)
end

function M.marginal(info)
  local r, mc = M.team_reward(info.outputs, info.gold), {}
  for k = 1, #info.gold do mc[k] = r - M.counterfactual(info, k) end
  return mc
end

-- ---------------------------------------------------------------- episodes

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

local function ask(task, k)
  local p = task.parts[k]
  return string.format("%d: %d%s%d", k, p.a, p.op, p.b)
end

function Episode:reset(task)
  self.task, self.k, self.outputs, self.solvers = task, 1, {}, {}
  self.u = M.draws(task)
  return ask(task, 1)
end

function Episode:step(action, parsed)
  local text = (parsed and parsed.kind == "answer" and parsed.text or action or ""):match("^%s*(.-)%s*$")
  local k, p = self.k, self.task.parts[self.k]
  local skill = M.SKILL[text]
  if skill then self.outputs[k] = output(skill[p.op], p.answer, self.u[k]) end
  self.solvers[k] = skill and text or "none"
  if k < #self.task.parts then
    self.k = k + 1
    return ask(self.task, k + 1), 0, false, { solver = self.solvers[k] }
  end
  local gold, defaults = {}, {}
  for j, q in ipairs(self.task.parts) do
    gold[j] = q.answer
    defaults[j] = output(M.DEFAULT[q.op], q.answer, self.u[j])
  end
  local r = M.team_reward(self.outputs, gold)
  return nil, r, true, { solver = self.solvers[k], success = r == 1, gold = gold, outputs = self.outputs,
    defaults = defaults, solvers = self.solvers }
end

function Episode:clone()
  local c = setmetatable({}, Episode)
  for key, v in pairs(self) do c[key] = v end
  c.outputs, c.solvers = table.move(self.outputs, 1, #self.outputs, 1, {}), table.move(self.solvers, 1, #self.solvers, 1, {})
  return c
end

-- The SFT demonstrations: a uniformly random solver per part (the mixed-routing oracle).
function M.oracle(task, rng)
  local out = {}
  for k = 1, #task.parts do out[k] = M.SOLVERS[rng:random(#M.SOLVERS)] end
  return out
end

-- The expert routing (the upper bound).
function M.best(task)
  local out = {}
  for k, p in ipairs(task.parts) do out[k] = M.expert(p.op) end
  return out
end

-- play(task, actions) -> the last turn's info: the task routed by a list of actions.
function M.play(task, actions)
  local inst = M.new()
  inst:reset(task)
  local info
  for k = 1, #task.parts do
    local _, _, done
    _, _, done, info = inst:step(actions[k], nil)
    if done then break end
  end
  return info
end

return M
