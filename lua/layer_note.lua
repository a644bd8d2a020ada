--[[ layer_note: keep the layer's in-flight index and its counters.

The in-flight index lists the operations that hold a claim, scored by when
their lease ends, so that recover_orphans finds those whose worker died
without scanning every idempotency record. The counters are the fleet-wide
totals an operator (and the demo) reads back.

KEYS[1]  in-flight sorted set        (<ns>:layer:{layer}:inflight)
KEYS[2]  counters hash               (<ns>:layer:{layer}:stats)
ARGV[1]  mode                        "add" | "rem" | "none"
ARGV[2]  member                      the idempotency key ("" with mode none)
ARGV[3]  lease_ms                    with "add": the lease, counted from now
ARGV[4..] field, increment, ...      counters to add to

Returns 1.
]]
local mode = ARGV[1]
if mode == "add" then
  local t = redis.call("TIME")
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local lease = tonumber(ARGV[3])
  redis.call("ZADD", KEYS[1], now + lease, ARGV[2])
  -- Entries of workers that died are removed by recover_orphans; if nobody
  -- ever runs it, the whole index still goes a week after the last claim.
  redis.call("PEXPIRE", KEYS[1], math.max(lease * 4, 604800000))
elseif mode == "rem" then
  redis.call("ZREM", KEYS[1], ARGV[2])
end
for i = 4, #ARGV, 2 do
  redis.call("HINCRBY", KEYS[2], ARGV[i], tonumber(ARGV[i + 1]))
end
return 1
