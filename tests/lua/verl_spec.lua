-- verl_spec.lua: busted spec of what verl 1dda039 changed or added since the advantage spec's
-- source (tests/advantage/verl_1dda039.md): every case of tests/advantage/verl_vectors.json,
-- written by an independent NumPy reference (tests/advantage/gen_verl_vectors.py), through
-- rl.advantage.<method>(inputs, params) at rtol 1e-5 / atol 1e-6, one test per case named
-- method/name; an output `error` holds a substring the refusal must contain. Then the two
-- examples the change list gives, spelled out.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local V = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "vectors.lua")(rl)

local doc = V.read(H.root .. "/tests/advantage/verl_vectors.json")

describe("verl 1dda039's vectors", function()
  it("are the cases the generator wrote, of the families rl.advantage has", function()
    assert.are.equal(doc.meta.n_cases, #doc.cases)
    assert.is_true(#doc.cases >= 60)
    local seen = {}
    for _, c in ipairs(doc.cases) do
      assert.is_function(rl.advantage[c.method], c.method)
      seen[c.method .. "/" .. c.name] = (seen[c.method .. "/" .. c.name] or 0) + 1
    end
    for k, n in pairs(seen) do assert.are.equal(1, n, k .. " appears twice") end
    for _, family in ipairs { "gdpo", "optimal_token_baseline", "tir_optimal_token_baseline",
      "policy_loss_dppo_tv", "policy_loss_dppo_kl", "policy_loss_clip_cov", "policy_loss_kl_cov",
      "policy_loss_dro", "policy_loss_reinforce", "policy_loss_bypass_mode", "rollout_correction",
      "policy_loss_geo_mean", "reinforce_plus_plus", "agg_loss" } do
      local found = false
      for k in pairs(seen) do found = found or k:sub(1, #family + 1) == family .. "/" end
      assert.is_true(found, family)
    end
  end)

  for _, case in ipairs(doc.cases) do
    it(case.method .. "/" .. case.name, function()
      local fn = rl.advantage[case.method]
      local inputs, params = V.from_json(case.inputs, true), V.from_json(case.params, true)
      if case.outputs.error ~= nil then
        local ok, err = pcall(fn, inputs, params)
        assert.is_false(ok, "the input must be refused")
        assert.truthy(tostring(err):find(case.outputs.error, 1, true), tostring(err))
        return
      end
      local got = fn(inputs, params)
      assert.is_table(got)
      for key, want in pairs(case.outputs) do
        local m = V.mismatch(got[key], V.from_json(want, false), key)
        if m then error(m, 0) end
      end
    end)
  end
end)

describe("the changes verl 1dda039 made, by example", function()
  it("seq-mean-token-sum-norm: loss [[1, 1], [1, 1]], full mask, L = 2 gives 1.0", function()
    local out = rl.advantage.agg_loss({ loss_mat = { { 1, 1 }, { 1, 1 } },
      loss_mask = { { 1, 1 }, { 1, 1 } } }, { mode = "seq-mean-token-sum-norm" })
    assert.are.equal(1.0, out.loss)
  end)

  it("REINFORCE++: rewards [0, 0, 1], mask [1, 0, 1], gamma 1 give returns [1, 0, 1]", function()
    local inputs = { token_level_rewards = { { 0, 0, 1 } }, response_mask = { { 1, 0, 1 } } }
    assert.are.same({ 1, 0, 1 }, rl.advantage.reinforce_plus_plus(inputs, { gamma = 1 }).returns[1])
    -- the rule before verl 8a1bf6d5b, by name
    assert.are.same({ 0, 1, 1 }, rl.advantage.reinforce_plus_plus(inputs,
      { gamma = 1, reset_at_mask = true }).returns[1])
  end)
end)
