--[[ console_sample: take one sample of the layer's counters for the web console's
charts, and return the capped history (the same on every console replica).

The counters of the layer (layer_stats) are cumulative; the console draws rates
from the differences between samples. Samples live in one capped stream, so
every console replica shows the same history and the history costs a bounded
amount of memory: at most ARGV[3] entries, the key expiring ARGV[4] ms after
the last sample. A sample is added only when the newest one is at least
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
ARGV[3]  max samples                 kept (integer >= 2)
ARGV[4]  ttl, ms                     of the history key after the last sample

Returns {"ok", added (0|1), entries}: entries as XRANGE returns them, oldest
first, each {id, {field, value, ...}} with the fields t (server ms), started,
succeeded, retries, parked, in_flight, lease_ended, backlog.
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
if last[1] then
  last_ms = tonumber(string.match(last[1][1], "^(%d+)")) or -1
end
if last_ms < 0 or now - last_ms >= interval then
  local live = redis.call("ZCOUNT", KEYS[1], "(" .. now, "+inf")
  local ended = redis.call("ZCOUNT", KEYS[1], "-inf", now)
  local c = redis.call("HMGET", KEYS[2], "started", "succeeded", "retries", "parked")
  redis.call("XADD", KEYS[3], "MAXLEN", cap, "*",
    "t", now, "started", c[1] or 0, "succeeded", c[2] or 0, "retries", c[3] or 0,
    "parked", c[4] or 0, "in_flight", live, "lease_ended", ended, "backlog", backlog)
  redis.call("PEXPIRE", KEYS[3], ttl)
  added = 1
end
return {"ok", added, redis.call("XRANGE", KEYS[3], "-", "+", "COUNT", cap)}
