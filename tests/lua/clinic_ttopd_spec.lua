-- clinic_ttopd_spec.lua - recipes/clinic_ttopd.lua (TT-OPD on the clinic): a smoke run prints
-- the seconds per step first, both arms' tables and training curves, and leaves each arm's run
-- folder (the TT-OPD arm's with its teacher checkpoint and options).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

describe("recipes/clinic_ttopd.lua", function()
  it("runs end to end in a smoke run: SFT with hinted demos, GRPO and GRPO + TT-OPD, the tables", function()
    local dir = os.tmpname()
    os.remove(dir)
    local out, code = H.run(string.format("cd %s && %s run recipes/clinic_ttopd.lua --smoke --dir %s",
      H.shell_quote(H.root), H.shell_quote(H.moonrl), H.shell_quote(dir)))
    assert.are.equal(0, code, out)
    -- the seconds per step come before any table
    local first_step = out:find("arm grpo: step 1 took [%d.]+ s")
    local first_table = out:find("\nSFT policy")
    assert.is_truthy(first_step and first_table and first_step < first_table, out)
    for _, row in ipairs { "SFT policy", "GRPO", "GRPO %+ TT%-OPD" } do
      assert.matches("\n" .. row .. " +[%d.]+%% +[%d.]+ +[%d.]+ +[%d.]+ +[%d.]+", out)
    end
    assert.matches("training success, GRPO %+ TT%-OPD: ", out)
    assert.matches("ttopd %d+ s %([%d.]+ s/step%)", out)
    -- 150 SFT examples: 120 plain and 30 hinted
    assert.matches("SFT %d+ %(150 examples", out)
    for _, arm in ipairs { "grpo", "ttopd" } do
      local lines = H.read_json_lines(dir .. "/clinic_ttopd-" .. arm .. "-s1/metrics.jsonl")
      assert.are.equal(3, #lines)
      assert.is_number(lines[3]["eval/success"])
      assert.is_number(lines[3]["eval/t1_bytes"])
      local state = rl.json.decode(assert(io.open(dir .. "/clinic_ttopd-" .. arm .. "-s1/state.json")):read("a"))
      if arm == "ttopd" then
        assert.are.equal("teacher-000002.bin", state.teacher)
        assert.are.equal(0.05, state.options.teacher.coef)
      else
        assert.is_nil(state.teacher)
      end
    end
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
