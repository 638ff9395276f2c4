-- moonrl.curriculum.beta: the Beta distribution's CDF (the regularized incomplete beta function
-- I_x(a, b)), its quantiles and log-gamma, for the band sampler's posterior bounds.
--
-- lgamma: Stirling's series after shifting x above 15 with Gamma(x + 1) = x Gamma(x) (about 1e-14
-- relative). I_x(a, b): the continued fraction of the incomplete beta integral, evaluated with the
-- modified Lentz method, on the side of the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) where it
-- converges fast. Quantiles: bisection on the CDF.
local M = {}

local HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)

function M.lgamma(x)
  assert(x > 0, "lgamma: x must be positive")
  local shift = 0
  while x < 15 do
    shift = shift + math.log(x)
    x = x + 1
  end
  local z = 1 / (x * x)
  local series = (1 / 12 - z * (1 / 360 - z * (1 / 1260 - z / 1680))) / x
  return (x - 0.5) * math.log(x) - x + HALF_LOG_2PI + series - shift
end

local TINY, EPS = 1e-300, 1e-15

-- The continued fraction 1 / (1 + d1 / (1 + d2 / (1 + ...))) of I_x(a, b).
local function fraction(x, a, b)
  local f, c, d = TINY, TINY, 0.0
  for j = 1, 400 do
    local num
    if j == 1 then
      num = 1
    else
      local m = (j - 1) // 2
      if (j - 1) % 2 == 1 then -- d_{2m+1}
        num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
      else                     -- d_{2m}
        num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
      end
    end
    d = 1 + num * d
    if math.abs(d) < TINY then d = TINY end
    c = 1 + num / c
    if math.abs(c) < TINY then c = TINY end
    d = 1 / d
    local delta = c * d
    f = f * delta
    if math.abs(delta - 1) < EPS then break end
  end
  return f
end

-- I_x(a, b) for a, b > 0 and x in [0, 1].
function M.cdf(x, a, b)
  if x <= 0 then return 0 end
  if x >= 1 then return 1 end
  local log_front = a * math.log(x) + b * math.log(1 - x)
    - (M.lgamma(a) + M.lgamma(b) - M.lgamma(a + b))
  if x < (a + 1) / (a + b + 2) then
    return math.exp(log_front) * fraction(x, a, b) / a
  end
  return 1 - math.exp(log_front) * fraction(1 - x, b, a) / b
end

-- The q-quantile of Beta(a, b).
function M.quantile(q, a, b)
  if q <= 0 then return 0 end
  if q >= 1 then return 1 end
  local lo, hi = 0.0, 1.0
  for _ = 1, 60 do
    local mid = (lo + hi) / 2
    if M.cdf(mid, a, b) < q then lo = mid else hi = mid end
  end
  return (lo + hi) / 2
end

return M
