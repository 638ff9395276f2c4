-- moonrl.train.reward: the reward stage: each episode's reward from the environment's return, the
-- recipe's reward terms and DAPO's overlong shaping, or from a reward graph; and the KL penalty
-- when the KL to the reference is in the reward (kl_reward_coef).
--
-- The `reward` option is a reward graph (rl.reward.graph, M.graph_stage) or replaces the stage:
-- a function(ctx, batch, step) -> terms that sets every episode's ep.reward (the total the
-- advantage sees) and returns {name = mean over the batch} (logged as reward/<name>). The default
-- keeps the environment's return in ep.env_reward and each episode's terms in ep.reward_terms (a
-- replacement used with advantage = "gdpo" sets those too).
local core = require "moonrl.core"
local score = require "moonrl.train.score"
local dist = require "moonrl.train.dist"

local M = {}

-- The recipe's reward terms in the order they are added: a list {{name =, fn =}, ...} in its
-- own order, a table {name = fn} in the bytewise order of the names (never pairs() order, which
-- differs between processes and would change the floating-point totals).
function M.terms(rewards)
  local list = {}
  if rewards == nil then return list end
  if #rewards > 0 then
    for i, e in ipairs(rewards) do list[i] = { name = e.name, fn = e.fn } end
    return list
  end
  for name, fn in pairs(rewards) do list[#list + 1] = { name = name, fn = fn } end
  table.sort(list, function(a, b) return a.name < b.name end)
  return list
end

-- The default stage: ep.reward = the environment's return + each term in M.terms order + the
-- overlong penalty. Each episode keeps its terms apart in ep.reward_terms = {env =, <name> =, ...,
-- overlong =} (what GDPO normalises term by term).
function M.run(ctx, batch)
  local c, terms = ctx.cfg, { env = 0 }
  local n = batch:size()
  local lengths = {}
  for i, ep in ipairs(batch.episodes) do
    ep.env_reward = ep.reward
    ep.reward_terms = { env = ep.reward }
    terms.env = terms.env + ep.reward / n
    lengths[i] = ep.length
  end
  for _, term in ipairs(M.terms(c.rewards)) do
    local name, fn = term.name, term.fn
    terms[name] = 0
    for _, ep in ipairs(batch.episodes) do
      local ok, r = pcall(fn, ep)
      if not ok or type(r) ~= "number" or r ~= r then
        error(string.format("train: reward %s failed on an episode: %s", name,
          ok and "returned " .. tostring(r) or tostring(r)), 0)
      end
      ep.reward = ep.reward + r
      ep.reward_terms[name] = r
      terms[name] = terms[name] + r / n
    end
  end
  if c.overlong then
    -- DAPO's soft overlong punishment on each episode's token count
    local o = c.overlong
    local pen = core.objective.overlong { lengths = lengths, max_len = o.max_len,
      buffer = o.buffer, factor = o.factor, floor = o.floor }
    terms.overlong = 0
    for i, ep in ipairs(batch.episodes) do
      ep.reward = ep.reward + pen[i]
      ep.reward_terms.overlong = pen[i]
      terms.overlong = terms.overlong + pen[i] / n
    end
  end
  return terms
end

-- ---------------------------------------------------------------- reward graphs

local STATS = { "mean", "std", "skip", "error", "gated", "na", "dominance", "dead", "corr_success" }
local JUDGE = { "calls", "hits", "errors", "timeouts", "tokens", "cost" }

-- The graph's health of the batch it scored last as metrics (without the "reward/" the loop
-- adds): <term>/{mean, std, skip, error, gated, na, dominance, dead, corr_success (when
-- defined)}, for judges also <term>/{calls, hits, errors, timeouts, tokens, cost}; unscorable
-- (the fraction of episodes), version.
function M.graph_metrics(g)
  local st = g:stats()
  local out = { unscorable = st.unscorable, version = g.version }
  for _, name in ipairs(st.order) do
    local e = st.terms[name]
    for _, k in ipairs(STATS) do
      if e[k] ~= nil then out[name .. "/" .. k] = e[k] end
    end
    for _, k in ipairs(JUDGE) do
      if e[k] ~= nil then out[name .. "/" .. k] = e[k] end
    end
  end
  return out
end

-- The stage with a reward graph (reward = g): the batch scored by it (ep.reward, ep.rewards,
-- ep.reward_terms, ep.reward_status, ep.reward_version; the environment's return stays in
-- ep.env_reward), its per-term health returned as the step's reward metrics.
function M.graph_stage(ctx, batch, step)
  local g = ctx.cfg.reward
  for _, ep in ipairs(batch.episodes) do ep.env_reward = ep.reward end
  g:score(batch, { step = step, run = ctx })
  return M.graph_metrics(g)
end

-- A watched graph (rl.reward.load(path, {watch = true})) reloads its file at the step boundary;
-- an attempt is logged in the run folder's reward.log (and a refusal on stderr). Returns the
-- attempt ({version =, accepted =, why =}) or nil when nothing changed.
function M.boundary(ctx, step)
  local g = ctx.cfg.reward
  local mt = getmetatable(g)
  if not (type(g) == "table" and mt and mt.__name == "moonrl.reward.graph") then return nil end
  if not (g.source and g.source.watch) then return nil end
  local changed = g:reload(step)
  if changed == false then return nil end
  local entry = g.reloads[#g.reloads]
  local line = entry.accepted
    and string.format("step %d: %s reloaded: version %d\n", step, g.source.path, entry.version)
    or string.format("step %d: %s refused, version %d kept: %s\n", step, g.source.path, entry.version,
      tostring(entry.why))
  local f = dist.lead() and io.open(ctx.dir .. "/reward.log", "a")
  if f then
    f:write(line)
    f:close()
  end
  if not entry.accepted then io.stderr:write("train: reward: ", line) end
  return entry
end

-- KL in the reward: each episode's score loses kl_reward_coef * its summed per-token KL from the
-- policy to the reference (ep.kl_penalty, which the advantage subtracts). Both are scored as
-- they are: with a temperature or top_k/top_p/min_p the sampled log-probs are not the policy's,
-- so the batch is rescored (as the update does for its ratio). Returns the mean penalty.
function M.kl_penalty(ctx, batch)
  local c = ctx.cfg
  local ref = score.score(ctx.ref, batch, c.minibatch)
  local kl = core.objective.kl { logp = score.policy(ctx, batch), ref_logp = ref, mask = batch.mask,
    kind = c.kl }
  local total = 0
  for i, ep in ipairs(batch.episodes) do
    local s = 0
    for p = batch.offsets[i] + 1, batch.offsets[i + 1] do s = s + kl:get(p) end
    ep.kl_penalty = c.kl_reward_coef * s
    total = total + ep.kl_penalty
  end
  return total / batch:size()
end

-- A text that changes with any episode's reward, per-turn rewards or reward status: ranks of a
-- data-parallel run compare theirs each step (a judge or reward function that answers
-- differently on different ranks would otherwise make the replicas drift apart unseen).
function M.fingerprint(batch)
  local out = {}
  for i, ep in ipairs(batch.episodes) do
    out[#out + 1] = string.format("%d:%q:%s:", i, ep.reward, tostring(ep.reward_status))
    for _, r in ipairs(ep.rewards or {}) do out[#out + 1] = string.format("%q,", r) end
  end
  return table.concat(out)
end

return M
