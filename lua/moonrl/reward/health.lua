-- moonrl.reward.health: per-term health of a scored batch — mean, std, skip / error / gated / not
-- applicable rates, dominance (the term's share of the within-group advantage variance),
-- correlation with success, dead terms (constant within every group) — and the hacking alarm
-- (a term rising while held-out success falls).
local M = {}

-- Unbiased standard deviation of a list (0 for fewer than 2 values), as the group baselines use.
local function sample_std(xs)
  local n = #xs
  if n < 2 then return 0, n > 0 and xs[1] or 0 end
  local s = 0
  for _, x in ipairs(xs) do s = s + x end
  local mean = s / n
  local q = 0
  for _, x in ipairs(xs) do q = q + (x - mean) * (x - mean) end
  return math.sqrt(q / (n - 1)), mean
end

local function mean_of(xs)
  local s = 0
  for _, x in ipairs(xs) do s = s + x end
  return #xs > 0 and s / #xs or 0
end

-- Pearson correlation of two lists, or nil when either is constant (or fewer than 2).
local function correlation(xs, ys)
  local n = #xs
  if n < 2 then return nil end
  local mx, my = mean_of(xs), mean_of(ys)
  local sxy, sxx, syy = 0, 0, 0
  for k = 1, n do
    local dx, dy = xs[k] - mx, ys[k] - my
    sxy, sxx, syy = sxy + dx * dy, sxx + dx * dx, syy + dy * dy
  end
  if sxx <= 0 or syy <= 0 then return nil end
  return sxy / math.sqrt(sxx * syy)
end

-- Each term's share of the within-group advantage variance. Per group (its scorable episodes,
-- two or more), e[i][j] is term j's part of episode i's advantage: under "sum", its contribution's
-- deviation from the group mean over the group's std of the total (GRPO's scaling); under
-- "per_term", its weight times its own group-normalised value (GDPO's). With D[i] = sum_j e[i][j]
-- the share is sum_i e[i][j] D[i] / sum_i D[i]^2 (the covariance split: the shares sum to 1, and
-- a term that works against the others gets a negative one).
local function dominance(g, batch, scores)
  local list, eps = g.terms, g.eps
  local num, den = {}, 0
  for j = 1, #list do num[j] = 0 end
  for _, grp in ipairs(batch:groups()) do
    local members = {}
    for _, i in ipairs(grp.members) do
      if scores[i].status == "ok" then members[#members + 1] = i end
    end
    if #members >= 2 then
      local e = {}
      for k = 1, #members do e[k] = {} end
      if g.combine == "sum" then
        local totals = {}
        for k, i in ipairs(members) do totals[k] = scores[i].total end
        local sd = sample_std(totals)
        for j, term in ipairs(list) do
          local c = {}
          for k, i in ipairs(members) do
            local r = scores[i].terms[term.name]
            c[k] = r.status == "ok" and term.weight * r.value or 0
          end
          local mu = mean_of(c)
          for k = 1, #members do e[k][j] = (c[k] - mu) / (sd + eps) end
        end
      else
        for j, term in ipairs(list) do
          local x = {}
          for k, i in ipairs(members) do
            local r = scores[i].terms[term.name]
            x[k] = r.status == "ok" and r.value or 0
          end
          local sd, mu = sample_std(x)
          for k = 1, #members do e[k][j] = term.weight * (x[k] - mu) / (sd + eps) end
        end
      end
      for k = 1, #members do
        local d = 0
        for j = 1, #list do d = d + e[k][j] end
        for j = 1, #list do num[j] = num[j] + e[k][j] * d end
        den = den + d * d
      end
    end
  end
  local out = {}
  for j = 1, #list do out[j] = den > 0 and num[j] / den or 0 end
  return out
end

-- The health of one scored batch: {episodes =, unscorable = (fraction), order = {names}, terms =
-- {name = {weight =, kind =, n =, mean =, std =, skip =, error =, gated =, na =, dominance =,
-- corr_success = (nil when undefined), dead = 0 | 1}}}. counters: {name = {calls =, ...}} of the
-- judge terms for this scoring, copied into their entries.
function M.batch(g, batch, scores, counters)
  local n = batch:size()
  local out = { episodes = n, order = {}, terms = {}, version = g.version }
  local bad = 0
  for i = 1, n do if scores[i].status ~= "ok" then bad = bad + 1 end end
  out.unscorable = n > 0 and bad / n or 0
  local dom = dominance(g, batch, scores)
  for j, term in ipairs(g.terms) do
    local name = term.name
    local vals, succ = {}, {}
    local count = { unscorable = 0, error = 0, gated = 0, na = 0 }
    for i, ep in ipairs(batch.episodes) do
      local r = scores[i].terms[name]
      if r.status == "ok" then
        vals[#vals + 1] = r.value
        succ[#succ + 1] = ep.success and 1 or 0
      else
        count[r.status] = count[r.status] + 1
      end
    end
    local mean = mean_of(vals)
    local q = 0
    for _, v in ipairs(vals) do q = q + (v - mean) * (v - mean) end
    -- dead: constant within every group that has two values or more (and there is one)
    local seen, varied = false, false
    for _, grp in ipairs(batch:groups()) do
      local first, count_ok = nil, 0
      for _, i in ipairs(grp.members) do
        local r = scores[i].terms[name]
        if r.status == "ok" then
          count_ok = count_ok + 1
          if first == nil then first = r.value elseif r.value ~= first then varied = true end
        end
      end
      if count_ok >= 2 then seen = true end
    end
    local e = { weight = term.weight, kind = term.kind, n = #vals, mean = mean,
      std = #vals > 0 and math.sqrt(q / #vals) or 0,
      skip = n > 0 and count.unscorable / n or 0, error = n > 0 and count.error / n or 0,
      gated = n > 0 and count.gated / n or 0, na = n > 0 and count.na / n or 0,
      dominance = dom[j], corr_success = correlation(vals, succ),
      dead = (seen and not varied) and 1 or 0 }
    for k, v in pairs(counters and counters[name] or {}) do e[k] = v end
    out.order[j] = name
    out.terms[name] = e
  end
  return out
end

-- The hacking alarm over the held-out points (each {step =, success =, means = {name = term
-- mean}}): for each weighted term, true when over the last `window` points its mean rose by more
-- than `rise` while held-out success fell by more than `fall`.
function M.alarm(g, points)
  local a = g.alarm
  local out = {}
  for _, term in ipairs(g.terms) do
    local hit = false
    if term.weight ~= 0 and #points >= a.window then
      local first, last = points[#points - a.window + 1], points[#points]
      local m0, m1 = first.means[term.name], last.means[term.name]
      if m0 and m1 then hit = m1 - m0 > a.rise and first.success - last.success > a.fall end
    end
    out[term.name] = hit
  end
  return out
end

return M
