-- moonrl.sft: supervised fine-tuning on token sequences with loss masks, the first stage of
-- two-stage recipes.
--
--   local stats = rl.sft{
--     model = m,                 -- an rl.model
--     data = examples,           -- list of {tokens = {ids...}, mask = {0/1...}} (0-based ids;
--                                -- mask[t] = 1 when token t is to be predicted, e.g. assistant
--                                -- tokens; without a mask every token after the first counts)
--     epochs = 1, batch_size = 8, grad_accum = 1,
--     lr = 1e-3, schedule = "cosine" | "constant", warmup = 0, min_lr = 0,
--     weight_decay = 0, beta1 = 0.9, beta2 = 0.95, clip = 1.0,
--     seed = 0,                  -- order of the examples
--     log = function(step, record) end,  -- called after every optimizer step
--   }
-- returns {steps = n, losses = {...}, final_loss = x}.
local core = require "moonrl.core"

local M = {}

-- A small deterministic shuffle (xorshift64*), independent of math.random's global state.
local function shuffled(n, seed)
  local order = {}
  for i = 1, n do order[i] = i end
  local state = (seed or 0) * 2654435761 + 88172645463325252
  if state == 0 then state = 1 end
  local function next_int(bound)
    state = state ~ (state >> 12)
    state = state ~ (state << 25)
    state = state ~ (state >> 27)
    local x = (state * 2685821657736338717) >> 1 -- non-negative
    return x % bound + 1
  end
  for i = n, 2, -1 do
    local j = next_int(i)
    order[i], order[j] = order[j], order[i]
  end
  return order
end
M.shuffled = shuffled

local function check_examples(data)
  if type(data) ~= "table" or #data == 0 then
    error("rl.sft: data must be a non-empty list of {tokens=, mask=} examples", 3)
  end
  for i, ex in ipairs(data) do
    if type(ex) ~= "table" or type(ex.tokens) ~= "table" then
      error(string.format("rl.sft: data[%d] must be a table with a tokens list", i), 3)
    end
    if ex.mask ~= nil and (type(ex.mask) ~= "table" or #ex.mask ~= #ex.tokens) then
      error(string.format("rl.sft: data[%d].mask must match the length of its tokens (%d)", i,
        #ex.tokens), 3)
    end
  end
end

-- An SFT example from a conversation: the chat template's tokens, with mask 1 exactly on what the
-- assistant says (its content and the end marker that follows it), 0 on everything else.
--   rl.sft_example(tok, {{role = "user", content = "hi"}, {role = "assistant", content = "hello"}})
-- Templates render message by message, so the tokens of a prefix of the conversation are a prefix
-- of the tokens of the whole; each assistant turn is the difference between the conversation up
-- to it and the conversation before it with the generation prompt.
function M.example(tok, messages, opts)
  if type(messages) ~= "table" or #messages == 0 then
    error("rl.sft_example: messages must be a non-empty list of {role=, content=}", 2)
  end
  local template = opts and opts.template
  local tokens = tok:chat(messages, { template = template, add_generation_prompt = false })
  local mask = {}
  for i = 1, #tokens do mask[i] = 0 end
  for i, msg in ipairs(messages) do
    if msg.role == "assistant" then
      local before = { table.unpack(messages, 1, i - 1) }
      local start = #tok:chat(before, { template = template, add_generation_prompt = true })
      local stop = #tok:chat({ table.unpack(messages, 1, i) },
        { template = template, add_generation_prompt = false })
      for t = start + 1, stop do mask[t] = 1 end
    end
  end
  return { tokens = tokens, mask = mask }
end

function M.sft(opts)
  if type(opts) ~= "table" then error("rl.sft: options table expected", 2) end
  local m = opts.model
  if type(m) ~= "userdata" then error("rl.sft: model must be an rl.model", 2) end
  check_examples(opts.data)
  local data = opts.data
  local epochs = opts.epochs or 1
  local batch_size = opts.batch_size or 8
  local accum = opts.grad_accum or 1
  local total = math.ceil(#data / batch_size) * epochs // accum
  local kind = opts.schedule or "cosine"
  if kind ~= "cosine" and kind ~= "constant" then
    error("rl.sft: schedule must be \"cosine\" or \"constant\"", 2)
  end
  local optim = {
    weight_decay = opts.weight_decay or 0, beta1 = opts.beta1 or 0.9, beta2 = opts.beta2 or 0.95,
    eps = opts.eps or 1e-8, clip = opts.clip or 1.0,
  }
  local losses, step, micro = {}, 0, 0
  local pending_loss, pending_tokens = 0, 0
  for epoch = 1, epochs do
    local order = shuffled(#data, (opts.seed or 0) + epoch)
    for first = 1, #data, batch_size do
      local tokens, mask = {}, {}
      for k = first, math.min(first + batch_size - 1, #data) do
        local ex = data[order[k]]
        tokens[#tokens + 1] = ex.tokens
        local mk = ex.mask
        if mk == nil then
          mk = {}
          for t = 1, #ex.tokens do mk[t] = 1 end
        end
        mask[#mask + 1] = mk
      end
      local loss, count = m:accumulate { tokens = tokens, mask = mask, scale = 1 / accum }
      pending_loss = pending_loss + loss * count
      pending_tokens = pending_tokens + count
      micro = micro + 1
      if micro % accum == 0 then
        optim.lr = core.lr_at(kind, step, total, opts.warmup or 0, opts.lr or 1e-3,
          opts.min_lr or 0)
        local grad_norm = m:step(optim)
        step = step + 1
        local mean = pending_tokens > 0 and pending_loss / pending_tokens or 0
        losses[step] = mean
        if opts.log then
          opts.log(step, { epoch = epoch, loss = mean, lr = optim.lr, grad_norm = grad_norm,
            tokens = pending_tokens })
        end
        pending_loss, pending_tokens = 0, 0
      end
    end
  end
  return { steps = step, losses = losses, final_loss = losses[step] }
end

return M
