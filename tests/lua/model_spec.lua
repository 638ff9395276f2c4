-- model_spec.lua - the Lua model API (`rl.model`): construction and its errors, logits and
-- log-probabilities (ragged batches), generation (greedy, seeds, stop tokens, behaviour
-- log-probabilities), parameter views, save/load, and SFT of a byte model on a toy task that it
-- then solves on words it never saw.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

-- byte-model specials (rl.tokenizer.bytes() numbering)
local USER, ASSISTANT, END = 260, 261, 263

local function tiny(extra)
  local cfg = { vocab = 264, dim = 32, layers = 2, heads = 2, ffn = 64, ctx = 32, seed = 1 }
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return rl.model.new(cfg)
end

local function log_softmax_row(t, b, pos)
  local row = {}
  local mx = -math.huge
  for j = 1, t:size(3) do
    row[j] = t:get(b, pos, j)
    mx = math.max(mx, row[j])
  end
  local sum = 0
  for j = 1, #row do sum = sum + math.exp(row[j] - mx) end
  local lse = mx + math.log(sum)
  return function(id) return row[id + 1] - lse end
end

describe("rl.model.new", function()
  it("builds each architecture with the asked configuration", function()
    for _, arch in ipairs { "llama", "qwen2", "qwen3" } do
      local m = tiny { arch = arch, kv_heads = 1 }
      local c = m:config()
      assert.are.equal(arch, c.arch)
      assert.are.equal(264, c.vocab)
      assert.are.equal(32, c.dim)
      assert.are.equal(1, c.kv_heads)
      assert.are.equal(16, c.head_dim)
      assert.are.equal(arch == "qwen2", c.qkv_bias)
      assert.are.equal(arch == "qwen3", c.qk_norm)
      assert.are.equal(arch == "llama", c.tie)
      assert.truthy(tostring(m):find("model(" .. arch, 1, true))
    end
  end)

  it("is reproducible from its seed", function()
    local a, b, c = tiny { seed = 5 }, tiny { seed = 5 }, tiny { seed = 6 }
    local name = "model.layers.0.self_attn.q_proj.weight"
    assert.is_true(a:parameters()[name]:allclose(b:parameters()[name], 0, 0))
    assert.is_false(a:parameters()[name]:allclose(c:parameters()[name], 0, 0))
  end)

  it("refuses bad configurations naming the field", function()
    H.assert_error(function() rl.model.new { arch = "gpt2" } end, { "arch" })
    H.assert_error(function() tiny { heads = 3 } end, { "heads (3) must divide dim (32)" })
    H.assert_error(function() tiny { kv_heads = 3 } end, { "kv_heads (3) must divide heads (2)" })
    H.assert_error(function() tiny { dim = -4 } end, { "dim", "positive" })
    H.assert_error(function() tiny { tie = 1 } end, { "tie", "boolean" })
    H.assert_error(function() rl.model.new "x" end, { "bad argument #1 to 'new'" })
  end)
end)

