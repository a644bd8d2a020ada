--[[ layer_walk: hand the next slice of the birth index to a recovery pass.

On Cluster (and the simulator's unfused store) a claim's own script lists it
in a birth-index bucket of its hash slot; recovery reads a slice of those
buckets per pass. The slices are handed out fleet-wide, in turn, so that every
bucket is read once per cycle whichever process runs the passes (a cron that
starts a new process each time included).

KEYS[1]  walk counter hash           (<ns>:layer:{layer}:walk)
ARGV[1]  ms                          how long the counter lasts after a pass

Returns the pass number (1, 2, ...).

@acks: replicas
]]
ready()
local pass = redis.call("HINCRBY", KEYS[1], "pass", 1)
redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[1]))
return pass
