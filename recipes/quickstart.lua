-- quickstart.lua - what `make demo` runs for now: softmax regression on synthetic clusters, written
-- with moonrl tensors from Lua (matmul on OpenBLAS, broadcasting, softmax, reductions, gather).
-- The RL quickstart replaces it once the policy model and trainer exist.
--
--   moonrl run recipes/quickstart.lua [steps]
local rl = require "moonrl"
local T = rl.tensor

local steps = tonumber(arg and arg[1]) or 200
local classes, dim, per_class = 4, 16, 256
local n = classes * per_class

local blas = rl.blas_info()
print(string.format("moonrl %s, OpenBLAS core %s (chosen by %s), %d threads",
  rl.version, blas.core, blas.source, blas.threads))

-- Data: class c is a Gaussian blob around a random centre; a held-out set comes from the same
-- centres with other noise.
local centres = T.randn({ classes, dim }, 1):scale(0.5)
local function make_split(seed)
  local noise = T.randn({ n, dim }, seed)
  local labels, rows = {}, {}
  for i = 1, n do
    labels[i] = (i - 1) % classes + 1
    rows[i] = labels[i]
  end
  local x = centres:index_select(1, rows) + noise
  return x, labels
end
local x_train, y_train = make_split(2)
local x_test, y_test = make_split(3)

-- One-hot targets (n x classes).
local function one_hot(labels)
  local t = T.zeros { #labels, classes }
  for i, c in ipairs(labels) do t:set(i, c, 1) end
  return t
end
local targets = one_hot(y_train)

local function accuracy(w, b, x, labels)
  local predicted = (x:matmul(w) + b):argmax(2) -- 1-based class per row
  local hits = 0
  for i = 1, #labels do
    if predicted[i] == labels[i] then hits = hits + 1 end
  end
  return hits / #labels
end

-- Parameters and full-batch gradient descent on the mean cross-entropy.
local w = T.randn({ dim, classes }, 4):scale(0.01)
local b = T.zeros { classes }
local lr = 0.05
local picked = {}
for i = 1, n do picked[i] = { y_train[i] } end

print(string.format("before training: held-out accuracy %.1f%%", 100 * accuracy(w, b, x_test, y_test)))
local t0 = rl.clock()
for step = 1, steps do
  local logits = x_train:matmul(w) + b                 -- (n, classes), b broadcasts over rows
  local logp = logits:log_softmax()
  local loss = -logp:gather(2, picked):mean()          -- log-probability of each true class
  local grad_logits = (logp:exp() - targets) / n       -- d loss / d logits
  local grad_w = x_train:matmul(grad_logits, { trans_a = true })
  local grad_b = grad_logits:sum(1)
  w = w - grad_w:scale(lr)
  b = b - grad_b:scale(lr)
  if step == 1 or step % 40 == 0 then
    print(string.format("step %4d  loss %.4f  train acc %5.1f%%  held-out acc %5.1f%%", step, loss,
      100 * accuracy(w, b, x_train, y_train), 100 * accuracy(w, b, x_test, y_test)))
  end
end
local elapsed = rl.clock() - t0
print(string.format("%d steps in %.2f s; held-out accuracy %.1f%%", steps, elapsed,
  100 * accuracy(w, b, x_test, y_test)))
