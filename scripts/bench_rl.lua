-- bench_rl.lua - RL throughput for `make bench`: rollouts of the quickstart environment (episode
-- turns/s, tokens/s, and the share of the time spent in the Lua environment code), one trainer
-- update step, and GRPO advantages + the PPO loss with its gradient over a batch of 1M tokens.
-- Prints tab-separated lines "rl <key> <value>".
--   moonrl run scripts/bench_rl.lua
local rl = require "moonrl"
local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.guess_letter"
local envlib = require "moonrl.env"

local function out(key, value) io.write(string.format("rl\t%s\t%.6g\n", key, value)) end

-- the quickstart's policy, briefly fine-tuned so that episodes look like real ones
local tok = rl.tokenizer.bytes()
local m = rl.model.new { vocab = 264, dim = 64, layers = 2, heads = 4, ffn = 192, ctx = 128, seed = 1 }
local T = require "moonrl.train"
local ctx = { cfg = { env = env, max_turns = env.max_turns }, tokenizer = tok }
rl.sft { model = m, data = T.oracle_examples(ctx, 400, 3), epochs = 1, batch_size = 16, lr = 3e-3 }

-- rollouts: 16 tasks x 16 episodes, as a quickstart step; the Lua side timed by wrapping the
-- protocol's step (parse + tool dispatch + the environment) and reset
local E = 256
local ro = rl.rollout.new { model = m, episodes = E, capacity = 128 }
local lua_time = 0
local step, new = envlib.step, env.new
envlib.step = function(...)
  local t0 = rl.clock()
  local a, b, c = step(...)
  lua_time = lua_time + rl.clock() - t0
  return a, b, c
end
env.new = function()
  local t0 = rl.clock()
  local inst = new()
  local reset = inst.reset
  inst.reset = function(self, ...)
    local t1 = rl.clock()
    local obs = reset(self, ...)
    lua_time = lua_time + rl.clock() - t1
    return obs
  end
  lua_time = lua_time + rl.clock() - t0
  return inst
end
local tasks = {}
for i, t in ipairs(env.tasks("train", 16, 5)) do
  for g = 1, 16 do tasks[(i - 1) * 16 + g] = t end
end
local seeds = {}
for i = 1, E do seeds[i] = i end
local best, turns, tokens, sampled, share = math.huge, 0, 0, 0, 0
for rep = 1, 5 do
  lua_time = 0
  local t0 = rl.clock()
  local res = ro:run { tokenizer = tok, env = env, tasks = tasks, seeds = seeds, max_turns = env.max_turns,
    max_turn_tokens = 3, temperature = 1 }
  local dt = rl.clock() - t0
  if dt < best then
    best, turns, tokens = dt, 0, 0
    for _, r in ipairs(res) do turns, tokens = turns + r.turns, tokens + r.length end
    sampled = ro:tensors(E).mask:sum()
    share = lua_time / dt
  end
  seeds[1] = seeds[1] + rep -- vary the episodes a little between repetitions
end
envlib.step, env.new = step, new
out("rollout_episodes", E)
out("rollout_seconds", best)
out("rollout_turns_per_s", turns / best)
out("rollout_tokens_per_s", tokens / best)
out("rollout_sampled_tokens_per_s", sampled / best)
out("rollout_lua_share", share)

-- one PPO update over that batch (forward + loss + backward + AdamW, minibatches of 64)
local batch = rl.batch.from_rollout(ro, ro:run { tokenizer = tok, env = env, tasks = tasks,
  seeds = seeds, max_turns = env.max_turns, max_turn_tokens = 3, temperature = 1 }, (function()
  local g = {}
  for i = 1, E do g[i] = (i - 1) // 16 end
  return g
end)())
local scores, groups = {}, {}
for i, ep in ipairs(batch.episodes) do scores[i], groups[i] = ep.reward, ep.group end
local upd = math.huge
for _ = 1, 3 do
  local t0 = rl.clock()
  local a = rl.objective.advantage { method = "grpo", scores = scores, groups = groups }
  local adv = rl.objective.broadcast { values = a, mask = batch.mask, offsets = batch.offsets }
  for s = 1, E, 64 do
    local eps = {}
    for i = s, s + 63 do eps[#eps + 1] = i end
    local lp = m:forward_batch { tokens = batch.tokens, mask = batch.mask, offsets = batch.offsets, episodes = eps }
    local _, dlogp = rl.objective.loss { logp = lp, old_logp = batch.logprobs, adv = adv, mask = batch.mask,
      offsets = batch.offsets, episodes = eps }
    m:backward_batch { tokens = batch.tokens, mask = batch.mask, offsets = batch.offsets, episodes = eps,
      dlogprobs = dlogp }
    m:step { lr = 0 }
  end
  upd = math.min(upd, rl.clock() - t0)
end
out("update_seconds", upd)
out("update_tokens_per_s", batch.offsets[E + 1] / upd)

-- GRPO + PPO loss over 1M tokens: 4096 episodes of 256 tokens, half of them sampled
local N, L = 4096, 256
local total = N * L
local r = rl.rng(1)
local mask_v, offsets, sc, gr = {}, { 0 }, {}, {}
for i = 1, total do mask_v[i] = (i % L) >= L // 2 and 1 or 0 end
for e = 1, N do
  offsets[e + 1] = e * L
  sc[e], gr[e] = r:random() < 0.5 and 1 or 0, (e - 1) // 16
end
local mask = rl.tensor.from(mask_v)
local logp = rl.tensor.rand({ total }, 7):scale(-3)
local old = logp + rl.tensor.randn({ total }, 8):scale(0.05)
local eps = {}
for e = 1, N do eps[e] = e end
local t_adv, t_loss = math.huge, math.huge
for _ = 1, 3 do
  local t0 = rl.clock()
  local a = rl.objective.advantage { method = "grpo", scores = sc, groups = gr }
  local adv = rl.objective.broadcast { values = a, mask = mask, offsets = offsets }
  local t1 = rl.clock()
  rl.objective.loss { logp = logp, old_logp = old, adv = adv, mask = mask, offsets = offsets,
    episodes = eps, clip_high = 0.28 }
  local t2 = rl.clock()
  t_adv, t_loss = math.min(t_adv, t1 - t0), math.min(t_loss, t2 - t1)
end
out("grpo_1m_seconds", t_adv)
out("ppo_loss_1m_seconds", t_loss)
