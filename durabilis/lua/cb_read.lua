--[[ cb_read: read a breaker's stored state and window (read-only).

Judged by the server clock. The counts are those of the window as the next
report would see it: results older than window_ms and beyond the newest
window_size are left out even if not yet evicted. Nothing is written: an OPEN
breaker past its reset timeout is still reported OPEN (the caller decides
from oa and now whether a probe would be admitted).

KEYS[1]  state hash      <ns>:cb:{<name>}
KEYS[2]  window zset     <ns>:cb:{<name>}:window
KEYS[3]  probes hash     <ns>:cb:{<name>}:probes
KEYS[4]  reporters zset  <ns>:cb:{<name>}:reporters
ARGV[1]  window_size     newest results kept
ARGV[2]  window_ms       results older than this are out of the window (ms), 0 = off

Returns one of
  {"info", state ("C"|"O"|"H"), generation, opened_at_ms (0 = never),
   newest_probe_ms, probe_successes, probes_in_flight, now_ms,
   requests, failures, slow, distinct_bad_reporters}
  {"corrupt", key_index, detail}

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local sk, wk, pk, rk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local at = 1

--@include lib/cb_fields.lua

local function main()
  local h = redis.call("HMGET", sk, "st", "g", "oa", "pn", "ps")
  local st = state(h[1])
  local g, oa, pn, ps = int(h[2], "g"), int(h[3], "oa"), int(h[4], "pn"), int(h[5], "ps")
  local t = redis.call("TIME")
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  at = 3
  local inflight = redis.call("HLEN", pk)
  at = 2
  local window_ms = tonumber(ARGV[2])
  local low = "-inf"
  if window_ms > 0 then low = string.format("%d", (now - window_ms) * 1000) end
  local members = redis.call("ZREVRANGEBYSCORE", wk, "+inf", low, "WITHSCORES",
    "LIMIT", 0, tonumber(ARGV[1]))
  local n, f, s = 0, 0, 0
  local oldest = nil
  for i = 1, #members, 2 do
    local c = string.sub(members[i], -1)
    n = n + 1
    if c == "f" then f = f + 1
    elseif c == "S" then s = s + 1
    elseif c == "F" then f = f + 1; s = s + 1
    elseif c ~= "s" then error({corrupt = "window member without a result flag"}) end
    oldest = members[i + 1]
  end
  at = 4
  local distinct = 0
  if oldest then distinct = redis.call("ZCOUNT", rk, oldest, "+inf") end
  return {"info", st, g, oa, pn, ps, inflight, now, n, f, s, distinct}
end

local ok, res = pcall(main)
if ok then return res end
local detail = type(res) == "table" and (res.corrupt or res.err) or tostring(res)
if at > 0 then return {"corrupt", at, detail} end
return redis.error_reply(detail)
