--[[ layer_lease: take a short lease for a periodic fleet chore (orphan recovery,
DLQ expiry cleanup).

One replica at a time runs the chore each period: the first to ask gets the
lease, the others skip until it ends. It is never released early: it simply
expires, so a holder that dies costs one period at most. (The chores,
recover_orphans and the DLQ's cleanup, are safe to run concurrently; the
lease only saves work.)

KEYS[1]  lease hash                  (<ns>:layer:{layer}:lease:<chore>, or
                                     <ns>:dlq:{dlq}:lease:cleanup)
ARGV[1]  holder                      who asks (replica id), kept for operators
ARGV[2]  ms                          the lease's length

Returns 1 when the lease was taken, 0 when another holder has it.

@acks: replicas
]]
ready()
if redis.call("EXISTS", KEYS[1]) == 1 then
  return 0
end
redis.call("HSET", KEYS[1], "holder", ARGV[1])
redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[2]))
return 1
