-- advantage_spec.lua: busted spec of rl.advantage: every case of the spec's test vectors
-- (tests/advantage/advantage_vectors.json, a copy of shared/spec/advantage_vectors.json) through
-- rl.advantage.<method>(inputs, params) at rtol 1e-5 / atol 1e-6, one test per case named
-- method/name, cases whose output is `error` raising; then the binding's own checks of its
-- arguments (unknown names, shapes, id semantics, option values). The families the trainer uses
-- run through rl.objective, the trainer's functions, so these cases check the trainer's path.
--
-- Run inside the moonrl command:
--   MOONRL_ROOT=$PWD MOONRL_BUILD=$PWD/build ./build/moonrl run /usr/bin/busted -o TAP \
--     tests/lua/advantage_spec.lua
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local V = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "vectors.lua")(rl)
local from_json, mismatch = V.from_json, V.mismatch

local function read_vectors() return V.read(H.root .. "/tests/advantage/advantage_vectors.json") end

-- rl.objective computes per-token values on sampled tokens only and gives 0 at the others (spec
-- 0.3: consumers multiply by the mask; the GAE vectors ask for mask-1 positions only). For these
-- outputs of the families that run through it, the reference's mask-0 entries are replaced by 0.
local SAMPLED_ONLY = { gae = { advantages = true, returns = true } }
for _, kind in ipairs { "vanilla", "gspo", "sapo", "cispo", "gpg", "geo_mean" } do
  SAMPLED_ONLY["policy_loss_" .. kind] = { pg_losses = true, grad_coeff_wrt_logp = true }
end

local function on_sampled(want, mask)
  local t = {}
  for b, row in ipairs(want) do
    t[b] = {}
    for j, v in ipairs(row) do t[b][j] = mask[b][j] == 1 and v or 0 end
  end
  return t
end

local doc = read_vectors()

describe("the advantage vectors", function()
  it("are the 140 cases of 54 method families the spec promises", function()
    local families = {}
    for _, c in ipairs(doc.cases) do families[c.method] = true end
    local n = 0
    for _ in pairs(families) do n = n + 1 end
    assert.equal(140, #doc.cases)
    assert.equal(54, n)
    for name in pairs(families) do assert.is_function(rl.advantage[name], name) end
  end)

  for _, case in ipairs(doc.cases) do
    it(case.method .. "/" .. case.name, function()
      local fn = rl.advantage[case.method]
      local inputs, params = from_json(case.inputs, true), from_json(case.params, true)
      if case.outputs.error ~= nil then
        local ok, err = pcall(fn, inputs, params)
        assert.is_false(ok, "the input must be refused")
        assert.truthy(tostring(err):find("mask", 1, true), tostring(err))
        return
      end
      local got = fn(inputs, params)
      assert.is_table(got)
      for key, want in pairs(case.outputs) do
        want = from_json(want, false)
        if (SAMPLED_ONLY[case.method] or {})[key] then want = on_sampled(want, inputs.response_mask) end
        local m = mismatch(got[key], want, key)
        if m then error(m, 0) end
      end
    end)
  end
end)

describe("rl.advantage arguments", function()
  local A = rl.advantage
  local base = {
    token_level_rewards = { { 0, 1 }, { 0, 0 }, { 0, 3 } },
    response_mask = { { 1, 1 }, { 1, 1 }, { 1, 0 } },
    index = { 1, 1, 1 },
  }
  local function with(changes)
    local t = {}
    for k, v in pairs(base) do t[k] = v end
    for k, v in pairs(changes) do t[k] = v end
    return t
  end

  it("names an unknown input or parameter", function()
    H.assert_error(function() A.grpo(with { rewards = {} }) end, { "unknown input", "rewards" })
    H.assert_error(function() A.grpo(base, { eps = 1 }) end,
      { "unknown param", "eps", "epsilon, norm_adv_by_std" })
  end)

  it("names a missing input and shapes that disagree", function()
    H.assert_error(function() A.grpo(with { index = false }) end, "inputs.index")
    H.assert_error(function() A.grpo(with { response_mask = { { 1, 1 }, { 1, 1 } } }) end,
      "inputs.response_mask is 2x2, but inputs.token_level_rewards is 3x2")
    H.assert_error(function() A.grpo(with { index = { 1, 1 } }) end, "inputs.index has 2 entries")
    H.assert_error(function() A.grpo(with { response_mask = { { 1, 1 }, { 1 }, { 1, 0 } } }) end,
      "row 2 has 1 entries")
  end)

  it("refuses values the engine refuses, with its reason", function()
    H.assert_error(function() A.grpo(with { response_mask = { { 1, 0.5 }, { 1, 1 }, { 1, 0 } } }) end,
      "a mask holds only 0 and 1")
    H.assert_error(function() A.grpo(with { token_level_rewards = { { 0, 0 / 0 }, { 0, 0 }, { 0, 3 } } }) end,
      "must be finite")
    H.assert_error(function() A.grpo_passk(with { index = { 1, 2, 2 } }) end, "groups of 2 or more")
  end)

  it("checks option values and names the choices", function()
    H.assert_error(function()
      A.agg_loss({ loss_mat = { { 1 } }, loss_mask = { { 1 } } }, { mode = "token-total" })
    end, { "params.mode", "token-mean, seq-mean-token-sum", "token-sum" })
    H.assert_error(function()
      A.kl_penalty({ logprob = { 0 }, ref_logprob = { 0 } }, { kind = "full" })
    end, "low_var_kl")
    H.assert_error(function() A.grpo(base, { epsilon = "small" }) end, "params.epsilon: number expected")
  end)

  it("takes ids as numbers or strings, equal exactly when equal in Lua", function()
    local together = A.drgrpo_advantage(with { index = { 1, 1, 1 } }).advantages
    local strings = A.drgrpo_advantage(with { index = { "1", "1", "1" } }).advantages
    local apart = A.drgrpo_advantage(with { index = { 1, "1", 1 } }).advantages
    H.assert_close(strings, together, 1e-6)
    assert.are_not.equal(apart[2][1], together[2][1]) -- "1" is a group of its own
    H.assert_close(apart[2][1], 0, 1e-6) -- a group of one keeps its score (0) under Dr. GRPO
    H.assert_error(function() A.grpo(with { index = { 1, {}, 1 } }) end, "id (a number or a string)")
  end)

  it("composes: GRPO advantages into PPO's token-mean loss", function()
    local adv = A.grpo(base).advantages
    -- scores 1, 0, 3: mean 4/3, unbiased std sqrt(7/3)
    local sd = math.sqrt(7 / 3)
    H.assert_close(adv[1], { (1 - 4 / 3) / (sd + 1e-6), (1 - 4 / 3) / (sd + 1e-6) }, 1e-6)
    H.assert_close(adv[3], { (3 - 4 / 3) / (sd + 1e-6), 0 }, 1e-6)
    local same = { { -1, -1 }, { -1, -1 }, { -1, -1 } }
    local pg = A.policy_loss_vanilla({ log_prob = same, old_log_prob = same, advantages = adv,
      response_mask = base.response_mask })
    -- at ratio 1 the loss is minus the token mean of the advantages (5 valid tokens)
    local want = -(2 * adv[1][1] + 2 * adv[2][1] + adv[3][1]) / 5
    H.assert_close(pg.loss, want, 1e-6)
    H.assert_close(pg.pg_clipfrac, 0, 1e-9)
  end)
end)
