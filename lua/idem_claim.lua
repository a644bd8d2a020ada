--[[ idem_claim: claim an idempotency key, or report the existing claim.

One atomic step: exactly one of any number of concurrent callers gets "new".
An in-progress claim whose lease has expired (its owner died) is taken over
here, as a compare-and-set, with a new fencing token.

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  window_ms                  dedup window, counted from the claim
ARGV[2]  lease_ms                   how long an in-progress claim is held
ARGV[3]  placeholder                msgpack bytes, "" = none
ARGV[4]  fingerprint                payload fingerprint, "" = none (not checked)
ARGV[5]  payload                    msgpack bytes kept while in progress, "" = none

Returns one of
  {"new", token, claimed_ms, window_expires_ms, taken_over (0|1), previous_token}
  {"dup", state ("p"|"d"), value (placeholder or result, "" = none), claimed_ms,
   window_expires_ms}
  {"mismatch"}                      key reused with another fingerprint
  {"corrupt", detail}               the key holds something durabilis did not write

Fields of the hash: s state (p in progress, d done), tok token, ts claimed ms,
le lease expiry ms, w window ms, ph placeholder, r result, fp fingerprint,
pl payload.
]]
local key = KEYS[1]
local window = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = string.format("%d", tonumber(t[1]) * 1000000 + tonumber(t[2]))

local function claim(taken_over, previous)
  -- One HSET with every field (fewer commands on the hot path); a takeover
  -- first drops what the dead owner's claim held.
  if taken_over == 1 then redis.call("HDEL", key, "r", "ph", "fp", "pl") end
  local fields = {"s", "p", "tok", token, "ts", now, "le", now + lease, "w", window}
  if ARGV[3] ~= "" then fields[#fields + 1] = "ph"; fields[#fields + 1] = ARGV[3] end
  if ARGV[4] ~= "" then fields[#fields + 1] = "fp"; fields[#fields + 1] = ARGV[4] end
  if ARGV[5] ~= "" then fields[#fields + 1] = "pl"; fields[#fields + 1] = ARGV[5] end
  redis.call("HSET", key, unpack(fields))
  redis.call("PEXPIREAT", key, now + math.max(window, lease))
  return {"new", token, now, now + window, taken_over, previous}
end

local kind = redis.call("TYPE", key)["ok"]
if kind == "none" then
  return claim(0, "")
end
if kind ~= "hash" then
  return {"corrupt", "a " .. kind .. " where an idempotency record (hash) belongs"}
end

-- A stored millisecond count, or nil: tonumber() alone also accepts "inf",
-- "nan" and fractions, which would poison every comparison and TTL below.
local function int(v)
  local n = tonumber(v)
  if n and n == n and n > -1e15 and n < 1e15 and n == math.floor(n) then return n end
  return nil
end
local f = redis.call("HMGET", key, "s", "tok", "ts", "le", "fp", "ph", "r", "w")
local state, tok, ts, le, fp = f[1], f[2], int(f[3]), int(f[4]), f[5]
if (state ~= "p" and state ~= "d") or not tok or not ts then
  return {"corrupt", "record hash without a valid state, token or claim time"}
end
if state == "p" and not le then
  return {"corrupt", "in-progress record without a valid lease expiry"}
end
if ARGV[4] ~= "" and fp and fp ~= ARGV[4] then
  return {"mismatch"}
end
local stored_window = int(f[8]) or window
if state == "d" then
  return {"dup", "d", f[7] or "", ts, ts + stored_window}
end
if now < le then
  return {"dup", "p", f[6] or "", ts, ts + stored_window}
end
-- In progress but the lease has expired: the owner is presumed dead.
return claim(1, tok)
