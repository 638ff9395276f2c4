-- moonrl: the Lua face of the engine. `local rl = require "moonrl"` in the moonrl command, in
-- plain lua5.4 (after `make install` or `eval "$(moonrl env)"`), and in programs that embed the
-- engine. LuaJIT users require "moonrl.ffi", which offers the same tensor API over FFI.
local core = require "moonrl.core"

local rl = {
  version = core.version,   -- engine version string, e.g. "0.1.0"
  tensor = core.tensor,     -- constructors: zeros, ones, full, randn, rand, arange, from, matmul
  tokenizer = core.tokenizer, -- bytes(), load(path): encode, decode, chat templates
  model = core.model,       -- the policy: new{...}, load(dir)
  advantage = core.advantage, -- the spec's advantages, KL and losses: advantage.<method>(inputs, params)
  rollout = core.rollout,   -- multi-turn episodes decoded together: new{model=, episodes=, capacity=}
  objective = core.objective, -- advantages and losses over a trajectory batch (the trainer's)
  fs = core.fs,             -- mkdir, atomic write, list (a folder's names, sorted), isatty
  json = core.json,         -- JSON: decode, encode (sorted keys, always UTF-8: bytes that are
                            -- not are written as U+10FE00 + byte), null, array(t)
  sandbox = core.sandbox,   -- tool sandbox: pool{...}:run{argv=...}, lua{code=...}
  http = require("moonrl.http"), -- HTTP client: client{base_url=, ...}:request{...}, coroutine
                            -- tasks (spawn, wait, run); openai{profile=, ...}: chat, complete, generate
  tool = require("moonrl.tool"), -- rl.tool{...}, rl.tool.shell{...}, rl.tool.lua{...}
  rng = core.rng,           -- rl.rng(seed): a seeded random stream (random, normal)
  env = require("moonrl.env"), -- the environment protocol
  parse = require("moonrl.parse"), -- tool-call and answer parsing (line and Hermes formats)
  batch = require("moonrl.batch"), -- trajectory batches: stats, select, concat, to_jsonl, load
  reward = require("moonrl.reward"), -- reward graphs: rl.reward.graph{terms = {...}}, judges, load
  curriculum = require("moonrl.curriculum"), -- task sources, samplers and gates chosen from
                            -- measured success: rl.curriculum.new{source =, sampler =, ...}
  train = require("moonrl.train"), -- the RL trainer: rl.train{model=, env=, tokenizer=, ...};
                            -- its stages: rl.train.advantage.register(name, fn), rl.train.rollout, ...
  replay = require("moonrl.replay"), -- replay buffers: rl.replay.new{capacity =, priority =, ...}
  skills = require("moonrl.skills"), -- Markdown skill repos: repo{dir =}, tools(repo), paired{...}
  synth = require("moonrl.synth"), -- task synthesis: loop{propose =, verify =, calibrate =, novelty =, pool =}
  plot = require("moonrl.plot"), -- learning curves as SVG
  sft = require("moonrl.sft").sft, -- supervised fine-tuning with loss masks
  sft_example = require("moonrl.sft").example, -- {tokens=, mask=} from a chat conversation
  lr_at = core.lr_at,       -- learning-rate schedules
  blas_info = core.blas_info, -- {core=, threads=, config=, source=, recommended=}
  blas_threads = core.blas_threads,
  threads = core.threads,   -- rl.threads([n]) -> the engine's thread count (0: the online cores)
  seed = core.seed,         -- reseeds the default RNG used by randn/rand without a seed
  memory = core.memory,     -- {used=, peak=} bytes of tensor memory held by the engine
  clock = core.clock,       -- seconds on a monotonic clock, for timing
  equal_words = core.equal_words, -- equal_words(a, b): equal 8-byte words of two packed strings
}

return rl
