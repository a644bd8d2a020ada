--[[ layer_lease: take a short lease for a periodic fleet chore (orphan recovery).

One replica at a time runs the chore each period: the first to ask gets the
lease, the others skip until it ends. It is never released early: it simply
expires, so a holder that dies costs one period at most. (The chore itself,
recover_orphans, is safe to run concurrently; the lease only saves work.)

KEYS[1]  lease hash                  (<ns>:layer:{layer}:lease:<chore>)
ARGV[1]  holder                      who asks (replica id), kept for operators
ARGV[2]  ms                          the lease's length

Returns 1 when the lease was taken, 0 when another holder has it.
]]
ready()
if redis.call("EXISTS", KEYS[1]) == 1 then
  return 0
end
redis.call("HSET", KEYS[1], "holder", ARGV[1])
redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[2]))
return 1
