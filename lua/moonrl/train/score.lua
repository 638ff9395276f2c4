-- moonrl.train.score: log-probabilities (and entropies) of a batch's sampled tokens under a
-- model, minibatch by minibatch, and the policy's own (untempered) log-probabilities of them.
local core = require "moonrl.core"
local dist = require "moonrl.train.dist"

local M = {}

-- Flat log-probs (and entropies with want_entropy) of the batch's sampled tokens under model,
-- `chunk` episodes at a time. With several ranks each scores its share of the episodes and the
-- scores are summed over the ranks (zeros elsewhere), so every rank gets all of them.
function M.score(model, batch, chunk, want_entropy)
  local n = batch:size()
  local total = batch.offsets[n + 1]
  local lp = core.tensor.zeros(math.max(total, 1))
  local ent = want_entropy and core.tensor.zeros(math.max(total, 1)) or nil
  local first, last = dist.share(n)
  for a = first, last, chunk do
    local eps = {}
    for i = a, math.min(last, a + chunk - 1) do eps[#eps + 1] = i end
    local l, h = model:forward_batch { tokens = batch.tokens, mask = batch.mask,
      offsets = batch.offsets, episodes = eps }
    local s, e = batch.offsets[a] + 1, batch.offsets[eps[#eps] + 1]
    lp:narrow(1, s, e - s + 1):copy(l:narrow(1, s, e - s + 1))
    if ent then ent:narrow(1, s, e - s + 1):copy(h:narrow(1, s, e - s + 1)) end
  end
  dist.sum(lp)
  if ent then dist.sum(ent) end
  return lp:narrow(1, 1, total), ent and ent:narrow(1, 1, total)
end

-- Whether the run samples from the policy as it is (temperature 1, no top_k/top_p/min_p, and
-- decoding from the float32 weights, not decode_bf16's copy): then the behaviour log-probs the
-- rollout recorded are the policy's own.
function M.plain_sampling(c)
  return not (c.temperature ~= 1 or c.top_k or c.top_p or c.min_p or c.decode_bf16)
end

-- The policy's log-probs of the batch's sampled tokens before this step's update: the rollout's
-- behaviour log-probs under plain sampling, else the untempered policy's, scored once per batch
-- (batch.policy_logprobs).
function M.policy(ctx, batch)
  if batch.policy_logprobs then return batch.policy_logprobs end -- (a batch with replayed episodes)
  if M.plain_sampling(ctx.cfg) then return batch.logprobs end
  if not batch.policy_logprobs then
    batch.policy_logprobs = M.score(ctx.model, batch, ctx.cfg.minibatch)
  end
  return batch.policy_logprobs
end

return M
