--[[ console_sample: take one sample of the layer's counters for the web console's
charts, and return the newest samples of the capped history (the same on every
console replica).

The counters of the layer (layer_stats) are cumulative; the console draws rates
from the differences between samples. Samples live in one capped stream, so
every console replica shows the same history and the history costs a bounded
amount of memory: at most the fleet's largest ARGV[3] entries (each sample
carries the cap it was trimmed with, field "cap": the next one keeps the larger
of that and ARGV[3], so a replica with a small history_size never wipes the
history a larger one shows; a stored cap above 10000, the console's maximum
history_size, is ignored; to shrink the cap, delete the key), the key
expiring ARGV[4] ms after the last sample (never sooner than an earlier
sample set). A sample is added only when the newest one is at least
ARGV[2] ms old (many replicas and many page loads add at most one sample per
interval). Read-only for the durable call's hot path: nothing here is touched
by an operation; the console runs it when its overview page is loaded.

The DLQ backlog lives under another hash tag ({dlq}): the caller reads it first
(dlq_stats) and passes it in ARGV[1], so this script keeps to one slot.

KEYS[1]  in-flight sorted set        (<ns>:layer:{layer}:inflight), read
KEYS[2]  counters hash               (<ns>:layer:{layer}:stats), read
KEYS[3]  history stream              (<ns>:layer:{layer}:console-history), written
ARGV[1]  DLQ backlog                 pending records (integer >= 0; -1 = unknown)
ARGV[2]  min interval, ms            between two samples (integer >= 1)
ARGV[3]  max samples                 this replica keeps and returns (integer >= 2)
ARGV[4]  ttl, ms                     of the history key after the last sample

Returns {"ok", added (0|1), entries}: the newest ARGV[3] entries as XREVRANGE
returns them, NEWEST first (the caller reverses them), each {id, {field, value,
...}} with the fields t (server ms), started, succeeded, retries, parked,
in_flight, lease_ended, backlog, cap.
  or {"corrupt", key, detail} when KEYS[3] holds something else than a stream.

@acks: none   (a sample for the console's charts: one lost in a failover is
              harmless, and the console must keep working with a replica down)
]]
local backlog = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local kind = redis.call("TYPE", KEYS[3])["ok"]
if kind ~= "none" and kind ~= "stream" then
  return {"corrupt", KEYS[3], "a " .. kind .. ", not a stream"}
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local added = 0
local last = redis.call("XREVRANGE", KEYS[3], "+", "-", "COUNT", 1)
local last_ms = -1
local keep = cap
if last[1] then
  last_ms = tonumber(string.match(last[1][1], "^(%d+)")) or -1
  local f = last[1][2]
  for i = 1, #f - 1, 2 do
    if f[i] == "cap" then
      local stored = tonumber(f[i + 1])
      if stored and stored > keep and stored <= 10000 then keep = math.floor(stored) end
    end
  end
end
if last_ms < 0 or now - last_ms >= interval then
  local live = redis.call("ZCOUNT", KEYS[1], "(" .. now, "+inf")
  local ended = redis.call("ZCOUNT", KEYS[1], "-inf", now)
  local c = redis.call("HMGET", KEYS[2], "started", "succeeded", "retries", "parked")
  local left = redis.call("PTTL", KEYS[3])
  redis.call("XADD", KEYS[3], "MAXLEN", keep, "*",
    "t", now, "started", c[1] or 0, "succeeded", c[2] or 0, "retries", c[3] or 0,
    "parked", c[4] or 0, "in_flight", live, "lease_ended", ended, "backlog", backlog,
    "cap", keep)
  if left < ttl then redis.call("PEXPIRE", KEYS[3], ttl) end
  added = 1
end
return {"ok", added, redis.call("XREVRANGE", KEYS[3], "+", "-", "COUNT", cap)}
