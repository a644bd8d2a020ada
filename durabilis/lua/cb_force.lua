--[[ cb_force: force a breaker OPEN or CLOSED (operator action).

"open": OPEN now, with the reset timer (re)started; probes in flight are
dropped. "close": CLOSED with everything reset (empty window, no probes, no
reporters). Either way the generation moves on, so permits handed out before
never count afterwards. A change of state is a transition: appended to the
events stream and returned. Forcing OPEN an already OPEN breaker only restarts
its timer (no transition).

KEYS[1]  state hash      <ns>:cb:{<name>}
KEYS[2]  window zset     <ns>:cb:{<name>}:window
KEYS[3]  probes hash     <ns>:cb:{<name>}:probes
KEYS[4]  events stream   <ns>:cb:{<name>}:events
KEYS[5]  reporters zset  <ns>:cb:{<name>}:reporters
ARGV[1]  mode            "open" | "close"
ARGV[2]  reset_ms        reset timeout (ms), written to the events stream
ARGV[3]  ttl_ms          idle TTL of the breaker's keys (ms)
ARGV[4]  events_maxlen   approximate cap of the events stream (entries)
ARGV[5]  replica         id of the calling process

Checks first (state fields, the type of every key), then ready(), then writes
(see durabilis/_scripts.py): foreign data returns before ready() and writes
nothing. The checks run under pcall and ready() outside it (a body of a fused
step cannot suspend across a pcall).

Returns one of
  {"ok", state, generation [, transition]}
  {"corrupt", key_index, detail}
transition = {from, to, at_ms, failures, requests, slow, reason, generation, stream_id}

@acks: replicas
]]
local sk, wk, pk, ek, rk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local mode = ARGV[1]
local ttl = ARGV[3]
local at = 1

local NAMES = {C = "closed", O = "open", H = "half_open"}

--@include lib/cb_fields.lua

-- Every check, no write: the stored state, or an error naming the key (at).
local function check()
  local h = redis.call("HMGET", sk, "st", "g", "n", "f", "sl")
  local st = state(h[1])
  local s = {st = st, g = int(h[2], "g"), n = int(h[3], "n"), fc = int(h[4], "f"),
             sc = int(h[5], "sl")}
  -- Type checks before any write, so foreign data never leaves a half-done step.
  local expected = {[2] = "zset", [3] = "hash", [4] = "stream", [5] = "zset"}
  for i = 2, 5 do
    at = i
    local kind = redis.call("TYPE", KEYS[i])["ok"]
    if kind ~= "none" and kind ~= expected[i] then
      error({corrupt = "a " .. kind .. " where a " .. expected[i] .. " belongs"})
    end
  end
  at = 0
  return s
end

local ok, s = pcall(check)
if not ok then
  local detail = type(s) == "table" and (s.corrupt or s.err) or tostring(s)
  if at > 0 then return {"corrupt", at, detail} end
  return redis.error_reply(detail)
end

ready()
local st, n, fc, sc = s.st, s.n, s.fc, s.sc
local to = mode == "open" and "O" or "C"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local g2 = s.g + 1
if st == "O" and to == "O" then g2 = s.g end
local tr = nil
if st ~= to then
  local id = redis.call("XADD", ek, "MAXLEN", "~", ARGV[4], "*",
    "time", string.format("%d", now), "from", NAMES[st], "to", NAMES[to],
    "reason", "forced", "failures", fc, "requests", n, "slow", sc,
    "failure_rate", "", "reset_timeout_ms", ARGV[2], "replica", ARGV[5],
    "generation", g2)
  redis.call("PEXPIRE", ek, ttl)
  tr = {st, to, now, fc, n, sc, "forced", g2, id}
end
redis.call("DEL", pk)
if to == "O" then
  redis.call("HSET", sk, "st", "O", "g", g2, "oa", string.format("%d", now), "ps", 0)
else
  redis.call("DEL", wk, rk)
  redis.call("HSET", sk, "st", "C", "g", g2, "ps", 0, "n", 0, "f", 0, "sl", 0)
end
redis.call("PEXPIRE", sk, ttl)
if tr then return {"ok", to, g2, tr} end
return {"ok", to, g2}
