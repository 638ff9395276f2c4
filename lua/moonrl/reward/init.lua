-- moonrl.reward (rl.reward): reward graphs of named, ordered terms.
--
--   local g = rl.reward.graph {
--     terms = {
--       rl.reward.fn("correct", function(ep) return ep.success and 1 or 0 end),
--       rl.reward.format { name = "style", pattern = "^%l$", weight = 0.2, gate = "correct" },
--       rl.reward.budget { tokens = 0.001 },
--       rl.reward.judge { name = "judge", client = c, prompt = "Is {answer} right? {task}", weight = 0.5 },
--       rl.reward.metric("turns", function(ep) return ep.turns end),
--     },
--     combine = "sum",                          -- or "per_term" (GDPO)
--   }
--   rl.train { ..., reward = g }
--
-- Terms: fn, metric, format, group, process, env, budget, overlong (moonrl.reward.terms) and
-- judge, rank (moonrl.reward.judge, with the client interface); every one takes name, weight (1;
-- 0 = a metric), gate (an earlier term's name or fn(ep, values) -> bool), when (fn(task) -> bool)
-- and clip = {lo, hi}. A term returns a number, nil (not applicable) or rl.reward.SKIP
-- (unscorable); an error is unscorable too, with its message — never 0 — and an unscorable
-- episode stays out of the group baselines (advantage 0). The graph (moonrl.reward.graph):
-- g:score(batch), g:rescore(batch), g:advantages(batch), g:stats(), g:observe(step, success),
-- g:check(cases), g:explain(ep), g:state(), g:load(state), g:reset(); rl.reward.load(path,
-- {watch = true}) and g:reload(). rl.reward.model_client{model =, tokenizer =} makes a local
-- rl.model a judge's client; rl.reward.cache(path) opens a judge cache file.
local terms = require "moonrl.reward.terms"
local judge = require "moonrl.reward.judge"
local graph = require "moonrl.reward.graph"

return {
  graph = graph.graph,
  is_graph = graph.is_graph,
  load = graph.load,
  fn = terms.fn,
  metric = terms.metric,
  format = terms.format,
  group = terms.group,
  process = terms.process,
  env = terms.env,
  budget = terms.budget,
  overlong = terms.overlong,
  judge = judge.judge,
  rank = judge.rank,
  model_client = judge.model_client,
  cache = judge.cache,
  hash = judge.hash,
  SKIP = terms.SKIP,
  skip = terms.skip,
  is_skip = terms.is_skip,
}
