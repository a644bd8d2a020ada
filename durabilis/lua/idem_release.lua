--[[ idem_release: give an in-progress claim back (the operation failed or was cancelled).

Only the current owner releases, named by its token or by its claim nonce
(when the claim's reply was lost, the caller knows only its nonce), and only
while in progress: a recorded result is never deleted here. The record becomes
a tombstone keeping the last token (until the record's TTL), so the next
claim's token is still higher.

A "touched" tombstone ("tc" = "1") says an earlier run may have had its
effect: the claim was released after an interruption once fn had started
(ARGV[5]), or it had been taken over from a dead owner ("to") or inherited a
touched tombstone itself ("tc"). The next claim reports it as taken over
(idem_claim), and it passes on from claim to claim until an outcome is
recorded (idem_record writes the record afresh).

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  token                      fencing token from the claim, "" = unknown
ARGV[2]  nonce                      the claim's nonce, "" = unknown
ARGV[3]  keep_taken                 "1": do not release a claim taken over from a
                                    dead owner (its operation may have run): the
                                    caller parks it instead
ARGV[4]  hold_ms                    "" = none; else keep the tombstone at least this
                                    long (a parked operation: as long as its DLQ
                                    record, so that a later delivery still learns
                                    there was an earlier claim and settles the record)
ARGV[5]  touched                    "1": fn had started (the run was interrupted, or
                                    recovery parks a dead worker's claim): the
                                    tombstone is touched; "" = as the claim was
ARGV[6]  fingerprint                the operation's payload fingerprint, "" = none
                                    (a hold is left only on a record of the same)
ARGV[7]  late                       "late": a layer parking (below); recovery's
                                    parking, gated on this release, never sets it

A PARKING THAT NO LONGER HOLDS ITS CLAIM (with hold_ms and "late"; the claim expired, and
another delivery claimed the key since, released or completed it, or the key is
gone) still leaves its hold on the key, whatever holds it: "hd" = at least
now + hold_ms on another's claim, a tombstone or a completed record of the same
payload fingerprint (ARGV[6]), whose TTL reaches it; on a missing key, a held
tombstone (as idem_tombstone writes). The other delivery's success then keeps
its record that long (idem_record), so a replay of the parked record finds the
operation done and never runs it again; a release keeps the hold, and a later
delivery, meeting the tombstone, learns of the parking and settles it.

Returns 1 when released, 0 when neither holds an in-progress claim (its hold
left, as above, with hold_ms), 2 when kept because it was taken over (with
keep_taken).

@acks: none   (a release lost in a failover is safe: the key is taken over
              only when its lease ends, as a dead worker's, never run twice)
]]
local key = KEYS[1]
local kind = redis.call("TYPE", key)["ok"]
local INT_LIMIT = 1e15  -- int()'s bound (stored milliseconds)
--@include lib/idem_clock.lua
local hold = tonumber(ARGV[4] or "")
local fp = ARGV[6] or ""
local late = hold and hold > 0 and ARGV[7] == "late"
if kind == "none" and late then  -- (a parking: its hold, as a tombstone)
  ready()
  redis.call("HSET", key, "s", "x", "tok", ARGV[1] ~= "" and ARGV[1] or "0", "hd", now + hold)
  if ARGV[5] == "1" then redis.call("HSET", key, "tc", "1") end
  if fp ~= "" then redis.call("HSET", key, "fp", fp) end
  redis.call("PEXPIREAT", key, now + hold)
  return 0
end
if kind ~= "hash" then return 0 end
local f = redis.call("HMGET", key, "s", "tok", "cn", "to", "hd", "tc", "fp")
local token, nonce = ARGV[1], ARGV[2] or ""
if f[1] == "p" and ((token ~= "" and f[2] == token) or (nonce ~= "" and f[3] == nonce)) then
  if ARGV[3] == "1" and f[4] == "1" then return 2 end
  ready()
  local fields = redis.call("HKEYS", key)
  local drop = {}
  for _, name in ipairs(fields) do
    -- The tombstone keeps the token (tokens only increase), the payload
    -- fingerprint (the key stays bound to its payload for the window) and
    -- "hd", until when it must last (a parked operation's DLQ record).
    if name ~= "s" and name ~= "tok" and name ~= "fp" and name ~= "hd" then
      drop[#drop + 1] = name
    end
  end
  if #drop > 0 then redis.call("HDEL", key, unpack(drop)) end
  redis.call("HSET", key, "s", "x")
  if ARGV[5] == "1" or f[4] == "1" or f[6] == "1" then
    redis.call("HSET", key, "tc", "1")  -- (HKEYS above dropped it: set afresh)
  end
  -- The hold is sticky: a later release without one (a non-retryable failure,
  -- a cancelled call) keeps the tombstone as long as an earlier one asked.
  local until_ms = tonumber(f[5] or "") or 0
  if hold and hold > 0 and now + hold > until_ms then
    until_ms = now + hold
    redis.call("HSET", key, "hd", until_ms)
  end
  local pttl = redis.call("PTTL", key)
  if until_ms > now and pttl >= 0 and now + pttl < until_ms then
    redis.call("PEXPIREAT", key, until_ms)
  end
  return 1
end
if late and (f[1] == "p" or f[1] == "x" or f[1] == "d") and (f[7] or "") == fp then
  local until_ms = tonumber(f[5] or "") or 0
  if now + hold > until_ms then
    ready()
    redis.call("HSET", key, "hd", now + hold)
    local pttl = redis.call("PTTL", key)
    if pttl >= 0 and pttl < hold then redis.call("PEXPIREAT", key, now + hold) end
  end
end
return 0
