--[[ cb_register: add a breaker's name to the namespace's index of breakers.

Sent once per process and name (the index lives in its own slot, so it
cannot share a script with the breaker's keys on Cluster). The index lives as
long as the namespace: it holds names only, one per dependency.
The check comes first (a foreign key at KEYS[1] raises WRONGTYPE there, before
any write), then ready(), then the write (see durabilis/_scripts.py).

KEYS[1]  names set       <ns>:cb-names
ARGV[1]  name            the breaker's name

Returns 1 when the name was new, 0 when already known.

@acks: replicas
]]
local known = redis.call("SISMEMBER", KEYS[1], ARGV[1])
ready()
if known == 1 then return 0 end
return redis.call("SADD", KEYS[1], ARGV[1])
