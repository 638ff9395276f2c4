-- moonrl.train.paired (rl.train.paired): paired-branch process rewards (ProactAgent's ProactRL):
-- a rollout stage that, for each marked turn of each training episode (a retrieval, a tool
-- call), runs a second branch from the identical prefix in which that action is replaced by
-- another the policy samples, and gives the marked turn a process reward from the two
-- outcomes; and an estimator that adds those rewards to a base estimator's advantages.
--
--   local stage = rl.train.paired.rollout { mark = function(turn_record) return is_recall end,
--     refuse = function(action_text) return is_recall end,
--     reward = function(a, b, turn) return a_outcome - b_outcome - 0.02 * (a.turns - b.turns) end }
--   rl.train.advantage.register("paired", rl.train.paired.advantage { base = "grpo", weight = 1 })
--   rl.train { ..., rollout = stage, advantage = "paired" }
--
-- How branch B is made (the rollout hooks can fork only after a turn, so not "at" the action
-- being replaced): B is the same episode run again, with the same task and the same sampling
-- seed, in a rollout engine of its own; every episode samples from its own stream, so B's turns
-- before the marked one are A's token for token, and at the marked turn on_action takes back
-- every action `refuse` refuses and samples again from the same logits (max_resamples times),
-- so B's action there is the policy's own sample conditioned on not being refused (not its
-- single most likely one). Without batch_invariant a different batch can move a float and
-- change a token before the marked turn: such a pair (prefixes differ) gets no process reward,
-- nor does one whose B still took a refused action after max_resamples. B episodes only score;
-- they are not in the batch. The environment must be deterministic given the task and the
-- episode's rng (the environment's state at the marked turn then is A's).
local argcheck = require "moonrl.argcheck"
local core = require "moonrl.core"
local rollout = require "moonrl.train.rollout"
local advantage = require "moonrl.train.advantage"

local M = {}

local function episode_return(rewards)
  local s = 0
  for _, v in ipairs(rewards) do s = s + v end
  return s
end

-- rollout{mark =, refuse =, reward =, max_resamples = 8} -> a rollout stage (ctx, req) -> batch:
-- req's episodes as rollout.run gives them (branch A), each episode ep with a marked turn t
-- (mark(ep.record[t]) truthy) paired with a branch B; ep.process[t] = reward(a, b, t), where a is
-- A's batch episode and b = {record =, rewards =, return_ =, turns =, ["end"] =} B's summary.
-- batch.paired = {marked =, paired =, differed = (prefixes differed), refused = (B still took a
-- refused action), mean = mean process reward of the paired turns (0: none)}.
function M.rollout(opts)
  local o = argcheck.fields("rl.train.paired.rollout", opts, {
    { "mark", nil, argcheck.func, required = true },
    { "refuse", nil, argcheck.func, required = true },
    { "reward", nil, argcheck.func, required = true },
    { "max_resamples", 8, argcheck.integer(1) },
  }, 2)
  return function(ctx, req)
    local b = rollout.run(ctx, req)
    local c, jobs = ctx.cfg, {}
    for i, ep in ipairs(b.episodes) do
      for t, r in ipairs(ep.record) do
        if o.mark(r) then jobs[#jobs + 1] = { i = i, turn = t } end
      end
    end
    local counts = { marked = #jobs, paired = 0, differed = 0, refused = 0, mean = 0 }
    b.paired = counts
    if #jobs == 0 then return b end
    local n = c.tasks_per_step * c.group_size
    if not ctx.paired_ro then
      ctx.paired_ro = core.rollout.new { model = ctx.model, episodes = n,
        capacity = c.capacity or ctx.model:config().ctx }
    end
    -- one run per turn budget (tasks with their own max_turns), in chunks of n episodes
    local by, order, parts = {}, {}, {}
    for _, job in ipairs(jobs) do
      local h = rollout.horizon(c, b.episodes[job.i].task)
      if not by[h] then
        by[h] = {}
        order[#order + 1] = h
      end
      local list = by[h]
      list[#list + 1] = job
    end
    for _, h in ipairs(order) do
      for first = 1, #by[h], n do
        parts[#parts + 1] = { h = h, jobs = table.move(by[h], first, math.min(#by[h], first + n - 1), 1, {}) }
      end
    end
    local sum = 0
    for _, chunk in ipairs(parts) do
      local part = chunk.jobs
      local tasks, seeds = {}, {}
      for j, job in ipairs(part) do
        local ep = b.episodes[job.i]
        tasks[j], seeds[j] = ep.task, ep.seed
      end
      local res = ctx.paired_ro:run { tokenizer = ctx.tokenizer, env = c.env, tasks = tasks,
        seeds = seeds, max_turns = chunk.h, max_turn_tokens = c.max_turn_tokens,
        temperature = req.temperature, top_k = c.top_k, top_p = c.top_p, min_p = c.min_p,
        system = c.system, batch_invariant = c.batch_invariant, max_resamples = o.max_resamples,
        on_action = function(view, action)
          -- (an action's view counts the turn it is taking: turns = t at turn t)
          return view.turns == part[view.episode].turn and o.refuse(action) and true or false
        end }
      for j, job in ipairs(part) do
        local a, bb = b.episodes[job.i], res[j]
        local same = #bb.record >= job.turn
        for t = 1, job.turn - 1 do same = same and bb.record[t].action == a.record[t].action end
        if not same then
          counts.differed = counts.differed + 1
        elseif o.refuse(bb.record[job.turn].action) then
          counts.refused = counts.refused + 1
        else
          local v = o.reward(a, { record = bb.record, rewards = bb.rewards, turns = bb.turns,
            return_ = episode_return(bb.rewards), ["end"] = bb["end"] }, job.turn)
          if not argcheck.finite(v) then
            error("rl.train.paired.rollout: reward: a finite number expected, got " .. argcheck.describe(v), 0)
          end
          a.process = a.process or {}
          a.process[job.turn] = v
          counts.paired, sum = counts.paired + 1, sum + v
        end
      end
    end
    counts.mean = counts.paired > 0 and sum / counts.paired or 0
    return b
  end
end

-- advantage{base = "grpo", weight = 1} -> an estimator (ctx, batch) -> adv, per_episode: the
-- base estimator's (a registered name), plus weight x ep.process[t] on every sampled token of
-- turn t of each episode that has one.
function M.advantage(opts)
  local o = argcheck.fields("rl.train.paired.advantage", opts or {}, {
    { "base", "grpo", argcheck.string }, { "weight", 1, argcheck.number() },
  }, 2)
  local est = advantage.get(o.base)
  if not est then argcheck.fail("rl.train.paired.advantage", "base: no estimator named " .. argcheck.describe(o.base), 2) end
  if est.critic then argcheck.fail("rl.train.paired.advantage", "base: an estimator without a critic expected", 2) end
  return function(ctx, batch)
    local adv, per_episode = est.fn(ctx, batch)
    local mask, turns = batch.mask, batch.turns
    for i, ep in ipairs(batch.episodes) do
      if ep.process then
        local first, last = batch:range(i)
        for p = first, last do
          local v = mask:get(p) ~= 0 and ep.process[math.floor(turns:get(p)) + 1]
          if v then adv:set(p, adv:get(p) + o.weight * v) end
        end
      end
    end
    return adv, per_episode
  end
end

return M
