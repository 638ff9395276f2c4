-- moonrl.train.diagnostics: the per-step figures that say how much of a batch the update could
-- learn from and whether the run is healthy: effective sample utilisation, gradient-norm
-- spikes and the selective rollout gate's counts (the batch's own figures, zero-variance groups,
-- turns and the tool-call rate, are rl.batch's stats). Each is a function of the batch, the
-- advantages or the run's history, so that it can be checked on hand-made data.
local core = require "moonrl.core"

local M = {}

-- Effective sample utilisation: the fraction of the batch's episodes with a non-zero advantage
-- on at least one sampled token (mask ~= 0). For an outcome estimator (GRPO, RLOO, ...) that is
-- the episodes whose advantage is not 0; for a token- or turn-level one (GAE, GiGPO, BEACON) an
-- episode counts once any of its tokens has one. 0 for an empty batch.
function M.utilisation(batch, adv)
  local n = batch:size()
  if n == 0 then return 0 end
  local longest = 0
  for i = 1, n do longest = math.max(longest, batch.offsets[i + 1] - batch.offsets[i]) end
  local zeros = core.tensor.zeros(math.max(longest, 1))
  local used = 0
  for i = 1, n do
    local a, len = batch.offsets[i], batch.offsets[i + 1] - batch.offsets[i]
    if len > 0 then
      local on = adv:narrow(1, a + 1, len) * batch.mask:narrow(1, a + 1, len)
      if on:max_abs_diff(zeros:narrow(1, 1, len)) > 0 then used = used + 1 end
    end
  end
  return used / n
end

-- ---------------------------------------------------------------- gradient-norm spikes

-- The defaults of rl.train's grad_spike option: a step's gradient norm is a spike when it is
-- above factor times the median of the last `window` earlier steps' norms, once min_steps earlier
-- norms exist.
M.SPIKE = { factor = 3, window = 20, min_steps = 5 }

-- The median of a list of numbers (the mean of the middle two for an even count); nil for none.
function M.median(list)
  local n = #list
  if n == 0 then return nil end
  local s = table.move(list, 1, n, 1, {})
  table.sort(s)
  if n % 2 == 1 then return s[(n + 1) // 2] end
  return (s[n // 2] + s[n // 2 + 1]) / 2
end

-- spike(previous, value [, opts]) -> is_spike, median: previous is the earlier steps' norms, in
-- step order; the median is of the last opts.window of them (nil, and no spike, while there are
-- fewer than opts.min_steps).
function M.spike(previous, value, opts)
  opts = opts or M.SPIKE
  local window, factor = opts.window or M.SPIKE.window, opts.factor or M.SPIKE.factor
  local min_steps = opts.min_steps or M.SPIKE.min_steps
  if #previous < min_steps then return false, nil end
  local last = {}
  for k = math.max(1, #previous - window + 1), #previous do last[#last + 1] = previous[k] end
  local med = M.median(last)
  return value > factor * med, med
end

-- The gradient norm a step's metrics watch: the largest of its optimizer steps'
-- (loss/grad_norm_max), else their mean (loss/grad_norm, from an update stage that gives no
-- maximum); nil for a step without an update.
function M.grad_norm(mt)
  return mt["loss/grad_norm_max"] or mt["loss/grad_norm"]
end

-- The spike metrics of step metrics mt given the run's earlier metrics (history, in step order):
-- grad/norm_median (the median it was compared with, once there is one), grad/spike (1 or 0) and
-- grad/spikes (the spikes of the run so far). Nothing for a step without an update.
function M.grad_metrics(history, mt, opts)
  local value = M.grad_norm(mt)
  if value == nil or mt["loss/updates"] == 0 then return {} end
  local previous, spikes = {}, 0
  for _, h in ipairs(history) do
    local v = h["loss/updates"] ~= 0 and M.grad_norm(h) or nil
    if v then previous[#previous + 1] = v end
    if h["grad/spikes"] then spikes = h["grad/spikes"] end
  end
  local spike, med = M.spike(previous, value, opts)
  if spike then spikes = spikes + 1 end
  return { ["grad/norm_median"] = med, ["grad/spike"] = spike and 1 or 0, ["grad/spikes"] = spikes }
end

-- ---------------------------------------------------------------- the selective rollout gate

-- A rollout stage that gates groups (the selective rollout gate) reports its counts in the batch
-- it returns, batch.gate = {groups = groups it examined, cut = groups it stopped and dropped,
-- cut_zero_variance = those of the cut ones whose rewards would all have been equal, where it
-- knows, ...}; every number there is summed over the step's rollouts (M.add_gate) and logged as
-- gate/<name>, with gate/cut_rate = cut / groups and gate/precision = cut_zero_variance / cut
-- (when there is a cut). A batch without the field logs nothing.
function M.add_gate(acc, gate)
  if type(gate) ~= "table" then return acc end
  acc = acc or {}
  local names = {}
  for k in pairs(gate) do
    if type(k) == "string" then names[#names + 1] = k end
  end
  table.sort(names)
  for _, k in ipairs(names) do
    local v = gate[k]
    if k == "decisions" and type(v) == "table" then -- the gate's per-group decisions, in order
      acc.decisions = acc.decisions or {}
      for _, d in ipairs(v) do acc.decisions[#acc.decisions + 1] = d end
    elseif type(v) == "number" and k ~= "turn" then
      acc[k] = (acc[k] or 0) + v
    elseif acc[k] == nil then -- the gate's settings (its turn, finish): the first rollout's
      acc[k] = v
    end
  end
  return acc
end

function M.gate_metrics(gate)
  local out = {}
  if type(gate) ~= "table" then return out end
  for k, v in pairs(gate) do
    if type(v) == "number" then out["gate/" .. k] = v end
  end
  local groups, cut, true_cut = gate.groups, gate.cut, gate.cut_zero_variance
  if groups and cut and groups > 0 then out["gate/cut_rate"] = cut / groups end
  if cut and true_cut and cut > 0 then out["gate/precision"] = true_cut / cut end
  return out
end

return M
