--[[ layer_stats: the layer's counters and how many claims are in flight (read-only).

In flight are the entries of the in-flight index whose lease has not ended: a
live worker's keep-alive renews its claims' entries, so an entry whose lease
ended is a dead worker's (or one a process that ended early never removed). It
counts as lease_ended, not in flight, until recover_orphans (`durabilis
recover`, the layer's periodic recovery) parks its operation or drops it: a
crashed process cannot leave in_flight wrong for longer than one lease.

KEYS[1]  in-flight sorted set        (<ns>:layer:{layer}:inflight)
KEYS[2]  counters hash               (<ns>:layer:{layer}:stats)

Returns {counters (HGETALL's flat field, value list), in_flight, lease_ended}.

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call("ZCOUNT", KEYS[1], "(" .. now, "+inf")
local ended = redis.call("ZCOUNT", KEYS[1], "-inf", now)
return {redis.call("HGETALL", KEYS[2]), live, ended}
