--[[ layer_orphans: in-flight operations whose lease has ended (read-only).

KEYS[1]  in-flight sorted set        (<ns>:layer:{layer}:inflight)
ARGV[1]  limit                       at most this many

Returns the idempotency keys (oldest lease end first).

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now, "LIMIT", 0, tonumber(ARGV[1]))
