-- moonrl.train.critic: the value head of PPO with a critic (an estimator registered with
-- critic = true, e.g. advantage = "gae"): V(h) = w . h + b on the policy's final hidden state (a
-- linear critic sharing the policy's trunk), with its own AdamW moments, saved in state.json.
local core = require "moonrl.core"

local M = {}

-- A new head for hidden size dim; w starts at zero.
function M.new(dim)
  local mw, vw = {}, {}
  for j = 1, dim do mw[j], vw[j] = 0, 0 end
  return { w = core.tensor.zeros { dim }, b = 0, mw = mw, vw = vw, mb = 0, vb = 0, t = 0 }
end

-- The head as plain numbers (for state.json: floats round-trip exactly) and back.
function M.state(v)
  local w = {}
  for j = 1, v.w:numel() do w[j] = v.w:get(j) end
  return { w = w, b = v.b, mw = v.mw, vw = v.vw, mb = v.mb, vb = v.vb, t = v.t }
end

function M.from(s)
  local v = M.new(#s.w)
  for j, x in ipairs(s.w) do v.w:set(j, x) end
  v.b, v.mw, v.vw, v.mb, v.vb, v.t = s.b, s.mw, s.vw, s.mb, s.vb, s.t
  return v
end

-- One AdamW step of the head on its gradients (no weight decay), with the run's betas.
function M.step(c, v, dw, db, lr)
  local b1, b2, eps = c.beta1, c.beta2, 1e-8
  v.t = v.t + 1
  local bc1, bc2 = 1 - b1 ^ v.t, 1 - b2 ^ v.t
  for j = 1, v.w:numel() do
    local g = dw:get(j)
    v.mw[j] = b1 * v.mw[j] + (1 - b1) * g
    v.vw[j] = b2 * v.vw[j] + (1 - b2) * g * g
    v.w:set(j, v.w:get(j) - lr * (v.mw[j] / bc1) / (math.sqrt(v.vw[j] / bc2) + eps))
  end
  v.mb = b1 * v.mb + (1 - b1) * db
  v.vb = b2 * v.vb + (1 - b2) * db * db
  v.b = v.b - lr * (v.mb / bc1) / (math.sqrt(v.vb / bc2) + eps)
end

-- The critic's value of every token of the batch (a flat tensor like batch.mask), minibatch by
-- minibatch, before the update.
function M.values(ctx, batch)
  local n, mask = batch:size(), batch.mask
  local total = batch.offsets[n + 1]
  local values = core.tensor.zeros(math.max(total, 1)):narrow(1, 1, total)
  for a = 1, n, ctx.cfg.minibatch do
    local eps = {}
    for i = a, math.min(n, a + ctx.cfg.minibatch - 1) do eps[#eps + 1] = i end
    local _, _, v = ctx.model:forward_batch { tokens = batch.tokens, mask = mask,
      offsets = batch.offsets, episodes = eps, value = ctx.value }
    local s, e = batch.offsets[a] + 1, batch.offsets[eps[#eps] + 1]
    if e >= s then values:narrow(1, s, e - s + 1):copy(v:narrow(1, s, e - s + 1)) end
  end
  return values
end

return M
