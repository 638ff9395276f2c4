-- skills_spec.lua - rl.skills: the Markdown skill repo (acceptance test 21: a fork's edits are
-- invisible to sibling groups; search gives the same top-k for the same repo and query, in any
-- process; paired continuations give exactly 0 when `with` equals `without`), BM25 by hand,
-- files in and only in the repo's dir, refusal of names that would leave it, the agent tools,
-- state, and bad input.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"
local skills = rl.skills

local tmpdir = H.tmpdir

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local LIBRARY = {
  ["binary-search"] = "# Binary search\nHalve the interval each guess: ask about the middle letter.",
  ["linear-scan"] = "# Linear scan\nTry each letter in turn from the start of the interval.",
  ["add-numbers"] = "# Adding\nCall the add tool with both numbers, then answer with the sum.",
  ["retry"] = "# Retry\nWhen a tool call fails, read the error and call again.",
  ["twin-a"] = "# Twin\nidentical text for a tie",
  ["twin-b"] = "# Twin\nidentical text for a tie",
}

local function filled(opts)
  local repo = assert(skills.repo(opts or {}))
  local names = {}
  for name in pairs(LIBRARY) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do assert(repo:put(name, LIBRARY[name])) end
  return repo
end

describe("rl.skills.repo", function()
  -- acceptance test 21, part 1
  it("keeps a fork's edits invisible to sibling groups and to the repo until merged", function()
    local repo = filled()
    local g1, g2 = repo:fork(), repo:fork() -- one fork per group
    assert(g1:put("new-trick", "# Trick\nAsk for the middle twice."))
    assert(g1:put("binary-search", "# Binary search, edited"))
    assert(g1:remove("linear-scan"))
    -- the sibling and the repo see none of it
    assert.is_nil(g2:get("new-trick"))
    assert.is_nil(repo:get("new-trick"))
    assert.are.equal(LIBRARY["binary-search"], g2:get("binary-search"))
    assert.are.equal(LIBRARY["binary-search"], repo:get("binary-search"))
    assert.are.equal(LIBRARY["linear-scan"], g2:get("linear-scan"))
    assert.are.equal(LIBRARY["linear-scan"], repo:get("linear-scan"))
    for _, hit in ipairs(g2:search("middle twice trick", 10)) do assert.are_not.equal("new-trick", hit.name) end
    -- through the agent tools too: what group 1 writes, group 2 cannot read
    local t1, t2 = skills.tools(g1), skills.tools(g2)
    assert.are.equal("saved skill by-tool", (t1[3].run { name = "by-tool", markdown = "# Tool" }))
    assert.are.equal("# Tool", (t1[2].run { name = "by-tool" }))
    assert.are.equal("[error: no skill named 'by-tool']", (t2[2].run { name = "by-tool" }))
    assert.is_nil((t2[1].run { query = "tool" }):find("by-tool", 1, true))
    assert.is_truthy((t1[1].run { query = "tool" }):find("by-tool", 1, true))
    assert(g1:remove("by-tool"))
    -- the fork sees its own edits
    assert.are.equal("# Trick\nAsk for the middle twice.", g1:get("new-trick"))
    assert.is_nil(g1:get("linear-scan"))
    assert.are.equal("new-trick", g1:search("middle twice trick", 1)[1].name)
    -- the repo's later edits stay out of its forks
    assert(repo:put("late", "# Late\nadded after the forks"))
    assert.is_nil(g1:get("late"))
    assert.is_nil(g2:get("late"))
    -- a fork of a fork, and siblings of it
    local g1a, g1b = g1:fork(), g1:fork()
    assert(g1a:put("deep", "# Deep"))
    assert.is_nil(g1b:get("deep"))
    assert.is_nil(g1:get("deep"))
    assert.are.equal("# Trick\nAsk for the middle twice.", g1b:get("new-trick"))
    -- merging g1 into the repo: the repo gets its edits, the sibling still does not
    assert.are.same({ "binary-search", "linear-scan", "new-trick" }, repo:merge(g1))
    assert.are.equal("# Binary search, edited", repo:get("binary-search"))
    assert.is_nil(repo:get("linear-scan"))
    assert.is_nil(g2:get("new-trick"))
    assert.are.equal(LIBRARY["linear-scan"], g2:get("linear-scan"))
    assert.are.equal("# Late\nadded after the forks", repo:get("late")) -- kept
    H.assert_error(function() repo:merge(g1a) end, "skills: merge: fork: a fork of this repo")
    -- many forks keep the layer chain short
    for _ = 1, 50 do
      local f = repo:fork()
      assert(f:put("x", "y"))
      assert(repo:put("tick", tostring(_)))
    end
    assert.is_true(#repo.layers <= 9, "layers: " .. #repo.layers)
    assert.are.equal("50", repo:get("tick"))
  end)

  -- acceptance test 21, part 2
  it("search returns the same top-k for the same repo and query, in any insertion order and process", function()
    local repo = filled()
    local q = "interval letter middle tie"
    local first = rl.json.encode(repo:search(q, 4))
    for _ = 1, 5 do assert.are.equal(first, rl.json.encode(repo:search(q, 4))) end
    -- the same skills put in the reverse order
    local names = {}
    for name in pairs(LIBRARY) do names[#names + 1] = name end
    table.sort(names, function(a, b) return a > b end)
    local other = assert(skills.repo {})
    for _, name in ipairs(names) do assert(other:put(name, LIBRARY[name])) end
    assert.are.equal(first, rl.json.encode(other:search(q, 4)))
    -- equal scores: the smaller name first
    local tie = repo:search("identical", 2)
    assert.are.equal("twin-a", tie[1].name)
    assert.are.equal("twin-b", tie[2].name)
    assert.are.equal(tie[1].score, tie[2].score)
    -- in another process, from the files of a repo with a dir
    local dir = tmpdir()
    local disk = filled { dir = dir .. "/skills" }
    local here = rl.json.encode(disk:search(q, 4))
    assert.are.equal(first, here)
    local out, _, ok = H.run_lua([[
      local rl = require "moonrl"
      local repo = assert(rl.skills.repo { dir = arg[1] })
      io.write(rl.json.encode(repo:search(arg[2], 4)))
    ]], dir .. "/skills", q)
    assert.is_true(ok, out)
    assert.are.equal(here, out)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("scores by BM25 (k1 = 1.2, b = 0.75), as computed by hand", function()
    local repo = assert(skills.repo {})
    assert(repo:put("a", "apple apple pie"))  -- words: a apple apple pie (4)
    assert(repo:put("b", "pie crust"))        -- b pie crust (3)
    assert(repo:put("c", "banana"))           -- c banana (2)
    local hits = repo:search("apple pie")
    local n, avg = 3, (4 + 3 + 2) / 3
    local function idf(df) return math.log(1 + (n - df + 0.5) / (df + 0.5)) end
    local function part(f, len) return f * 2.2 / (f + 1.2 * (1 - 0.75 + 0.75 * len / avg)) end
    local a = idf(1) * part(2, 4) + idf(2) * part(1, 4)
    local b = idf(2) * part(1, 3)
    assert.are.equal(2, #hits) -- c matches nothing
    assert.are.equal("a", hits[1].name)
    assert.is_true(math.abs(hits[1].score - a) < 1e-12)
    assert.is_true(math.abs(hits[2].score - b) < 1e-12)
    assert.are.same({}, repo:search("nothing here"))
    assert.are.same({}, repo:search(""))
    assert.are.equal(1, #repo:search("apple pie", 1))
    -- the name's words count: "c" is found by its name
    assert.are.equal("c", repo:search("c")[1].name)
  end)

  it("keeps skills as <dir>/<name>.md and touches no other file", function()
    local dir = tmpdir()
    local sdir = dir .. "/lib"
    assert(rl.fs.mkdir(sdir))
    local f = assert(io.open(sdir .. "/notes.txt", "w")); f:write("mine"); f:close()
    f = assert(io.open(sdir .. "/.hidden.md", "w")); f:write("not a skill"); f:close()
    f = assert(io.open(sdir .. "/existing.md", "w")); f:write("# Existing\nfrom disk"); f:close()
    f = assert(io.open(dir .. "/outside.md", "w")); f:write("outside"); f:close()
    local repo = assert(skills.repo { dir = sdir })
    assert.are.same({ "existing" }, repo:names())
    assert(repo:put("fresh", "# Fresh"))
    assert.are.equal("# Fresh", read(sdir .. "/fresh.md"))
    assert(repo:remove("existing"))
    assert.is_false(exists(sdir .. "/existing.md"))
    -- a fork writes nothing until merged
    local fork = repo:fork()
    assert(fork:put("forked", "# Forked"))
    assert(fork:remove("fresh"))
    assert.is_false(exists(sdir .. "/forked.md"))
    assert.is_true(exists(sdir .. "/fresh.md"))
    repo:merge(fork)
    assert.are.equal("# Forked", read(sdir .. "/forked.md"))
    assert.is_false(exists(sdir .. "/fresh.md"))
    -- load replaces the skills: their files only
    assert(repo:load { format = "moonrl.skills/1", skills = { one = "1", two = "2" } })
    assert.are.same({ "one", "two" }, repo:names())
    assert.is_false(exists(sdir .. "/forked.md"))
    assert.are.equal("1", read(sdir .. "/one.md"))
    -- what was never a skill of the repo is still there
    assert.are.equal("mine", read(sdir .. "/notes.txt"))
    assert.are.equal("not a skill", read(sdir .. "/.hidden.md"))
    assert.are.equal("outside", read(dir .. "/outside.md"))
    -- a new repo on the folder reads the same skills
    local again = assert(skills.repo { dir = sdir })
    assert.are.same(repo:state(), again:state())
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("refuses names that would leave its dir (path traversal)", function()
    local dir = tmpdir()
    local repo = assert(skills.repo { dir = dir .. "/lib" })
    local f = assert(io.open(dir .. "/victim.md", "w")); f:write("keep me"); f:close()
    for _, bad in ipairs { "../victim", "..", "a/b", "/etc/passwd", "./x", ".hidden", "", "a..b",
      "x\0y", "sub/../../victim", "back\\slash", string.rep("n", 101), 42 } do
      for _, call in ipairs {
        function() return repo:put(bad, "pwned") end,
        function() return repo:get(bad) end,
        function() return repo:remove(bad) end,
      } do
        H.assert_error(call, "name: a skill name")
      end
    end
    H.assert_error(function() repo:load { format = "moonrl.skills/1", skills = { ["../victim"] = "x" } } end,
      "skills: load: state.skills: a skill name")
    assert.are.equal("keep me", read(dir .. "/victim.md"))
    assert.are.same({}, rl.fs.list(dir .. "/lib"))
    assert.are.same({ "lib", "victim.md" }, rl.fs.list(dir)) -- rl.fs.list: sorted names
    local none, why = rl.fs.list(dir .. "/nope")
    assert.is_nil(none)
    assert.matches("nope: No such file or directory", why, 1, true)
    -- through the tools the agent gets an error text, never a file outside
    local tools = skills.tools(repo)
    local text, res = tools[3].run { "../victim", "pwned" }
    assert.matches("%[error: not a skill name", text)
    assert.are.equal("error", res.status)
    text = tools[2].run { "../victim" }
    assert.matches("%[error: not a skill name", text)
    assert.are.equal("keep me", read(dir .. "/victim.md"))
    assert.is_true(skills.valid_name("a.b-c_d9"))
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("bounds the number and size of skills (expected failures return nil, message)", function()
    local repo = assert(skills.repo { max_skills = 2, max_bytes = 10 })
    assert(repo:put("a", "1"))
    assert(repo:put("b", "2"))
    local ok, err = repo:put("c", "3")
    assert.is_nil(ok)
    assert.matches("the repo is full (max_skills = 2)", err, 1, true)
    assert(repo:put("a", "replaced")) -- replacing is not adding
    ok, err = repo:put("a", "far too long text")
    assert.is_nil(ok)
    assert.matches("more than max_bytes = 10", err, 1, true)
    ok, err = repo:remove("zzz")
    assert.is_nil(ok)
    assert.matches("no skill named 'zzz'", err, 1, true)
    ok, err = repo:get("zzz")
    assert.is_nil(ok)
    assert.matches("no skill named 'zzz'", err, 1, true)
    -- a dir with more skills than max_skills
    local dir = tmpdir()
    for i = 1, 3 do local f = assert(io.open(dir .. "/s" .. i .. ".md", "w")); f:write("x"); f:close() end
    local r, why = skills.repo { dir = dir, max_skills = 2 }
    assert.is_nil(r)
    assert.matches("holds 3 skills, more than max_skills = 2", why, 1, true)
    -- a dir that cannot be made
    r, why = skills.repo { dir = dir .. "/s1.md/sub" }
    assert.is_nil(r)
    assert.is_string(why)
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("state() and load() restore a repo or a fork", function()
    local repo = filled()
    local fork = repo:fork()
    assert(fork:put("extra", "# Extra"))
    local st = rl.json.decode(rl.json.encode(fork:state()))
    local copy = assert(skills.repo {})
    assert(copy:load(st))
    assert.are.same(fork:names(), copy:names())
    assert.are.equal(rl.json.encode(fork:search("interval", 3)), rl.json.encode(copy:search("interval", 3)))
    -- a fork loaded from a state merges what differs from its parent
    local f2 = repo:fork()
    assert(f2:load(st))
    assert.are.same({ "extra" }, repo:merge(f2))
    assert.are.equal("# Extra", repo:get("extra"))
    H.assert_error(function() copy:load { skills = {} } end, "skills: load: state: a table from repo:state()")
    H.assert_error(function() copy:load { format = "moonrl.skills/1", skills = { a = 1 } } end, "a string expected")
  end)

  it("refuses bad options naming the field", function()
    H.assert_error(function() skills.repo() end, "rl.skills.repo: a table of options expected")
    H.assert_error(function() skills.repo { dri = "x" } end, "unknown field 'dri' (did you mean 'dir'?)")
    H.assert_error(function() skills.repo { dir = 5 } end, "rl.skills.repo: dir: a folder path (a string) expected, got 5")
    H.assert_error(function() skills.repo { dir = "" } end, "dir: a folder path expected")
    H.assert_error(function() skills.repo { index = "tfidf" } end, "index: one of \"bm25\" expected, got \"tfidf\"")
    H.assert_error(function() skills.repo { max_skills = 0 } end, "max_skills: a positive integer expected, got 0")
    H.assert_error(function() skills.repo { max_bytes = -1 } end, "max_bytes: a positive integer expected")
    H.assert_error(function() skills.repo { k1 = -1 } end, "k1: a non-negative number expected")
    H.assert_error(function() skills.repo { b = 2 } end, "b: a number in [0, 1] expected, got 2")
    local repo = assert(skills.repo {})
    H.assert_error(function() repo:put("a", 5) end, "skills: put: markdown: a string expected, got 5")
    H.assert_error(function() repo:search(5) end, "skills: search: query: a string expected")
    H.assert_error(function() repo:search("x", 0) end, "skills: search: k: a positive integer expected, got 0")
    H.assert_error(function() skills.tools({}) end, "rl.skills.tools: repo: an rl.skills repo expected")
    H.assert_error(function() skills.tools(repo, { kk = 1 }) end, "rl.skills.tools: unknown field 'kk' (did you mean 'k'?)")
  end)
end)

describe("rl.skills.tools", function()
  it("makes retrieval and curation agent actions (rl.tool objects)", function()
    local repo = filled()
    local tools = skills.tools(repo, { k = 2 })
    local names = {}
    for i, t in ipairs(tools) do names[i] = t.name end
    assert.are.same({ "search_skills", "read_skill", "write_skill" }, names)
    -- line format: positional arguments
    local text, res = tools[1].run { "halve", "the", "interval" }
    assert.are.equal("ok", res.status)
    assert.matches("^binary%-search: Binary search\n", text)
    assert.are.equal(2, select(2, text:gsub("\n", "")) + 1)
    assert.are.equal(LIBRARY.retry, (tools[2].run { "retry" }))
    text = tools[3].run { "memo", "#", "Memo", "write", "it", "down" }
    assert.are.equal("saved skill memo", text)
    assert.are.equal("# Memo write it down", repo:get("memo"))
    -- hermes format: named arguments
    assert.are.equal("saved skill memo", (tools[3].run { name = "memo", markdown = "# Memo\nv2" }))
    assert.are.equal("# Memo\nv2", (tools[2].run { name = "memo" }))
    text, res = tools[2].run { name = "missing" }
    assert.are.equal("[error: no skill named 'missing']", text)
    assert.are.equal("error", res.status)
    assert.matches("needs a query", (tools[1].run {}))
    assert.are.equal("no skills match", (tools[1].run { query = "zebra" }))
    -- as an environment's tools: a failed call is recorded as a tool error
    local env = { name = "skilled", tools = tools, tasks = function() return {} end,
      new = function() return { reset = function() return "" end, step = function() return "", 0, true end } end }
    local record = {}
    rl.env.step(env, env.new(), "CALL read_skill nowhere", record)
    assert.is_true(record[1].tool_error)
    rl.env.step(env, env.new(), "CALL read_skill retry", record)
    assert.is_nil(record[2].tool_error)
    assert.are.equal(LIBRARY.retry, record[2].observation)
  end)
end)

-- ---------------------------------------------------------------- paired continuations

-- A counter: reset at task.start; "up"/"down" move; reaching 5 ends with reward 1. Its reset
-- draws a number from the episode's rng, which continuations see in the state.
local Counter = {}
Counter.__index = Counter
function Counter:reset(task, rng) self.pos, self.noise = task.start, rng:random() return "at " .. self.pos end
function Counter:step(action)
  if action == "up" then self.pos = self.pos + 1 elseif action == "down" then self.pos = self.pos - 1 end
  if self.pos >= 5 then return nil, 1, true end
  return "at " .. self.pos, 0, false
end
function Counter:clone() return setmetatable({ pos = self.pos, noise = self.noise }, Counter) end
local counter = { name = "counter", max_turns = 8, tasks = function() return { { start = 1 } } end,
  new = function() return setmetatable({}, Counter) end }

-- An episode of the counter played with the given actions.
local function played(actions, seed)
  local inst, record = counter.new(), {}
  inst:reset({ start = 1 }, rl.rng(seed))
  for _, a in ipairs(actions) do
    local _, _, done = rl.env.step(counter, inst, a, record)
    if done then break end
  end
  return { task = { start = 1 }, seed = seed, record = record, turns = #record }
end

describe("rl.skills.paired", function()
  -- acceptance test 21, part 3
  it("gives exactly 0 when with equals without, and the outcome difference otherwise", function()
    local ep = played({ "up", "up", "down", "up" }, 9)
    local function greedy(inst, ctx) -- moves its own copy, reads the shared stream
      local r = 0
      for _ = 1, 3 do
        local _, rew, done = inst:step("up")
        r = r + rew
        if done then break end
      end
      return r + inst.pos * 0.1 + inst.noise + ctx.rng:random()
    end
    for turn = 0, 3 do
      local same = skills.paired { env = counter, turn = turn, with = greedy, without = greedy }
      assert.are.equal(0, same(ep), "turn " .. turn) -- exactly
      local lists = skills.paired { env = counter, turn = turn, with = { "up", "up" }, without = { "up", "up" } }
      assert.are.equal(0, lists(ep))
    end
    -- after turn 2 the counter is at 3: "up up" reaches 5 (reward 1), "down up" does not
    local diff = skills.paired { env = counter, turn = 2, with = { "up", "up" }, without = { "down", "up" } }
    assert.are.equal(1, diff(ep))
    -- each continuation has its own clone: one that moves far does not move the other
    local far = function(inst) inst.pos = inst.pos + 100 return inst.pos end
    assert.are.equal(0, skills.paired { env = counter, turn = 1, with = far, without = far }(ep))
    -- turn as a function of the episode; not applicable past the episode's end
    local last = skills.paired { env = counter, turn = function(e) return e.turns end, with = far, without = far }
    assert.are.equal(0, last(ep)) -- still going after its 4 turns
    assert.is_nil(last(played({ "up", "up", "up", "up" }, 9))) -- ended at its last turn
    assert.is_nil(skills.paired { env = counter, turn = 9, with = far, without = far }(ep))
    -- an environment that does not replay the prefix is an error, not a silent number
    local forged = played({ "up", "up" }, 9)
    forged.record[1].observation = "at 7"
    H.assert_error(function() diff(forged) end, "did not replay turn 1")
  end)

  it("works as a reward term on real rollouts", function()
    local guess = dofile(H.root .. "/envs/guess_letter.lua")
    local function steps_left(inst) return inst.hi - inst.lo end
    local dir = tmpdir()
    local r = rl.train { model = rl.model.new { vocab = 264, dim = 32, layers = 1, heads = 2,
        ffn = 64, ctx = 128, seed = 2 }, tokenizer = rl.tokenizer.bytes(), env = guess, dir = dir,
      seed = 3, steps = 2, tasks_per_step = 2, group_size = 4, max_turn_tokens = 3,
      eval = false, progress = false, plot = false, sft = { examples = 16, epochs = 1 },
      rewards = {
        same = skills.paired { env = guess, turn = function(ep) return ep.turns > 1 and 1 or 0 end,
          with = steps_left, without = steps_left },
        wider = function(ep)
          return skills.paired { env = guess, turn = 0, with = steps_left,
            without = function() return 0 end }(ep) / 100
        end,
      } }
    for s = 2, 3 do
      assert.are.equal(0, r.history[s]["reward/same"])
      assert.is_true(r.history[s]["reward/wider"] > 0)
    end
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("refuses bad options naming the field", function()
    local f = function() return 0 end
    H.assert_error(function() skills.paired() end, "rl.skills.paired: a table of options expected")
    H.assert_error(function() skills.paired { turn = 1, with = f, without = f } end, "rl.skills.paired: env: an environment module (with new()) expected (it is required)")
    H.assert_error(function() skills.paired { env = counter, with = f, without = f } end, "turn:")
    H.assert_error(function() skills.paired { env = counter, turn = -1, with = f, without = f } end, "turn: a non-negative integer or a function")
    H.assert_error(function() skills.paired { env = counter, turn = 1, with = 5, without = f } end, "with: a function(instance, ctx)")
    H.assert_error(function() skills.paired { env = counter, turn = 1, with = f, without = { 1 } } end, "without: a function(instance, ctx)")
    H.assert_error(function() skills.paired { env = counter, turn = 1, with = f, withot = f } end, "unknown field 'withot' (did you mean 'without'?)")
    local noclone = { name = "x", tasks = function() return {} end, new = function() return {} end }
    H.assert_error(function() skills.paired { env = noclone, turn = 1, with = f, without = f } end, "instances need a clone() method")
    local bad = skills.paired { env = counter, turn = 0, with = function() return "x" end, without = f }
    H.assert_error(function() bad(played({ "up" }, 1)) end, "with returned \"x\", not a number")
    H.assert_error(function() bad(5) end, "ep: an episode")
  end)
end)
