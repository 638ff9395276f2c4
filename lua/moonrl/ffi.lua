-- moonrl/ffi.lua - moonrl for LuaJIT over FFI: `local rl = require "moonrl.ffi"` offers the
-- tensor API of `require "moonrl"` in Lua 5.4 (same functions, 1-based dims and indices, same
-- results and error messages) with rl.rng, rl.seed, rl.blas_info, rl.blas_threads, rl.lr_at,
-- rl.clock and rl.memory, and beside them the whole C API unwrapped: rl.C, the library declared
-- by the cdef of moonrl.h, and rl.engine to create things from. Raw calls are C: 0-based,
-- unchecked, and what the header says the caller owns is freed with ffi.gc or by hand;
-- rl.tensor.own(handle) turns a raw mrl_tensor * into a checked tensor. The model, tokenizer,
-- rollout, objective, sandbox and trainer modules of Lua 5.4 have no wrapper here.
--
-- Each function mirrors its C twin in engine/src/lua/lua_tensor.c or lua_module.c; read those for the
-- reasons behind a check. The C declarations are generated from moonrl.h at build time
-- (moonrl.ffi_cdef), and the library is checked at load to be the version they describe.
local ffi = require "ffi"
local generated = require "moonrl.ffi_cdef"

local floor, max, min = math.floor, math.max, math.min
local format, select, type, tonumber = string.format, select, type, tonumber

ffi.cdef(generated.cdef)

-- ---- the library and the engine ----------------------------------------------------------

