-- ledger.lua - Ledger-QA (UMA, spec reproductions.md section 3.3): a stream of account updates
-- shown one per turn, a structured memory bank the policy keeps with CRUD operations, and
-- questions answered from the bank alone.
--
-- Two kinds of task, one environment:
--   memory  the stream: observation "ann +5" (add 5 to ann; an unseen account starts at 0) or
--           "bob x" (bob's account is closed); the action is one memory op on the bank:
--           "set ann 8", "del bob" or "none". The episode ends after the last update. A turn's
--           reward is the format term: 0 for a well-formed op, -0.1 otherwise (the op is then
--           ignored). Each step's info carries bank (the bank after the op, as text), truth (the
--           true ledger's text), touched (the update's account), op_ok (whether the op left
--           that account's entry equal to the truth) and guideline (the op's score against the
--           fixed memory guideline M.guideline, M.guideline_score: 1, 0 or -1; MemCoE).
--   qa      observation "ann=8 bob=3|ann?" (a bank and a question; the updates are not shown),
--           action the value ("8") or "none" for an account not in the bank; reward 1 when it is
--           the true ledger's value (or "none" for a closed or unseen account), else 0; one turn.
--
-- Values stay in 0..9 (one digit), at most M.accounts accounts a stream. Splits: a stream is
-- held out ("test") when a hash of its updates is 0 mod 5, so no test stream is a training one;
-- M.stream(len, split, rng) draws one; M.tasks(split, n, seed [, {len =, kind =}]) makes n tasks:
-- kind "memory" (the default for "test"), "qa", or "mixed" (the default for "train", what SFT
-- uses: memory streams of 3..8 updates, and QA tasks on the bank the imperfect oracle kept).
-- M.qa_task(bank_text, truth, account) makes a QA task; M.questions(task) the final questions
-- (one per account of the stream). M.oracle(task, rng): the demonstrator, right on each op with
-- probability 1 - M.slip, else it writes the account's previous value (forgets the update);
-- it answers QA from the bank it is given. M.perfect(task) never slips.
local rl = require "moonrl"

local M = { name = "ledger", format = "line", max_turns = 8, accounts = 3, slip = 0.15, invalid = -0.1,
  max_bank = 6 }
M.names = { "ann", "bob", "cal", "dee", "eve", "fay", "gus", "hal" }

local function hash(s)
  local h = 17
  for i = 1, #s do h = rl.train.mix(h, s:byte(i)) end
  return h
end

-- ---------------------------------------------------------------- banks

-- A bank: {order = {names in insertion order}, value = {name = digit text}}.
local function new_bank() return { order = {}, value = {} } end

