--[[ idem_tombstone: leave a tombstone for an operation parked without a claim.

An operation parked before it could claim its key (its breaker was open:
park_on_open) holds no claim, so nothing at the key says it was ever
delivered. This tombstone says so: a later delivery's claim then names a
previous token, and its success settles the parked DLQ record (see
layer_note/idem_claim and dlq_finish). A recorded key is left as it is; a
tombstone's hold ("hd", see idem_release) is only extended, and so is that of
another delivery's claim (claimed meanwhile): its success then keeps its
record as long, so a replay of the parked record finds the operation done.

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  fingerprint                the payload fingerprint, "" = none
ARGV[2]  hold_ms                    how long the tombstone lasts (the DLQ record's TTL)

Returns 1 when a tombstone was written or extended, 0 otherwise.

@acks: replicas
]]
local key = KEYS[1]
local hold = tonumber(ARGV[2])
local t = redis.call("TIME")
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + hold
local kind = redis.call("TYPE", key)["ok"]
if kind == "none" then
  ready()
  redis.call("HSET", key, "s", "x", "tok", "0", "hd", until_ms)
  if ARGV[1] ~= "" then redis.call("HSET", key, "fp", ARGV[1]) end
  redis.call("PEXPIREAT", key, until_ms)
  return 1
end
local state = kind == "hash" and redis.call("HGET", key, "s")
if state ~= "x" and state ~= "p" then return 0 end
if (tonumber(redis.call("HGET", key, "hd") or "") or 0) < until_ms then
  ready()
  redis.call("HSET", key, "hd", until_ms)
  local pttl = redis.call("PTTL", key)  -- (extended, never shortened)
  if pttl >= 0 and pttl < hold then redis.call("PEXPIREAT", key, until_ms) end
  return 1
end
return 0
