-- autosearch_spec.lua - smoke runs of recipes/autosearch.lua (AutoSearch's excess-search penalty
-- on kbqa.variant{guess = true}): both arms and the SFT row in its table, the same table twice
-- for the same seed, the penalty term only in the autosearch arm and equal to -0.1 x the
-- episode's excess searches, and its option errors. Not that it learns (the README's table).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local run = H.smoke_runner("autosearch.lua")

local function table_of(out) return H.table_without_seconds(out, "autosearch, seed 1;") end -- s/step dropped

describe("recipes/autosearch.lua", function()
  local dir = H.tmpdir()
  local out, code = run(dir)
  teardown(function() H.sh("rm -rf " .. H.shell_quote(dir)) end)

  it("prints both arms and the SFT start, with searches and excess per question", function()
    assert.are.equal(0, code, out)
    local tbl = table_of(out)
    assert.is_truthy(tbl, out)
    assert.matches("arm%s+1%-hop%%%s+2%-hop%%%s+3%-hop%%%s+4%-hop%%%s+all%%%s+searches%s+excess%s+s/step", out)
    for _, arm in ipairs { "grpo", "autosearch", "SFT" } do
      assert.matches("\n" .. arm .. "%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+[%d.]+%s+[%d.]+", tbl)
    end
  end)

  it("prints the same table for the same seed", function()
    local dir2 = H.tmpdir()
    local out2, code2 = run(dir2)
    assert.are.equal(0, code2, out2)
    assert.are.equal(table_of(out), table_of(out2))
    H.sh("rm -rf " .. H.shell_quote(dir2))
  end)

  it("adds the excess penalty in the autosearch arm only, -0.1 per excess search", function()
    local as = H.read_json_lines(dir .. "/autosearch-autosearch-s1/episodes.jsonl")
    local gr = H.read_json_lines(dir .. "/autosearch-grpo-s1/episodes.jsonl")
    assert.is_true(#as > 0 and #gr > 0)
    for _, ep in ipairs(as) do
      local info = ep.record[#ep.record].info
      assert.is_number(info.excess)
      assert.is_near(-0.1 * info.excess, ep.reward_terms.excess, 1e-12)
    end
    for _, ep in ipairs(gr) do assert.is_nil(ep.reward_terms.excess) end
  end)

  it("refuses an unknown arm and a negative penalty", function()
    local bad = H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/autosearch.lua"),
      "--arms grpo,ppo" }, " "))
    assert.matches("unknown arm 'ppo'", bad)
    bad = H.run(table.concat({ H.shell_quote(H.moonrl), "run", H.shell_quote(H.root .. "/recipes/autosearch.lua"),
      "--penalty -1" }, " "))
    assert.matches("%-%-penalty: a number >= 0", bad)
  end)
end)
