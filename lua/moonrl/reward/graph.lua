-- moonrl.reward.graph: a reward graph of named, ordered terms — scoring a batch (values,
-- statuses, gates, clips, totals added in list order, dense per-turn rewards), the advantages it
-- implies, per-term health, contracts (check), exact Shapley attribution over terms (explain),
-- re-scoring of saved batches, hot reload from a file, and its state for checkpoints.
local core = require "moonrl.core"
local check = require "moonrl.reward.check"
local terms = require "moonrl.reward.terms"
local judge = require "moonrl.reward.judge"
local health = require "moonrl.reward.health"
local batchlib = require "moonrl.batch"

local json = core.json
local M = {}

local Graph = { __name = "moonrl.reward.graph" }
Graph.__index = Graph
M.Graph = Graph

function M.is_graph(v) return getmetatable(v) == Graph end

local HISTORY = 64 -- steps of term means kept for the hacking alarm (and in the state)

-- ---------------------------------------------------------------- construction

local function terms_check(v)
  if type(v) ~= "table" or #v == 0 then return "a non-empty list of rl.reward terms" end
  for k in pairs(v) do
    if math.type(k) ~= "integer" or k < 1 or k > #v then return "a list of rl.reward terms (no named keys)" end
  end
  for _, t in ipairs(v) do
    if not terms.is_term(t) then return "a list of rl.reward terms (rl.reward.fn{...}, rl.reward.judge{...}, ...)" end
  end
  return nil
end

local function cases_check(v)
  if type(v) ~= "table" then return "a list of check cases" end
  for k in pairs(v) do
    if math.type(k) ~= "integer" or k < 1 or k > #v then return "a list of check cases" end
  end
  return nil
end

-- The hacking alarm: over the last `window` held-out points a term's mean rose by more than
-- `rise` while held-out success fell by more than `fall` (5 points: about two standard errors of
-- a success rate measured on 256 tasks).
local ALARM = { { "window", check.integer(2), default = 3 }, { "rise", check.number(0), default = 0 },
  { "fall", check.number(0), default = 0.05 } }

-- Checks a graph's definition (opts) and returns the fields a Graph holds, raising at level.
local function definition(opts, level)
  level = level + 1
  local d = check.fields("rl.reward.graph", opts, {
    { "name", check.name, default = "reward" },
    { "terms", terms_check, required = true },
    { "combine", check.enum { "sum", "per_term" }, default = "sum" },
    { "scale", check.enum { "group", "batch" } },
    { "eps", check.number(0), default = 1e-6 },
    { "seed", check.integer(), default = 0 },
    { "checks", cases_check },
    { "alarm", check.sub("alarm", ALARM) },
  }, level)
  if d.scale and d.combine ~= "per_term" then
    error("rl.reward.graph: scale: only with combine = \"per_term\" (under \"sum\" the trainer's "
      .. "advantage estimator normalises the total)", level)
  end
  d.scale = d.scale or "group"
  d.alarm = check.fields("rl.reward.graph", d.alarm or {}, ALARM, level)
  local seen, weighted = {}, 0
  for k, t in ipairs(d.terms) do
    if seen[t.name] then
      error(string.format("rl.reward.graph: terms[%d]: the name '%s' is taken by terms[%d]", k, t.name, seen[t.name]), level)
    end
    if type(t.gate) == "string" and not seen[t.gate] then
      error(string.format("rl.reward.graph: terms[%d] (%s): gate: '%s' is not an earlier term", k, t.name, t.gate), level)
    end
    seen[t.name] = k
    if t.weight ~= 0 then weighted = weighted + 1 end
  end
  if d.combine == "per_term" and weighted == 0 then
    error("rl.reward.graph: combine = \"per_term\" needs a term of non-zero weight", level)
  end
  return d
end

-- rl.reward.graph{name = "reward", terms = {...}, combine = "sum" | "per_term", scale = "group" |
-- "batch" (per_term only), eps = 1e-6, seed = 0, checks = {cases}, alarm = {window = 3, rise = 0,
-- fall = 0.05}} -> g.
function M.graph(opts)
  local g = definition(opts, 2)
  g.version, g.scored, g.history, g.heldout, g.reloads, g.stores = 1, 0, {}, {}, {}, {}
  return setmetatable(g, Graph)
