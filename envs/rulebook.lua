-- rulebook.lua - task streams governed by a hidden rule (spec reproductions.md, section 2.5),
-- for the skill-library recipe (recipes/skills.lua). Two environments share the rule book:
--
-- The executor (this module): a door shows a letter d (a..p, 16 letters); its code is the letter
-- d + SHIFT[rule] (mod 16), the rule being one of 8 families. The executor tries letters
-- ("try f"); a wrong try answers "no", the right one ends the episode with reward 1; 8 turns.
-- Without help it can only explore (16 letters, 8 tries: about half the time it runs out); with
-- the right one-line skill "skill: +5" in its prompt it opens the door on the first try. The
-- prompt holds the repo's entries, one `skill:` line each (a `+k` rule, or a bare letter: "try
-- this letter first"), or one `last:` line (raw memory: the previous task's compressed
-- trajectory), then "door c".
--
--   observation  "skill: +5\ndoor c"   action  "try h"   -> done, reward 1
--
-- The executor's oracle (SFT) reads each `skill:` line in order and tries what it says (d + k,
-- or the letter), reuses the last trajectory's successful letter when given raw memory, then
-- explores the untried letters from a on: deliberately imperfect, it never infers a rule itself.
--
-- The curator (M.curator): after task i of a stream it sees the repo and the compressed
-- trajectory of task i ("r:+5;f\nc>abh!": door c, tried a, b, h, the last one opened it; "."
-- when it ran out) and emits one operation: "add <text>", "upd <n> <text>", "del <n>" or
-- "none". M.apply(repo, op) gives the repo after it. Its reward is computed by the recipe (the
-- frozen executor on the stream's later tasks), so its own step returns 0.
--
-- Streams: M.streams(split, n, seed, families) -> {{rule =, doors = {4 letters}}, ...}; "train"
-- and "test" draw from disjoint seed spaces; families 7 and 8 are held out of the curator's
-- training (M.TRAIN_FAMILIES) for the domain-transfer rows.
local M = {
  name = "rulebook",
  max_turns = 8,
  format = "line",
  LETTERS = 16,
  SHIFT = { 1, 3, 4, 6, 9, 10, 12, 15 },
  TRAIN_FAMILIES = { 1, 2, 3, 4, 5, 6 },
  HELD_FAMILIES = { 7, 8 },
  MAX_REPO = 4,
  MAX_ENTRY = 16,
  TASKS = 4,
}

local A = string.byte("a")
local function letter(i) return string.char(A + i % M.LETTERS) end
local function index(ch)
  if type(ch) ~= "string" or #ch ~= 1 then return nil end
  local i = ch:byte() - A
  if i < 0 or i >= M.LETTERS then return nil end
  return i
end
M.letter, M.index = letter, index

local function rng_of(seed) return require("moonrl").rng(seed) end

-- The skill text of a rule family.
function M.skill(rule) return "+" .. M.SHIFT[rule] end

-- code(rule, door) -> the letter index that opens the door.
function M.code(rule, door) return (door + M.SHIFT[rule]) % M.LETTERS end

-- The letter a skill line says to try first at door (nil: the line says nothing usable).
function M.suggest(text, door)
  local k = type(text) == "string" and text:match("^%+(%d+)$")
  if k then return (door + tonumber(k)) % M.LETTERS end
  return index(text)
end

-- streams(split, n, seed, families): n streams of the split; each a rule from families (a list of
-- family numbers, default all 8) and TASKS door letters.
function M.streams(split, n, seed, families)
  if split ~= "train" and split ~= "test" then error("rulebook.streams: split: \"train\" or \"test\" expected", 2) end
  if math.type(n) ~= "integer" or n < 0 then error("rulebook.streams: n: a non-negative integer expected", 2) end
  families = families or { 1, 2, 3, 4, 5, 6, 7, 8 }
  for _, f in ipairs(families) do
    if not M.SHIFT[f] then error("rulebook.streams: families: unknown family " .. tostring(f), 2) end
  end
  local rng = rng_of(((seed or 0) * 2 + (split == "test" and 1 or 0)) * 7919 + 13)
  local out = {}
  for i = 1, n do
    local s = { rule = families[rng:random(#families)], doors = {} }
    for t = 1, M.TASKS do s.doors[t] = rng:random(M.LETTERS) - 1 end
    out[i] = s
  end
  return out
end

-- An executor task: {rule =, door =, repo = {texts} or nil, last = trajectory text or nil}.
function M.task(rule, door, repo, last)
  return { rule = rule, door = door, repo = repo or {}, last = last }
end

-- tasks(split, n, seed): executor tasks for SFT / evaluation: a random rule and door, and a
-- repo of 0-3 entries (the right skill in about half of them, wrong rules and letters in the
-- rest) or, one time in six, raw memory.
function M.tasks(split, n, seed)
  if split ~= "train" and split ~= "test" then error("rulebook.tasks: split: \"train\" or \"test\" expected", 2) end
  local rng = rng_of(((seed or 0) * 2 + (split == "test" and 1 or 0)) * 104729 + 7)
  local out = {}
  for i = 1, n do
    local rule, door = rng:random(8), rng:random(M.LETTERS) - 1
    local repo, last = {}, nil
    if rng:random() < 1 / 6 then
      local d = rng:random(M.LETTERS) - 1
      last = rng:random() < 0.7 and (letter(d) .. ">" .. letter(M.code(rule, d)) .. "!") or (letter(d) .. ">abc.")
    else
      local k = rng:random(4) - 1
      for j = 1, k do
        local r = rng:random()
        repo[j] = r < 0.45 and M.skill(rule) or r < 0.8 and M.skill(rng:random(8)) or letter(rng:random(M.LETTERS) - 1)
      end
    end
    out[i] = M.task(rule, door, repo, last)
  end
  return out
end

function M.prompt(task)
  local lines = {}
  for _, s in ipairs(task.repo or {}) do lines[#lines + 1] = "skill: " .. s end
  if task.last then lines[#lines + 1] = "last: " .. task.last end
  lines[#lines + 1] = "door " .. letter(task.door)
  return table.concat(lines, "\n")
end

local Episode = {}
Episode.__index = Episode

function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.code, self.tried = task, M.code(task.rule, task.door), {}
  return M.prompt(task)
end

-- "try x": x is tried; anything else wastes the turn ("say try x").
function Episode:step(action)
  local x = index(type(action) == "string" and action:match("^%s*try%s+(%a)%s*$"))
  if not x then return "say try x", 0, false, { success = false } end
  self.tried[#self.tried + 1] = x
  if x == self.code then return nil, 1, true, { success = true, tried = letter(x) } end
  return "no", 0, false, { success = false, tried = letter(x) }
end

function Episode:clone()
  local c = setmetatable({}, Episode)
  c.task, c.code, c.tried = self.task, self.code, table.move(self.tried, 1, #self.tried, 1, {})
  return c
end

-- The executor's imperfect oracle: the skills' suggestions in order, the raw memory's successful
-- letter, then the untried letters from a on (a fixed order, so that a greedy executor can follow
-- it; random exploration decoded greedily repeats one letter). rng is unused.
function M.oracle(task, rng)
  local order, seen = {}, {}
  local function add(i) if i and not seen[i] then seen[i] = true; order[#order + 1] = i end end
  for _, s in ipairs(task.repo or {}) do add(M.suggest(s, task.door)) end
  if task.last then add(index(task.last:match(">%a*(%a)!$"))) end
  for i = 0, M.LETTERS - 1 do add(i) end
  local out = {}
  for k = 1, M.max_turns do out[k] = "try " .. letter(order[k]) end
  return out
end

-- trajectory(door, tried, success) -> the compressed trajectory "c>abh!" (or "c>abcdefgh.").
function M.trajectory(door, tried, success)
  return letter(door) .. ">" .. table.concat(tried) .. (success and "!" or ".")
end

-- The tried letters and success of an executor episode record (rl.batch episode).
function M.outcome(ep)
  local tried = {}
  for _, r in ipairs(ep.record or {}) do
    if type(r.info) == "table" and r.info.tried then tried[#tried + 1] = r.info.tried end
  end
  return tried, ep.success and true or false, #(ep.record or {})
end

-- apply(repo, op) -> the new repo (a copy), or nil, why for an operation that is malformed or
-- does not fit (an entry longer than MAX_ENTRY bytes, a fifth entry, a number out of range).
function M.apply(repo, op)
  if type(repo) ~= "table" then error("rulebook.apply: repo: a list of strings expected", 2) end
  if type(op) ~= "string" then return nil, "not an operation" end
  op = op:match("^%s*(.-)%s*$")
  local new = table.move(repo, 1, #repo, 1, {})
  if op == "none" then return new end
  local text = op:match("^add%s+(%S+)$")
  if text then
    if #text > M.MAX_ENTRY then return nil, "entry too long" end
    if #new >= M.MAX_REPO then return nil, "repo full" end
    new[#new + 1] = text
    return new
  end
  local n, t = op:match("^upd%s+(%d+)%s+(%S+)$")
  if n then
    n = tonumber(n)
    if not new[n] then return nil, "no entry " .. n end
    if #t > M.MAX_ENTRY then return nil, "entry too long" end
    new[n] = t
    return new
  end
  n = op:match("^del%s+(%d+)$")
  if n then
    n = tonumber(n)
    if not new[n] then return nil, "no entry " .. n end
    table.remove(new, n)
    return new
  end
  return nil, "not an operation"
end

-- The curator environment: one turn; task = {repo =, traj =, stream =, i =}.
local C = { name = "rulebook_curator", max_turns = 1, format = "line" }
M.curator = C

function C.prompt(task)
  return "r:" .. table.concat(task.repo, ";") .. "\n" .. task.traj
end

local Cur = {}
Cur.__index = Cur
function C.new() return setmetatable({}, Cur) end
function Cur:reset(task) self.task = task; return C.prompt(task) end
function Cur:step(action)
  local new, why = M.apply(self.task.repo, action)
  return nil, 0, true, { success = new ~= nil, op_error = why }
end

-- The curator's imperfect oracle: after a success, add the rule it implies (the code minus the
-- door) unless the repo has it, 65% of the time, else a random rule or the letter; after a
-- failure, delete the first entry when there is one (it misled), else nothing.
function C.oracle(task, rng)
  local door, tried, ok = task.traj:match("^(%a)>(%a*)([!.])$")
  if ok == "!" then
    local d, c = index(door), index(tried:sub(-1))
    local right = "+" .. ((c - d) % M.LETTERS)
    for _, s in ipairs(task.repo) do if s == right then return { "none" } end end
    local pick = rng:random() < 0.65 and right or (rng:random() < 0.5 and M.skill(rng:random(8)) or tried:sub(-1))
    if #task.repo >= M.MAX_REPO then return { "upd 1 " .. pick } end
    return { "add " .. pick }
  end
  if #task.repo > 0 then return { "del 1" } end
  return { "none" }
end

-- tasks for the curator's SFT: random repos and trajectories of the training families.
function C.tasks(split, n, seed)
  local rng = rng_of(((seed or 0) * 2 + (split == "test" and 1 or 0)) * 15485863 + 3)
  local out = {}
  for i = 1, n do
    local rule = M.TRAIN_FAMILIES[rng:random(#M.TRAIN_FAMILIES)]
    local door = rng:random(M.LETTERS) - 1
    local repo = {}
    for j = 1, rng:random(3) - 1 do
      repo[j] = rng:random() < 0.4 and M.skill(rule) or M.skill(rng:random(8))
    end
    local tried = {}
    local k = rng:random(8)
    for j = 1, k - 1 do tried[j] = letter((M.code(rule, door) + j) % M.LETTERS) end
    local ok = rng:random() < 0.6
    if ok then tried[k] = letter(M.code(rule, door)) end
    out[i] = { repo = repo, traj = M.trajectory(door, tried, ok) }
  end
  return out
end

return M
