--[[ idem_reclaim: take over an ORPHANED claim for recovery (its lease expired).

Used by the layer's recover_orphans, for one in-flight index entry (a key and
the nonce of the claim that listed it). The one caller that reclaims gets the
stored payload, to park the operation in the DLQ; any other caller, a claim
still alive, done, or now held by ANOTHER claim (another nonce: the entry is
stale), gets "skip". The reclaimed claim keeps its nonce and gets a lease of
its own, so a crashed recoverer's claim is recovered later from the same entry.

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  lease_ms                   lease for the recoverer
ARGV[2]  nonce                      the index entry's claim nonce ("" = any claim)

Returns one of
  {"reclaimed", token, payload ("" = none), previous_token, claimed_ms,
   fingerprint ("" = none: kept apart from the payload, so it survives a damaged one)}
  {"skip", reason [, lease_expires_ms]}
      reason "none" | "done" | "other" | "corrupt" | "alive" (with its lease end)

@acks: replicas
]]
local key = KEYS[1]
local kind = redis.call("TYPE", key)["ok"]
if kind == "none" then return {"skip", "none"} end
if kind ~= "hash" then return {"skip", "corrupt"} end
local INT_LIMIT = 1e16  -- int()'s bound (fencing tokens: microseconds)
--@include lib/idem_clock.lua
local f = redis.call("HMGET", key, "s", "tok", "le", "pl", "ts", "w", "cn", "hd", "fp")
if f[1] == "d" then return {"skip", "done"} end
if f[1] == "x" then return {"skip", "none"} end
local le, ts, window, prev = int(f[3]), int(f[5]), int(f[6]), int(f[2])
if f[1] ~= "p" or not prev or not le or not ts or not window then
  return {"skip", "corrupt"}
end
local nonce = ARGV[2] or ""
if nonce ~= "" and f[7] ~= nonce then return {"skip", "other"} end
if now < le then return {"skip", "alive", le} end
local lease = tonumber(ARGV[1])
local tok = tonumber(t[1]) * 1000000 + tonumber(t[2])
if prev >= tok then tok = prev + 1 end
local token = string.format("%d", tok)
ready()
redis.call("HSET", key, "tok", token, "le", now + lease)
-- Never before its hold ("hd": a parked operation's DLQ record still names it),
-- and a window past the lease's end (idem_claim: recovery's window).
redis.call("PEXPIREAT", key, math.max(ts + window, now + lease + window, int(f[8]) or 0))
return {"reclaimed", token, f[4] or "", f[2], ts, f[9] or ""}
