--[[ cb_before: admit a call to a dependency, or reject it (circuit breaker).

One atomic step for the whole fleet.
- CLOSED admits and writes nothing (the hot path: one HMGET).
- OPEN rejects until reset_ms have passed since it opened; the first caller
  after that turns it HALF_OPEN (a transition) and is its first probe.
- HALF_OPEN admits while fewer than probe_cap probes are in flight. When every
  slot is taken and the newest probe is older than probe_timeout_ms, all slots
  are freed (re-arm: the abandoned probes' late reports are then ignored) and
  the caller is admitted.
A transition bumps the generation, is appended to the events stream and is
returned, so the calling process fires its callbacks.

KEYS[1]  state hash      <ns>:cb:{<name>}
KEYS[2]  probes hash     <ns>:cb:{<name>}:probes    probe id -> admitted at (ms)
KEYS[3]  events stream   <ns>:cb:{<name>}:events
ARGV[1]  config, fields joined by "|" (one argument: fewer to encode per call):
         reset_ms          OPEN rejects for this long after opening (ms)
         probe_cap         probes in flight at most (probe_success_required)
         probe_timeout_ms  after this the newest probe is presumed abandoned (ms)
         ttl_ms            idle TTL of the breaker's keys (ms)
         events_maxlen     approximate cap of the events stream (entries)
         replica           id of the calling process (the rest of the argument)

Returns one of
  generation                           admitted while CLOSED (the hot path: a bare integer)
  {"ok", generation, probe_id ("" = not a probe), state ("C"|"H"), rearmed (0|1)
   [, transition]}
  {"open", generation, retry_after_ms}
  {"corrupt", key_index, detail}       KEYS[key_index] holds foreign data
transition = {from, to, at_ms, failures, requests, slow, reason, generation, stream_id}

State hash fields: st state (C|O|H), g generation, oa opened at ms, pn newest
probe admitted at ms, pid last probe id, ps probe successes, n f sl window
counts (results, failures, slow), ls last window score, tx TTLs refreshed at ms.
]]
local sk, pk, ek = KEYS[1], KEYS[2], KEYS[3]
local h = redis.pcall("HMGET", sk, "st", "g")
if h.err then return {"corrupt", 1, h.err} end
local st = h[1]
local g = tonumber(h[2] or 0)
if not g then return {"corrupt", 1, "field g is not a number"} end
if not st or st == "C" then return g end
if st ~= "O" and st ~= "H" then return {"corrupt", 1, "unknown breaker state " .. st} end
h = redis.call("HMGET", sk, "oa", "pn", "pid", "n")

local reset, cap, timeout, ttl, maxlen, replica =
  string.match(ARGV[1], "^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$")
reset, cap, timeout = tonumber(reset), tonumber(cap), tonumber(timeout)
local oa, pn, pid, n = tonumber(h[1] or 0), tonumber(h[2] or 0), tonumber(h[3] or 0),
  tonumber(h[4] or 0)
if not (oa and pn and pid and n) then
  return {"corrupt", 1, "a timestamp or counter field is not a number"}
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local snow = string.format("%d", now)

if st == "O" then
  if now - oa < reset then return {"open", g, oa + reset - now} end
  local kind = redis.call("TYPE", pk)["ok"]
  if kind ~= "none" and kind ~= "hash" then
    return {"corrupt", 2, "a " .. kind .. " where the probes hash belongs"}
  end
  g, pid = g + 1, pid + 1
  local id = redis.pcall("XADD", ek, "MAXLEN", "~", maxlen, "*",
    "time", snow, "from", "open", "to", "half_open", "reason", "reset_timeout",
    "failures", 0, "requests", n, "slow", 0, "failure_rate", "",
    "reset_timeout_ms", reset, "replica", replica, "generation", g)
  if type(id) == "table" then return {"corrupt", 3, id.err} end
  redis.call("PEXPIRE", ek, ttl)
  redis.call("DEL", pk)
  redis.call("HSET", pk, pid, snow)
  redis.call("PEXPIRE", pk, ttl)
  redis.call("HSET", sk, "st", "H", "g", g, "pn", snow, "pid", pid, "ps", 0)
  redis.call("PEXPIRE", sk, ttl)
  return {"ok", g, tostring(pid), "H", 0, {"O", "H", now, 0, n, 0, "reset_timeout", g, id}}
end

-- HALF_OPEN
local inflight = redis.pcall("HLEN", pk)
if type(inflight) == "table" then return {"corrupt", 2, inflight.err} end
local rearmed = 0
if inflight >= cap then
  if now - pn < timeout then return {"open", g, pn + timeout - now} end
  rearmed = 1
  redis.call("DEL", pk)
end
pid = pid + 1
redis.call("HSET", pk, pid, snow)
redis.call("PEXPIRE", pk, ttl)
redis.call("HSET", sk, "pn", snow, "pid", pid)
redis.call("PEXPIRE", sk, ttl)
return {"ok", g, tostring(pid), "H", rearmed}
