-- moonrl.train.warmstart: the optional SFT warm start (option sft) on the environment's oracle:
-- its demonstrations replayed through the environment itself, as chat examples, then rl.sft.
local core = require "moonrl.core"
local envlib = require "moonrl.env"
local sftlib = require "moonrl.sft"
local seedlib = require "moonrl.train.seed"

local mix = seedlib.mix
local M = {}

-- n SFT examples ({tokens =, mask =}) from env.oracle on the training split, drawn with seed.
function M.oracle_examples(ctx, n, seed)
  local c = ctx.cfg
  local env = c.env
  if type(env.oracle) ~= "function" then error("train: sft needs env.oracle(task, rng)", 2) end
  local tasks = env.tasks("train", n, seed)
  local out = {}
  for i, task in ipairs(tasks) do
    local rng = core.rng(mix(seed, i))
    local actions = env.oracle(task, rng)
    local inst = env.new()
    local msgs = {}
    local sys = c.system or env.system
    if sys then msgs[#msgs + 1] = { role = "system", content = sys } end
    msgs[#msgs + 1] = { role = "user", content = inst:reset(task, core.rng(mix(seed, i, 1))) }
    local record = {}
    for k, action in ipairs(actions) do
      if k > c.max_turns then break end
      msgs[#msgs + 1] = { role = "assistant", content = action }
      local obs, _, done = envlib.step(env, inst, action, record)
      if done or obs == nil then break end
      msgs[#msgs + 1] = { role = "user", content = obs }
    end
    out[i] = sftlib.example(ctx.tokenizer, msgs)
  end
  return out
end

-- Runs the warm start (cfg.sft, its defaults filled in by moonrl.train.options), with a synthesis
-- loop's proposer demonstrations (rl.synth.proposer{warm_start = n}) when the proposer is the
-- policy; returns {examples =, steps =, final_loss =, seconds =} for the state.
-- Leaves the optimizer reset for RL.
function M.run(ctx)
  local c, m = ctx.cfg, ctx.model
  local t0 = core.clock()
  local s = c.sft
  local data = M.oracle_examples(ctx, s.examples, mix(c.seed, 0xF7))
  -- a synthesis loop whose proposer is the policy: its warm-start demonstrations of proposing
  local p = c.synth and c.synth.proposer
  if p and p.warm_start and p.warm_start > 0 and p.kind == "self" then
    for _, ex in ipairs(p:sft_examples(ctx.tokenizer, p.warm_start, mix(c.seed, 0x5E7))) do data[#data + 1] = ex end
  end
  local r = sftlib.sft { model = m, data = data, epochs = s.epochs, batch_size = s.batch_size,
    lr = s.lr, schedule = s.schedule, warmup = s.warmup, seed = mix(c.seed, 0x5F7),
    weight_decay = s.weight_decay }
  m:reset_optimizer()
  return { examples = #data, steps = r.steps, final_loss = r.final_loss,
    seconds = core.clock() - t0 }
end

return M
