-- lockers.lua - a lifelong stream of locker tasks in one small world, where some tasks need a
-- code seen in an earlier task of the stream: the miniature of ProactAgent's proactive retrieval
-- (spec reproductions.md, section 3.3).
--
-- A world has 8 lockers (1..8), each with a one-letter code (a..z) fixed for the whole stream.
-- A stream is M.stream_length (12) tasks; each task asks to open two lockers, in order, and the
-- observation names the locker at hand and its code, or "?" when it is not shown:
--
--   observation  "lkr 3 k"             locker 3, code k
--   action       "open k"              observation "ok; lkr 5 ?" (the next locker; its code hidden)
--   action       "recall 5"            observation "5=q" (the experience base's entry) or "none"
--   action       "open q"              done, reward 1 ("wrong" for a wrong code, the turn spent)
--
-- A locker's code is shown the first time the stream uses it; later it is hidden with
-- probability M.hide (0.5), and then only the experience base has it (a code seen in task 3,
-- needed in task 9). A task "needs a past fact" when one of its codes is hidden. `recall <k>`
-- costs a turn (it is a turn) and returns the base's entry for locker k, or "none" (any locker,
-- not only the one at hand). `open <c>` tries code c on the locker at hand. Anything else is
-- "bad", the turn spent. Budget: M.max_turns = 4 turns (the engine ends the episode there, reward 0); success
-- (reward 1) is both lockers open.
--
-- The experience base. The environment owns it: it is the list of the codes the stream's
-- observations revealed before the task (every shown code of tasks 1 .. k - 1 of the stream),
-- written by the stream, not by the policy, so the base a task sees is a pure function of
-- (stream, position): each task carries its snapshot (task.memory, never changed after it is
-- made), every episode of a GRPO group (the same task) and every fork or clone of an episode
-- sees the same base, and an arm's base never depends on what another arm's policy did. (A base
-- written by the policy's own actions would make the members of a group see different pasts;
-- this miniature keeps the part of the claim about *when to retrieve*, not about what to store.)
--
-- M.tasks(split, n, seed): the tasks of consecutive streams, in stream order. Split by
-- construction: a world (its 8 codes in order) whose hash says so (about one in five) is held
-- out; "test" draws only those, "train" only the others. Task fields: {stream =, pos =,
-- lockers = {a, b}, codes = {ca, cb}, shown = {bool, bool}, memory = {[k] = code}, need =}.
--
-- M.oracle(task, rng), the SFT warm start's, is deliberately imperfect, with consistent biases
-- that imitation keeps (its most likely choice is the wrong one in two cases): at a hidden code
-- of an even locker it guesses a code first (wrong) and recalls after "wrong" (p = 0.6, else it
-- recalls at once); at a hidden code of an odd locker it recalls (p = 0.8, else it guesses
-- first); it recalls a shown code needlessly (p = 0.6 for lockers 6, 7, 8; 0.15 for the others).
-- M.solve(task) recalls exactly the hidden codes (the ceiling). Instances have clone().
local rl = require "moonrl"

local M = { name = "lockers", format = "line", max_turns = 4, lockers = 8, stream_length = 12,
  hide = 0.5 }

-- The i-th code letter (1..26: a..z).
function M.letter(i) return string.char(96 + i) end

-- Whether a world (its codes in locker order) is held out: about one in five, by a hash.
local function held_out(codes)
  local h = #codes
  for _, c in ipairs(codes) do h = rl.train.mix(h, c:byte()) end
  return h % 5 == 0
end
M.held_out = held_out

-- stream(split, rng) -> the M.stream_length tasks of one stream of a world of that split.
function M.stream(split, rng, id)
  local codes
  repeat
    codes = {}
    for k = 1, M.lockers do codes[k] = M.letter(rng:random(26)) end
  until held_out(codes) == (split == "test")
  local seen, memory, out = {}, {}, {}
  for pos = 1, M.stream_length do
    local a = rng:random(M.lockers)
    local b = rng:random(M.lockers - 1)
    if b >= a then b = b + 1 end
    local task = { stream = id, pos = pos, lockers = { a, b }, codes = { codes[a], codes[b] },
      shown = {}, memory = {}, need = false }
    for k, v in pairs(memory) do task.memory[k] = v end
    for i, l in ipairs(task.lockers) do
      local hide = (seen[l] and rng:random() < M.hide) or false
      task.shown[i] = not hide
      task.need = task.need or hide
    end
    for i, l in ipairs(task.lockers) do
      seen[l] = true
      if task.shown[i] then memory[l] = codes[l] end
    end
    out[pos] = task
  end
  return out
end

-- tasks(split, n, seed) -> n tasks: whole streams in order (the last one cut at n).
function M.tasks(split, n, seed)
  assert(split == "train" or split == "test", "lockers.tasks: split must be \"train\" or \"test\"")
  local rng, out, id = rl.rng(seed or 0), {}, 0
  while #out < n do
    id = id + 1
    for _, t in ipairs(M.stream(split, rng, id)) do
      if #out < n then out[#out + 1] = t end
    end
  end
  return out
end

-- "lkr 3 k" / "lkr 5 ?": locker i of the task (1 or 2), its code or "?" when hidden.
function M.at(task, i)
  return string.format("lkr %d %s", task.lockers[i], task.shown[i] and task.codes[i] or "?")
end
function M.prompt(task) return M.at(task, 1) end

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.cur = task, 1
  return M.prompt(task)
end

function Episode:step(action, parsed)
  local text = ((parsed and parsed.text) or action):lower()
  local task = self.task
  local k = text:match("^%s*recall%s+(%d)%s*$")
  if k then
    local code = task.memory[tonumber(k)]
    return code and (k .. "=" .. code) or "none", 0, false, { recall = true, tool_call = true, success = false }
  end
  local c = text:match("^%s*open%s+(%a)%s*$")
  if not c then return "bad", 0, false, { success = false, invalid = true } end
  if c ~= task.codes[self.cur] then return "wrong", 0, false, { success = false } end
  if self.cur == #task.lockers then return nil, 1, true, { success = true } end
  self.cur = self.cur + 1
  return "ok; " .. M.at(task, self.cur), 0, false, { success = false }
end

function Episode:clone()
  return setmetatable({ task = self.task, cur = self.cur }, Episode)
end

-- The actions of a demonstration: for each locker, recall first when recall(i) says so, guess a
-- wrong code first when guess(i) does (then recall after "wrong").
local function demo(task, recall, guess, rng)
  local out = {}
  for i, l in ipairs(task.lockers) do
    if guess(i) then
      local g
      repeat g = M.letter(rng:random(26)) until g ~= task.codes[i]
      out[#out + 1] = "open " .. g
      out[#out + 1] = "recall " .. l
    elseif recall(i) then
      out[#out + 1] = "recall " .. l
    end
    out[#out + 1] = "open " .. task.codes[i]
  end
  return out
end

-- solve(task) -> the perfect policy's actions: a recall exactly for each hidden code.
function M.solve(task)
  return demo(task, function(i) return not task.shown[i] end, function() return false end)
end

-- oracle(task, rng) -> the SFT oracle's actions (see the top of the file).
function M.oracle(task, rng)
  local plan = {}
  for i, l in ipairs(task.lockers) do
    local u = rng:random()
    if task.shown[i] then
      plan[i] = u < (l >= 6 and 0.6 or 0.15) and "recall" or "open"
    else
      plan[i] = u < (l % 2 == 0 and 0.6 or 0.2) and "guess" or "recall"
    end
  end
  return demo(task, function(i) return plan[i] == "recall" end, function(i) return plan[i] == "guess" end, rng)
end

return M