end

-- The judge terms' caches: `cache = true` ones share one per graph (in memory, or the run
-- folder's judge_cache.jsonl once rl.train has called use_dir), a path gets its own.
function Graph:use_dir(dir)
  self.dir = dir
  self.stores = {}
  for _, t in ipairs(self.terms) do t.store = nil end
end

function Graph:prepare()
  for _, t in ipairs(self.terms) do
    if t.calls_judge and t.store == nil and t.cache ~= false then
      local path = t.cache
      if path == true then path = self.dir and self.dir .. "/judge_cache.jsonl" end
      local key = path or ":memory:"
      self.stores[key] = self.stores[key] or judge.cache(path)
      t.store = self.stores[key]
    end
  end
end

-- The weighted terms (weight ~= 0): their names and weights, in order.
function Graph:weighted()
  local names, weights = {}, {}
  for _, t in ipairs(self.terms) do
    if t.weight ~= 0 then
      names[#names + 1], weights[#weights + 1] = t.name, t.weight
    end
  end
  return names, weights
end

-- ---------------------------------------------------------------- the scoring context

local Ctx = {}
Ctx.__index = Ctx

-- What a term function receives per episode: {batch =, index =, episode =, step =, graph =,
-- run = (the trainer's ctx, in a run), turn = (process terms)}.
function Ctx:episode(i)
  return { batch = self.batch, index = i, episode = self.batch.episodes[i], step = self.step,
    graph = self.graph, run = self.run }
end

-- ... and per group: {batch =, members = {episode numbers}, group = id, step =, graph =, run =}.
function Ctx:group(g)
  return { batch = self.batch, members = g.members, group = g.id, step = self.step, graph = self.graph,
    run = self.run }
end

-- The batch's groups (order of first appearance) restricted to the episodes of sel.
function Ctx:groups(sel)
  local want = {}
  for _, i in ipairs(sel) do want[i] = true end
  local out = {}
  for _, g in ipairs(self.all_groups) do
    local m = {}
    for _, i in ipairs(g.members) do if want[i] then m[#m + 1] = i end end
    if #m > 0 then out[#out + 1] = { id = g.id, members = m } end
  end
  return out
end

function Ctx:sampled(i)
  if not self.counts then self.counts = self.batch:sampled_counts() end
  return self.counts[i]
end

-- ---------------------------------------------------------------- scoring

local function clip(v, c) return math.min(math.max(v, c[1]), c[2]) end

-- Scores the batch's episodes (nothing is written to them): a list of {total =, status =, terms =
-- {name = {value =, status =, message =, cost =, cached =, turns = (a dense term's values per
-- turn)}}, rewards = {per turn}}, and the judge terms' counters for this scoring.
function Graph:evaluate(batch, opts)
  opts = opts or {}
  self:prepare()
  local ctx = setmetatable({ batch = batch, graph = self, step = opts.step, run = opts.run,
    seed = self.seed, scored = self.scored, costs = {}, all_groups = batch:groups() }, Ctx)
  local before = {}
  for _, t in ipairs(self.terms) do
    if t.counters then
      before[t.name] = {}
      for k, v in pairs(t.counters) do before[t.name][k] = v end
    end
  end
  local order = {}
  for j, t in ipairs(self.terms) do if not t.late then order[#order + 1] = j end end
  for j, t in ipairs(self.terms) do if t.late then order[#order + 1] = j end end
  local raw = {}
  for _, j in ipairs(order) do
    local term = self.terms[j]
    local out, sel = {}, {}
    for i, ep in ipairs(batch.episodes) do
      if term.when then
        local ok, v = pcall(term.when, ep.task)
        if not ok then
          out[i] = { status = "error", message = "when: " .. tostring(v) }
        elseif v then
          sel[#sel + 1] = i
        else
          out[i] = { status = "na" }
        end
      else
        sel[#sel + 1] = i
      end
    end
    term.eval(term, batch, sel, ctx, out)
    for _, i in ipairs(sel) do
      out[i] = out[i] or { status = "error", message = "the term gave no result" }
    end
    raw[j] = out
  end
  local scores = {}
  for i, ep in ipairs(batch.episodes) do
    local res_i, values = {}, {}
    local total, status = 0, "ok"
    local rewards = {}
    for k = 1, terms.turn_count(ep) do rewards[k] = 0 end
    for j, term in ipairs(self.terms) do
      local r = raw[j][i]
      local res = { status = r.status, value = r.value, message = r.message, cost = r.cost, cached = r.cached }
      local per_turn = r.turns
      if res.status == "ok" and term.clip then
        if per_turn then
          local s, c = 0, {}
          for k, v in ipairs(per_turn) do
            c[k] = clip(v, term.clip)
            s = s + c[k]
          end
          per_turn, res.value = c, s
        else
          res.value = clip(res.value, term.clip)
        end
      end
      if res.status == "ok" and term.gate then
        if type(term.gate) == "string" then
          local gr = res_i[term.gate]
          if gr.status == "unscorable" or gr.status == "error" then
            res = { status = "unscorable", message = "its gate " .. term.gate .. " is " .. gr.status }
          elseif gr.status ~= "ok" or not (gr.value > 0) then
            res = { status = "gated", value = 0 }
          end
        else
          local ok, pass = pcall(term.gate, ep, values)
          if not ok then
            res = { status = "error", message = "gate: " .. tostring(pass) }
          elseif not pass then
            res = { status = "gated", value = 0 }
          end
        end
      end
      if res.status == "ok" and per_turn and term.dense then res.turns = per_turn end
      res_i[term.name] = res
      if res.status == "ok" then
        values[term.name] = res.value
        if term.weight ~= 0 then
          total = total + term.weight * res.value
          if per_turn and term.dense then
            for k, v in ipairs(per_turn) do rewards[k] = (rewards[k] or 0) + term.weight * v end
          end
        end
      elseif term.weight ~= 0 and (res.status == "unscorable" or res.status == "error") then
        status = "unscorable"
      end
    end
    scores[i] = { total = total, status = status, terms = res_i, rewards = rewards }
  end
  local counters = {}
  for _, t in ipairs(self.terms) do
    if t.counters then
      counters[t.name] = {}
      for k, v in pairs(t.counters) do counters[t.name][k] = v - before[t.name][k] end
    end
  end
  return scores, counters
end

-- Writes scores onto the batch's episodes: ep.reward (the total; for an unscorable episode the
-- total of the terms it could be scored on, which no baseline sees), ep.rewards (the dense terms'
-- weighted values per turn), ep.reward_terms ({name = value}: 0 for a term gated, not applicable
-- or unscorable), ep.reward_status ("ok" | "unscorable"), ep.reward_version, ep.reward_detail
-- (the scores' terms).
function Graph:write(batch, scores)
  for i, ep in ipairs(batch.episodes) do
    local s = scores[i]
    local values = {}
    for _, t in ipairs(self.terms) do
      local r = s.terms[t.name]
      values[t.name] = r.status == "ok" and r.value or 0
    end
    ep.reward, ep.rewards, ep.reward_terms = s.total, s.rewards, values
    ep.reward_status, ep.reward_version, ep.reward_detail = s.status, self.version, s.terms
  end
end

local function check_batch(where, batch, level)
  if type(batch) ~= "table" or getmetatable(batch) ~= batchlib.Batch then
    error(string.format("%s: batch: an rl.batch expected, got %s", where, check.describe(batch)), level + 1)
  end
end

-- g:score(batch [, {step =, run =}]) -> scores (one per episode: {total =, status =, terms =
-- {name = {value =, status =, message =, cost =}}}), written onto the episodes (Graph:write).
-- Updates the graph's health figures (g:stats()) and its step history.
function Graph:score(batch, opts)
  check_batch("score", batch, 2)
  local scores, counters = self:evaluate(batch, opts)
  self:write(batch, scores)
  self.scored = self.scored + 1
  self.last = health.batch(self, batch, scores, counters)
  self.last.step = opts and opts.step
  local means = {}
  for _, name in ipairs(self.last.order) do means[name] = self.last.terms[name].mean end
  self.history[#self.history + 1] = { step = opts and opts.step or self.scored, means = means }
  while #self.history > HISTORY do table.remove(self.history, 1) end
  self.last_batch = batch
  return scores
end

-- g:rescore(batch | {batch, ...}) -> scores (a list of them for a list): the stored episodes
-- scored again under the current version (rl.batch.load of a to_jsonl file, a replay buffer's
-- batch), written onto them. The graph's health figures and history stay those of training.
function Graph:rescore(b)
  if type(b) == "table" and getmetatable(b) ~= batchlib.Batch and #b > 0 then
    local out = {}
    for k, x in ipairs(b) do
      check_batch("rescore", x, 2)
      out[k] = self:rescore(x)
    end
    return out
  end
  check_batch("rescore", b, 2)
  local scores = self:evaluate(b)
  self:write(b, scores)
  return scores
end

-- ---------------------------------------------------------------- advantages

-- Per-episode advantages of term contributions c[j][i] (only the listed term positions js): under
-- "sum" the method's (default "grpo") on the totals, under "per_term" GDPO on the values; the
-- unscorable episodes stay out and get 0.
local function advantages_of(g, batch, values, js, opts)
  local n = batch:size()
  local keep = {}
  for i, ep in ipairs(batch.episodes) do
    if ep.reward_status ~= "unscorable" then keep[#keep + 1] = i end
  end
  local out = {}
  for i = 1, n do out[i] = 0 end
  if #keep == 0 or #js == 0 then return out end
  local counts_all = batch:sampled_counts()
  local groups, counts = {}, {}
  for k, i in ipairs(keep) do
    groups[k] = (g.combine == "per_term" and g.scale == "batch") and 1 or batch.episodes[i].group
    counts[k] = counts_all[i]
  end
  local a
  if g.combine == "per_term" then
    local tl, w, scores = {}, {}, {}
    for m, j in ipairs(js) do
      tl[m] = {}
      for k, i in ipairs(keep) do tl[m][k] = values[j][i] end
      w[m] = g.terms[j].weight
    end
    for k in ipairs(keep) do scores[k] = 0 end
    a = core.objective.advantage { method = "gdpo", scores = scores, groups = groups, counts = counts,
      terms = tl, term_weights = w, epsilon = g.eps }
  else
    local totals = {}
    for k, i in ipairs(keep) do
      local s = 0
      for _, j in ipairs(js) do s = s + g.terms[j].weight * values[j][i] end
      totals[k] = s - (batch.episodes[i].kl_penalty or 0)
    end
    a = core.objective.advantage { method = opts.method or "grpo", scores = totals, groups = groups,
      counts = counts, epsilon = opts.epsilon }
  end
  for k, i in ipairs(keep) do out[i] = a[k] end
  return out
end

-- The scored values of the weighted terms: values[j][i] (0 unless ok), and their positions.
local function scored_values(g, batch)
  local values, js = {}, {}
  for j, t in ipairs(g.terms) do
    values[j] = {}
    for i, ep in ipairs(batch.episodes) do
      if type(ep.reward_terms) ~= "table" or ep.reward_terms[t.name] == nil then
        error(string.format("advantages: episode %d was not scored by this graph (it has no term '%s')", i, t.name), 3)
      end
      values[j][i] = ep.reward_terms[t.name]
    end
    if t.weight ~= 0 then js[#js + 1] = j end
  end
  return values, js
end

-- g:advantages(batch [, {method = "grpo", epsilon =}]) -> one advantage per episode of a scored
-- batch: the graph's combination (the method's estimator on the totals under "sum", GDPO under
-- "per_term"), unscorable episodes left out of every group and given 0.
function Graph:advantages(batch, opts)
  check_batch("advantages", batch, 2)
  local values, js = scored_values(self, batch)
  return advantages_of(self, batch, values, js, opts or {})
end

-- g:explain(ep [, {batch =, method =}]) -> {advantage =, base =, terms = {name = share}}: each
-- weighted term's exact Shapley share of ep's advantage (at most 12 of them): the value of a
-- coalition S is ep's advantage when only the terms of S count (for every episode of the batch,
-- from the cached values; the empty coalition's is `base`, 0). The shares sum to advantage - base.
-- batch defaults to the batch scored last; weight-0 terms get 0.
function Graph:explain(ep, opts)
  opts = opts or {}
  local batch = opts.batch or self.last_batch
  if not batch then error("explain: no batch: score one first or pass {batch =}", 2) end
  check_batch("explain", batch, 2)
  local index
  for i, e in ipairs(batch.episodes) do if e == ep then index = i end end
  if not index then error("explain: ep: an episode of the batch expected", 2) end
  local values, js = scored_values(self, batch)
  local k = #js
  if k > 12 then error(string.format("explain: %d weighted terms; exact Shapley values are for at most 12", k), 2) end
  local v = {}
  for mask = 0, (1 << k) - 1 do
    local sub = {}
    for b = 1, k do if mask & (1 << (b - 1)) ~= 0 then sub[#sub + 1] = js[b] end end
    v[mask] = advantages_of(self, batch, values, sub, opts)[index]
  end
  local fact = { [0] = 1 }
  for m = 1, k do fact[m] = fact[m - 1] * m end
  local shares = {}
  for _, t in ipairs(self.terms) do shares[t.name] = 0 end
  for b = 1, k do
    local bit, phi = 1 << (b - 1), 0
    for mask = 0, (1 << k) - 1 do
      if mask & bit == 0 then
        local s = 0
        for c = 1, k do if mask & (1 << (c - 1)) ~= 0 then s = s + 1 end end
        phi = phi + fact[s] * fact[k - s - 1] / fact[k] * (v[mask | bit] - v[mask])
      end
    end
    shares[self.terms[js[b]].name] = phi
  end
  return { advantage = v[(1 << k) - 1], base = v[0], terms = shares }
end

-- ---------------------------------------------------------------- health

-- g:stats() -> the last scored batch's health ({step =, version =, episodes =, unscorable =,
-- order = {names}, terms = {name = {weight =, kind =, mean =, std =, skip =, error =, gated =,
-- na =, dominance =, corr_success =, dead =, alarm =, and for judges calls =, hits =, errors =,
-- timeouts =, tokens =, cost = (this scoring's)}}}) plus judge = {name = totals so far}; nil
-- before the first score.
function Graph:stats()
  if not self.last then return nil end
  local out = {}
  for k, v in pairs(self.last) do out[k] = v end
  out.version = self.version
  out.judge = {}
  for _, t in ipairs(self.terms) do
    if t.counters then
      out.judge[t.name] = {}
      for k, v in pairs(t.counters) do out.judge[t.name][k] = v end
    end
  end
  local alarm = self.alarms or {}
  for name, e in pairs(out.terms) do e.alarm = alarm[name] or false end
  return out
end

-- g:observe(step, heldout_success) -> {name = true | false}: records a held-out evaluation (the
-- trainer calls it after each) beside each term's mean over the steps scored since the previous
-- one; the hacking alarm of each weighted term (health.alarm).
function Graph:observe(step, success)
  if math.type(step) ~= "integer" then error("observe: step: an integer expected, got " .. check.describe(step), 2) end
  if not check.finite(success) then error("observe: success: a number expected, got " .. check.describe(success), 2) end
  -- each term's mean over the steps scored since the previous held-out point (one step is noisy)
  local prev = self.heldout[#self.heldout]
  local sums, n = {}, 0
  for _, h in ipairs(self.history) do
    if h.step <= step and (not prev or h.step > prev.step) then
      n = n + 1
      for _, t in ipairs(self.terms) do sums[t.name] = (sums[t.name] or 0) + (h.means[t.name] or 0) end
    end
  end
  local means = {}
  if n > 0 then for name, v in pairs(sums) do means[name] = v / n end end
  self.heldout[#self.heldout + 1] = { step = step, success = success, means = means }
  while #self.heldout > HISTORY do table.remove(self.heldout, 1) end
  self.alarms = health.alarm(self, self.heldout)
  return self.alarms
end

-- ---------------------------------------------------------------- contracts

local OPS = {
  ["=="] = function(a, b) return a == b end, ["~="] = function(a, b) return a ~= b end,
  ["<"] = function(a, b) return a < b end, ["<="] = function(a, b) return a <= b end,
  [">"] = function(a, b) return a > b end, [">="] = function(a, b) return a >= b end,
}

-- An episode for a check case: a text is a one-turn episode whose action is the text (task:
-- the case's task); an episode table is copied (so that scoring leaves the caller's alone).
local function case_episode(x, task)
  if type(x) == "string" then
    return { task = task, record = { { action = x, reward = 0, done = true, info = {} } }, turns = 1,
      reward = 0, group = 1, seed = 0 }
  end
  local ep = {}
  for k, v in pairs(x) do ep[k] = v end
  ep.reward = ep.reward or 0
  ep.group = 1
  return ep
end

-- A batch of episodes with one prompt token and each turn's action as sampled bytes.
local function case_batch(eps)
  local tokens, mask, turns, offsets = {}, {}, {}, { 0 }
  for _, ep in ipairs(eps) do
    tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = 256, 0, -1
    for k, r in ipairs(ep.record or {}) do
      local text = tostring(r.action or "")
      for p = 1, math.max(#text, 1) do
        tokens[#tokens + 1], mask[#mask + 1], turns[#turns + 1] = text:byte(p) or 32, 1, k - 1
      end
    end
    offsets[#offsets + 1] = #tokens
  end
  local T = core.tensor
  return batchlib.new { tokens = T.from(tokens), logprobs = T.zeros { #tokens }, mask = T.from(mask),
    turns = T.from(turns), offsets = offsets, episodes = eps }
end

-- Runs the cases; returns the number passed and a list of failures {case =, why =}.
local function run_cases(g, cases, level)
  level = level + 1
  local failures = {}
  for k, case in ipairs(cases) do
    if type(case) ~= "table" then error(string.format("check: cases[%d]: a table expected", k), level) end
    local where = string.format("cases[%d]", k)
    if case.better ~= nil or case.worse ~= nil then
      for f in pairs(case) do
        if f ~= "better" and f ~= "worse" and f ~= "task" and f ~= "name" then
          error(string.format("check: %s: unknown field '%s' (known: better, worse, task, name)", where, tostring(f)), level)
        end
      end
      if case.better == nil or case.worse == nil then
        error(string.format("check: %s: both better and worse expected", where), level)
      end
      local b = case_batch { case_episode(case.better, case.task), case_episode(case.worse, case.task) }
      local s = g:evaluate(b)
      local why
      if s[1].status ~= "ok" then why = "better is unscorable"
      elseif s[2].status ~= "ok" then why = "worse is unscorable"
      elseif not (s[1].total > s[2].total) then
        why = string.format("better scores %.6g, not more than worse's %.6g", s[1].total, s[2].total)
      end
      if why then failures[#failures + 1] = { case = k, name = case.name, why = why } end
    elseif case.ep ~= nil then
      for f in pairs(case) do
        if f ~= "ep" and f ~= "term" and f ~= "expect" and f ~= "task" and f ~= "name" then
          error(string.format("check: %s: unknown field '%s' (known: ep, term, expect, task, name)", where, tostring(f)), level)
        end
      end
      local e = case.expect
      if type(e) ~= "table" or (not OPS[e[1]] and e[1] ~= "status") then
        error(string.format("check: %s: expect: {op, value} expected, op one of ==, ~=, <, <=, >, >=, status", where), level)
      end
      local known = case.term == nil
      for _, t in ipairs(g.terms) do known = known or t.name == case.term end
      if not known then
        error(string.format("check: %s: term: '%s' is not a term of the graph", where, tostring(case.term)), level)
      end
      local s = g:evaluate(case_batch { case_episode(case.ep, case.task) })[1]
      local got, status
      if case.term then
        got, status = s.terms[case.term].value, s.terms[case.term].status
      else
        got, status = s.total, s.status
      end
      local ok
      if e[1] == "status" then
        ok = status == e[2]
      else
        ok = status == "ok" and type(got) == "number" and OPS[e[1]](got, e[2])
      end
      if not ok then
        local what = case.term and "term " .. case.term or "the total"
        failures[#failures + 1] = { case = k, name = case.name, why = e[1] == "status"
          and string.format("%s has status %s, not %s", what, tostring(status), tostring(e[2]))
          or string.format("%s is %s (%s), expected %s %s", what, tostring(got), tostring(status), e[1], tostring(e[2])) }
      end
    else
      error(string.format("check: %s: {better =, worse =} or {ep =, term =, expect = {op, value}} expected", where), level)
    end
  end
  return #cases - #failures, failures
end

-- g:check([cases]) -> true | nil, message, failures: each case passes — {better = ep or text,
-- worse = ep or text [, task =]}: better's total is more than worse's, both scorable (scored as
-- one group); {ep = ep or text, term = name (nil: the total), expect = {op, value} [, task =]}:
-- op one of ==, ~=, <, <=, >, >= on the value, or "status" on the status. cases default to the
-- graph's own checks. failures lists {case =, name =, why =}; the message says the same.
function Graph:check(cases)
  cases = cases or self.checks or {}
  if type(cases) ~= "table" then error("check: cases: a list expected, got " .. check.describe(cases), 2) end
  local _, failures = run_cases(self, cases, 2)
  if #failures == 0 then return true end
  local lines = {}
  for _, f in ipairs(failures) do
    lines[#lines + 1] = string.format("case %d%s: %s", f.case, f.name and " (" .. f.name .. ")" or "", f.why)
  end
  return nil, string.format("%d of %d check cases failed: %s", #failures, #cases, table.concat(lines, "; ")), failures
end

-- ---------------------------------------------------------------- loading and hot reload

local SAFE = { "assert", "error", "ipairs", "next", "pairs", "pcall", "select", "tonumber", "tostring",
  "type", "xpcall", "setmetatable", "getmetatable", "rawequal", "rawget", "rawlen", "rawset", "print" }

-- A fresh environment for a reward file: the safe base functions, copies of math, string, table
-- and utf8, `rl`, and the loader's globals; reading any other global is an error.
local function fresh_env(globals)
  local env = { _VERSION = _VERSION, rl = require("moonrl") }
  for _, k in ipairs(SAFE) do env[k] = _G[k] end
  for _, lib in ipairs { "math", "string", "table", "utf8" } do
    local t = {}
    for k, v in pairs(_G[lib]) do t[k] = v end
    env[lib] = t
  end
  for k, v in pairs(globals or {}) do env[k] = v end
  return setmetatable(env, { __index = function(_, k)
    error("undefined global '" .. tostring(k) .. "'", 2)
  end })
end

local function read(path)
  local f, err = io.open(path, "r")
  if not f then return nil, err end
  local text = f:read("a")
  f:close()
  return text
end

-- The graph a reward file's text defines, or nil and why.
local function build(path, text, globals)
  local chunk, err = load(text, "@" .. path, "t", fresh_env(globals))
  if not chunk then return nil, err end
  local ok, g = pcall(chunk)
  if not ok then return nil, tostring(g) end
  if not M.is_graph(g) then return nil, path .. " returned " .. check.describe(g) .. " (an rl.reward.graph expected)" end
  return g
end

-- Runs the loader's checks and the graph's own; true or nil, why.
local function contracts(g, extra)
  local ok, msg = g:check(extra or {})
  if not ok then return nil, msg end
  if g.checks then
    ok, msg = g:check(g.checks)
    if not ok then return nil, msg end
  end
  return true
end

-- rl.reward.load(path [, {watch = false, checks = {cases}, globals = {name = value}}]) -> g, or
-- nil and why: the graph the Lua file at path returns, run in a fresh environment (the safe base
-- library, `rl`, and globals: what the file may use besides, a judge's client for one), accepted
-- when the checks (and the graph's own) pass. With watch = true, g:reload() — which rl.train calls
-- at every step boundary — loads the file again when its text changed.
function M.load(path, opts)
  if type(path) ~= "string" then error("rl.reward.load: path: a string expected, got " .. check.describe(path), 2) end
  local o = check.fields("rl.reward.load", opts or {}, {
    { "watch", check.boolean, default = false },
    { "checks", cases_check },
    { "globals", check.table },
  }, 2)
  local text, err = read(path)
  if not text then return nil, err end
  local g
  g, err = build(path, text, o.globals)
  if not g then return nil, err end
  local ok, why = contracts(g, o.checks)
  if not ok then return nil, path .. ": " .. why end
  g.source = { path = path, text = text, watch = o.watch, checks = o.checks, globals = o.globals }
  return g
end

-- g:reload() -> true (a new version was accepted), false (the file did not change), or nil and
-- why (it could not be read, loaded or checked: the graph stays as it was). Each attempt that
-- found a change is kept in g.reloads ({version =, accepted =, why =, step =}).
function Graph:reload(step)
  local src = self.source
  if not src then error("reload: the graph was not loaded from a file (rl.reward.load)", 2) end
  local text, err = read(src.path)
  local new
  if text then
    if text == src.text then return false end
    new, err = build(src.path, text, src.globals)
    if new then
      local ok, why = contracts(new, src.checks)
      if not ok then new, err = nil, why end
    end
  end
  if not new then
    -- the same broken text is not tried again (and logged again) every step
    src.text = text or src.text
    self.reloads[#self.reloads + 1] = { step = step, version = self.version, accepted = false, why = err }
    return nil, err
  end
  local old = {}
  for _, t in ipairs(self.terms) do old[t.name] = t end
  for _, t in ipairs(new.terms) do
    local o = old[t.name]
    if o and o.kind == t.kind then t:load(o:state()) end -- a judge's budget goes on being spent
  end
  for _, k in ipairs { "name", "terms", "combine", "scale", "eps", "seed", "checks", "alarm" } do
    self[k] = new[k]
  end
  self.stores = {}
  self.version = self.version + 1
  src.text = text
  self.reloads[#self.reloads + 1] = { step = step, version = self.version, accepted = true }
  return true
end

-- ---------------------------------------------------------------- state

-- g:state() -> a JSON-ready table (version, scorings, the step and held-out history, each term's
-- state: the judges' counters); g:load(state) restores it. Judge replies are in their caches.
function Graph:state()
  local ts = {}
  for _, t in ipairs(self.terms) do ts[t.name] = t:state() end
  return { version = self.version, scored = self.scored, history = json.array(self.history),
    heldout = json.array(self.heldout), terms = ts, reloads = json.array(self.reloads),
    source_hash = self.source and judge.hash(self.source.text) or nil }
end

-- g:reset(): forgets what the graph measured (scorings, history, held-out points, the judges'
-- counters and budgets spent) but not its definition or version: rl.train calls it when a fresh
-- run starts, so that a graph reused for another run starts as a new one.
function Graph:reset()
  self.scored, self.history, self.heldout, self.reloads = 0, {}, {}, {}
  self.last, self.last_batch, self.alarms = nil, nil, nil
  for _, t in ipairs(self.terms) do
    if t.counters then
      for k in pairs(t.counters) do t.counters[k] = 0 end
    end
  end
end

function Graph:load(s)
  if type(s) ~= "table" then error("load: state: a table expected, got " .. check.describe(s), 2) end
  self.version = math.tointeger(s.version) or self.version
  self.scored = math.tointeger(s.scored) or self.scored
  self.history = type(s.history) == "table" and s.history or {}
  self.heldout = type(s.heldout) == "table" and s.heldout or {}
  self.reloads = type(s.reloads) == "table" and s.reloads or {}
  for _, t in ipairs(self.terms) do
    if type(s.terms) == "table" and s.terms[t.name] ~= nil then t:load(s.terms[t.name]) end
  end
  if #self.heldout > 0 then self.alarms = health.alarm(self, self.heldout) end
end

return M
