-- profile_model.lua - the workloads that scripts/profile.sh runs under `perf record`:
--   moonrl run scripts/profile_model.lua WORKLOAD [STEPS]
-- WORKLOAD: small-train, large-train, small-decode16, large-decode1 or large-decode16.
-- Each does a warm-up, then STEPS timed steps of one kind, and prints one line
--   profile <workload> <steps> <wall seconds per step> <CPU seconds per step>
-- so that the sample shares of the profile can be turned into milliseconds per step.
-- small-train     the bench's small config (d128 L4, batch 16 x 256): accumulate + AdamW step
-- large-train     the bench's large config (d512 L8, batch 8 x 256): accumulate + AdamW step
-- small-decode16  the small config with 16 sequences (16-token prompts): the bench's small sampling
-- large-decode1   the bench's large config (d512 L8): one sequence, one new token per step
-- large-decode16  the same with 16 sequences (16-token prompts), 16 new tokens per step
local rl = require "moonrl"

local workload, steps = arg and arg[1], tonumber(arg and arg[2] or "")
local SMALL = { vocab = 256, dim = 128, layers = 4, heads = 4, ffn = 384, ctx = 384, seed = 1 }
local LARGE = { vocab = 256, dim = 512, layers = 8, heads = 8, ffn = 1536, ctx = 384, seed = 1 }

local function random_batch(B, T, vocab, seed)
  local state, tokens = seed, {}
  for b = 1, B do
    local row = {}
    for t = 1, T do
      state = (state * 6364136223846793005 + 1442695040888963407)
      row[t] = (state >> 33) % vocab
    end
    tokens[b] = row
  end
  return tokens
end

-- perf's control FIFOs (perf record -D -1 --control fifo:CTL,ACK): only the timed steps are sampled
local ctl, ack = os.getenv("MOONRL_PERF_CTL"), os.getenv("MOONRL_PERF_ACK")
local function perf(command)
  if not ctl then return end
  local f = assert(io.open(ctl, "w"))
  f:write(command, "\n")
  f:close()
  local a = assert(io.open(ack, "r"))
  a:read("l")
  a:close()
end

local function report(n, wall, cpu)
  print(string.format("profile\t%s\t%d\t%.6g\t%.6g", workload, n, wall / n, cpu / n))
end

if workload == "small-train" or workload == "large-train" then
  local large = workload == "large-train"
  steps = steps or (large and 6 or 40)
  local m = rl.model.new(large and LARGE or SMALL)
  local opts = { tokens = random_batch(large and 8 or 16, 256, 256, 42) }
  local optim = { lr = 1e-4, weight_decay = 0.1 }
  m:accumulate(opts)
  m:step(optim)
  perf("enable")
  local w0, c0 = rl.clock(), os.clock()
  for _ = 1, steps do
    m:accumulate(opts)
    m:step(optim)
  end
  local w1, c1 = rl.clock(), os.clock()
  perf("disable")
  report(steps, w1 - w0, c1 - c0)
elseif workload == "large-decode1" or workload == "large-decode16" or workload == "small-decode16" then
  -- one generate call of `steps` new tokens; the prefill of 16 prompt tokens is a few steps' worth
  steps = steps or (workload == "large-decode1" and 300 or 200)
  local m = rl.model.new(workload == "small-decode16" and SMALL or LARGE)
  local B = workload == "large-decode1" and 1 or 16
  local prompts = random_batch(B, 16, 256, 7)
  m:generate { prompts = prompts, max_new_tokens = 8 }
  perf("enable")
  local w0, c0 = rl.clock(), os.clock()
  m:generate { prompts = prompts, max_new_tokens = steps, temperature = 1, seed = 1 }
  local w1, c1 = rl.clock(), os.clock()
  perf("disable")
  report(steps, w1 - w0, c1 - c0)
else
  io.stderr:write("usage: moonrl run scripts/profile_model.lua " ..
    "small-train|large-train|small-decode16|large-decode1|large-decode16 [STEPS]\n")
  os.exit(2)
end