local function bank_set(b, name, v)
  if b.value[name] == nil then
    if #b.order >= M.max_bank then return false end
    b.order[#b.order + 1] = name
  end
  b.value[name] = v
  return true
end

local function bank_del(b, name)
  if b.value[name] == nil then return end
  b.value[name] = nil
  for i, n in ipairs(b.order) do
    if n == name then table.remove(b.order, i) break end
  end
end

-- "ann=8 bob=3" (insertion order); "empty" for none.
function M.bank_text(b)
  local parts = {}
  for _, n in ipairs(b.order) do parts[#parts + 1] = n .. "=" .. b.value[n] end
  return #parts > 0 and table.concat(parts, " ") or "empty"
end

-- The value of account in a bank's text, or nil.
function M.lookup(text, account)
  for n, v in text:gmatch("(%a+)=(%d+)") do
    if n == account then return v end
  end
  return nil
end

-- One memory op's text -> {op = "set" | "del" | "none", name =, value =} or nil (malformed).
function M.parse_op(text)
  text = text:match("^%s*(.-)%s*$")
  local name, v = text:match("^set (%l+) (%d)$")
  if name then return { op = "set", name = name, value = v } end
  name = text:match("^del (%l+)$")
  if name then return { op = "del", name = name } end
  if text == "none" then return { op = "none" } end
  return nil
end

-- ---------------------------------------------------------------- streams and tasks

local function draw_stream(len, rng)
  local pool = {}
  for i, n in ipairs(M.names) do pool[i] = n end
  local names = {}
  for k = 1, M.accounts do names[k] = table.remove(pool, rng:random(#pool)) end
  local value, updates = {}, {}
  for t = 1, len do
    local name = names[rng:random(#names)]
    local v = value[name]
    if v ~= nil and v > 0 and rng:random(5) == 1 then
      updates[t] = { name = name, close = true, text = name .. " x" }
      value[name] = nil
    else
      v = v or 0
      local d
      repeat
        d = rng:random(4) * (rng:random(2) == 1 and 1 or -1)
      until v + d >= 0 and v + d <= 9
      updates[t] = { name = name, delta = d, text = string.format("%s %+d", name, d) }
      value[name] = v + d
    end
  end
  return names, updates
end

local function stream_key(updates)
  local parts = {}
  for t, u in ipairs(updates) do parts[t] = u.text end
  return table.concat(parts, ";")
end

-- One stream of len updates of the split: {kind = "memory", len =, names =, updates =, max_turns =}.
function M.stream(len, split, rng)
  assert(split == "train" or split == "test", "split must be \"train\" or \"test\"")
  assert(math.type(len) == "integer" and len >= 1 and len <= M.max_turns, "len: 1.." .. M.max_turns .. " expected")
  while true do
    local names, updates = draw_stream(len, rng)
    local test = hash(stream_key(updates)) % 5 == 0
    if test == (split == "test") then
      return { kind = "memory", len = len, names = names, updates = updates, max_turns = len }
    end
  end
end

-- The true ledger after the first t updates of a memory task, as a bank.
function M.truth(task, t)
  local b = new_bank()
  for k = 1, t or #task.updates do
    local u = task.updates[k]
    if u.close then bank_del(b, u.name) else
      bank_set(b, u.name, tostring(tonumber(b.value[u.name] or "0") + u.delta))
    end
  end
  return b
end

-- The right answer to "account?" about a true ledger's text.
local function answer_of(truth_text, account) return M.lookup(truth_text, account) or "none" end

function M.qa_task(bank_text, truth_text, account)
  return { kind = "qa", bank = bank_text, question = account, answer = answer_of(truth_text, account), max_turns = 1 }
end

-- The final questions of a memory task: one per account of the stream (about the true ledger).
function M.questions(task) return task.names end

-- The op the demonstrator writes at update t given the true values so far (a slip: the
-- account's previous value, or "none" for an unseen one).
local function demo_op(task, t, slip)
  local u = task.updates[t]
  if u.close then return slip and "none" or ("del " .. u.name) end
  local before = M.truth(task, t - 1).value[u.name]
  if slip then return before and ("set " .. u.name .. " " .. before) or "none" end
  return "set " .. u.name .. " " .. M.truth(task, t).value[u.name]
end

function M.tasks(split, n, seed, opts)
  opts = opts or {}
  local kind = opts.kind or (split == "train" and "mixed" or "memory")
  local rng, out = rl.rng(seed or 0), {}
  for i = 1, n do
    local len = opts.len or (3 + (i - 1) % (M.max_turns - 2))
    local s = M.stream(len, split, rng)
    if kind == "qa" or (kind == "mixed" and i % 2 == 0) then
      -- the bank the demonstrator would keep over the stream, asked about one account
      local b = new_bank()
      for t = 1, len do
        local op = M.parse_op(demo_op(s, t, rng:random() < M.slip))
        if op.op == "set" then bank_set(b, op.name, op.value) elseif op.op == "del" then bank_del(b, op.name) end
      end
      out[i] = M.qa_task(M.bank_text(b), M.bank_text(M.truth(s)), s.names[rng:random(#s.names)])
    else
      out[i] = s
    end
  end
  return out
end

-- ---------------------------------------------------------------- the memory guideline (MemCoE)

-- MemCoE's second stage scores each memory op against a global guideline; its first stage (the
-- guideline induced by an LLM from contrastive feedback) has no miniature, so the guideline here
-- is fixed.
M.guideline = "after each update set the account to its running total (the sum of its changes so far in the "
  .. "stream); delete an account when it is closed; never delete an account that is still open (a later "
  .. "question may need it)"

-- guideline_score(op, update, truth) -> 1, 0 or -1: the op (M.parse_op's, nil when malformed)
-- written for update ({name =, delta =} or {name =, close = true}), truth the true ledger after
-- the update (a bank, M.truth's). -1: it deletes an account still open in truth; 1: it sets the
-- updated account to its running total, or deletes the closed account; 0 otherwise (a malformed
-- op's penalty is the format term's).
function M.guideline_score(op, update, truth)
  if not op then return 0 end
  if op.op == "del" and truth.value[op.name] ~= nil then return -1 end
  if update.close then return (op.op == "del" and op.name == update.name) and 1 or 0 end
  return (op.op == "set" and op.name == update.name and op.value == truth.value[update.name]) and 1 or 0
end

-- ---------------------------------------------------------------- episodes

local Episode = {}
Episode.__index = Episode
function M.new() return setmetatable({}, Episode) end

function Episode:reset(task)
  self.task, self.t, self.bank = task, 0, new_bank()
  if task.kind == "qa" then return task.bank .. "|" .. task.question .. "?" end
  return task.updates[1].text
end

function Episode:clone()
  local c = setmetatable({ task = self.task, t = self.t, bank = new_bank() }, Episode)
  for _, n in ipairs(self.bank.order) do bank_set(c.bank, n, self.bank.value[n]) end
  return c
end

function Episode:step(action)
  local task = self.task
  if task.kind == "qa" then
    local right = action:match("^%s*(.-)%s*$") == task.answer
    return nil, right and 1 or 0, true, { success = right }
  end
  self.t = self.t + 1
  local op, reward = M.parse_op(action), 0
  if not op then
    reward = M.invalid
  elseif op.op == "set" then
    bank_set(self.bank, op.name, op.value)
  elseif op.op == "del" then
    bank_del(self.bank, op.name)
  end
  local u = task.updates[self.t]
  local truth = M.truth(task, self.t)
  local guideline = M.guideline_score(op, u, truth)
  local info = { bank = M.bank_text(self.bank), truth = M.bank_text(truth), touched = u.name, state = self.t,
    op_ok = self.bank.value[u.name] == truth.value[u.name], guideline = guideline }
  local done = self.t >= #task.updates
  if done then info.success = info.bank == info.truth end
  return (not done) and task.updates[self.t + 1].text or nil, reward, done, info
end

-- ---------------------------------------------------------------- Task-Stratified credit

-- The QA tasks branching from memory episodes ({task =, record =}, the rollout's): from the bank
-- after each op, the account the op updated; after the last op also every account of the
-- stream. Each task carries mem (the episode's index), state (the op, 1-based) and final.
function M.branches(episodes)
  local list = {}
  for i, ep in ipairs(episodes) do
    local n = #ep.record
    for t, rec in ipairs(ep.record) do
      local info = rec.info
      if type(info) == "table" and info.bank then
        local asked = {}
        local function ask(name, final)
          if asked[name] then return end
          asked[name] = true
          local q = M.qa_task(info.bank, info.truth, name)
          q.mem, q.state, q.final = i, t, final
          list[#list + 1] = q
        end
        if t == n then
          for _, name in ipairs(ep.task.names) do ask(name, true) end
        end
        ask(info.touched, t == n)
      end
    end
  end
  return list
end

local function mean(list)
  local s = 0
  for _, v in ipairs(list) do s = s + v end
  return #list > 0 and s / #list or 0
end

-- (v - mean) / (population sd + 1e-6) over a list; 0 for a list of one.
local function normalise(values)
  local m, sq = mean(values), 0
  for _, v in ipairs(values) do sq = sq + (v - m) ^ 2 end
  local sd, out = math.sqrt(sq / #values), {}
  for k, v in ipairs(values) do out[k] = #values > 1 and (v - m) / (sd + 1e-6) or 0 end
  return out
end

-- Groups of indices by key(item), in order of first appearance.
local function by_key(items, key)
  local order, groups = {}, {}
  for i, it in ipairs(items) do
    local g = key(it)
    if not groups[g] then
      groups[g] = {}
      order[#order + 1] = g
    end
    table.insert(groups[g], i)
  end
  local out = {}
  for k, g in ipairs(order) do out[k] = groups[g] end
  return out
end

-- Each memory episode's outcome: the mean reward of its final QA branches plus its format
-- terms (the sum of its turns' rewards).
function M.outcomes(memory, qa)
  local fin, out = {}, {}
  for i = 1, #memory do fin[i] = {} end
  for _, q in ipairs(qa) do
    if q.task.final then table.insert(fin[q.task.mem], q.reward) end
  end
  for i, ep in ipairs(memory) do
    local fmt = 0
    for _, rec in ipairs(ep.record) do fmt = fmt + (rec.reward or 0) end
    out[i] = mean(fin[i]) + fmt
  end
  return out
end

-- A turn record's guideline score (info.guideline; 0 for a turn without one).
function M.op_score(rec)
  return type(rec.info) == "table" and rec.info.guideline or 0
end

-- credit(kind, memory, qa [, weight]) -> turn_adv, qa_adv: the advantages of the memory episodes' turns
-- (turn_adv[i][t], t 1-based) and of the QA episodes (qa_adv[j]). memory: {{group =, record =
-- {{reward =}, ...}}, ...}; qa: {{group =, reward =, task = {mem =, state =, final =}}, ...}.
--   "outcome"     GRPO with one normalisation: M.outcomes normalised over each memory group;
--                 every turn of episode i and every QA episode from it get that value.
--   "stratified"  turn t of episode i: the mean reward of the QA episodes from its state t plus
--                 the turn's format term, normalised over the group's episodes with a state t;
--                 QA episodes normalised within their own group (one question, one bank).
--   "guideline"   MemCoE's guideline-aligned process rewards added to the outcome: "outcome"'s
--                 values, and turn t of episode i also gets weight x (its guideline score
--                 M.op_score less the mean score of the group's turns t); QA as "outcome".
function M.credit(kind, memory, qa, weight)
  local turn_adv, qa_adv = {}, {}
  for i = 1, #memory do turn_adv[i] = {} end
  local groups = by_key(memory, function(ep) return ep.group end)
  if kind == "guideline" and not (type(weight) == "number" and weight >= 0 and weight < math.huge) then
    error("ledger.credit: weight: a number >= 0 expected for \"guideline\", got " .. tostring(weight), 2)
  end
  if kind == "outcome" or kind == "guideline" then
    local out, per = M.outcomes(memory, qa), {}
    for _, members in ipairs(groups) do
      local values = {}
      for k, i in ipairs(members) do values[k] = out[i] end
      for k, a in ipairs(normalise(values)) do per[members[k]] = a end
    end
    for i, ep in ipairs(memory) do
      for t = 1, #ep.record do turn_adv[i][t] = per[i] end
    end
    for j, q in ipairs(qa) do qa_adv[j] = per[q.task.mem] end
    if kind == "guideline" then
      -- op t's guideline score less the mean score of the group's ops t, times weight
      for _, members in ipairs(groups) do
        local sum, n = {}, {}
        for _, i in ipairs(members) do
          for t, rec in ipairs(memory[i].record) do
            sum[t], n[t] = (sum[t] or 0) + M.op_score(rec), (n[t] or 0) + 1
          end
        end
        for _, i in ipairs(members) do
          for t, rec in ipairs(memory[i].record) do
            turn_adv[i][t] = turn_adv[i][t] + weight * (M.op_score(rec) - sum[t] / n[t])
          end
        end
      end
    end
    return turn_adv, qa_adv
  end
  if kind ~= "stratified" then error("ledger.credit: kind: \"outcome\", \"stratified\" or \"guideline\" expected, got "
    .. tostring(kind), 2) end
  local from = {}
  for i = 1, #memory do from[i] = {} end
  for _, q in ipairs(qa) do
    local s = from[q.task.mem]
    s[q.task.state] = s[q.task.state] or {}
    table.insert(s[q.task.state], q.reward)
  end
  for _, members in ipairs(groups) do
    local at, states = {}, {}
    for _, i in ipairs(members) do
      for t, rec in ipairs(memory[i].record) do
        if from[i][t] then
          if not at[t] then
            at[t] = { who = {}, values = {} }
            states[#states + 1] = t
          end
          table.insert(at[t].who, i)
          table.insert(at[t].values, mean(from[i][t]) + (rec.reward or 0))
        end
      end
    end
    for _, t in ipairs(states) do
      for k, a in ipairs(normalise(at[t].values)) do turn_adv[at[t].who[k]][t] = a end
    end
  end
  for _, members in ipairs(by_key(qa, function(q) return q.group end)) do
    local values = {}
    for k, j in ipairs(members) do values[k] = qa[j].reward end
    for k, a in ipairs(normalise(values)) do qa_adv[members[k]] = a end
  end
  return turn_adv, qa_adv
end

function M.oracle(task, rng)
  if task.kind == "qa" then return { M.lookup(task.bank, task.question) or "none" } end
  local out = {}
  for t = 1, #task.updates do out[t] = demo_op(task, t, rng:random() < M.slip) end
  return out
end

function M.perfect(task)
  if task.kind == "qa" then return { M.lookup(task.bank, task.question) or "none" } end
  local out = {}
  for t = 1, #task.updates do out[t] = demo_op(task, t, false) end
  return out
end

return M
