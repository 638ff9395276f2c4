-- eval_spec.lua - moonrl.train.eval's PASS@(k, T) grid: the unbiased pass@k against binomials
-- computed by hand, the grid against a direct count over the same rollouts, and the claim that
-- success within T turns of a max_turns rollout equals rolling out with max_turns = T.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local eval = rl.train.eval
local guess = dofile(H.root .. "/envs/guess_letter.lua")

local function choose(n, k)
  local r = 1
  for i = 1, k do r = r * (n - k + i) / i end
  return r
end

describe("rl.train.eval.pass_at_k", function()
  it("is 1 - C(n - c, k) / C(n, k)", function()
    for n = 1, 12 do
      for c = 0, n do
        for k = 1, n do
          local want = n - c < k and 1 or 1 - choose(n - c, k) / choose(n, k)
          assert.is_true(math.abs(eval.pass_at_k(n, c, k) - want) < 1e-12, string.format("n %d c %d k %d", n, c, k))
        end
      end
    end
    assert.are.equal(0.5, eval.pass_at_k(4, 1, 2)) -- 1 - 3/6
    H.assert_error(function() eval.pass_at_k(4, 5, 1) end, { "0 <= c <= n" })
    H.assert_error(function() eval.pass_at_k(4, 1, 5) end, { "1 <= k <= n" })
  end)
end)

describe("rl.train.eval.pass_grid", function()
  it("counts successes within T turns over n samples, as rolling out with max_turns = T does", function()
    local dir = H.tmpdir()
    local tok = rl.tokenizer.bytes()
    local m = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2, ffn = 64, ctx = 160, seed = 3 }
    local tasks = guess.tasks("test", 6, 11)
    local grid, direct, horizons, errors
    rl.train {
      model = m, tokenizer = tok, env = guess, dir = dir, name = "grid", seed = 5, steps = 1,
      tasks_per_step = 4, group_size = 4, max_turn_tokens = 2, sft = { examples = 400, epochs = 3, lr = 3e-3 },
      progress = false, eval = { every = 1, tasks = 2, k = 1 },
      evaluate = function(ctx, step)
        if step ~= 1 then return {} end
        grid = eval.pass_grid(ctx, { tasks = tasks, n = 8, ks = { 1, 2, 8 }, seed = 9, chunk = 2 })
        -- the same rollouts by hand: chunks of 2 tasks, 8 samples each, the grid's seeds
        direct, horizons = {}, {}
        for first = 1, #tasks, 2 do
          local part = { tasks[first], tasks[first + 1] }
          local b = ctx.stages.rollout(ctx, { tasks = part, repeats = 8, seed = rl.train.mix(9, first),
            temperature = 1, group_base = first - 1 })
          for j, ep in ipairs(b.episodes) do
            direct[ep.group] = direct[ep.group] or {}
            direct[ep.group][#direct[ep.group] + 1] = { success = ep.success, turns = ep.turns }
            horizons[#horizons + 1] = { group = ep.group, j = j, success = ep.success, turns = ep.turns, first = first }
          end
          -- each depth T again with max_turns = T: the same successes within T turns
          for t = 1, guess.max_turns do
            local short = {}
            for i, task in ipairs(part) do
              short[i] = setmetatable({ max_turns = t }, { __index = task })
            end
            local bt = ctx.stages.rollout(ctx, { tasks = short, repeats = 8, seed = rl.train.mix(9, first),
              temperature = 1, group_base = first - 1 })
            for j, ep in ipairs(bt.episodes) do
              local full = b.episodes[j]
              local within = full.success and full.turns <= t
              if within ~= (ep.success and true or false) then
                errors = (errors or "") .. string.format("task %d sample %d depth %d; ", ep.group, j, t)
              end
            end
          end
        end
        return {}
      end,
    }
    assert.is_nil(errors)
    assert.are.equal(8, grid.n)
    assert.are.equal(#tasks, grid.tasks)
    local some_between = false
    for t = 1, guess.max_turns do
      for _, k in ipairs { 1, 2, 8 } do
        local sum = 0
        for i = 1, #tasks do
          local c = 0
          for _, s in ipairs(direct[i]) do
            if s.success and s.turns <= t then c = c + 1 end
          end
          sum = sum + (8 - c < k and 1 or 1 - choose(8 - c, k) / choose(8, k))
        end
        assert.is_true(math.abs(grid[t][k] - sum / #tasks) < 1e-12, string.format("T %d k %d", t, k))
        if grid[t][k] > 0 and grid[t][k] < 1 then some_between = true end
      end
      if t > 1 then assert.is_true(grid[t][1] >= grid[t - 1][1]) end -- more turns never lose a success
    end
    assert.is_true(some_between, "the grid has values strictly between 0 and 1")
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("refuses bad options, naming them", function()
    local ctx = { cfg = { max_turns = 4, tasks_per_step = 2, group_size = 2 } }
    H.assert_error(function() eval.pass_grid(ctx, { tasks = { {} }, n = 4, ks = { 8 } }) end, { "ks: 8 is more than n = 4" })
    H.assert_error(function() eval.pass_grid(ctx, { tasks = {} }) end, { "tasks: a non-empty list" })
    H.assert_error(function() eval.pass_grid(ctx, { tasks = { {} }, k = 2 }) end, { "unknown option 'k'" })
    H.assert_error(function() eval.pass_grid(ctx, { tasks = { {} }, depths = { 0 } }) end, { "depths: a list of positive" })
  end)
end)
