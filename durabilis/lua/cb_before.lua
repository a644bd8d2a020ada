--[[ cb_before: admit a call to a dependency, or reject it (circuit breaker).

One atomic step for the whole fleet.
- CLOSED admits and writes nothing (the hot path: one HMGET).
- OPEN rejects until reset_ms have passed since it opened; the first caller
  after that turns it HALF_OPEN (a transition) and is its first probe.
- HALF_OPEN: when at least one probe is in flight and the newest probe was
  admitted probe_timeout_ms or more ago, every slot is freed first (re-arm:
  the abandoned probes' late reports are then ignored), so a stale probe never
  holds a slot. Then the caller is admitted while fewer than probe_cap probes
  are in flight. A probe id already in flight (the caller's own, its first
  reply lost) is admitted again on its own slot, its admission time unchanged.
A transition bumps the generation, is appended to the events stream and is
returned, so the calling process fires its callbacks.
Checks first, then ready(), then writes: a rejection ("open") or foreign data
("corrupt") returns before ready() and writes nothing; every admission calls
ready(), the CLOSED hot path included (see durabilis/_scripts.py).

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
ARGV[2]  probe id chosen by the caller (optional; "" or absent = none): if the
         call is admitted as a probe, this is its id in the probes hash instead
         of the counter pid + 1 (no "|", at most 64 characters)

Returns one of
  generation                           admitted while CLOSED (the hot path: a bare integer)
  {"ok", generation, probe_id ("" = not a probe), state ("C"|"H"), rearmed (0|1)
   [, transition]}
  {"open", generation, retry_after_ms}
  {"corrupt", key_index, detail}       KEYS[key_index] holds foreign data
transition = {from, to, at_ms, failures, requests, slow, reason, generation, stream_id}

State hash fields: st state (C|O|H), g generation, oa opened at ms, pn newest
probe admitted at ms, pid last counter probe id, ps probe successes, n f sl
window counts (results, failures, slow), ls last window score, tx TTLs
refreshed at ms.

@acks: replicas
]]
local sk, pk, ek = KEYS[1], KEYS[2], KEYS[3]
local h = redis.pcall("HMGET", sk, "st", "g")
if h.err then return {"corrupt", 1, h.err} end
local st = h[1]
local g = tonumber(h[2] or 0)
if not g then return {"corrupt", 1, "field g is not a number"} end
if not st or st == "C" then
  ready()
  return g
end
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
local chosen = ARGV[2] or ""
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local snow = string.format("%d", now)

-- The id of a newly admitted probe: the caller's, else the next counter value.
local function next_id()
  if chosen ~= "" then return chosen end
  pid = pid + 1
  return tostring(pid)
end

if st == "O" then
  if now < oa then
    -- Opened "in the future": the server clock stepped back (a failover to a
    -- replica whose clock is behind, an NTP step). The reset timeout starts
    -- again from now: one more reset timeout, not the whole jump. (A refusal
    -- that writes: fused with a claim, the plan gives the claim back.)
    ready()
    redis.call("HSET", sk, "oa", snow)
    return {"open", g, reset}
  end
  if now - oa < reset then return {"open", g, oa + reset - now} end
  local kind = redis.call("TYPE", pk)["ok"]
  if kind ~= "none" and kind ~= "hash" then
    return {"corrupt", 2, "a " .. kind .. " where the probes hash belongs"}
  end
  kind = redis.call("TYPE", ek)["ok"]
  if kind ~= "none" and kind ~= "stream" then
    return {"corrupt", 3, "a " .. kind .. " where the events stream belongs"}
  end
  ready()
  g = g + 1
  local id = next_id()
  local sid = redis.call("XADD", ek, "MAXLEN", "~", maxlen, "*",
    "time", snow, "from", "open", "to", "half_open", "reason", "reset_timeout",
    "failures", 0, "requests", n, "slow", 0, "failure_rate", "",
    "reset_timeout_ms", reset, "replica", replica, "generation", g)
  redis.call("PEXPIRE", ek, ttl)
  redis.call("DEL", pk)
  redis.call("HSET", pk, id, snow)
  redis.call("PEXPIRE", pk, ttl)
  redis.call("HSET", sk, "st", "H", "g", g, "pn", snow, "pid", pid, "ps", 0)
  redis.call("PEXPIRE", sk, ttl)
  return {"ok", g, id, "H", 0, {"O", "H", now, 0, n, 0, "reset_timeout", g, sid}}
end

-- HALF_OPEN
local inflight = redis.pcall("HLEN", pk)
if type(inflight) == "table" then return {"corrupt", 2, inflight.err} end
local rearmed = 0
if inflight > 0 and now < pn then
  -- Probes admitted "in the future": the clock stepped back. They keep their
  -- slots, their admission times restamped to now, so a dead prober's slots
  -- are re-armed one probe timeout from now, not after the whole jump (and a
  -- live probe's report is still credited).
  ready()
  local all = redis.call("HGETALL", pk)
  for i = 1, #all, 2 do
    local at = tonumber(all[i + 1])
    if not at or at > now then redis.call("HSET", pk, all[i], snow) end
  end
  redis.call("HSET", sk, "pn", snow)
  pn = now
end
if inflight > 0 and now - pn >= timeout then
  -- The newest probe is presumed abandoned, and so is every older one: free
  -- every slot before deciding, so no stale probe is ever credited.
  rearmed = 1
elseif chosen ~= "" and inflight > 0 and redis.call("HEXISTS", pk, chosen) == 1 then
  -- Our own probe, asked for again (its first reply was lost): the same slot.
  ready()
  return {"ok", g, chosen, "H", 0}
elseif inflight >= cap then
  return {"open", g, pn + timeout - now}
end
ready()
if rearmed == 1 then redis.call("DEL", pk) end
local id = next_id()
redis.call("HSET", pk, id, snow)
redis.call("PEXPIRE", pk, ttl)
redis.call("HSET", sk, "pn", snow, "pid", pid)
redis.call("PEXPIRE", sk, ttl)
return {"ok", g, id, "H", rearmed}
