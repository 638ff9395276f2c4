-- moonrl.env: the environment protocol, and the step the rollout engine calls for Lua
-- environments.
--
-- An environment module is a table:
--   name        a string
--   new()       -> an instance with the methods below (one per episode)
--   tasks(split, n, seed) -> a list of n tasks ("train" and "test" must not overlap)
--   oracle(task) -> optional: a list of demonstration turns {action, action, ...} for SFT
--   system      optional system message
--   format      "line" (default) or "hermes": how actions are parsed (moonrl.parse)
--   tools       optional list of rl.tool objects the agent may call
-- and an instance has:
--   reset(task, rng) -> first observation (a string); rng is an rl.rng for the episode
--   step(action, parsed) -> observation, reward, done, info
--       action is the turn's text, parsed its moonrl.parse result (a malformed call arrives as
--       {kind = "error", message = ...}, never raised); info is an optional table, e.g.
--       {success = true}; observation may be nil when done. Fields the engine reads: success,
--       milestone (BEACON), error, tool_call = true (the turn was a tool call the environment
--       parsed itself: counted in the tool-call rate and rl.reward.budget's tool_calls), costs =
--       {currency = amount} (the turn's charges, rl.envkit's ledger:turn(): summed into ep.costs)
--   clone()     optional: an independent copy of the episode's state (tree rollouts)
--   state_key() optional: a string naming the current state (GiGPO step groups)
--   episode_info() optional: a table of per-episode facts (its persona, its planned noise),
--       asked once the episode has ended and logged with it as env_info (episodes.jsonl); an
--       error here is the episode's env_error
-- A call to one of the environment's tools is run by the engine when the instance does not
-- handle calls itself (handles_calls = true): the tool's text becomes the observation, with
-- reward 0, and the episode goes on.
local core = require "moonrl.core"
local parse = require "moonrl.parse"

local M = {}

local function check(cond, msg, level)
  if not cond then error(msg, level + 1) end
end

-- Checks an environment module's shape; returns it.
function M.check(module)
  check(type(module) == "table", "environment: a table expected", 2)
  check(type(module.name) == "string", "environment: name (a string) is missing", 2)
  check(type(module.new) == "function", "environment " .. module.name .. ": new() is missing", 2)
  check(type(module.tasks) == "function", "environment " .. module.name .. ": tasks() is missing", 2)
  check(module.format == nil or module.format == "line" or module.format == "hermes",
    "environment " .. module.name .. ": format must be \"line\" or \"hermes\"", 2)
  if module.tools then
    check(type(module.tools) == "table", "environment " .. module.name .. ": tools must be a list", 2)
    for i, t in ipairs(module.tools) do
      check(type(t) == "table" and type(t.name) == "string" and type(t.run) == "function",
        string.format("environment %s: tools[%d] is not an rl.tool", module.name, i), 2)
    end
  end
  return module
end

-- Runs a parsed call against a tool list: the observation text (nil when no tool has the name)
-- and whether the call failed: the tool raised, or its result table (what rl.tool.shell and
-- rl.tool.lua return second) says it did not end cleanly.
local function run_tool(tools, parsed)
  for _, t in ipairs(tools) do
    if t.name == parsed.name then
      local ok, text, res = pcall(t.run, parsed.args)
      if not ok then return "tool " .. t.name .. " failed: " .. tostring(text), true end
      local failed = type(res) == "table" and ((res.status ~= nil and res.status ~= "exited"
        and res.status ~= "ok") or (res.exit_code ~= nil and res.exit_code ~= 0))
      local cpu = type(res) == "table" and type(res.cpu_ms) == "number" and res.cpu_ms or nil
      return tostring(text), failed, cpu
    end
  end
  return nil
end

-- The step the rollout engine calls: parses the action, runs a tool call the instance does not
-- handle, or passes it to instance:step. `record` (a table) gets one entry per turn:
-- {action=, parsed=, observation=, reward=, done=, info=, state=, tool_error=, tool_cpu_ms=}
-- (state: the instance's state_key() before the step, when it has one; tool_error: true when the
-- engine ran a tool call that failed; tool_cpu_ms: the CPU time of a sandboxed tool the engine
-- ran, as the sandbox measured it). Returns observation, reward, done.
function M.step(module, instance, action, record)
  local parsed = parse.parse(action, module.format)
  local state = instance.state_key and instance:state_key() or nil
  local obs, reward, done, info, tool_error, tool_cpu_ms
  if parsed.kind == "call" and module.tools and not instance.handles_calls then
    obs, tool_error, tool_cpu_ms = run_tool(module.tools, parsed)
  end
  if obs then
    reward, done = 0, false
  else
    obs, reward, done, info = instance:step(action, parsed)
  end
  if reward ~= nil and type(reward) ~= "number" then
    error("step returned a reward that is not a number: " .. type(reward), 0)
  end
  if reward ~= nil and (reward ~= reward or reward == math.huge or reward == -math.huge) then
    error("step returned a reward that is not a finite number: " .. tostring(reward), 0)
  end
  if obs ~= nil and type(obs) ~= "string" then
    error("step returned an observation that is not a string: " .. type(obs), 0)
  end
  record[#record + 1] = { action = action, parsed = parsed, observation = obs,
    reward = reward or 0, done = done and true or false, info = info, state = state,
    tool_error = tool_error or nil, tool_cpu_ms = tool_cpu_ms }
  return obs, reward or 0, done and true or false
end

-- ro:run (C) steps Lua environments with M.step: registered here, so that the C module needs
-- no Lua module of its own.
core.rollout.set_step(M.step)

return M
