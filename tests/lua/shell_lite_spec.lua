-- shell_lite_spec.lua - envs/shell_lite.lua (PrivEsc-LLM in miniature on rl.shell): every family's
-- exploit reaches uid 0 on its training and holdout variants and on the static scenarios, the
-- variants differ in names, recon alone never does, the interface penalty, the demonstrator's
-- structure, the outcome_cost term by hand; and a smoke run of recipes/shell_lite.lua.
local rl = require "moonrl"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
package.path = H.root .. "/?.lua;" .. package.path
local env = require "envs.shell_lite"

local function play(task, actions)
  local inst, record = env.new(), {}
  inst:reset(task)
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(env, inst, a, record)
    if done then break end
  end
  return record, inst
end

describe("envs/shell_lite", function()
  it("each family's exploit gives uid 0 on both variants and every static scenario; recon alone does not", function()
    local sets = { env.tasks("train", 28, 3), env.tasks("test", 28), env.tasks("static", 12) }
    assert.are.equal(12, #sets[3])
    for _, tasks in ipairs(sets) do
      for _, t in ipairs(tasks) do
        local r = env.play(t, env.perfect(t))
        assert.is_true(r.success, (t.family or "?") .. " " .. tostring(t.seed or t.static))
        assert.are.equal(#env.perfect(t), r.turns)
        local recon = env.play(t, env.RECON)
        assert.is_false(recon.success)
      end
    end
  end)

  it("holdout variants use other usernames and binaries than training ones", function()
    local train_users, train_first = {}, {}
    for _, t in ipairs(env.tasks("train", 140, 1)) do
      local h, exploit, _, intro = env.build(t)
      train_users[h.user] = true
      train_first[exploit[#exploit]] = true
      assert.matches("^" .. h.user .. "@%w+ pw:%S+ %-> root%?$", intro)
    end
    for _, t in ipairs(env.tasks("test", 140)) do
      local h, exploit = env.build(t)
      assert.is_nil(train_users[h.user])
      if t.family == "sudo" or t.family == "suid" or t.family == "caps" or t.family == "cron" then
        assert.is_nil(train_first[exploit[1]], exploit[1])
      end
    end
    -- one task, one host (the seed decides everything)
    local t = env.tasks("test", 5)[5]
    assert.are.equal(rl.shell.literal(env.build(t)), rl.shell.literal(env.build(t)))
  end)

  it("plays a sudo escalation through the protocol, with the interface penalty for malformed commands", function()
    local t
    for _, x in ipairs(env.tasks("test", 7)) do if x.family == "sudo" then t = x end end
    local h = env.build(t)
    local bin = h.sudoers[h.user][1]
    local record = play(t, { "sudo -l", "frobnicate", "cat", "sudo " .. bin:match("[^/]+$"), "id" })
    assert.are.equal(4, #record)
    assert.are.equal("(root) NOPASSWD: " .. bin, record[1].observation)
    assert.are.equal(0, record[1].reward)
    assert.are.equal(-env.INTERFACE_PENALTY, record[2].reward)
    assert.are.equal(-env.INTERFACE_PENALTY, record[3].reward)
    assert.is_true(record[2].info.malformed)
    assert.are.equal(1, record[4].reward)
    assert.is_true(record[4].done)
    assert.is_true(record[4].info.success)
  end)

  it("the demonstrator recons in random order up to the revealing command, then exploits", function()
    local skipped, repeated, total = 0, 0, 0
    for i, t in ipairs(env.tasks("train", 210, 2)) do
      local _, exploit, reveal = env.build(t)
      local a = env.oracle(t, rl.rng(i))
      assert.is_true(env.play(t, a, 99).success or t.family == "weak")
      if reveal and t.family ~= "pwfile" then
        -- the recon before the exploit never runs past the revealing command (a repeat aside)
        local k = #a - #exploit
        while a[k] == exploit[1] do k = k - 1 end
        local seen = false
        for j = 1, k do
          assert.is_true(not seen or a[j] == reveal, "recon after the revealing command: " .. table.concat(a, " | "))
          if a[j] == reveal then seen = true end
        end
      end
      local _, _, _, _, weak = env.build(t)
      if not weak and t.family ~= "reuse" and reveal then
        local seen = 0
        for _, c in ipairs(a) do if c == reveal then seen = seen + 1 end end
        total = total + 1
        if seen == 0 then skipped = skipped + 1 elseif seen == 2 then repeated = repeated + 1 end
      end
    end
    -- each command is skipped with probability 0.1 and doubled with 0.1 (a loose check)
    assert.is_true(skipped / total > 0.03 and skipped / total < 0.2, skipped .. "/" .. total)
    assert.is_true(repeated / total > 0.03 and repeated / total < 0.2, repeated .. "/" .. total)
  end)

  it("the outcome_cost term is lambda (1 - turns / h_max) on success", function()
    assert.are.equal(0, env.cost_term { success = false, turns = 2 })
    assert.are.equal(0.1 * (1 - 3 / 10), env.cost_term { success = true, turns = 3 })
    assert.are.equal(0, env.cost_term { success = true, turns = 10 })
  end)

  it("clones fork the simulated host", function()
    local t = env.tasks("test", 7)[6] -- reuse
    local _, exploit = env.build(t)
    local a = env.new()
    a:reset(t)
    a:step("sudo -l")
    local b = a:clone()
    local _, r, done = b:step(exploit[1])
    assert.are.equal(1, r)
    assert.is_true(done)
    assert.are.equal(1000, a.sh:uid())
  end)
end)

describe("recipes/shell_lite.lua", function()
  it("runs end to end in a smoke run: both SFT sizes, both GRPO arms, the table", function()
    local dir = os.tmpname()
    os.remove(dir)
    local out, code = H.run(string.format("cd %s && %s run recipes/shell_lite.lua --smoke --dir %s",
      H.shell_quote(H.root), H.shell_quote(H.moonrl), H.shell_quote(dir)))
    assert.are.equal(0, code, out)
    assert.matches("grpo_outcome: [%d.]+ s per RL step", out)
    for _, row in ipairs { "SFT 25%% %(base%)", "SFT all", "SFT %+ GRPO outcome", "SFT %+ GRPO outcome_cost",
      "demonstrator %(scripted%)", "perfect oracle %(ceiling%)" } do
      assert.matches("\n" .. row .. " +[%d.]+%% +[%d.]+ +[%d.]+%%", out)
    end
    assert.matches("perfect oracle %(ceiling%) +100%.0%%", out)
    local lines = H.read_json_lines(dir .. "/shell_lite-grpo_cost-s1/metrics.jsonl")
    assert.is_number(lines[1]["eval/holdout_success"])
    assert.is_number(lines[1]["eval/static_turns"])
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)
end)
