--[[ idem_tombstone: leave a tombstone for an operation parked without a claim.

An operation parked before it could claim its key (its breaker was open:
park_on_open) holds no claim, so nothing at the key says it was ever
delivered. This tombstone says so: a later delivery's claim then names a
previous token, and its success settles the parked DLQ record (see
layer_note/idem_claim and dlq_finish). A key already claimed, recorded or
released is left as it is (a tombstone's life is only extended).

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  fingerprint                the payload fingerprint, "" = none
ARGV[2]  hold_ms                    how long the tombstone lasts (the DLQ record's TTL)

Returns 1 when a tombstone was written or extended, 0 otherwise.
]]
local key = KEYS[1]
local hold = tonumber(ARGV[2])
local kind = redis.call("TYPE", key)["ok"]
if kind == "none" then
  ready()
  redis.call("HSET", key, "s", "x", "tok", "0")
  if ARGV[1] ~= "" then redis.call("HSET", key, "fp", ARGV[1]) end
  redis.call("PEXPIRE", key, hold)
  return 1
end
if kind ~= "hash" or redis.call("HGET", key, "s") ~= "x" then return 0 end
local pttl = redis.call("PTTL", key)
if pttl >= 0 and pttl < hold then
  ready()
  redis.call("PEXPIRE", key, hold)
  return 1
end
return 0