describe("scoring", function()
  local m = tiny { arch = "qwen2", kv_heads = 1 }
  local seqs = { { 1, 5, 9, 200, 3 }, { 7, 7, 2 } }

  it("logprobs equal the log-softmax of the logits at each next token", function()
    local logp, ent = m:logprobs { tokens = seqs, entropy = true }
    assert.are.equal(4, #logp[1])
    assert.are.equal(2, #logp[2])
    for b, s in ipairs(seqs) do
      local z = m:logits { s }
      for t = 1, #s - 1 do
        local lsm = log_softmax_row(z, 1, t)
        assert.is_true(math.abs(logp[b][t] - lsm(s[t + 1])) < 1e-5)
        assert.is_true(ent[b][t] > 0 and ent[b][t] <= math.log(264) + 1e-4)
      end
    end
  end)

  it("logits have shape (batch, steps, vocab) and refuse ragged input", function()
    local z = m:logits { { 1, 2, 3 }, { 4, 5, 6 } }
    assert.are.same({ 2, 3, 264 }, z:shape())
    H.assert_error(function() m:logits(seqs) end, { "equal length" })
  end)

  it("refuses bad token batches", function()
    H.assert_error(function() m:logprobs { tokens = { { 1, 264 } } } end, { "tokens[1][2]", "0..263" })
    H.assert_error(function() m:logprobs { tokens = { {} } } end, { "tokens[1]", "length 0" })
    H.assert_error(function() m:logprobs { tokens = { "x" } } end, { "tokens[1]", "table" })
    local long = {}
    for i = 1, 40 do long[i] = 1 end
    H.assert_error(function() m:logprobs { tokens = { long } } end, { "context" })
  end)
end)

describe("generation", function()
  local m = tiny { seed = 3 }
  local prompts = { { USER, 104, 105, END, ASSISTANT }, { USER, 121, END, ASSISTANT } }

  it("is deterministic for a seed and independent of the other sequences", function()
    local a = m:generate { prompts = prompts, max_new_tokens = 8, seed = 11 }
    local b = m:generate { prompts = prompts, max_new_tokens = 8, seed = 11 }
    assert.are.same(a.tokens, b.tokens)
    -- the second prompt alone, with the seed it had as sequence 2 (seed + 1)
    local alone = m:generate { prompts = { prompts[2] }, max_new_tokens = 8, seed = 12 }
    assert.are.same(a.tokens[2], alone.tokens[1])
    local c = m:generate { prompts = prompts, max_new_tokens = 8, seed = 99 }
    assert.are_not.same(a.tokens, c.tokens)
  end)

  it("wraps seed + i - 1 around the integer limits (seed = math.maxinteger)", function()
    local a = m:generate { prompts = prompts, max_new_tokens = 8, seed = math.maxinteger }
    local first = m:generate { prompts = { prompts[1] }, max_new_tokens = 8, seed = math.maxinteger }
    local second = m:generate { prompts = { prompts[2] }, max_new_tokens = 8, seed = math.mininteger }
    assert.are.same(first.tokens[1], a.tokens[1])
    assert.are.same(second.tokens[1], a.tokens[2])
    local other = m:generate { prompts = { prompts[2] }, max_new_tokens = 8, seed = math.maxinteger - 1 }
    assert.are_not.same(other.tokens[1], a.tokens[2])
  end)

  it("takes max_new_tokens beyond the context: sequences stop where the context ends", function()
    local long = {}
    for i = 1, 30 do long[i] = 100 + i end -- the tiny model's context is 32
    local g = m:generate { prompts = { long, prompts[2] }, max_new_tokens = 1000000, seed = 1,
      temperature = 1 }
    assert.are.equal(3, #g.tokens[1]) -- 30 + 2 appended, the third sampled after them
    assert.are.equal("length", g.stop[1])
    assert.are.equal(29, #g.tokens[2])
  end)

  it("records behaviour log-probabilities that a fresh scoring pass reproduces", function()
    local g = m:generate { prompts = prompts, max_new_tokens = 6, seed = 4, temperature = 1 }
    for b = 1, #prompts do
      local seq = { table.unpack(prompts[b]) }
      for _, t in ipairs(g.tokens[b]) do seq[#seq + 1] = t end
      local logp = m:logprobs { tokens = { seq } }[1]
      for k, lp in ipairs(g.logprobs[b]) do
        assert.is_true(math.abs(lp - logp[#prompts[b] - 1 + k]) < 1e-4)
      end
    end
  end)

  it("decodes from a bfloat16 copy with m:decode_bf16, close to float32 scoring, refreshed by m:step", function()
    local b = tiny { seed = 5 }
    assert.is_false(b:decode_bf16())
    local f32 = b:generate { prompts = prompts, max_new_tokens = 6, seed = 4, temperature = 1 }
    assert.is_true(b:decode_bf16(true))
    assert.is_true(b:decode_bf16())
    local bf = b:generate { prompts = prompts, max_new_tokens = 6, seed = 4, temperature = 1 }
    local worst, differs = 0, false
    for i = 1, #prompts do
      local seq = { table.unpack(prompts[i]) }
      for _, t in ipairs(bf.tokens[i]) do seq[#seq + 1] = t end
      local logp = b:logprobs { tokens = { seq } }[1] -- scoring stays float32
      for k, lp in ipairs(bf.logprobs[i]) do
        worst = math.max(worst, math.abs(lp - logp[#prompts[i] - 1 + k]))
        differs = differs or lp ~= f32.logprobs[i][k]
      end
    end
    assert.is_true(differs)      -- the copy is what decoding read
    assert.is_true(worst < 0.1)  -- and it is the same model, rounded
    -- a step moves the weights; the copy follows (decoding equals a fresh copy of the new weights)
    b:accumulate { tokens = { prompts[1] } }
    b:step { lr = 0.05 }
    local after = b:generate { prompts = prompts, max_new_tokens = 6, seed = 4, temperature = 1 }
    local fresh = b:clone()
    fresh:decode_bf16(true)
    assert.are.same(fresh:generate { prompts = prompts, max_new_tokens = 6, seed = 4, temperature = 1 }.logprobs,
      after.logprobs)
    assert.is_true(b:decode_bf16(false))
    assert.has_error(function() b:decode_bf16("yes") end)
    fresh:free()
    b:free()
  end)

  it("greedy decoding follows the argmax and stops on stop tokens", function()
    local g = m:generate { prompts = { prompts[1] }, max_new_tokens = 5, temperature = 0 }
    local first = g.tokens[1][1]
    local z = m:logits { prompts[1] }
    local _, idx = z:select(1, 1):select(1, #prompts[1]):max()
    assert.are.equal(idx - 1, first)
    local s = m:generate { prompts = { prompts[1] }, max_new_tokens = 5, temperature = 0,
      stop = { first } }
    assert.are.same({ first }, s.tokens[1])
    assert.are.equal("stop", s.stop[1])
    assert.are.equal("length", g.stop[1])
    assert.are.equal(5, #g.tokens[1])
  end)

  it("stops on a stop string spanning tokens, with the tokenizer to decode with", function()
    local tok = rl.tokenizer.bytes()
    local free = m:generate { prompts = { prompts[1] }, max_new_tokens = 12, temperature = 0 }
    local pieces = {}
    for k, t in ipairs(free.tokens[1]) do pieces[k] = tok:decode { t } end
    -- the last byte of token 3 and the first of token 4: the string spans two tokens
    local stop = pieces[3]:sub(-1) .. pieces[4]:sub(1, 1)
    local first -- the first token after which the generated text contains the stop string
    for k = 1, #pieces do
      if table.concat(pieces, "", 1, k):find(stop, 1, true) then first = k break end
    end
    local s = m:generate { prompts = { prompts[1] }, max_new_tokens = 12, temperature = 0,
      stop_strings = { "never-generated", stop }, tokenizer = tok }
    assert.is_true(first <= 4)
    assert.are.equal(first, #s.tokens[1])
    assert.are.equal("stop", s.stop[1])
    H.assert_error(function() m:generate { prompts = prompts, stop_strings = { "x" } } end,
      { "tokenizer" })
    H.assert_error(function() m:generate { prompts = prompts, stop_strings = { "" }, tokenizer = tok } end,
      { "stop_strings" })
  end)

  it("refuses bad options", function()
    H.assert_error(function() m:generate { prompts = prompts, max_new_tokens = 0 } end,
      { "max_new_tokens" })
    H.assert_error(function() m:generate { prompts = prompts, temperature = -1 } end,
      { "temperature" })
    H.assert_error(function() m:generate { prompts = prompts, stop = { 999 } } end, { "stop" })
    H.assert_error(function() m:generate { prompts = prompts, max_tokens = 4 } end,
      { "unknown field 'max_tokens'", "max_new_tokens" })
  end)
end)

describe("parameters", function()
  it("are views: writing one changes the model", function()
    local m = tiny()
    local before = m:logits { { 1, 2, 3 } }
    local p = m:parameters()
    p["model.norm.weight"]:fill(2)
    local after = m:logits { { 1, 2, 3 } }
    assert.is_false(before:allclose(after))
    assert.are.same({ 264, 32 }, p["model.embed_tokens.weight"]:shape())
    assert.is_nil(p["lm_head.weight"]) -- tied
  end)
end)

describe("save and load", function()
  it("round-trips weights exactly in f32 and closely in bf16", function()
    local m = tiny { arch = "qwen3", kv_heads = 1 }
    local dir = os.tmpname()
    os.remove(dir)
    assert.is_true(m:save(dir))
    local back = assert(rl.model.load(dir))
    assert.are.same(m:config(), back:config())
    local z1, z2 = m:logits { { 1, 2, 3, 4 } }, back:logits { { 1, 2, 3, 4 } }
    assert.are.equal(0, z1:max_abs_diff(z2))
    assert.is_true(m:save(dir, { dtype = "bf16" }))
    local half = assert(rl.model.load(dir))
    assert.is_true(half:logits { { 1, 2, 3, 4 } }:max_abs_diff(z1) < 0.1)
    H.run("rm -rf " .. H.shell_quote(dir))
  end)

  it("checkpoints restore weights and optimizer state exactly", function()
    local m = tiny { seed = 8 }
    local batch = { tokens = { { 1, 2, 3, 4, 5 } } }
    m:sft_step { tokens = batch.tokens, lr = 1e-2 }
    local path = os.tmpname()
    assert.is_true(m:save_checkpoint(path, 17))
    -- two more steps from the checkpoint, twice: the same weights both times
    local function two_more(model)
      model:sft_step { tokens = batch.tokens, lr = 1e-2 }
      model:sft_step { tokens = batch.tokens, lr = 1e-2 }
      return model:logits(batch.tokens)
    end
    local a = two_more(m)
    local other = tiny { seed = 99 }
    assert.are.equal(17, other:load_checkpoint(path))
    local b = two_more(other)
    assert.are.equal(0, a:max_abs_diff(b))
    local bad, err = tiny { dim = 16, heads = 2 }:load_checkpoint(path)
    assert.is_nil(bad)
    assert.truthy(err:find("config", 1, true) or err:find("dim", 1, true), err)
    os.remove(path)
  end)

  it("returns nil and a message for a missing directory", function()
    local m, err = rl.model.load("/nonexistent/model")
    assert.is_nil(m)
    assert.truthy(err:find("/nonexistent/model", 1, true))
  end)
end)

-- The toy task: "<user>abc<end><assistant>" -> "ABC<end>". Trained on random three-letter words,
-- checked on words held out of training.
local function example(word)
  local tokens, mask = { USER }, { 0 }
  for i = 1, #word do tokens[#tokens + 1], mask[#mask + 1] = word:byte(i), 0 end
  tokens[#tokens + 1], mask[#mask + 1] = END, 0
  tokens[#tokens + 1], mask[#mask + 1] = ASSISTANT, 0
  local up = word:upper()
  for i = 1, #up do tokens[#tokens + 1], mask[#mask + 1] = up:byte(i), 1 end
  tokens[#tokens + 1], mask[#mask + 1] = END, 1
  return { tokens = tokens, mask = mask }
end

local function words(n, seed)
  local out, state = {}, seed
  for i = 1, n do
    local w = ""
    for _ = 1, 3 do
      state = (state * 1103515245 + 12345) % 2147483648
      w = w .. string.char(97 + state % 26)
    end
    out[i] = w
  end
  return out
end

describe("rl.sft", function()
  it("learns the toy task and then answers words it never saw", function()
    local m = rl.model.new { vocab = 264, dim = 64, layers = 2, heads = 4, ffn = 128, ctx = 16,
      seed = 7 }
    local train, held_out = words(400, 1), words(20, 999)
    local data = {}
    for i, w in ipairs(train) do data[i] = example(w) end
    local function solved(list)
      local prompts = {}
      for i, w in ipairs(list) do
        local ex = example(w)
        prompts[i] = { table.unpack(ex.tokens, 1, 6) }
      end
      local g = m:generate { prompts = prompts, max_new_tokens = 4, temperature = 0, stop = { END } }
      local right = 0
      for i, w in ipairs(list) do
        local answer = ""
        for _, t in ipairs(g.tokens[i]) do
          if t < 256 then answer = answer .. string.char(t) end
        end
        if answer == w:upper() then right = right + 1 end
      end
      return right / #list
    end
    local before = solved(held_out)
    local stats = rl.sft { model = m, data = data, epochs = 6, batch_size = 16, lr = 3e-3,
      warmup = 10, schedule = "cosine", min_lr = 3e-4, seed = 1 }
    local after = solved(held_out)
    print(string.format("\n  toy SFT: loss %.3f -> %.3f over %d steps; held-out solved %.0f%% -> %.0f%%",
      stats.losses[1], stats.final_loss, stats.steps, 100 * before, 100 * after))
    assert.is_true(stats.final_loss < 0.25 * stats.losses[1])
    assert.is_true(before < 0.1)
    assert.is_true(after >= 0.8)
  end)

  it("sft_step lowers the loss on the batch it trains on", function()
    local m = tiny()
    local batch = { tokens = { example("cat").tokens, example("dog").tokens },
      mask = { example("cat").mask, example("dog").mask } }
    local first = m:sft_step { tokens = batch.tokens, mask = batch.mask, lr = 1e-2 }
    local last
    for _ = 1, 20 do last = m:sft_step { tokens = batch.tokens, mask = batch.mask, lr = 1e-2 } end
    assert.are.equal(8, first.tokens) -- 4 masked targets per example
    assert.is_true(last.loss < 0.5 * first.loss)
    assert.is_true(first.grad_norm > 0)
  end)

  it("sft_example masks exactly the assistant's turns", function()
    local tok = rl.tokenizer.bytes()
    local ex = rl.sft_example(tok, {
      { role = "user", content = "hi" },
      { role = "assistant", content = "yo" },
      { role = "user", content = "x" },
      { role = "assistant", content = "z" },
    })
    -- <user>h i<end><assistant>y o<end><user>x<end><assistant>z<end>
    local want = { USER, 104, 105, END, ASSISTANT, 121, 111, END, USER, 120, END, ASSISTANT, 122, END }
    assert.are.same(want, ex.tokens)
    assert.are.same({ 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1 }, ex.mask)
    H.assert_error(function() rl.sft_example(tok, {}) end, { "non-empty" })
  end)

  it("refuses bad data", function()
    local m = tiny()
    H.assert_error(function() rl.sft { model = m, data = {} } end, { "non-empty" })
    H.assert_error(function() rl.sft { model = m, data = { { tokens = { 1, 2 }, mask = { 1 } } } } end,
      { "data[1].mask" })
    H.assert_error(function() rl.sft { model = m, data = { example("abc") }, schedule = "step" } end,
      { "schedule" })
  end)
end)
