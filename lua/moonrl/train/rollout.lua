-- moonrl.train.rollout: the rollout stage (the episodes of some tasks -> a trajectory batch) and
-- the sampling of a training step's batch (tasks -> rollouts, with DAPO's dynamic sampling).
--
-- The `rollout` option replaces the stage: a function(ctx, req) -> an rl.batch, where req is
--   {tasks = list, repeats = episodes per task, seed = integer, temperature = number,
--    group_base = integer, tree = nil or {turn =, k =}, hooks = nil or rollout_hooks,
--    forced = nil or function(view) -> text}
-- and batch.episodes[i].group is group_base + the index of the episode's task. Training and the
-- default evaluation both roll out through it; only training's requests carry the hooks and
-- forced: with the info_gain option, forced(view) = info_gain.answer(view.task), which ro:run
-- scores after the prompt and after each turn an episode goes on from (mrl_rollout_score,
-- the episode undisturbed), each episode's scores landing in batch.episodes[i].forced =
-- {{turn =, logp =, tokens =, logprobs =}, ...} for the a2tgpo / igpo estimators.
-- A stage that stops and drops groups mid-rollout (the selective rollout gate) reports its counts
-- as batch.gate: a training step logs its numbers as gate/<name>, with gate/cut_rate and
-- gate/precision (moonrl.train.diagnostics).
--
-- With rollout_hooks (ro:run's on_turn, on_branches, on_action, max_resamples and gate; README
-- "Rollout hooks") the batch holds the episodes the hooks kept: a cut group's leave no trace.
-- batch.gate then holds the gate's counts, which rollout.sample also returns as info.gate,
-- summed over its tries:
--   {turn = K, groups = groups the gate saw, cut = groups cut, episodes_cut = their episodes,
--    finish = gate.finish, cut_zero_variance = (with finish) cut groups whose episodes all had
--    one environment return, decisions = {{group =, cut =, episodes =, distance =,
--    termination =, returns =, zero_variance =}, ...}}
local core = require "moonrl.core"
local batchlib = require "moonrl.batch"
local seedlib = require "moonrl.train.seed"
local tasks = require "moonrl.train.tasks"
local remote = require "moonrl.remote"
local diagnostics = require "moonrl.train.diagnostics"
local score = require "moonrl.train.score"
local argcheck = require "moonrl.argcheck"
local dist = require "moonrl.train.dist"

local mix = seedlib.mix
local M = {}

-- The rollout engine a run of n episodes with hooks uses: ctx.ro, or with on_turn one with room
-- for the forks too (n + fork_room episodes, made once and grown when a run needs more).
local function hooked_rollout(ctx, n, hooks)
  if not hooks.on_turn then return ctx.ro end
  local need = n + (hooks.fork_room or n)
  if not ctx.fork_ro or ctx.fork_ro_episodes < need then
    if ctx.fork_ro then ctx.fork_ro:free() end
    ctx.fork_ro = core.rollout.new { model = ctx.model, episodes = need,
      capacity = ctx.cfg.capacity or ctx.model:config().ctx }
    ctx.fork_ro_episodes = need
  end
  return ctx.fork_ro
end

-- The turns an episode of task may take: the task's own max_turns (a horizon curriculum's) or
-- the max_turns option, less the turns a backward start already replayed (task.start_turn);
-- at least 1.
function M.horizon(c, task)
  local h = c.max_turns
  if type(task) == "table" then
    local own, start = task.max_turns, task.start_turn
    if own ~= nil then
      if math.type(own) ~= "integer" or own < 1 then
        error("train: rollout: task.max_turns: a positive integer expected, got " .. tostring(own), 0)
      end
      h = own
    end
    if start ~= nil then
      if math.type(start) ~= "integer" or start < 0 then
        error("train: rollout: task.start_turn: a non-negative integer expected, got " .. tostring(start), 0)
      end
      h = h - start
    end
  end
  return math.max(h, 1)
end

