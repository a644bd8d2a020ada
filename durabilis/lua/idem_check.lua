--[[ idem_check: read an idempotency record (read-only), judged by the server clock.

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  mode                       optional: "x" = answer {"x", touched} for a
                                    released claim's tombstone (the layer's read of a
                                    key's aliases: an earlier delivery may be parked,
                                    or may have had its effect); "g" / "G" = the
                                    guard of a parking (below)
ARGV[2]  fingerprint                (modes "g", "G") the parking's payload fingerprint,
                                    "" = none

THE GUARD OF A PARKING ("g", "G"). It goes in front of a parking's enqueue,
gated, in the same step (fused on standalone, a wave before it on Cluster), and
answers before ready() (a gated refusal aborts the step: nothing of it written):
  {"done"}  the operation's record is completed: the operation succeeded (a
            redelivery, a replay, a new owner), so a parking of it, sent late,
            must not make a pending record that a replay would run again;
  {"held"}  (mode "G": a parking without a claim of its own, its breaker open
            before it could claim) another delivery holds a live claim: its
            success would not settle a record parked behind its back, and the
            call, having run nothing, claims again (a duplicate's answer).
Anything else (no record, a claim whose lease ended, a tombstone, foreign data,
a record or claim of another payload fingerprint: a caller key reused, not this
operation) answers {"open"} after ready(): the parking goes (nothing of the
operation may be lost for a guess). A delivery that completed the operation
after taking over the parking's lapsed claim keeps its record as long as a
DLQ record (the layer's record step, with its hold), so a late parking meets
it completed, not missing.
Read-only.

Returns (modes "g" and "G": {"done"}, {"held"} or {"open"}, above) one of
  {"none"}                          no record (or a released claim's tombstone)
  {"x", touched ("1"|"0")}          (with ARGV[1] "x") a released claim's tombstone;
                                    touched "1" when an earlier run may have had its
                                    effect (idem_release's "tc" mark)
  {"dup", state ("p"|"d"), value ("" = none), claimed_ms, window_expires_ms,
   lease_expired (0|1), not_stored ("" = the result is stored, else why not)}
  {"corrupt", detail}

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local key = KEYS[1]
local guard = ARGV[1] == "g" or ARGV[1] == "G"
local kind = redis.call("TYPE", key)["ok"]
if guard and kind ~= "hash" then  -- (no record, or foreign data: the parking goes)
  ready()
  return {"open"}
end
if kind == "none" then return {"none"} end
if kind ~= "hash" then
  return {"corrupt", "a " .. kind .. " where an idempotency record (hash) belongs"}
end
local INT_LIMIT = 1e15  -- int()'s bound (stored milliseconds)
--@include lib/idem_clock.lua
if guard then
  local f = redis.call("HMGET", key, "s", "le", "fp")
  if (f[3] or "") == (ARGV[2] or "") then  -- (idem_claim's rule: same fingerprint, same operation)
    if f[1] == "d" then return {"done"} end
    local le = int(f[2])
    if ARGV[1] == "G" and f[1] == "p" and le and now < le then return {"held"} end
  end
  ready()
  return {"open"}
end
local f = redis.call("HMGET", key, "s", "ts", "le", "w", "ph", "r", "ns", "tc")
local state, ts, le, window = f[1], int(f[2]), int(f[3]), int(f[4])
if state == "x" then
  if ARGV[1] == "x" then
    if f[8] == "1" then return {"x", "1"} end
    return {"x", "0"}
  end
  return {"none"}
end
if (state ~= "p" and state ~= "d") or not ts or not window then
  return {"corrupt", "record hash without a valid state, claim time or window"}
end
if state == "d" then
  return {"dup", "d", f[6] or "", ts, ts + window, 0, f[7] or ""}
end
if not le then
  return {"corrupt", "in-progress record without a valid lease expiry"}
end
local expired = 0
if now >= le then expired = 1 end
return {"dup", "p", f[5] or "", ts, ts + window, expired, ""}
