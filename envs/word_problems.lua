-- word_problems.lua - arithmetic word problems checked by Lua execution, for task synthesis.
-- Six seed topics; a task is a proposal in rl.synth's contract: an instruction, its answer, a Lua
-- check (called with the solver's answer), a Lua solution and failure cases. The solver replies
-- with an arithmetic expression or a number ("-3+5", "2"), which the environment evaluates in a
-- restricted Lua state; the task's check then decides success. One turn.
--
--   observation "It was -3 degrees. It got 5 degrees warmer. What is it now?"   action "-3+5"
--
-- What proposes what: a tiny byte-level policy cannot write Lua, so the proposer is a
-- structured generator driven by the policy's choices. The policy writes "<topic> <size>"
-- ("temp 4") after a prompt that shows an exemplar task ("propose like dive -3 5:"); the
-- generator (M.parse, the contract's parse) moves the exemplar's operands to values drawn
-- uniformly from [x - size, x + size] within the topic's ranges, with the rng the loop seeds
-- for that proposal (drawing again, up to 8 times, while the loop's novelty index holds the
-- task), in the topic the policy named, and writes every field: the instruction (the
-- topic's sentence, with a name and objects picked by a hash of topic and operands), the
-- answer, the check `local x = ... return tonumber(x) == <answer>`, the solution
-- `return (<a>) <op> (<b>)` and failure cases (answer +- 1, the answer with a's sign dropped,
-- the other operation's). So the policy chooses the kind of task and how far from the
-- exemplar to go; the numbers are the generator's. An unknown topic, a size outside 1..9 or
-- any other text is a contract violation. Operands that name a held-out task are read as the
-- next b that does not (the proposer never sees, nor is penalised for, the held-out set).
--
-- Splits: "train" is the seeds' fixed tasks (4 per topic, one-digit operands, one name each);
-- "small" tasks with one-digit operands, any name and object (recipes/synth.lua's warm start);
-- "warm" the same but one task in four with operands up to 15; "wide" any operands over the
-- topics' full ranges, never a held-out task (recipes/synth.lua's warm start and its bound);
-- "test" is held out: any topic, operands over the topics' full ranges, among the one in four
-- topic-and-operand combinations that no warm-start or synthesised task can have (a hash
-- decides; never one of the fixed tasks); "test_neg" the held-out tasks whose first operand is
-- negative (temp, bank, dive).
-- M.with{weakness = "negative", keep = q} is the environment with an oracle that drops the
-- minus sign of negative operands (keeping it with probability q: the injected weakness of
-- recipes/synth.lua's targeting run); M.with{wide = q} one that writes a two-digit operand
-- whole with probability q only (the closed run's).
local rl = require "moonrl"

local M = { name = "word_problems", max_turns = 1, format = "line" }

-- topic: its operation, its sentence, the ranges of a and b.
local TOPICS = {
  { name = "gain", op = "+", a = { 1, 15 }, b = { 1, 15 },
    text = "{who} has {a} {what} and gets {b} more. How many {what} now?" },
  { name = "loss", op = "-", a = { 4, 15 }, b = { 1, 9 },
    text = "{who} has {a} {what} and loses {b}. How many {what} are left?" },
  { name = "boxes", op = "*", a = { 1, 9 }, b = { 1, 9 },
    text = "{who} packs {a} boxes with {b} {what} each. How many {what} in all?" },
  { name = "temp", op = "+", a = { -15, 15 }, b = { 1, 15 },
    text = "{who} sees {a} degrees. It gets {b} degrees warmer. What does {who} see now?" },
  { name = "bank", op = "-", a = { -15, 15 }, b = { 1, 15 },
    text = "{who} had {a} dollars and paid {b}. How many dollars now?" },
  { name = "dive", op = "+", a = { -15, -1 }, b = { 1, 15 },
    text = "{who} dives to {a} meters and rises {b} meters. Where is {who} now?" },
}
M.topics = TOPICS
local BY_NAME = {}
for i, t in ipairs(TOPICS) do BY_NAME[t.name] = i end

local NAMES = { "Ann", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jo", "Kim", "Lu" }
local THINGS = { "apples", "pens", "cards", "cups", "hats", "keys", "nuts", "pins", "eggs", "toys" }

local function hash(s)
  local h = 0xcbf29ce484222325
  for i = 1, #s do h = (h ~ s:byte(i)) * 0x100000001b3 end
  return h & 0x7FFFFFFF
end

local function apply(op, a, b)
  if op == "+" then return a + b elseif op == "-" then return a - b end
  return a * b
end

-- The task of topic k with operands a, b; who and what name the person and the objects (by
-- default picked by a hash of topic and operands, so that a proposal always reads the same).
function M.make(k, a, b, who, what)
  local t = TOPICS[k]
  local h = hash(string.format("%s %d %d", t.name, a, b))
  who = who or NAMES[h % #NAMES + 1]
  what = what or THINGS[(h // #NAMES) % #THINGS + 1]
  local fill = { who = who, what = what, a = tostring(a), b = tostring(b) }
  local text = t.text:gsub("{(%l+)}", fill)
  local ans = apply(t.op, a, b)
  local fails, seen = {}, { [ans] = true }
  local other = t.op == "+" and "-" or "+"
  for _, f in ipairs { ans + 1, ans - 1, apply(t.op, math.abs(a), b), apply(other, a, b) } do
    if not seen[f] then seen[f] = true fails[#fails + 1] = tostring(f) end
  end
  return { instruction = text, answer = tostring(ans),
    check = string.format("local x = ... return tonumber(x) == %d", ans),
    solution = string.format("return (%d) %s (%d)", a, t.op, b), failures = fails,
    topic = t.name, a = a, b = b }
end

-- ---------------------------------------------------------------- proposals in a template

-- The task as the proposer's prompt shows it: "<topic> <a> <b>".
function M.render(task) return string.format("%s %d %d", task.topic, task.a, task.b) end

-- Whether topic k's task with operands a, b is held out (one in four, by a hash).
local function is_held_out(k, a, b) return hash(string.format("held %s %d %d", TOPICS[k].name, a, b)) % 4 == 0 end
M.is_held_out = function(task) return is_held_out(BY_NAME[task.topic], task.a, task.b) end

-- The first operands from (a, b) on, b counting up, that name no held-out task (nil: none).
local function not_held_out(k, a, b)
  local t = TOPICS[k]
  for _ = 1, t.b[2] - t.b[1] + 1 do
    if not is_held_out(k, a, b) then return a, b end
    b = b + 1
    if b > t.b[2] then b = t.b[1] end
  end
  return nil
end

-- A proposal, "<topic> <size>", read into a task moved from the exemplar; or nil and why. With
-- known (the loop's novelty index), up to 8 draws look for operands it does not hold yet, so a
-- duplicate means the proposer named a neighbourhood that is used up, not that the draw was
-- unlucky.
function M.parse(text, exemplar, rng, known)
  local name, size = text:match("^%s*(%l+) (%d)%f[^%d]")
  if not name then return nil, "not \"<topic> <size>\"" end
  local k = BY_NAME[name]
  if not k then return nil, "no topic " .. name end
  size = math.tointeger(tonumber(size))
  if size < 1 then return nil, "size 0" end
  if type(exemplar) ~= "table" or math.type(exemplar.a) ~= "integer" then return nil, "no exemplar to move from" end
  rng = rng or rl.rng(hash(text .. M.render(exemplar)))
  local t = TOPICS[k]
  local function moved(x, range)  -- uniform over [x - size, x + size] within the range
    local lo, hi = math.max(range[1], x - size), math.min(range[2], x + size)
    if lo > hi then return range[1] end
    return rng:random(lo, hi)
  end
  local task
  for _ = 1, known and 8 or 1 do
    local a, b = moved(exemplar.a, t.a), moved(exemplar.b, t.b)
    if a == 0 then a = exemplar.a > 0 and 1 or -1 end
    if a < t.a[1] or a > t.a[2] then a = t.a[1] end
    a, b = not_held_out(k, a, b)
    if a then
      task = M.make(k, a, b)
      if not known or not known(task) then return task end
    end
  end
  if not task then return nil, "every task of these operands is held out" end
  return task
end

M.contract = rl.synth.contract { "instruction", "answer", "check", "solution", "failures",
  parse = M.parse, render = M.render }

-- The novelty key of a task: topic and operands (a new name alone is no new task).
function M.key(task) return M.render(task) end

-- A demonstration of proposing, for the proposer's warm start: mostly the exemplar's topic
-- (one in five another), a size from 1 to 9.
function M.demo(exemplar, rng)
  local k = BY_NAME[exemplar.topic]
  if rng:random() < 0.2 then k = rng:random(#TOPICS) end
  return string.format("%s %d", TOPICS[k].name, rng:random(1, 9))
end

-- The environment's own solver (rl.synth.oracle): it reads the numbers of the instruction.
function M.solve(task)
  local k = BY_NAME[task.topic]
  if not k then return nil end
  local nums = {}
  for n in task.instruction:gmatch("%-?%d+") do nums[#nums + 1] = tonumber(n) end
  if #nums < 2 then return nil end
  return apply(TOPICS[k].op, nums[1], nums[2])
end

-- ---------------------------------------------------------------- splits

-- The seeds' fixed tasks: per topic four tasks with small operands and one name.
local FIXED = {}
local SMALL = { { 2, 3 }, { 4, 1 }, { 5, 4 }, { 3, 6 } }
for k, t in ipairs(TOPICS) do
  for _, ab in ipairs(SMALL) do
    local a, b = ab[1], ab[2]
    if t.a[2] < 0 then a = -a end             -- dive: below the surface
    if t.name == "loss" then a = a + 4 end    -- loss: more to lose from
    FIXED[#FIXED + 1] = M.make(k, a, b, NAMES[k], THINGS[k])
  end
end
M.fixed = FIXED
local FIXED_KEY = {}
for _, t in ipairs(FIXED) do FIXED_KEY[M.render(t)] = true end

-- The seed of each topic: its first fixed task.
M.seeds = {}
for k = 1, #TOPICS do M.seeds[k] = FIXED[(k - 1) * #SMALL + 1] end

local function draw(rng, split)
  while true do
    local k = rng:random(#TOPICS)
    local t = TOPICS[k]
    local a, b = rng:random(t.a[1], t.a[2]), rng:random(t.b[1], t.b[2])
    local ok = a ~= 0 and not FIXED_KEY[string.format("%s %d %d", t.name, a, b)]
    local warm = split == "warm" or split == "small" or split == "wide"
    ok = ok and warm ~= is_held_out(k, a, b)
    if split == "wide" then
      -- the held-out distribution's ranges, on the tasks that are not held out
    elseif warm then
      -- one-digit operands ("warm": one task in four up to 15)
      local limit = split == "warm" and rng:random() < 0.25 and 15 or 9
      ok = ok and math.abs(a) <= limit and b <= limit
    elseif split == "test_neg" then
      ok = ok and a < 0
    end
    if ok then return M.make(k, a, b, NAMES[rng:random(#NAMES)], THINGS[rng:random(#THINGS)]) end
  end
end

-- tasks(split, n, seed): "train" (the fixed tasks, drawn with the seed), "small", "warm",
-- "test", "test_neg".
function M.tasks(split, n, seed)
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do
    if split == "train" then out[i] = FIXED[rng:random(#FIXED)]
    elseif split == "warm" or split == "small" or split == "wide" or split == "test" or split == "test_neg" then out[i] = draw(rng, split)
    else error("word_problems: split: \"train\", \"small\", \"warm\", \"test\" or \"test_neg\" expected, got " .. tostring(split), 2) end
  end
  return out
end

-- ---------------------------------------------------------------- episodes

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task = task
  return task.instruction
end

-- The reply is an arithmetic expression (digits, + - *, parentheses) or a number, evaluated in a
-- restricted Lua state; the task's check judges the value.
function Episode:step(action, parsed)
  local text = (parsed and parsed.kind == "answer" and parsed.text or action):match("^%s*(.-)%s*$")
  local ok = false
  if text ~= "" and #text <= 24 and text:match("^[%d%+%-%*%(%) ]+$") then
    local r = rl.sandbox.lua { code = "return " .. text, budget = 10000, mem_mb = 1 }
    if r.status == "ok" and math.type(r.value) == "integer" then
      ok = rl.synth.check_answer(self.task, tostring(r.value)) == true
    end
  end
  return nil, ok and 1 or 0, true, { success = ok }
end

-- The form of the problem the reply answers: its topic and the sign of its first operand.
function Episode:state_key()
  return string.format("%s/%s", self.task.topic, (self.task.a or 0) < 0 and "neg" or "pos")
end

-- The oracle writes the expression. weak: nil, or {sign = q} (a negative a keeps its sign with
-- probability q, else loses it: the injected weakness) and/or {wide = q} (an operand of two
-- digits is written whole with probability q, else as its ones digit: "12" as "2"). Without an
-- rng a weak oracle is always wrong where it can be.
local function oracle(weak)
  return function(task, rng)
    local k = BY_NAME[task.topic]
    local function keep(q) return q ~= nil and rng ~= nil and rng:random() < q end
    local function write(x, first)
      if weak and weak.sign and first and x < 0 and not keep(weak.sign) then x = -x end
      if weak and weak.wide and math.abs(x) >= 10 and not keep(weak.wide) then
        x = (x < 0 and -1 or 1) * (math.abs(x) % 10)
      end
      return x
    end
    return { string.format("%d%s%d", write(task.a, true), TOPICS[k].op, write(task.b, false)) }
  end
end
M.oracle = oracle(nil)

-- M.with{weakness = "negative", keep = 0, wide = nil}: this environment with an oracle that
-- drops negative operands' signs (keeping them with probability keep: SFT on it teaches the
-- weakness) and, with wide = q, writes two-digit operands whole with probability q only.
function M.with(opts)
  local copy = {}
  for k, v in pairs(M) do copy[k] = v end
  local weak = {}
  if opts.weakness == "negative" then
    weak.sign = opts.keep or 0
    copy.name = M.name .. "_weak"
  elseif opts.weakness ~= nil then
    error("word_problems.with: weakness: \"negative\" expected, got " .. tostring(opts.weakness), 2)
  end
  if opts.wide ~= nil then
    if type(opts.wide) ~= "number" or opts.wide < 0 or opts.wide > 1 then
      error("word_problems.with: wide: a probability expected, got " .. tostring(opts.wide), 2)
    end
    weak.wide = opts.wide
    copy.name = copy.name .. "_narrow"
  end
  copy.oracle = oracle(next(weak) and weak or nil)
  return copy
end

return M
