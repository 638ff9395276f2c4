-- shell_spec.lua - rl.shell: the simulated host cannot touch the real machine (simulated files
-- only, crafted command lines stay data, nothing written reaches the disk), the commands'
-- semantics (permissions, su, ssh keys, sudo rules, SUID and capability escapes, cron), output
-- width, determinism, clone independence and bad hosts.
local rl = require "moonrl"

-- A host with one of everything; bob (uid 1000) is logged in.
local function spec()
  return {
    user = "bob",
    users = { root = { uid = 0, password = "R00t!x" }, bob = { uid = 1000, password = "sunny7" },
      eve = { uid = 1001, password = "evepw", key = "KEY-eve-1" } },
    files = {
      ["/etc/passwd"] = { owner = "root", mode = "644", content = "root:x:0:0:sim" },
      ["/etc/shadow"] = { owner = "root", mode = "600", content = "root:$6$sim" },
      ["/usr/bin/vim"] = { owner = "root", mode = "755" },
      ["/usr/bin/less"] = { owner = "root", mode = "755" },
      ["/usr/bin/find"] = { owner = "root", mode = "4755" },
      ["/usr/bin/passwd"] = { owner = "root", mode = "4755" },
      ["/usr/bin/perl"] = { owner = "root", mode = "755" },
      ["/usr/bin/python3"] = { owner = "root", mode = "755" },
      ["/bin/bash"] = { owner = "root", mode = "755" },
      ["/opt/backup.sh"] = { owner = "root", mode = "777", content = "tar czf /b /home" },
      ["/opt/locked.sh"] = { owner = "root", mode = "755", content = "true" },
      ["/home/bob/notes"] = { owner = "bob", mode = "600", content = "todo" },
      ["/home/eve/id_rsa"] = { owner = "eve", mode = "644", content = "KEY-eve-1" },
      ["/root/flag"] = { owner = "root", mode = "600", content = "FLAG" },
    },
    dirs = { ["/root"] = { owner = "root", mode = "700" } },
    sudoers = { bob = { "/usr/bin/less", "/usr/bin/passwd" } },
    caps = { ["/usr/bin/perl"] = "cap_setuid+ep" },
    cron = { { user = "root", script = "/opt/backup.sh" } },
  }
end
local function shell(opts, s) return assert(rl.shell.new(s or spec(), opts or { width = 64 })) end

