--[[ idem_reclaim: take over an ORPHANED claim for recovery (its lease expired).

Used by the layer's recover_orphans: the one caller that reclaims gets the
stored payload, to park the operation in the DLQ; any other caller, or a claim
still alive or already done, gets "skip". The recovered claim keeps a lease of
its own so a crashed recoverer's claim is itself recovered later.

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  lease_ms                   lease for the recoverer

Returns one of
  {"reclaimed", token, payload ("" = none), previous_token, claimed_ms}
  {"skip", reason}                  "none" | "done" | "alive" | "corrupt"
]]
local key = KEYS[1]
local kind = redis.call("TYPE", key)["ok"]
if kind == "none" then return {"skip", "none"} end
if kind ~= "hash" then return {"skip", "corrupt"} end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A stored millisecond count, or nil: tonumber() alone also accepts "inf",
-- "nan" and fractions, which would poison every comparison and TTL below.
local function int(v)
  local n = tonumber(v)
  if n and n == n and n > -1e15 and n < 1e15 and n == math.floor(n) then return n end
  return nil
end
local f = redis.call("HMGET", key, "s", "tok", "le", "pl", "ts", "w")
if f[1] == "d" then return {"skip", "done"} end
local le, ts, window = int(f[3]), int(f[5]), int(f[6])
if f[1] ~= "p" or not f[2] or not le or not ts or not window then
  return {"skip", "corrupt"}
end
if now < le then return {"skip", "alive"} end
local lease = tonumber(ARGV[1])
local token = string.format("%d", tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call("HSET", key, "tok", token, "le", now + lease)
redis.call("PEXPIREAT", key, math.max(ts + window, now + lease))
return {"reclaimed", token, f[4] or "", f[2], ts}
