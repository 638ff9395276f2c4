-- moonrl.train.teacher: TT-OPD's teacher (shared/spec/advantage.md 6.12, the Healthcare AI GYM
-- paper): a second set of weights and a second context in the loss. The teacher is a copy of the
-- policy taken after the SFT warm start, never trained by gradient: after each update its
-- weights move by EMA toward the student's (rl.objective.ema on every parameter tensor). In each
-- update it scores the student's sampled tokens in a context that also holds privileged text
-- (the hidden answer, key findings), and the turn-level KL of student to teacher on those tokens
-- (rl.objective.turn_kl) is added to the policy loss: coef times
--   mean over episodes of  sum_k w_k KL_k / sum_k w_k,   KL_k = mean over turn k's sampled tokens
-- of the estimator (kl) of logp_student - logp_teacher.
--
--   rl.train{ ..., teacher = {
--     privileged = function(task, episode) return "hint dx=" .. case_of(task).disease end,
--     decay = 0.99,        -- EMA: teacher = decay teacher + (1 - decay) student, per update
--     coef = 1,            -- the KL term's weight in the loss
--     kl = "k1",           -- the estimator (rl.objective's KL names: k1, k2, k3, abs, ...)
--     weights = nil,       -- per-turn weights: a list (turn k weighs weights[k], later turns 1)
--                          -- or function(episode) -> such a list
--     truncate = nil,      -- n: only each turn's first n sampled tokens count
--   } }
--
-- The teacher's context: the privileged text goes into the system message (after the run's own
-- system message and a newline, or as a system message of its own when the run has none),
-- rendered with the chat template the rollout used; the episode's tokens after its system
-- message follow unchanged, so each teacher log-prob is of the very token the student sampled
-- (M.context). privileged returning nil leaves the episode's context as it is. Tokens that would
-- fall past the model's context in the teacher's longer sequence are left out of the KL.
-- Metrics: loss/teacher_kl (the KL, before coef), teacher/kl_turn_<k> (turn k's mean KL over the
-- update's episodes that have it). The checkpoint stage saves the teacher beside the model
-- (teacher-<step>.bin, named in state.json) and resume restores it bit-exactly.
local core = require "moonrl.core"

local M = {}

-- The teacher's system message: the run's (system, or nil) and the privileged text.
function M.system_text(system, text)
  if system then return system .. "\n" .. text end
  return text
end

-- The ids of a system message (nil: none) as the chat template renders it, without the
-- generation prompt (Llama 3's begin-of-text included).
local function render_system(tok, system)
  return tok:chat(system and { { role = "system", content = system } } or {})
end

-- M.context(tok, system, text, ids) -> teacher ids (a list), shift: the teacher's sequence for an
-- episode whose tokens are ids (a list) under the run's system message system (or nil), given the
-- privileged text (nil: ids as they are). Position p of ids (past the system message) is position
-- p + shift of the teacher's. Raises when ids do not start with the system message as the chat
-- template renders it.
function M.context(tok, system, text, ids)
  if text == nil or #ids == 0 then return ids, 0 end
  local head = render_system(tok, system)
  for i, id in ipairs(head) do
    if ids[i] ~= id then
      error("train: teacher: the episode does not start with the run's system message as the "
        .. "chat template renders it", 0)
    end
  end
  local out = render_system(tok, M.system_text(system, text))
  local shift = #out - #head
  table.move(ids, #head + 1, #ids, #out + 1, out)
  return out, shift
end

-- ---------------------------------------------------------------- lifetime and checkpoints

-- A fresh run's teacher: a copy of the policy as it is now (after the SFT warm start).
function M.init(ctx) ctx.teacher = ctx.model:clone() end

-- Saves the teacher's weights at the end of step (before state.json is written) and removes the
-- previous step's file.
function M.save(ctx, step)
  local name = string.format("teacher-%06d.bin", step)
  local ok, err = ctx.teacher:save_checkpoint(ctx.dir .. "/" .. name, step)
  if not ok then error("train: checkpoint: teacher: " .. err, 0) end
  local prev = ctx.state.teacher
  ctx.state.teacher = name
  if prev and prev ~= name then os.remove(ctx.dir .. "/" .. prev) end
end

-- Restores the teacher a resumed run saved (state: state.json's). A run resumed with
-- resume = "force" that had no teacher starts one from the resumed policy.
function M.load(ctx, state)
  if type(state.teacher) ~= "string" then
    if ctx.cfg.resume == "force" then return M.init(ctx) end
    error("train: resume: state.json names no teacher checkpoint (the run had no teacher)", 0)
  end
  local t = ctx.model:clone()
  local step, err = t:load_checkpoint(ctx.dir .. "/" .. state.teacher)
  if not step then error("train: resume: teacher: " .. err, 0) end
  if step ~= state.step then error("train: resume: the teacher's checkpoint and state.json disagree", 0) end
  ctx.teacher = t
end

-- ---------------------------------------------------------------- the update

local function zeros(n) return core.tensor.zeros(math.max(n, 1)):narrow(1, 1, n) end

-- The per-turn weights of episode ep.
local function weights_of(tc, ep)
  local w = tc.weights
  if type(w) == "function" then
    w = w(ep)
    if type(w) ~= "table" then
      error("train: teacher.weights: the function returned " .. type(w) .. ", not a list of numbers", 0)
    end
  end
  return w
end

-- M.prepare(ctx, batch) -> the update's teacher data: the teacher's log-probs of the batch's
-- sampled tokens laid out as batch.mask (logp), the mask of the tokens the KL counts (mask),
-- the per-episode turn weights, and the per-turn sums the metrics are made of.
function M.prepare(ctx, batch)
  local c, tc, tok = ctx.cfg, ctx.cfg.teacher, ctx.tokenizer
  local system = c.system or c.env.system
  local n = batch:size()
  local ids, mask = batch.tokens:totable(), batch.mask:totable()
  local limit = ctx.teacher:config().ctx
  local t_ids, t_mask, t_off, plan = {}, {}, { 0 }, {}
  for i, ep in ipairs(batch.episodes) do
    local a, b = batch.offsets[i], batch.offsets[i + 1]
    local own = table.move(ids, a + 1, b, 1, {})
    local text = tc.privileged(ep.task, ep)
    if text ~= nil and type(text) ~= "string" then
      error("train: teacher.privileged: a string (or nil) expected, got " .. type(text), 0)
    end
    local seq, shift = M.context(tok, system, text, own)
    local keep = math.min(#seq, limit) -- the teacher's tokens that fit its context
    for p = 1, keep do
      t_ids[#t_ids + 1] = seq[p]
      local q = p - shift -- the student's position of teacher position p
      t_mask[#t_mask + 1] = (q >= 1 and q <= #own) and mask[a + q] or 0
    end
    t_off[#t_off + 1] = #t_ids
    plan[i] = { a = a, len = b - a, shift = shift, fit = keep - shift } -- student tokens 1..fit scored
  end
  local total = #t_ids
  local tokens = total > 0 and core.tensor.from(t_ids) or zeros(0)
  local tmask = total > 0 and core.tensor.from(t_mask) or zeros(0)
  local logp = zeros(batch.offsets[n + 1])
  for s = 1, n, c.minibatch do
    local eps = {}
    for i = s, math.min(n, s + c.minibatch - 1) do eps[#eps + 1] = i end
    local tl = ctx.teacher:forward_batch { tokens = tokens, mask = tmask, offsets = t_off, episodes = eps }
    for _, i in ipairs(eps) do
      local p = plan[i]
      local from, count = math.max(1, 1 - p.shift), math.min(p.len, p.fit) -- student positions
      count = count - from + 1
      if count > 0 then
        logp:narrow(1, p.a + from, count):copy(tl:narrow(1, t_off[i] + from + p.shift, count))
      end
    end
  end
  -- the KL's tokens: the sampled ones the teacher scored, each turn's first `truncate` of them
  local km, turns = {}, batch.turns:totable()
  for i = 1, n do
    local p, seen = plan[i], {}
    for q = 1, p.len do
      local v = mask[p.a + q]
      if v ~= 0 and (q > p.fit or q + p.shift < 1) then v = 0 end
      if v ~= 0 and tc.truncate then
        local k = turns[p.a + q]
        seen[k] = (seen[k] or 0) + 1
        if seen[k] > tc.truncate then v = 0 end
      end
      km[p.a + q] = v
    end
  end
  local weights
  if tc.weights then
    weights = {}
    for i, ep in ipairs(batch.episodes) do weights[i] = weights_of(tc, ep) end
  end
  return { logp = logp, mask = #km > 0 and core.tensor.from(km) or zeros(0), weights = weights,
    sums = {}, counts = {} }
end

-- M.add_loss(ctx, t, batch, logp, eps, dlogp, stats): the KL term of minibatch eps (the
-- student's log-probs logp from forward_batch) added to dlogp (in place) and to stats (loss,
-- teacher_kl).
function M.add_loss(ctx, t, batch, logp, eps, dlogp, stats)
  local tc = ctx.cfg.teacher
  local w
  if t.weights then
    w = {}
    for j, i in ipairs(eps) do w[j] = t.weights[i] end
  end
  local st, d = core.objective.turn_kl { logp = logp, teacher_logp = t.logp, mask = t.mask,
    turns = batch.turns, offsets = batch.offsets, episodes = eps, kind = tc.kl, coef = tc.coef,
    turn_weights = w }
  dlogp:add(d, dlogp)
  stats.loss = stats.loss + st.loss
  stats.teacher_kl = st.kl
  for _, row in ipairs(st.per_turn) do
    for k, v in pairs(row) do
      t.sums[k] = (t.sums[k] or 0) + v
      t.counts[k] = (t.counts[k] or 0) + 1
    end
  end
end

-- M.finish(ctx, t): after the update's optimizer steps, the teacher's EMA step toward the student;
-- the turn metrics for the step (ctx.teacher_metrics).
function M.finish(ctx, t)
  local student = ctx.model:parameters()
  for name, w in pairs(ctx.teacher:parameters()) do
    core.objective.ema { teacher = w, student = student[name], decay = ctx.cfg.teacher.decay }
  end
  local mt = {}
  for k, s in pairs(t.sums) do mt["teacher/kl_turn_" .. k] = s / t.counts[k] end
  ctx.teacher_metrics = mt
end

return M