-- MOONRL_LIB (a path) first; then the directory `make install` writes into ffi_cdef.lua; then
-- the dynamic linker's search path.
local function load_library()
  local names, errors = {}, {}
  local env = os.getenv("MOONRL_LIB")
  if env and env ~= "" then names[#names + 1] = env end
  if generated.libdir then names[#names + 1] = generated.libdir .. "/libmoonrl.so.0" end
  names[#names + 1] = "moonrl"
  for _, name in ipairs(names) do
    local ok, lib = pcall(ffi.load, name)
    if ok then return lib, name end
    errors[#errors + 1] = lib
  end
  error("moonrl.ffi: cannot load libmoonrl (set MOONRL_LIB to its path):\n  "
        .. table.concat(errors, "\n  "), 0)
end

-- `lib` is an upvalue of every function below, so the library stays loaded as long as they live.
local lib, lib_name = load_library()

-- The declarations describe one version of moonrl.h; calling another library through them would
-- pass wrong arguments without any error, so refuse to load instead.
local lib_version = ffi.string(lib.mrl_version())
if lib_version ~= generated.version then
  error(format("moonrl.ffi: %s is libmoonrl version %s, but moonrl/ffi_cdef.lua declares version "
               .. "%s: rebuild, or set MOONRL_LIB to the matching library", lib_name, lib_version,
               generated.version), 0)
end

local MAX_RANK = lib.MRL_MAX_RANK

-- One engine for this module's lifetime (tensors retain it, so freeing order does not matter).
local engine
do
  local slot = ffi.new("mrl_engine *[1]")
  if lib.mrl_engine_new(slot) ~= 0 then error("moonrl.ffi: cannot allocate an engine", 0) end
  engine = ffi.gc(slot[0], lib.mrl_engine_free)
end

-- ---- the tensor box ----------------------------------------------------------------------
-- ffi.metatype on the opaque `struct mrl_tensor` is accepted, but LuaJIT treats t[i] and t1 - t2
-- on a pointer to it as C pointer arithmetic and raises "size of C type is unknown" before any
-- metamethod runs. So a tensor is a one-field struct holding the handle (lua_tensor.c's box, in
-- FFI). Its __gc frees the handle; t:free() frees it at once and stores NULL ("closed"). A box
-- cannot carry an ffi.gc finalizer on the handle itself, since the handle is copied into it.
ffi.cdef [[ struct moonrl_ffi_tensor { mrl_tensor *handle; }; ]]

local Tensor -- the box ctype, set by ffi.metatype below

local function is_tensor(v) return ffi.istype(Tensor, v) end

local function new_slot() return ffi.new("mrl_tensor *[1]") end

-- A view shares storage that some tensor already reported to the collector.
local function view(handle) return Tensor(handle) end

-- A LuaJIT build without GC64 shifts a step size into a 32-bit byte count; a step of 4 GiB
-- already finishes a cycle.
local MAX_STEP_KB = 0x3fffff

-- A box for a tensor with new storage. Its memory is invisible to the collector (the box is a few
-- bytes), so report it the way charge_gc does in lua_tensor.c: garbage tensors are then collected
-- at the pace at which tensor memory grows.
local function fresh(handle)
  local t = Tensor(handle)
  local kb = floor(tonumber(lib.mrl_tensor_numel(handle)) * 4 / 1024)
  if kb >= 1 then collectgarbage("step", min(kb, MAX_STEP_KB)) end
  return t
end

-- ---- errors ------------------------------------------------------------------------------
-- Messages read as the Lua 5.4 binding's (luaL_argerror): "bad argument #N to 'name' (...)",
-- with N not counting self in t:method() calls, the name as the caller wrote it, and the
-- caller's position. The function the user called is the outermost frame of this file on the
-- stack (LuaJIT keeps a frame's call-site name through tail calls).

local SOURCE = debug.getinfo(1, "S").source

-- Returns the getinfo record of the entry frame and the level, as seen from our caller, of the
-- code that called it.
local function entry_frame()
  local level = 2 -- the caller of entry_frame
  while true do
    local info = debug.getinfo(level + 1, "S")
    if not info or info.source ~= SOURCE then break end
    level = level + 1
  end
  return debug.getinfo(level, "n"), level
end

local function argerror(narg, msg)
  local info, level = entry_frame()
  local name = info.name or "?"
  if info.namewhat == "metamethod" then name = name:gsub("^__", "") end
  if info.namewhat == "method" then
    narg = narg - 1
    if narg == 0 then error(format("calling '%s' on bad self (%s)", name, msg), level) end
  end
  error(format("bad argument #%d to '%s' (%s)", narg, name, msg), level)
end

-- luaL_error: the message at the caller's position.
local function raise(msg)
  local _, level = entry_frame()
  error(msg, level)
end

-- Raises the engine's last error for a failed call, on argument narg when narg > 0; the
-- "mrl_xxx: " prefix names a C function the Lua user did not call, so it goes.
local function check(status, narg)
  if status == 0 then return end
  local msg = ffi.string(lib.mrl_engine_last_error(engine))
  if msg == "" then msg = ffi.string(lib.mrl_strerror(status)) end
  local colon = msg:find(": ", 1, true)
  if msg:sub(1, 4) == "mrl_" and colon then msg = msg:sub(colon + 2) end
  lib.mrl_engine_clear_error(engine)
  if narg > 0 then argerror(narg, msg) end
  raise(msg)
end

-- ---- argument checks (luaL_check* of Lua 5.4) -----------------------------------------------

-- luaL_typeerror names a tensor by its metatable's __name.
local function typename(v)
  if is_tensor(v) then return "moonrl.tensor" end
  return type(v)
end

local function typeerror(narg, expected, v)
  argerror(narg, format("%s expected, got %s", expected, typename(v)))
end

-- luaL_typename, for messages that name a basic type: a tensor is a full userdata in Lua 5.4.
local function basic_type(v)
  if is_tensor(v) then return "userdata" end
  return type(v)
end

-- lua_tostring of a number without an integer value, as Lua 5.4 writes it: "%.14g", with ".0"
-- added where that reads as an integer, and C's "-nan" for a NaN with the sign bit set (LuaJIT's
-- tostring writes every NaN as "nan").
local nan_bits = ffi.new("union { double d; int64_t i; }")
local function float_string(v)
  if v ~= v then
    nan_bits.d = v
    return nan_bits.i < 0 and "-nan" or "nan"
  end
  local s = format("%.14g", v)
  if not s:find("[^-0-9]") then s = s .. ".0" end
  return s
end

-- lua_tointegerx: a number with an exact integer value, or a string that converts to one.
local function tointeger(v)
  if type(v) == "string" then v = tonumber(v) end
  if type(v) == "number" and v == floor(v) and v >= -2^63 and v < 2^63 then return v end
  return nil
end

-- The same, refusing numeric strings: shape entries must be numbers.
local function tointeger_strict(v)
  if type(v) == "number" then return tointeger(v) end
  return nil
end

local function check_integer(v, narg)
  local i = tointeger(v)
  if i then return i end
  if type(v) == "number" or (type(v) == "string" and tonumber(v)) then
    argerror(narg, "number has no integer representation")
  end
  typeerror(narg, "number", v)
end

local function opt_integer(v, narg, default)
  if v == nil then return default end
  return check_integer(v, narg)
end

local function check_number(v, narg)
  local n = type(v) == "number" and v or type(v) == "string" and tonumber(v)
  if not n then typeerror(narg, "number", v) end
  return n
end

local function opt_number(v, narg, default)
  if v == nil then return default end
  return check_number(v, narg)
end

local function check_table(v, narg)
  if type(v) ~= "table" then typeerror(narg, "table", v) end
end

-- An open tensor's handle; a closed tensor or anything else raises.
local function check_tensor(v, narg, name)
  if not is_tensor(v) then argerror(narg, format("%s: tensor expected, got %s", name, type(v))) end
  local handle = v.handle
  if handle == nil then argerror(narg, name .. ": tensor is closed") end
  return handle
end

-- The handle of an open tensor, or nil.
local function test_tensor(v)
  if is_tensor(v) and v.handle ~= nil then return v.handle end
  return nil
end

-- A 1-based (negative: from the end) dimension to a 0-based one.
local function check_dim(v, narg, rank, name)
  local d = check_integer(v, narg)
  if d >= 1 and d <= rank then return d - 1 end
  if d <= -1 and d >= -rank then return rank + d end
  argerror(narg, format("%s: %d is out of range for a rank-%d tensor (1..%d or -%d..-1)", name,
                        d, rank, rank, rank))
end

local function rank_of(handle) return lib.mrl_tensor_rank(handle) end

local function size_of(handle, d) return tonumber(lib.mrl_tensor_shape(handle)[d]) end

local function list_of(rank, values)
  local t = {}
  for i = 0, rank - 1 do t[i + 1] = tonumber(values[i]) end
  return t
end

-- Reads a shape given as a table {2, 3} (argument 1) or as integers (arguments 1..n).
local function check_shape(...)
  local shape, rank = ffi.new("int64_t[?]", MAX_RANK), nil
  local first = ...
  if type(first) == "table" then
    rank = #first
    if rank > MAX_RANK then argerror(1, format("shape: rank %d is above %d", rank, MAX_RANK)) end
    for i = 1, rank do
      local v = tointeger_strict(first[i])
      if not v or v < 0 then
        argerror(1, format("shape: entry %d must be a non-negative integer", i))
      end
      shape[i - 1] = v
    end
    return rank, shape
  end
  if first == nil then argerror(1, "shape: shape table expected, got no value") end
  rank = select("#", ...)
  if rank > MAX_RANK then argerror(1, format("shape: rank %d is above %d", rank, MAX_RANK)) end
  for i = 1, rank do
    local arg = select(i, ...)
    local v = tointeger_strict(arg)
    if not v or v < 0 then
      argerror(i, format("shape: non-negative integer expected, got %s", basic_type(arg)))
    end
    shape[i - 1] = v
  end
  return rank, shape
end

-- Reads rank 1-based indices (arguments first, first + 1, ...) into a 0-based index array.
local function check_index(handle, first, ...)
  local rank = rank_of(handle)
  local index = ffi.new("int64_t[?]", MAX_RANK)
  for i = 0, rank - 1 do
    local v, n = check_integer((select(i + 1, ...)), first + i), size_of(handle, i)
    if v < 1 or v > n then
      argerror(first + i, format("index %d is outside 1..%d of dimension %d", v, n, i + 1))
    end
    index[i] = v - 1
  end
  return index
end

-- ---- nested tables -----------------------------------------------------------------------

-- The shape of a nested table, from the lengths of its first elements. `name` names the
-- argument in messages ("data" or "index").
local function nested_shape(v, narg, name)
  local shape, rank = ffi.new("int64_t[?]", MAX_RANK), 0
  while type(v) == "table" do
    if rank == MAX_RANK then
      argerror(narg, format("%s: nested deeper than %d levels", name, MAX_RANK))
    end
    shape[rank] = #v
    rank = rank + 1
    v = v[1]
  end
  return rank, shape
end

-- Copies a nested table of the given shape into dst (a float or double array), row-major.
-- The path of the element being read ("[2][1]") is only built for a message.
local function nested_read(data, narg, name, rank, shape, dst)
  local pos, k = {}, 0
  local function path(depth)
    local parts = {}
    for d = 1, depth do parts[d] = "[" .. pos[d] .. "]" end
    return table.concat(parts)
  end
  local function walk(v, d)
    local n = tonumber(shape[d])
    if type(v) ~= "table" or #v ~= n then
      argerror(narg, format("%s: ragged nested table: element %s %s (expected %d entries)", name,
                            d == 0 and "(top)" or path(d),
                            type(v) == "table" and "has a different length" or "is not a table", n))
    end
    for i = 1, n do
      pos[d + 1] = i
      local e = v[i]
      if d + 1 < rank then
        walk(e, d + 1)
      elseif type(e) ~= "number" then
        argerror(narg, format("%s: element %s is %s, expected a number", name, path(d + 1),
                              basic_type(e)))
      else
        dst[k] = e
        k = k + 1
      end
    end
  end
  walk(data, 0)
end

-- Reads 1-based integer indices from a (nested) table or a tensor into a 0-based int64_t array.
-- Returns the array, its rank, shape and count.
local function read_indices(v, narg)
  if is_tensor(v) and v.handle == nil then argerror(narg, "index: tensor is closed") end
  local handle = test_tensor(v)
  local rank, shape
  if handle then
    rank, shape = rank_of(handle), ffi.new("int64_t[?]", MAX_RANK)
    ffi.copy(shape, lib.mrl_tensor_shape(handle), ffi.sizeof("int64_t") * rank)
  elseif type(v) == "table" then
    rank, shape = nested_shape(v, narg, "index")
  else
    argerror(narg, format("index: table or tensor of integers expected, got %s", basic_type(v)))
  end
  local n = 1
  for i = 0, rank - 1 do n = n * tonumber(shape[i]) end
  if n >= 2^61 then argerror(narg, "index: too many entries") end
  local values
  if handle then
    values = ffi.new("float[?]", max(n, 1))
    lib.mrl_tensor_read(handle, values, n)
  else
    values = ffi.new("double[?]", max(n, 1))
    nested_read(v, narg, "index", rank, shape, values)
  end
  local index = ffi.new("int64_t[?]", max(n, 1))
  for i = 0, n - 1 do
    local x = values[i]
    if not (x >= -9.2e18 and x <= 9.2e18) or x ~= floor(x) then
      argerror(narg, "index: entries must be integers")
    end
    index[i] = x - 1
  end
  return index, rank, shape, n
end

-- Raises unless each of the n 0-based indices is below size, naming the entry and its value
-- 1-based.
local function check_index_range(narg, index, n, size)
  for i = 0, n - 1 do
    local v = tonumber(index[i])
    if v < 0 or v >= size then
      argerror(narg, format("index: entry %d is %d, outside 1..%d", i + 1, v + 1, size))
    end
  end
end

local function nested_table(data, rank, shape, stride, d, offset)
  if d == rank then return data[offset] end
  local t, step = {}, tonumber(stride[d])
  for i = 0, tonumber(shape[d]) - 1 do
    t[i + 1] = nested_table(data, rank, shape, stride, d + 1, offset + i * step)
  end
  return t
end

-- ---- constructors ------------------------------------------------------------------------

local tensor = {}

-- A new zero-filled tensor of the shape in the arguments.
local function new_tensor(...)
  local rank, shape = check_shape(...)
  local slot = new_slot()
  check(lib.mrl_tensor_new(engine, rank, shape, slot), 1)
  return fresh(slot[0])
end

function tensor.zeros(...) return new_tensor(...) end

function tensor.ones(...)
  local t = new_tensor(...)
  lib.mrl_tensor_fill(t.handle, 1)
  return t
end

function tensor.full(shape, value)
  check_table(shape, 1)
  local v = check_number(value, 2)
  local t = new_tensor(shape)
  lib.mrl_tensor_fill(t.handle, v)
  return t
end

-- (uint64_t)n as C casts it: through int64_t, since LuaJIT saturates a negative number converted
-- to uint64_t.
local function as_u64(n) return ffi.cast("int64_t", n) end

-- rl.tensor.randn(shape [, seed]) / rand(shape [, seed]): without a seed, the engine's RNG. A
-- seed draws from a fresh RNG, freed right after.
local function random_constructor(draw)
  return function(shape, seed)
    check_table(shape, 1)
    local s = seed ~= nil and check_integer(seed, 2)
    local t = new_tensor(shape)
    if not s then
      draw(t.handle, nil, 0, 1)
      return t
    end
    local slot = ffi.new("mrl_rng *[1]")
    check(lib.mrl_rng_new(engine, as_u64(s), slot), 2)
    draw(t.handle, slot[0], 0, 1)
    lib.mrl_rng_free(slot[0])
    return t
  end
end

tensor.randn = random_constructor(lib.mrl_tensor_rand_normal)
tensor.rand = random_constructor(lib.mrl_tensor_rand_uniform)

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

-- rl.tensor.arange(stop) or arange(start, stop [, step]): start, start+step, ... below stop.
function tensor.arange(a, b, c)
  local start, stop, step = 0, nil, 1
  if b == nil then
    stop = check_number(a, 1)
  else
    start, stop, step = check_number(a, 1), check_number(b, 2), opt_number(c, 3, 1)
  end
  local stop_arg = b == nil and 1 or 2 -- arange(stop) takes stop as argument 1
  if step == 0 or not finite(step) then argerror(3, "step: must be finite and non-zero") end
  if not finite(start) then argerror(1, "start: must be finite") end
  if not finite(stop) then argerror(stop_arg, "stop: must be finite") end
  local count = math.ceil((stop - start) / step)
  if count < 0 then count = 0 end
  if count > 1e15 then argerror(stop_arg, "stop: too many elements") end
  local slot = new_slot()
  check(lib.mrl_tensor_new(engine, 1, ffi.new("int64_t[1]", count), slot), 1)
  local t = fresh(slot[0])
  lib.mrl_tensor_arange(t.handle, start, step)
  return t
end

-- rl.tensor.from(nested_table or number)
function tensor.from(data)
  local slot = new_slot()
  if type(data) == "number" then
    check(lib.mrl_tensor_scalar(engine, data, slot), 1)
    return fresh(slot[0])
  end
  if type(data) ~= "table" then
    argerror(1, format("data: nested table of numbers expected, got %s", basic_type(data)))
  end
  local rank, shape = nested_shape(data, 1, "data")
  check(lib.mrl_tensor_new(engine, rank, shape, slot), 1)
  local t = fresh(slot[0])
  nested_read(data, 1, "data", rank, shape, lib.mrl_tensor_data(t.handle))
  return t
end

function tensor.is_tensor(v) return is_tensor(v) end

-- rl.tensor.own(handle) -> a tensor owning handle, an mrl_tensor * that a raw rl.C call returned
-- for the caller to free: it is freed with the tensor (t.handle lends it to raw calls again).
function tensor.own(handle)
  if type(handle) ~= "cdata" or not ffi.istype("mrl_tensor *", handle) then
    typeerror(1, "mrl_tensor *", handle)
  end
  if handle == nil then argerror(1, "NULL mrl_tensor *") end
  return fresh(handle)
end

-- ---- tensor methods: queries ---------------------------------------------------------------

local methods = {}

function methods.totable(self)
  local h = check_tensor(self, 1, "self")
  return nested_table(lib.mrl_tensor_data(h), rank_of(h), lib.mrl_tensor_shape(h),
                      lib.mrl_tensor_strides(h), 0, 0)
end

function methods.shape(self)
  local h = check_tensor(self, 1, "self")
  return list_of(rank_of(h), lib.mrl_tensor_shape(h))
end

function methods.stride(self)
  local h = check_tensor(self, 1, "self")
  return list_of(rank_of(h), lib.mrl_tensor_strides(h))
end

function methods.size(self, dim)
  local h = check_tensor(self, 1, "self")
  if dim == nil then return list_of(rank_of(h), lib.mrl_tensor_shape(h)) end
  return size_of(h, check_dim(dim, 2, rank_of(h), "dim"))
end

function methods.dim(self) return rank_of(check_tensor(self, 1, "self")) end

function methods.numel(self)
  return tonumber(lib.mrl_tensor_numel(check_tensor(self, 1, "self")))
end

function methods.is_contiguous(self)
  return lib.mrl_tensor_is_contiguous(check_tensor(self, 1, "self")) ~= 0
end

function methods.get(self, ...)
  local h = check_tensor(self, 1, "self")
  local rank, n = rank_of(h), select("#", ...)
  if n ~= rank then
    raise(format("get: expected %d indices for a rank-%d tensor, got %d", rank, rank, n))
  end
  local value = ffi.new("float[1]")
  lib.mrl_tensor_get(h, check_index(h, 2, ...), value)
  return value[0]
end

function methods.set(self, ...)
  local h = check_tensor(self, 1, "self")
  local rank, n = rank_of(h), select("#", ...) + 1 -- n counts self, as lua_gettop does
  if n - 2 ~= rank then
    raise(format("set: expected %d indices and a value for a rank-%d tensor, got %d arguments",
                 rank, rank, n - 1))
  end
  local index = check_index(h, 2, ...)
  lib.mrl_tensor_set(h, index, check_number((select(n - 1, ...)), n))
  return self
end

-- ---- views -------------------------------------------------------------------------------

function methods.narrow(self, dim, start, length)
  local h = check_tensor(self, 1, "self")
  local d = check_dim(dim, 2, rank_of(h), "dim")
  local s, len = check_integer(start, 3), check_integer(length, 4)
  local n = size_of(h, d)
  if s < 1 or s > n + 1 or len < 0 or len > n - (s - 1) then
    argerror(3, format("start %d, length %d do not fit dimension %d of size %d", s, len, d + 1, n))
  end
  local slot = new_slot()
  check(lib.mrl_tensor_narrow(h, d, s - 1, len, slot), 3)
  return view(slot[0])
end

-- t:slice(dim, i [, j [, step]]): entries i..j inclusive like string.sub (negatives count from
-- the end, j defaults to -1).
function methods.slice(self, dim, first, last, step)
  local h = check_tensor(self, 1, "self")
  local d = check_dim(dim, 2, rank_of(h), "dim")
  local n = size_of(h, d)
  local i, j = check_integer(first, 3), opt_integer(last, 4, -1)
  local by = opt_integer(step, 5, 1)
  if by <= 0 then argerror(5, "step: must be positive") end
  if i < 0 then i = i + n + 1 end
  if j < 0 then j = j + n + 1 end
  if i < 1 then i = 1 end
  if j > n then j = n end
  local start = i - 1
  local stop = j >= i and j or start
  if start > n then start, stop = n, n end
  local slot = new_slot()
  check(lib.mrl_tensor_slice(h, d, start, stop, by, slot), 3)
  return view(slot[0])
end

function methods.select(self, dim, index)
  local h = check_tensor(self, 1, "self")
  local d = check_dim(dim, 2, rank_of(h), "dim")
  local i, n = check_integer(index, 3), size_of(h, d)
  if i < 1 and (i < -n or i == 0) or i > n then
    argerror(3, format("index %d is outside 1..%d", i, n))
  end
  local slot = new_slot()
  check(lib.mrl_tensor_select(h, d, i > 0 and i - 1 or i, slot), 3)
  return view(slot[0])
end

function methods.transpose(self, dim1, dim2)
  local h = check_tensor(self, 1, "self")
  local rank = rank_of(h)
  if rank < 2 and dim1 == nil then argerror(1, "self: transpose needs a tensor of rank >= 2") end
  local d0 = dim1 == nil and rank - 2 or check_dim(dim1, 2, rank, "dim1")
  local d1 = dim2 == nil and rank - 1 or check_dim(dim2, 3, rank, "dim2")
  local slot = new_slot()
  check(lib.mrl_tensor_transpose(h, d0, d1, slot), 2)
  return view(slot[0])
end

-- t:permute(2, 1) or t:permute({2, 1}). A bad entry of the table, or a dimension it names twice,
-- is reported as argument 2 (the table); in the vararg form, as the argument at fault.
function methods.permute(self, ...)
  local h = check_tensor(self, 1, "self")
  local rank, perm = rank_of(h), ffi.new("int[?]", MAX_RANK)
  local list = ...
  local from_table = type(list) == "table"
  local n = from_table and #list or select("#", ...)
  if n ~= rank then argerror(2, format("perm: expected %d dimensions, got %d", rank, n)) end
  local seen = {}
  for i = 1, n do
    local d, narg
    if from_table then
      local v = tointeger(list[i])
      narg = 2
      if not v or v == 0 or v < -rank or v > rank then
        argerror(2, format("perm: entry %d must be a dim in 1..%d or -%d..-1", i, rank, rank))
      end
      d = v > 0 and v - 1 or rank + v
    else
      narg = i + 1
      d = check_dim((select(i, ...)), narg, rank, "perm entry")
    end
    if seen[d] then argerror(narg, format("perm: dimension %d is named twice", d + 1)) end
    seen[d] = true
    perm[i - 1] = d
  end
  local slot = new_slot()
  check(lib.mrl_tensor_permute(h, perm, slot), 2)
  return view(slot[0])
end

-- A view when self is contiguous, otherwise a copy (reported to the collector).
local function view_or_fresh(h, handle)
  if lib.mrl_tensor_shares_storage(h, handle) ~= 0 then return view(handle) end
  return fresh(handle)
end

function methods.reshape(self, ...)
  local h = check_tensor(self, 1, "self")
  local shape, rank = ffi.new("int64_t[?]", MAX_RANK), nil
  local list = ...
  if type(list) == "table" then
    rank = #list
    if rank > MAX_RANK then argerror(2, "shape: rank above 8") end
    for i = 1, rank do
      local v = tointeger_strict(list[i])
      if not v then argerror(2, "shape: entries must be integers (-1 to infer one)") end
      shape[i - 1] = v
    end
  else
    rank = select("#", ...)
    if rank > MAX_RANK then argerror(2, "shape: rank above 8") end
    for i = 1, rank do shape[i - 1] = check_integer((select(i, ...)), i + 1) end
  end
  local slot = new_slot()
  check(lib.mrl_tensor_reshape(h, rank, shape, slot), 2)
  return view_or_fresh(h, slot[0])
end

function methods.contiguous(self)
  local h = check_tensor(self, 1, "self")
  local slot = new_slot()
  check(lib.mrl_tensor_contiguous(h, slot), 0)
  return view_or_fresh(h, slot[0])
end

function methods.clone(self)
  local h = check_tensor(self, 1, "self")
  local slot = new_slot()
  check(lib.mrl_tensor_clone(h, slot), 0)
  return fresh(slot[0])
end

-- ---- in-place fills ----------------------------------------------------------------------

function methods.copy(self, src)
  local h = check_tensor(self, 1, "self")
  check(lib.mrl_tensor_copy(h, check_tensor(src, 2, "src")), 2)
  return self
end

function methods.fill(self, value)
  local h = check_tensor(self, 1, "self")
  lib.mrl_tensor_fill(h, check_number(value, 2))
  return self
end

-- ---- elementwise -------------------------------------------------------------------------

-- The slot an operation writes through: the `out` tensor when given, else empty for a new one.
local function result_slot(out, narg)
  local slot = new_slot()
  if out ~= nil then slot[0] = check_tensor(out, narg, "out") end
  return slot
end

local function check_operand(v, narg, name)
  if type(v) ~= "number" and test_tensor(v) == nil then
    argerror(narg, format("%s: tensor or number expected, got %s", name,
                          is_tensor(v) and "a closed tensor" or type(v)))
  end
end

-- A number operand becomes a rank-0 tensor that broadcasts. It is freed right after the
-- operation; ffi.gc frees it if something raises first.
local function operand_handle(v, narg)
  if type(v) ~= "number" then return v.handle end
  local slot = new_slot()
  check(lib.mrl_tensor_scalar(engine, v, slot), narg)
  return ffi.gc(slot[0], lib.mrl_tensor_free)
end

local function release_operand(v, handle)
  if type(v) == "number" then lib.mrl_tensor_free(ffi.gc(handle, nil)) end
end

-- When an operation with an `out` fails although its operands fit each other, what is left to
-- blame is `out`. The C binding asks the engine's internal shape functions (mrl__broadcast_shape,
-- mrl__matmul_shape) whether the operands fit; libmoonrl does not export them, so the tests are
-- repeated here. Matching the engine's "out has shape" message instead would tie the blame to
-- that wording, and miss any other failure of a call whose operands fit.

-- Whether the first na dims of a and the first nb dims of b broadcast, aligned at their ends
-- (a missing dim counts as 1, which fits anything).
local function dims_broadcast(ha, na, hb, nb)
  for i = 1, min(na, nb) do
    local x, y = size_of(ha, na - i), size_of(hb, nb - i)
    if x ~= y and x ~= 1 and y ~= 1 then return false end
  end
  return true
end

local INT_MAX = 2^31 - 1

-- mrl__matmul_shape's checks: ranks >= 2, equal inner dims (after the transposes), matrix dims
-- that BLAS takes, batch dims that broadcast.
local function matmul_fits(ha, hb, trans_a, trans_b)
  local ra, rb = rank_of(ha), rank_of(hb)
  if ra < 2 or rb < 2 then return false end
  local rows = size_of(ha, trans_a and ra - 1 or ra - 2)
  local inner_a = size_of(ha, trans_a and ra - 2 or ra - 1)
  local inner_b = size_of(hb, trans_b and rb - 1 or rb - 2)
  local cols = size_of(hb, trans_b and rb - 2 or rb - 1)
  if inner_a ~= inner_b or max(rows, cols, inner_a) > INT_MAX then return false end
  return dims_broadcast(ha, ra - 2, hb, rb - 2)
end

-- t:op(other [, out]) and the metamethods: either operand may be a number.
local function binary(op)
  return function(a, b, out)
    check_operand(a, 1, "self")
    local ha = operand_handle(a, 1)
    check_operand(b, 2, "other")
    local hb = operand_handle(b, 2)
    local slot = result_slot(out, 3)
    local status = op(slot, ha, hb)
    local blame = 2
    if status ~= 0 and out ~= nil and dims_broadcast(ha, rank_of(ha), hb, rank_of(hb)) then
      blame = 3
    end
    release_operand(a, ha)
    release_operand(b, hb)
    check(status, blame)
    return out or fresh(slot[0])
  end
end

-- t:op([out])
local function unary(op)
  return function(self, out)
    local h = check_tensor(self, 1, "self")
    local slot = result_slot(out, 2)
    check(op(slot, h), 2)
    return out or fresh(slot[0])
  end
end

methods.add = binary(lib.mrl_tensor_add)
methods.sub = binary(lib.mrl_tensor_sub)
methods.mul = binary(lib.mrl_tensor_mul)
methods.div = binary(lib.mrl_tensor_div)
methods.neg = unary(lib.mrl_tensor_neg)
methods.exp = unary(lib.mrl_tensor_exp)
methods.log = unary(lib.mrl_tensor_log)
methods.tanh = unary(lib.mrl_tensor_tanh)
methods.silu = unary(lib.mrl_tensor_silu)
methods.softmax = unary(lib.mrl_tensor_softmax)
methods.log_softmax = unary(lib.mrl_tensor_log_softmax)

function methods.scale(self, alpha, out)
  local h = check_tensor(self, 1, "self")
  local a = check_number(alpha, 2)
  local slot = result_slot(out, 3)
  check(lib.mrl_tensor_scale(slot, h, a), 3)
  return out or fresh(slot[0])
end

-- `-t` arrives as __unm(t, t): the second operand is not an `out`.
local function mm_unm(self)
  local h = check_tensor(self, 1, "self")
  local slot = new_slot()
  check(lib.mrl_tensor_neg(slot, h), 2)
  return fresh(slot[0])
end

-- ---- reductions --------------------------------------------------------------------------

-- t:sum() -> number; t:sum(dim [, keepdim]) -> tensor. Same for mean.
local function reduction(op, op_all)
  return function(self, dim, keepdim)
    local h = check_tensor(self, 1, "self")
    if dim == nil then
      local v = ffi.new("double[1]")
      op_all(h, v)
      return v[0]
    end
    local d = check_dim(dim, 2, rank_of(h), "dim")
    local slot = new_slot()
    check(op(slot, h, d, keepdim and 1 or 0), 2)
    return fresh(slot[0])
  end
end

methods.sum = reduction(lib.mrl_tensor_sum, lib.mrl_tensor_sum_all)
methods.mean = reduction(lib.mrl_tensor_mean, lib.mrl_tensor_mean_all)

-- argmax writes 0-based indices as floats (exact below 2^24, which the engine checks).
local function to_one_based(t)
  local h = t.handle
  local p = lib.mrl_tensor_data(h)
  for i = 0, tonumber(lib.mrl_tensor_numel(h)) - 1 do p[i] = p[i] + 1 end
  return t
end

local function argmax_tensor(h, d, keep)
  local slot = new_slot()
  check(lib.mrl_tensor_argmax(slot, h, d, keep), 1)
  return to_one_based(fresh(slot[0]))
end

-- t:max() -> value, flat index; t:max(dim [, keepdim]) -> values, indices (1-based).
function methods.max(self, dim, keepdim)
  local h = check_tensor(self, 1, "self")
  if dim == nil then
    local value, index = ffi.new("float[1]"), ffi.new("int64_t[1]")
    check(lib.mrl_tensor_max_all(h, value, index), 1)
    return value[0], tonumber(index[0]) + 1
  end
  local d = check_dim(dim, 2, rank_of(h), "dim")
  local keep = keepdim and 1 or 0
  local slot = new_slot()
  check(lib.mrl_tensor_max(slot, h, d, keep), 1)
  local values = fresh(slot[0])
  return values, argmax_tensor(h, d, keep)
end

function methods.argmax(self, dim, keepdim)
  local h = check_tensor(self, 1, "self")
  if dim == nil then
    local index = ffi.new("int64_t[1]")
    check(lib.mrl_tensor_max_all(h, nil, index), 1)
    return tonumber(index[0]) + 1
  end
  return argmax_tensor(h, check_dim(dim, 2, rank_of(h), "dim"), keepdim and 1 or 0)
end

-- ---- matmul, gather, index_select ----------------------------------------------------------

-- a:matmul(b [, {trans_a=, trans_b=, out=}]) and rl.tensor.matmul(a, b [, opts])
function methods.matmul(self, other, opts)
  local ha = check_tensor(self, 1, "self")
  local hb = check_tensor(other, 2, "other")
  local trans_a, trans_b, out = false, false, nil
  if opts ~= nil then
    check_table(opts, 3)
    trans_a, trans_b = opts.trans_a and true or false, opts.trans_b and true or false
    if opts.out ~= nil then
      out = opts.out
      if test_tensor(out) == nil then argerror(3, "opts.out: open tensor expected") end
    end
  end
  local flags = (trans_a and lib.MRL_TRANS_A or 0) + (trans_b and lib.MRL_TRANS_B or 0)
  local slot = new_slot()
  if out then slot[0] = out.handle end
  local status = lib.mrl_tensor_matmul(slot, ha, hb, flags)
  local blame = 2
  if status ~= 0 and out and matmul_fits(ha, hb, trans_a, trans_b) then blame = 3 end
  check(status, blame)
  return out or fresh(slot[0])
end
tensor.matmul = methods.matmul

function methods.index_select(self, dim, index)
  local h = check_tensor(self, 1, "self")
  local d = check_dim(dim, 2, rank_of(h), "dim")
  local idx, rank, _, n = read_indices(index, 3)
  if rank ~= 1 then argerror(3, "index: a flat list of indices expected") end
  check_index_range(3, idx, n, size_of(h, d))
  local slot = new_slot()
  check(lib.mrl_tensor_index_select(slot, h, d, idx, n), 3)
  return fresh(slot[0])
end

function methods.gather(self, dim, index)
  local h = check_tensor(self, 1, "self")
  local rank = rank_of(h)
  local d = check_dim(dim, 2, rank, "dim")
  local idx, index_rank, shape, n = read_indices(index, 3)
  if index_rank ~= rank then
    argerror(3, format("index: rank %d expected (same as self), got %d", rank, index_rank))
  end
  for i = 0, rank - 1 do
    local size, own = tonumber(shape[i]), size_of(h, i)
    if i ~= d and size > own then
      argerror(3, format("index: size %d of dimension %d is larger than self's %d", size, i + 1,
                         own))
    end
  end
  check_index_range(3, idx, n, size_of(h, d))
  local slot = new_slot()
  check(lib.mrl_tensor_gather(slot, h, d, idx, shape), 3)
  return fresh(slot[0])
end

-- ---- comparisons -------------------------------------------------------------------------

function methods.allclose(self, other, rtol, atol)
  local ha = check_tensor(self, 1, "self")
  local hb = check_tensor(other, 2, "other")
  local result = ffi.new("int[1]")
  check(lib.mrl_tensor_allclose(ha, hb, opt_number(rtol, 3, 1e-5), opt_number(atol, 4, 1e-8),
                                result), 3)
  return result[0] ~= 0
end

function methods.max_abs_diff(self, other)
  local ha = check_tensor(self, 1, "self")
  local hb = check_tensor(other, 2, "other")
  local d = ffi.new("double[1]")
  check(lib.mrl_tensor_max_abs_diff(ha, hb, d), 2)
  return d[0]
end

-- ---- lifetime and metamethods ------------------------------------------------------------

local function check_box(v)
  if not is_tensor(v) then typeerror(1, "moonrl.tensor", v) end
  return v
end

-- Frees the tensor now (its storage goes with its last view); later uses raise.
function methods.free(self)
  check_box(self)
  lib.mrl_tensor_free(self.handle)
  self.handle = nil
end

function methods.is_closed(self) return check_box(self).handle == nil end

methods.t = methods.transpose

local function mm_tostring(self)
  local h = check_box(self).handle
  if h == nil then return "tensor(closed)" end
  local len = ffi.new("size_t[1]")
  lib.mrl_tensor_format(h, nil, 0, len)
  local n = tonumber(len[0])
  local buf = ffi.new("char[?]", n + 1)
  lib.mrl_tensor_format(h, buf, n + 1, nil)
  return ffi.string(buf, n)
end

local function mm_len(self)
  local h = check_tensor(self, 1, "self")
  if rank_of(h) == 0 then raise("a scalar tensor has no length (use t:numel())") end
  return size_of(h, 0)
end

-- t[i]: a number for rank 1, a view of row i otherwise; t.name: a method.
local function mm_index(self, key)
  if type(key) ~= "number" then return methods[key] end
  local h = check_tensor(self, 1, "self")
  local rank = rank_of(h)
  if rank == 0 then raise("cannot index a scalar tensor (use t:get())") end
  local i, n = tointeger(key), size_of(h, 0)
  if not i then raise(format("index %s is not an integer", float_string(key))) end
  if i < 1 or i > n then raise(format("index %d is outside 1..%d", i, n)) end
  if rank == 1 then
    return lib.mrl_tensor_data(h)[(i - 1) * tonumber(lib.mrl_tensor_strides(h)[0])]
  end
  local slot = new_slot()
  check(lib.mrl_tensor_select(h, 0, i - 1, slot), 0)
  return view(slot[0])
end

-- t[i] = v: sets an entry of a rank-1 tensor, or fills / copies into row i.
local function mm_newindex(self, key, value)
  local h = check_tensor(self, 1, "self")
  if type(key) ~= "number" then
    raise(format("tensor fields cannot be assigned (key of type %s)", basic_type(key)))
  end
  local i = tointeger(key)
  if not i then raise(format("index %s is not an integer", float_string(key))) end
  if rank_of(h) == 0 then raise("cannot index a scalar tensor (use t:set())") end
  local n = size_of(h, 0)
  if i < 1 or i > n then raise(format("index %d is outside 1..%d", i, n)) end
  local src = test_tensor(value)
  if not src and type(value) ~= "number" then
    raise(format("assigned value must be a number or a tensor, got %s", basic_type(value)))
  end
  local slot = new_slot()
  check(lib.mrl_tensor_select(h, 0, i - 1, slot), 0)
  local row, status = slot[0], nil
  if src then
    status = lib.mrl_tensor_copy(row, src)
  else
    status = lib.mrl_tensor_fill(row, value)
  end
  lib.mrl_tensor_free(row)
  check(status, 3)
end

Tensor = ffi.metatype("struct moonrl_ffi_tensor", {
  __index = mm_index,
  __newindex = mm_newindex,
  __add = methods.add,
  __sub = methods.sub,
  __mul = methods.mul,
  __div = methods.div,
  __unm = mm_unm,
  __len = mm_len,
  __tostring = mm_tostring,
  __gc = function(self) lib.mrl_tensor_free(self.handle) end,
})

-- ---- the module --------------------------------------------------------------------------

local rl = {
  version = lib_version, -- engine version string, e.g. "0.1.0"
  tensor = tensor,       -- constructors: zeros, ones, full, randn, rand, arange, from, matmul
  -- the whole C API (mrl_model_*, mrl_tokenizer_*, ...; not mrl_script_*) as raw C calls, with
  -- the module's engine to create things from; a tensor's mrl_tensor * is t.handle
  C = lib,
  engine = engine,
}

-- rl.blas_info() -> {core=, threads=, config=, source=, recommended=}
function rl.blas_info()
  local core, config, source = ffi.new("const char *[1]"), ffi.new("const char *[1]"),
                               ffi.new("const char *[1]")
  local threads = ffi.new("int[1]")
  lib.mrl_blas_info(core, threads, config, source)
  local recommended = lib.mrl_blas_recommended_coretype()
  return {
    core = ffi.string(core[0]),
    threads = threads[0],
    config = ffi.string(config[0]),
    source = ffi.string(source[0]),
    recommended = recommended ~= nil and ffi.string(recommended) or nil,
  }
end

-- rl.blas_threads(n): sets OpenBLAS's thread count (process-wide).
function rl.blas_threads(n)
  local threads = check_integer(n, 1)
  if threads < 1 or threads > 1024 then argerror(1, "threads: expected 1..1024") end
  lib.mrl_blas_set_threads(threads)
end

-- rl.threads([n]) -> count: sets (with n; 0 means the cores the process may run on) and returns the number of
-- threads the engine computes on (attention, sampling). Results do not depend on it.
function rl.threads(n)
  if n ~= nil then
    local threads = check_integer(n, 1)
    if threads < 0 or threads > 1024 then
      argerror(1, "threads: expected 0..1024 (0: the cores the process may run on)")
    end
    lib.mrl_engine_set_threads(engine, threads)
  end
  return lib.mrl_engine_threads(engine)
end

-- rl.seed(n): reseeds the engine's default RNG (used by randn/rand without a seed).
function rl.seed(n)
  lib.mrl_rng_seed(lib.mrl_engine_rng(engine), as_u64(check_integer(n, 1)))
end

-- rl.rng([seed]) -> a seeded random stream of its own (the engine's generator, so the same seed
-- draws the same numbers as under Lua 5.4): r:random() in [0, 1), r:random(n) in 1..n,
-- r:random(m, n) in m..n (mrl_rng_int: uniform for any m <= n; bounds and results are LuaJIT
-- numbers, exact up to 2^53), r:normal().
local rng_methods = {}
rng_methods.__index = rng_methods
ffi.cdef [[ struct moonrl_ffi_rng { mrl_rng *handle; }; ]]
local rng_ct = ffi.metatype("struct moonrl_ffi_rng", rng_methods)
local draw, drawn = ffi.new("double[1]"), ffi.new("int64_t[1]")

function rl.rng(seed)
  local s = seed == nil and 0 or check_integer(seed, 1)
  local slot = ffi.new("mrl_rng *[1]")
  check(lib.mrl_rng_new(engine, as_u64(s), slot), 1)
  return ffi.gc(rng_ct(slot[0]), function(r) lib.mrl_rng_free(r.handle) end)
end

function rng_methods.random(r, ...)
  local args = select("#", ...)
  if args == 0 then
    lib.mrl_rng_uniform(r.handle, draw)
    return draw[0]
  end
  if args > 2 then argerror(4, "at most two bounds expected") end
  local m, n = ...
  local lo, hi = 1, check_integer(m, 2)
  if args == 2 then lo, hi = hi, check_integer(n, 3) end
  if lo > hi then argerror(args + 1, "interval is empty") end
  lib.mrl_rng_int(r.handle, as_u64(lo), as_u64(hi), drawn)
  return tonumber(drawn[0])
end

function rng_methods.normal(r)
  lib.mrl_rng_normal(r.handle, draw)
  return draw[0]
end

-- rl.clock() -> seconds on a monotonic clock, for timing.
function rl.clock() return lib.mrl_clock() end

-- rl.equal_words(a, b) -> how many of the 8-byte words of strings a and b are equal, position by
-- position; a and b of the same length, a multiple of 8 (as the Lua 5.4 binding's).
function rl.equal_words(a, b)
  if type(a) ~= "string" then typeerror(1, "string", a) end
  if type(b) ~= "string" then typeerror(2, "string", b) end
  if #a % 8 ~= 0 then argerror(1, "a length that is a multiple of 8 expected") end
  if #b ~= #a then argerror(2, "a string as long as the first expected") end
  local same = 0
  for i = 1, #a, 8 do
    if a:sub(i, i + 7) == b:sub(i, i + 7) then same = same + 1 end
  end
  return same
end

-- rl.lr_at(schedule, step, total, warmup, base [, min_lr]): the learning rate at a 0-based step
-- ("constant" or "cosine", linear warmup), from the engine's mrl_lr_at.
local LR_SCHEDULES = { constant = lib.MRL_LR_CONSTANT, cosine = lib.MRL_LR_COSINE }
function rl.lr_at(kind, step, total, warmup, base, min_lr)
  local k = type(kind) == "string" and LR_SCHEDULES[kind]
  if not k then
    if type(kind) == "string" then argerror(1, format("invalid option '%s'", kind)) end
    typeerror(1, "string", kind)
  end
  return lib.mrl_lr_at(k, check_integer(step, 2), check_integer(total, 3),
    check_integer(warmup, 4), check_number(base, 5), opt_number(min_lr, 6, 0.0))
end

-- rl.memory() -> {used=, peak=} bytes held by the engine (tensors and handles).
function rl.memory()
  return {
    used = tonumber(lib.mrl_engine_memory_used(engine)),
    peak = tonumber(lib.mrl_engine_memory_peak(engine)),
  }
end

-- rl.comm: the data-parallel communicator (mrl_comm), as in the Lua 5.4 module: rank(), size(),
-- backend(), backends(), allreduce(tensor) (in place; returns it) or allreduce({numbers}) (a new
-- list of sums), barrier(). One handle for this module's lifetime, made on first use.
local comm_handle
local function the_comm()
  if not comm_handle then
    local slot = ffi.new("mrl_comm *[1]")
    check(lib.mrl_comm_new(engine, slot), 0)
    comm_handle = ffi.gc(slot[0], lib.mrl_comm_free)
  end
  return comm_handle
end

rl.comm = {}
function rl.comm.rank() return lib.mrl_comm_rank(the_comm()) end
function rl.comm.size() return lib.mrl_comm_size(the_comm()) end
function rl.comm.backend() return ffi.string(lib.mrl_comm_backend(the_comm())) end
function rl.comm.backends() return ffi.string(lib.mrl_comm_backends()) end
function rl.comm.barrier() check(lib.mrl_comm_barrier(the_comm()), 0) end
function rl.comm.allreduce(x)
  local c = the_comm()
  if is_tensor(x) then
    if not x:is_contiguous() then argerror(1, "allreduce: a contiguous tensor expected") end
    check(lib.mrl_comm_allreduce_f32(c, lib.mrl_tensor_data(x.handle), x:numel()), 0)
    return x
  end
  if type(x) ~= "table" then argerror(1, "a tensor or a list of numbers expected") end
  local n = #x
  local v = ffi.new("double[?]", math.max(n, 1))
  for i = 1, n do
    if type(x[i]) ~= "number" then argerror(1, format("[%d]: a number expected", i)) end
    v[i - 1] = x[i]
  end
  check(lib.mrl_comm_allreduce_f64(c, v, n), 0)
  local out = {}
  for i = 1, n do out[i] = tonumber(v[i - 1]) end
  return out
end

return rl
