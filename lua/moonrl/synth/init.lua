-- moonrl.synth (rl.synth): task synthesis in a closed loop: propose -> contract -> verify by
-- execution -> novelty -> calibrate by the current policy's pass rate -> admit into a curriculum
-- pool; retire what is mastered, bring back what is forgotten; provenance for every task.
--
--   local S = rl.synth
--   local loop = S.loop {
--     propose = S.proposer { policy = "self", contract = S.contract { "instruction", "answer",
--       "check", "solution", "failures" }, prompt = "...{exemplar}", seeds = seeds },
--     verify = { S.exec { lang = "lua" }, S.oracle(env.solve) },
--     calibrate = S.pass_rate { k = 8, band = { .125, .875 } },
--     novelty = S.novelty { ngram = 5, minhash = 128, threshold = .7 },
--     target = S.target { from = cur, by = { "end", "state" } },
--     pool = cur, reward = "learnability", per_step = 16,
--   }
--   rl.train { ..., curriculum = cur, synth = loop }
--
-- Modules: moonrl.synth.loop (the loop), .proposer (proposer, mutate, generator), .contract,
-- .verify (exec, oracle, vote, judge, check_answer), .calibrate (pass_rate), .novelty, .target
-- (failure clusters, per-tag pass rates, turn-type contrast), .solver (how the loop rolls out
-- the current policy).
local loop = require "moonrl.synth.loop"
local proposer = require "moonrl.synth.proposer"
local contract = require "moonrl.synth.contract"
local verify = require "moonrl.synth.verify"
local calibrate = require "moonrl.synth.calibrate"
local novelty = require "moonrl.synth.novelty"
local target = require "moonrl.synth.target"

return {
  loop = loop.loop,
  is_loop = loop.is_loop,
  proposer = proposer.proposer,
  mutate = proposer.mutate,
  generator = proposer.generator,
  contract = contract.contract,
  exec = verify.exec,
  oracle = verify.oracle,
  vote = verify.vote,
  judge = verify.judge,
  check_answer = verify.check_answer,
  normal_answer = verify.normal_answer,
  pass_rate = calibrate.pass_rate,
  novelty = novelty.novelty,
  target = target.target,
}
