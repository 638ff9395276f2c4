-- composite_reward.lua - a reward graph of several terms trained together, with each term's health
-- reported at the end (a table) and plotted (runs/composite_reward/reward.svg, dominance.svg).
--
-- The environment is envs/guess_letter.lua (find a hidden letter in an interval in 4 guesses;
-- held-out tasks never seen in training). The reward graph:
--   correct  the environment's return: 1 on the turn the letter is found (a dense term, so
--            GiGPO's step term sees it on its turn)
--   style    every turn's reply is exactly one lowercase letter (share of such turns), gated on
--            correct: a wrong episode gets nothing for style
--   budget   -0.05 per turn and -0.005 per sampled token
--   judge    a judge that is asked whether the first guess split the interval near its middle;
--            here a deterministic mock client answers (a stand-in for an LLM behind the client
--            interface: any object with chat(messages, opts) -> text, info), cached in the run
--            folder's judge_cache.jsonl
--   turns    a weight-0 metric: logged, not rewarded
--
--   moonrl run recipes/composite_reward.lua [seed]     (files go to runs/composite_reward/)
local rl = require "moonrl"

local root = os.getenv("MOONRL_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local env = require "envs.guess_letter"

local seed = math.tointeger(tonumber(arg and arg[1] or "")) or 1
local tok = rl.tokenizer.bytes()
local model = rl.model.new { vocab = tok:vocab_size(), dim = 64, layers = 2, heads = 4, ffn = 192,
  ctx = 128, seed = seed }

-- The mock judge: it reads the interval and the first guess from the prompt and says "yes" when
-- the guess is within a sixth of the interval's width of its middle. Deterministic, no network.
local judge_client = { calls = 0 }
function judge_client:chat(messages)
  self.calls = self.calls + 1
  local text = messages[#messages].content
  local lo, hi = text:match("letters (%l) to (%l)")
  local guess = text:match("first guess: (%l)")
  if not (lo and hi) then return nil, "the prompt names no interval" end
  if not guess then return "no", { prompt_tokens = #text // 4, completion_tokens = 1 } end
  local mid = (lo:byte() + hi:byte()) / 2
  local near = math.abs(guess:byte() - mid) <= (hi:byte() - lo:byte()) / 6
  return near and "yes" or "no", { prompt_tokens = #text // 4, completion_tokens = 1 }
end

local function letter(i) return string.char(string.byte("a") + i) end
local judge_prompt = function(ep)
  local t = ep.task
  local first = ep.record[1] and ep.record[1].action:match("^%s*(%l)") or nil
  return string.format("The player must find a letter among letters %s to %s. Its first guess: %s.\n"
    .. "Did that guess split the letters near the middle? Answer yes or no.", letter(t.from),
    letter(t.to), first or "(none)")
end

local reward = rl.reward.graph {
  name = "composite",
  terms = {
    rl.reward.env { name = "correct" },
    rl.reward.format { name = "style", pattern = "^%l$", where = "each_turn", weight = 0.2, gate = "correct" },
    rl.reward.budget { turns = 0.05, tokens = 0.005 },
    rl.reward.judge { name = "judge", client = judge_client, model = "mock-bisect-judge",
      prompt = judge_prompt, weight = 0.3 },
    rl.reward.metric("turns", function(ep) return ep.turns end),
  },
}

print(string.format("composite_reward: %s, policy of %d parameters, BLAS %s x%d", env.name,
  model:config().params, rl.blas_info().core, rl.blas_info().threads))

local t0 = rl.clock()
local result = rl.train {
  model = model, tokenizer = tok, env = env, name = "composite_reward", dir = root .. "/runs",
  seed = seed, overwrite = true, reward = reward,
  sft = { examples = 2000, epochs = 6, lr = 3e-3, batch_size = 16, warmup = 10 },
  steps = 120, tasks_per_step = 16, group_size = 8, minibatch = 64, epochs = 1,
  max_turn_tokens = 3, temperature = 1.0,
  advantage = "gigpo", gamma = 0.8,
  loss = "ppo", clip_low = 0.2, clip_high = 0.28,
  lr = 2e-3, schedule = "cosine", min_lr = 2e-4,
  eval = { every = 20, tasks = 256, k = 2 },
}
local seconds = rl.clock() - t0

-- The health table: the last step's figures, and over the whole run the mean dominance, skip and
-- gated rates, and the judge's calls and cache hits.
local hist = {}
for _, h in ipairs(result.history) do if h.step > 0 then hist[#hist + 1] = h end end
local function run_mean(key)
  local s, n = 0, 0
  for _, h in ipairs(hist) do
    if type(h[key]) == "number" then s, n = s + h[key], n + 1 end
  end
  return n > 0 and s / n or nil
end
local function run_sum(key)
  local s = 0
  for _, h in ipairs(hist) do s = s + (h[key] or 0) end
  return s
end
local st = reward:stats()
local function fmt(v, f) return v == nil and "-" or string.format(f or "%.3f", v) end
print("")
print("| term | weight | mean (last step) | std | dominance (run mean) | corr. with success | skip | gated | dead | alarm |")
print("|---|---|---|---|---|---|---|---|---|---|")
for _, name in ipairs(st.order) do
  local e = st.terms[name]
  print(string.format("| %s | %g | %s | %s | %s | %s | %s | %s | %s | %s |", name, e.weight, fmt(e.mean),
    fmt(e.std), fmt(run_mean("reward/" .. name .. "/dominance")), fmt(e.corr_success),
    fmt(run_mean("reward/" .. name .. "/skip"), "%.2f"), fmt(run_mean("reward/" .. name .. "/gated"), "%.2f"),
    e.dead == 1 and "yes" or "no", e.alarm and "yes" or "no"))
end
print(string.format("\njudge: %d calls, %d cache hits over the run; unscorable episodes: %.1f%% on average",
  run_sum("reward/judge/calls"), run_sum("reward/judge/hits"), 100 * (run_mean("reward/unscorable") or 0)))

-- dominance.svg: each weighted term's share of the within-group advantage variance per step
local series = {}
for _, name in ipairs(st.order) do
  if st.terms[name].weight ~= 0 then
    local pts = {}
    for _, h in ipairs(hist) do pts[#pts + 1] = { h.step, h["reward/" .. name .. "/dominance"] } end
    series[#series + 1] = { name = name, points = pts }
  end
end
assert(rl.plot.svg(result.dir .. "/dominance.svg", { title = "composite_reward: dominance per term",
  xlabel = "RL step", ylabel = "share of within-group advantage variance", series = series }))

local b, a = result.before, result.after
print(string.format("held-out greedy success: after SFT %.1f%%, after RL %.1f%% (%+.1f points); %.0f s",
  100 * b["eval/greedy_success"], 100 * a["eval/greedy_success"],
  100 * (a["eval/greedy_success"] - b["eval/greedy_success"]), seconds))
print("files: " .. result.dir .. "/metrics.jsonl, reward.svg, dominance.svg, judge_cache.jsonl")