describe("rl.shell", function()
  it("answers from the simulated host, never the real one", function()
    local sh = shell()
    assert.are.equal("root:x:0:0:sim", sh:run("cat /etc/passwd"))
    local real = io.open("/etc/passwd"):read("a")
    assert.are_not.equal(real:sub(1, 14), sh:run("cat /etc/passwd"))
    assert.are.equal("cat: no such file", sh:run("cat /etc/hostname"))
    assert.are.equal("uid=1000(bob)", sh:run("id"))
  end)

  it("keeps crafted command lines as data: no io, os, require or bytecode load is reachable", function()
    local marker = os.tmpname()
    os.remove(marker)
    local sh = shell()
    local attacks = {
      'cat "); io.open("' .. marker .. '","w"):write("x") --',
      "cat ]]..io.open('" .. marker .. "','w'):write('x')..[[",
      'echo x>"..os.execute("touch ' .. marker .. '").."',
      "cat /etc/passwd\n; require('os').exit(1)",
      "cat \0" .. marker,
      "$(touch " .. marker .. ")",
      "`touch " .. marker .. "`",
      string.rep("A", 5000),
    }
    for _, a in ipairs(attacks) do
      local out = sh:run(a)
      assert.is_string(out)
      assert.is_nil(out:find("root shell", 1, true))
    end
    assert.is_nil(io.open(marker, "r"))
    assert.are.equal("sh: line too long", sh:run(string.rep("A", 5000)))
    -- the interpreter's own state has none of io, os, require, debug, string.dump, binary load
    for _, probe in ipairs { "return not pcall(function() return io.open end)",
      "return not pcall(function() return os.execute end)", "return not pcall(function() return require end)",
      "return not pcall(function() return debug.getinfo end)",
      "return string.dump == nil", "return (load(string.char(27) .. 'Lua', 'x', 'b')) == nil" } do
      local v = rl.sandbox.lua { code = rl.shell.SOURCE .. "\n" .. probe, budget = 1e6 }
      assert.are.equal("ok", v.status)
      assert.is_true(v.value)
    end
    -- a file whose content is Lua bytecode is shown, not run
    local s = spec()
    s.files["/tmp/evil"] = { owner = "bob", mode = "755", content = "\27LuaT\0" }
    local ev = shell(nil, s)
    assert.are.equal(" LuaT ", ev:run("cat /tmp/evil"))
    assert.are.equal("evil: no privileges", ev:run("/tmp/evil -p"))
  end)

  it("never writes the simulation's files to disk", function()
    local path = os.tmpname()
    os.remove(path)
    local sh = shell()
    assert.are.equal("ok", sh:run("echo pwned>/tmp/" .. path:match("[^/]+$")))
    assert.are.equal("echo: permission denied", sh:run("echo pwned>" .. path:match("^(.*)/") .. "/../etc/x"))
    assert.is_nil(io.open(path, "r"))
    assert.is_nil(io.open("/tmp/" .. path:match("[^/]+$"), "r"))
    assert.are.equal("pwned", sh:run("cat /tmp/" .. path:match("[^/]+$")))
  end)

  it("checks read and write permissions by owner and other bits; root passes", function()
    local sh = shell()
    assert.are.equal("cat: permission denied", sh:run("cat /etc/shadow"))
    assert.are.equal("todo", sh:run("cat /home/bob/notes"))
    assert.are.equal("ls: permission denied", sh:run("ls /root"))
    assert.are.equal("id_rsa", sh:run("ls /home/eve"))
    assert.are.equal("backup.sh locked.sh", sh:run("ls /opt"))
    assert.are.equal("echo: permission denied", sh:run("echo x>/opt/locked.sh"))
    assert.are.equal("ok", sh:run("echo hello>/opt/backup.sh"))
    assert.are.equal("hello", sh:run("cat /opt/backup.sh"))
    assert.are.equal("ls: no such dir", sh:run("ls /nowhere"))
    local s = spec()
    s.user = "root"
    local r = shell(nil, s)
    assert.are.equal("root:$6$sim", r:run("cat /etc/shadow"))
    assert.are.equal("flag", r:run("ls /root"))
  end)

  it("su and ssh switch users only with the right password or key", function()
    local sh = shell()
    assert.are.equal("su: auth failure", sh:run("su root sunny7"))
    assert.are.equal(1000, sh:uid())
    assert.are.equal("su: no such user", sh:run("su mallory x"))
    assert.are.equal("now eve", sh:run("ssh eve -i /home/eve/id_rsa"))
    assert.are.equal("uid=1001(eve)", sh:run("id"))
    assert.are.equal("ssh: denied", sh:run("ssh root -i /home/eve/id_rsa"))
    assert.are.equal("now root", sh:run("su root R00t!x"))
    assert.are.equal(0, sh:uid())
    assert.are.equal("uid=0(root)", sh:run("id"))
  end)

  it("sudo follows the rules: a shell-capable binary gives root, others only run", function()
    local sh = shell()
    assert.are.equal("(root) NOPASSWD: /usr/bin/less; (root) NOPASSWD: /usr/bin/passwd", sh:run("sudo -l"))
    assert.are.equal("sudo: not allowed", sh:run("sudo vim"))
    assert.are.equal("ran passwd", sh:run("sudo passwd"))
    assert.are.equal(1000, sh:uid())
    assert.are.equal("# root shell", sh:run("sudo /usr/bin/less"))
    assert.are.equal(0, sh:uid())
    local s = spec()
    s.sudoers = nil
    assert.are.equal("bob may not sudo", shell(nil, s):run("sudo -l"))
  end)

  it("the -p escape gives uid 0 for a SUID-root shell binary or an interpreter with cap_setuid", function()
    local sh = shell()
    assert.are.equal("/usr/bin/find /usr/bin/passwd", sh:run("find suid"))
    assert.are.equal("/usr/bin/perl cap_setuid+ep", sh:run("getcap"))
    assert.are.equal("vim: no privileges", sh:run("vim -p"))
    assert.are.equal("passwd: no privileges", sh:run("passwd -p")) -- SUID but not shell-capable
    assert.are.equal("python3: no privileges", sh:run("python3 -p")) -- no capability
    assert.are.equal("sh: ghost: not found", sh:run("ghost -p"))
    local c = sh:clone()
    assert.are.equal("# root shell", c:run("perl -p"))
    assert.are.equal(0, c:uid())
    assert.are.equal("# root shell", sh:run("/usr/bin/find -p"))
    assert.are.equal("uid=0(root)", sh:run("id"))
  end)

  it("wait runs root's cron jobs: a writable script that sets SUID on bash leads to root", function()
    local sh = shell()
    assert.are.equal("root /opt/backup.sh", sh:run("crontab"))
    assert.are.equal("bash: no privileges", sh:run("bash -p"))
    assert.are.equal("ok", sh:run("echo chmod u+s /bin/bash>/opt/backup.sh"))
    assert.are.equal("bash: no privileges", sh:run("bash -p")) -- not run yet
    assert.are.equal("time passes", sh:run("wait"))
    assert.are.equal("4755", sh:state().files["/bin/bash"].mode)
    assert.are.equal("# root shell", sh:run("bash -p"))
    assert.are.equal(0, sh:uid())
  end)

  it("cuts outputs at the width, blanks control characters, and flags unknown commands", function()
    local sh = shell { width = 24 }
    assert.are.equal("(root) NOPASSWD: /usr/bi", sh:run("sudo -l"))
    local out, known = sh:run("rm -rf /")
    assert.are.equal("sh: rm: not found", out)
    assert.is_false(known)
    out, known = sh:run("cat")
    assert.are.equal("cat: bad arguments", out)
    assert.is_false(known)
    assert.is_true(select(2, sh:run("id")))
    assert.are.equal(false, select(2, sh:run("   ")))
  end)

  it("is deterministic and runs the same in the sandbox and directly", function()
    local lines = { "id", "sudo -l", "find suid", "echo a>/tmp/a", "cat /tmp/a", "su root x", "wait", "find -p", "id" }
    local a, b, c = shell(), shell(), shell { width = 64, sandbox = false }
    for _, l in ipairs(lines) do
      local oa, ob, oc = a:run(l), b:run(l), c:run(l)
      assert.are.equal(oa, ob)
      assert.are.equal(oa, oc)
    end
    assert.are.equal(rl.shell.literal(a:state()), rl.shell.literal(b:state()))
    assert.are.equal(rl.shell.literal(a:state()), rl.shell.literal(c:state()))
  end)

  it("exec leaves its input host alone, and a clone forks the host", function()
    local h = assert(rl.shell.host(spec()))
    local before = rl.shell.literal(h)
    local h2, out = rl.shell.exec(h, "echo x>/tmp/z")
    assert.are.equal("ok", out)
    assert.are.equal(before, rl.shell.literal(h))
    assert.are.equal("x", h2.files["/tmp/z"].content)
    local sh = shell()
    local c = sh:clone()
    c:run("su root R00t!x")
    c:run("echo only-clone>/tmp/c")
    assert.are.equal(1000, sh:uid())
    assert.are.equal("cat: no such file", sh:run("cat /tmp/c"))
    sh:run("echo only-orig>/tmp/o")
    assert.are.equal("cat: no such file", c:run("cat /tmp/o"))
    assert.are.equal(0, c:uid())
  end)

  it("returns nil and a message for a bad host, and raises on misuse", function()
    local bad = {
      { function(s) s.user = "nobody" end, "user" },
      { function(s) s.users.bob.uid = -1 end, "users.bob.uid" },
      { function(s) s.users.bob.uid = 1.5 end, "users.bob.uid" },
      { function(s) s.files["/etc/passwd"].mode = "999" end, "mode" },
      { function(s) s.files["/etc/passwd"].owner = "ghost" end, "owner" },
      { function(s) s.files["relative"] = { owner = "root", mode = "644" } end, "absolute" },
      { function(s) s.files["/x"] = { owner = "root", mode = "644", run = print } end, "unknown field" },
      { function(s) s.sudoers.ghost = { "/usr/bin/vim" } end, "sudoers" },
      { function(s) s.caps["/nope"] = "cap_setuid+ep" end, "caps" },
      { function(s) s.cron[1].user = "ghost" end, "cron[1]" },
      { function(s) s.colour = "red" end, "unknown field" },
      { function(s) s.users.bob.shell = "/bin/sh" end, "unknown field" },
    }
    for i, case in ipairs(bad) do
      local s = spec()
      case[1](s)
      local sh, why = rl.shell.new(s)
      assert.is_nil(sh, "case " .. i)
      assert.truthy(why:find(case[2], 1, true), why)
    end
    assert.is_nil((rl.shell.host("x")))
    assert.has_error(function() shell():run(42) end, "shell:run: line: a string expected, got 42")
    assert.has_error(function() rl.shell.exec({}, nil) end, "rl.shell.exec: line: a string expected, got nil")
    assert.has_error(function() rl.shell.new(spec(), { widht = 3 }) end)
    -- a command that exhausts the sandbox's budget comes back as nil and a message
    local h, why = rl.shell.exec(assert(rl.shell.host(spec())), "id", { budget = 1000 })
    assert.is_nil(h)
    assert.truthy(why:find("budget", 1, true))
  end)
end)