-- One ro:run of the listed episodes with one max_turns; the batch.
local function run_once(ctx, req, list, seeds, groups, max_turns)
  local c, tree, hooks = ctx.cfg, req.tree, req.hooks
  local opts = {
    tokenizer = ctx.tokenizer, env = c.env, tasks = list, seeds = seeds, max_turns = max_turns,
    max_turn_tokens = c.max_turn_tokens, temperature = req.temperature, top_k = c.top_k,
    top_p = c.top_p, min_p = c.min_p, system = c.system, branch = tree,
    batch_invariant = c.batch_invariant,
  }
  local ro = ctx.ro
  opts.forced = req.forced
  if hooks then
    ro = hooked_rollout(ctx, #list, hooks)
    opts.groups, opts.gate, opts.max_resamples = groups, hooks.gate, hooks.max_resamples
    opts.on_turn, opts.on_branches, opts.on_action = hooks.on_turn, hooks.on_branches, hooks.on_action
  end
  local results = ro:run(opts)
  if tree then
    local by_root = groups
    groups = {}
    for i, r in ipairs(results) do groups[i] = by_root[r.branch.root] end
  elseif results.groups then
    groups = results.groups
  end
  local b = batchlib.from_rollout(ro, results, groups)
  b.gate = results.gate
  if tree then b = b:select(M.root_major(b)) end
  return b
end

-- The episodes of a tree rollout in root-major order (each root's episodes together, by branch
-- index): the order does not depend on when each root reached the branching turn, so a batch
-- shared out over ranks and gathered again has one process's order.
function M.root_major(b)
  local order = {}
  for i = 1, b:size() do order[i] = i end
  table.sort(order, function(x, y)
    local bx, by = b.episodes[x].branch, b.episodes[y].branch
    if bx.root ~= by.root then return bx.root < by.root end
    if bx.index ~= by.index then return bx.index < by.index end
    return x < y
  end)
  return order
end

-- One remote rollout (rl.remote, the endpoint of the remote option) of the listed episodes.
local function run_remote(ctx, req, list, seeds, groups, max_turns)
  local c = ctx.cfg
  return remote.rollout {
    client = c.remote.client, clients = c.remote.clients, tokenizer = ctx.tokenizer, env = c.env, tasks = list, seeds = seeds,
    groups = groups, max_turns = max_turns, max_turn_tokens = c.max_turn_tokens,
    temperature = req.temperature, top_k = c.top_k, top_p = c.top_p, min_p = c.min_p,
    system = c.system or c.env.system, capacity = c.capacity or ctx.model:config().ctx,
  }
end

-- With several ranks (moonrl.train.dist): one run's groups shared out, each rank rolling out its
-- own with the seeds one process would give them, and every rank gathering the whole batch, in
-- one process's order.
local function sharded(run)
  return function(ctx, req, list, seeds, groups, max_turns)
    if dist.size() == 1 then return run(ctx, req, list, seeds, groups, max_turns) end
    local starts = {} -- where each group's episodes begin in list (they are consecutive)
    for i = 1, #list do
      if i == 1 or groups[i] ~= groups[i - 1] then starts[#starts + 1] = i end
    end
    local a, b = dist.share(#starts)
    local mine
    if a <= b then
      local l, s, g = {}, {}, {}
      for i = starts[a], (starts[b + 1] or #list + 1) - 1 do
        l[#l + 1], s[#s + 1], g[#g + 1] = list[i], seeds[i], groups[i]
      end
      mine = run(ctx, req, l, s, g, max_turns)
      for _, ep in ipairs(mine.episodes) do -- (a tree's roots: positions in the whole list)
        if ep.branch then ep.branch.root = ep.branch.root + starts[a] - 1 end
      end
    else
      mine = dist.empty_batch()
    end
    return dist.gather_batch(mine, diagnostics.add_gate)
  end
end
run_once, run_remote = sharded(run_once), sharded(run_remote)

-- The default stage: the engine's batched multi-turn rollout (ctx.ro), or with the remote
-- option the endpoint's (rl.remote.rollout, no tree). With req.tree, repeats /
-- k roots per task each branch into k episodes after tree.turn turns (all of a task's episodes
-- are its group). Tasks with different horizons (M.horizon) are rolled out in one ro:run per
-- horizon, in order of first appearance, and their batches concatenated.
function M.run(ctx, req)
  local run_once = ctx.cfg.remote and run_remote or run_once
  local list, seeds, groups, turns = {}, {}, {}, {}
  local tree = req.tree
  local roots = tree and req.repeats // tree.k or req.repeats
  local c = ctx.cfg
  for t, task in ipairs(req.tasks) do
    local h = M.horizon(c, task)
    for _ = 1, roots do
      list[#list + 1] = task
      seeds[#seeds + 1] = mix(req.seed, #list)
      groups[#groups + 1] = req.group_base + t
      turns[#turns + 1] = h
    end
  end
  local by, order = {}, {}
  for i, h in ipairs(turns) do
    if not by[h] then
      by[h] = {}
      order[#order + 1] = h
    end
    local b = by[h]
    b[#b + 1] = i
  end
  if #order == 1 then return run_once(ctx, req, list, seeds, groups, order[1]) end
  local parts, gates = {}, {}
  for k, h in ipairs(order) do
    local l, s, g = {}, {}, {}
    for j, i in ipairs(by[h]) do l[j], s[j], g[j] = list[i], seeds[i], groups[i] end
    parts[k] = run_once(ctx, req, l, s, g, h)
    gates[#gates + 1] = parts[k].gate
  end
  local b = batchlib.concat(parts)
  local gate
  for _, g in ipairs(gates) do gate = diagnostics.add_gate(gate, g) end
  b.gate = gate
  return b
end

-- noised{sd =, base = M.run} -> a rollout stage that samples from a noised copy of the policy
-- (exploration by weight noise): before the rollout every parameter tensor w of ctx.model gets
-- sd x rms(w) x Gaussian noise, drawn from seeds mix(req.seed, k) (k: the tensor's place in the
-- sorted names), so the same request gets the same noise; base(ctx, req) rolls out; then the
-- clean weights are copied back (also when base raises) and the batch is rescored under them
-- (batch.policy_logprobs: the PPO ratio and the gradient are the clean policy's; batch.logprobs
-- stay the noised sampler's). sd = 0 is the base stage's batch.
function M.noised(opts)
  local o = argcheck.fields("rl.train.rollout.noised", opts, {
    { "sd", nil, argcheck.number(0), required = true },
    { "base", M.run, argcheck.func },
  }, 2)
  local saved = {}
  return function(ctx, req)
    local params, names = ctx.model:parameters(), {}
    for name in pairs(params) do names[#names + 1] = name end
    table.sort(names)
    for k, name in ipairs(names) do
      local w = params[name]
      saved[name] = saved[name] or w:clone()
      saved[name]:copy(w)
      local rms = math.sqrt((w * w):mean())
      w:add(core.tensor.randn(w:shape(), mix(req.seed, k)):scale(o.sd * rms), w)
    end
    local ok, b = pcall(o.base, ctx, req)
    for _, name in ipairs(names) do params[name]:copy(saved[name]) end
    if not ok then error(b, 0) end
    b.policy_logprobs = score.score(ctx.model, b, ctx.cfg.minibatch or math.max(b:size(), 1))
    return b
  end
end

-- The info_gain option's forced function for ro:run, or nil.
function M.forced(c)
  local ig = c.info_gain
  if not ig then return nil end
  return function(view)
    local text = ig.answer(view.task)
    if type(text) ~= "string" or text == "" then
      error("info_gain.answer: the text of the answer (a non-empty string) expected, got "
        .. (type(text) == "string" and "\"\"" or type(text)), 0)
    end
    return text
  end
end

local function push_all(ctx)
  local path = ctx.dir .. "/served.bin"
  local ok, err = ctx.model:save_checkpoint(path)
  if not ok then error("train: remote: push_weights: " .. tostring(err), 0) end
  local f, ferr = io.open(path, "rb")
  if not f then error("train: remote: push_weights: " .. tostring(ferr), 0) end
  local bytes = f:read("a")
  f:close()
  local version
  for i, client in ipairs(ctx.cfg.remote.clients or { ctx.cfg.remote.client }) do
    local where = ctx.cfg.remote.clients and string.format(" (endpoint %d)", i) or ""
    local http = client.http
    if type(http) ~= "table" or type(http.request) ~= "function" then
      error("train: remote: push_weights: the client has no http client (rl.http.openai's .http)" .. where, 0)
    end
    local status, headers, body = http:request { method = "POST", path = "/v1/load_weights",
      body = bytes, headers = { ["Content-Type"] = "application/octet-stream" } }
    if status ~= 200 then
      error(string.format("train: remote: push_weights%s: /v1/load_weights: %s", where, status
        and ("HTTP " .. status .. ": " .. tostring(body):sub(1, 200)) or tostring(headers)), 0)
    end
    local reply = core.json.decode(body)
    if i == 1 then version = type(reply) == "table" and reply.policy_version or nil end
  end
  return version
end

-- remote = {push_weights = true}: the policy's weights as a checkpoint (ctx.dir/served.bin)
-- posted as bytes to each endpoint's /v1/load_weights, so that they sample from them next.
-- Returns the policy_version the (first) endpoint reports; raises when a push fails (its
-- episodes would come from stale weights).
function M.push_weights(ctx)
  -- with several ranks rank 0 pushes and the others wait for it (their next rollouts must see
  -- the new weights); they return nil
  if not dist.lead() then
    dist.barrier()
    return nil
  end
  local version = push_all(ctx)
  dist.barrier()
  return version
end

-- The batch of training step `step`: tasks_per_step tasks of group_size episodes each. With
-- dynamic_sampling, groups whose episodes all got one reward (the environment's return; with
-- dynamic_sampling = "reward", the reward graph's total) are dropped and more tasks drawn
-- (up to max_sampling_tries); a curriculum's gate (rl.curriculum.gate) decides instead which
-- groups to drop, and whether to draw more (resample, up to its max_tries). Returns the batch
-- (nil when every group was dropped, or cut by rollout_hooks.gate) and {tries =, groups_drawn =,
-- groups_dropped =, rejected = the dropped groups' episodes, gate = the rollout stage's
-- batch.gate summed over the tries (diagnostics.add_gate; see the top of this file), or nil}.
function M.sample(ctx, step)
  local c = ctx.cfg
  local gate = c.curriculum and c.curriculum.gate
  local want = c.tasks_per_step
  local parts, kept, tries, drawn, filtered, rejected, counts = {}, 0, 0, 0, 0, {}, nil
  local max_tries = gate and (gate.resample and gate.max_tries or 1) or c.max_sampling_tries
  repeat
    tries = tries + 1
    local list = tasks.sample(ctx, step, want, mix(c.seed, step, tries))
    local b = ctx.stages.rollout(ctx, { tasks = list, repeats = c.group_size,
      seed = mix(c.seed, step, tries, 7), temperature = c.temperature,
      group_base = tries * 100000, tree = c.tree, hooks = c.rollout_hooks,
      forced = M.forced(c) })
    drawn = drawn + #list
    counts = diagnostics.add_gate(counts, b.gate)
    if not (c.dynamic_sampling or gate) then
      local info = { tries = 1, groups_drawn = drawn, groups_dropped = 0, rejected = rejected,
        gate = counts }
      if b:size() == 0 then return nil, info end -- the rollout gate cut every group
      return b, info
    end
    local keep = {}
    -- dynamic_sampling = "reward": the totals the reward graph will give (evaluate writes
    -- nothing), so a group whose episodes differ only in cost or format terms is kept
    local totals
    if c.dynamic_sampling == "reward" then
      totals = {}
      for i, s in ipairs(c.reward:evaluate(b, { step = step, run = ctx })) do totals[i] = s.total end
    end
    for _, g in ipairs(b:groups()) do
      local members = {}
      for j, i in ipairs(g.members) do members[j] = b.episodes[i] end
      local drop
      if gate then
        drop = gate:rejects(members)
      else
        drop = true
        local first = g.members[1]
        for _, i in ipairs(g.members) do
          if totals then
            drop = drop and totals[i] == totals[first]
          else
            drop = drop and b.episodes[i].reward == b.episodes[first].reward
          end
        end
      end
      if not drop and kept < c.tasks_per_step then
        for _, i in ipairs(g.members) do keep[#keep + 1] = i end
        kept = kept + 1
      else
        filtered = filtered + 1
        for _, ep in ipairs(members) do rejected[#rejected + 1] = ep end
      end
    end
    if #keep > 0 then parts[#parts + 1] = b:select(keep) end
    want = c.tasks_per_step - kept
  until kept >= c.tasks_per_step or tries >= max_tries
  local info = { tries = tries, groups_drawn = drawn, groups_dropped = filtered, rejected = rejected,
    gate = counts }
  if #parts == 0 then return nil, info end
  local batch = batchlib.concat(parts)
  batch.gate = info.gate
  return batch, info
end

return M
