--[[ idem_claim: claim an idempotency key, or report the existing claim.

One atomic step: exactly one of any number of concurrent callers gets "new".
An in-progress claim whose lease has expired (its owner died) is taken over
here, as a compare-and-set, with a new fencing token. A claim sent again with
the nonce of the claim in progress (its first reply was lost) gets that same
claim back, lease renewed.

A claim in progress is kept a dedup window past its lease's end (and past the
window from the claim): a worker that died holding it, however long it held
it, leaves recover_orphans a whole window to find it.

Fencing tokens are the server clock in microseconds, but never lower than the
key's previous token + 1 (kept across a release as a tombstone), so they
strictly increase per key even if the clock steps back (a failover to a
replica with a slower clock).

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  window_ms                  dedup window, counted from the claim
ARGV[2]  lease_ms                   how long an in-progress claim is held
ARGV[3]  placeholder                msgpack bytes, "" = none
ARGV[4]  fingerprint                payload fingerprint, "" = none (must equal the stored one)
ARGV[5]  payload                    msgpack bytes kept while in progress, "" = none
ARGV[6]  nonce                      the caller's claim id, "" = none (optional)

Returns one of
  {"new", token, claimed_ms, window_expires_ms, taken_over (0|1), previous_token}
      taken_over 1: an earlier run may have had its effect (the claim was taken
      over from a dead owner, or the key is a "touched" tombstone: see below)
  {"dup", state ("p"|"d"), value (placeholder or result, "" = none), claimed_ms,
   window_expires_ms, not_stored ("" = the result is stored, else why not)}
  {"mismatch"}                      key reused with another fingerprint
  {"corrupt", detail}               the key holds something durabilis did not write

Fields of the hash: s state (p in progress, d done, x released: a tombstone
keeping tok), tok token, ts claimed ms, le lease expiry ms, w window ms, ph
placeholder, r result, ns why the result was not stored, fp fingerprint, pl
payload, cn the claim's nonce, to "1" when the claim was taken over from a dead
owner, hd until when (ms) the key must last: its operation is parked in the DLQ,
tc "1" (a tombstone, or the claim that inherited one) when an earlier run may have
had its effect (idem_release: interrupted after fn started, or a dead owner's).

@acks: replicas
]]
local key = KEYS[1]
local window = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local nonce = ARGV[6] or ""
local INT_LIMIT = 1e16  -- int()'s bound (fencing tokens: microseconds)
--@include lib/idem_clock.lua
local clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function claim(taken_over, previous, hd, touched)
  local tok = clock_us
  local prev = int(previous)
  if prev and prev >= tok then tok = prev + 1 end
  local token = string.format("%d", tok)
  -- A tombstone held for a parked operation (idem_release "hd") outlives the
  -- window (hd: read with the other fields; nil for a key that does not exist).
  local held = int(hd) or 0
  ready()
  -- The HSET is this script's first write: under maxmemory (noeviction)
  -- Redis refuses it, and a refused claim writes nothing. (Fused with its
  -- birth entry on Cluster, the entry's ZADD comes first: refused the same
  -- way, it leaves nothing either.)
  local fields = {"s", "p", "tok", token, "ts", now, "le", now + lease, "w", window}
  local drop = {}
  local function opt(name, value)
    if value ~= "" then
      fields[#fields + 1] = name; fields[#fields + 1] = value
    else
      drop[#drop + 1] = name
    end
  end
  opt("ph", ARGV[3]); opt("fp", ARGV[4]); opt("pl", ARGV[5]); opt("cn", nonce)
  -- "to": taken over from a dead owner, whose operation may have run: this
  -- claim inherits it (idem_release will not simply drop it).
  if taken_over == 1 then opt("to", "1") else drop[#drop + 1] = "to" end
  -- "tc": inherited from a touched tombstone; passed on when released again.
  if touched then opt("tc", "1") else drop[#drop + 1] = "tc" end
  redis.call("HSET", key, unpack(fields))
  if taken_over == 1 or previous then
    -- What the previous claim (dead owner, or a tombstone) held and ours does not.
    drop[#drop + 1] = "r"; drop[#drop + 1] = "ns"
    redis.call("HDEL", key, unpack(drop))
  end
  redis.call("PEXPIREAT", key, math.max(now + lease + window, held))  -- (see above)
  local told = taken_over
  if touched then told = 1 end
  return {"new", token, now, now + window, told, previous or ""}
end

local kind = redis.call("TYPE", key)["ok"]
if kind == "none" then
  return claim(0, nil)
end
if kind ~= "hash" then
  return {"corrupt", "a " .. kind .. " where an idempotency record (hash) belongs"}
end

local f = redis.call("HMGET", key, "s", "tok", "ts", "le", "fp", "ph", "r", "w", "ns", "cn", "hd",
                     "tc", "to")
local touched = f[12] == "1"
local state, tok, ts, le, fp = f[1], f[2], int(f[3]), int(f[4]), f[5]
if state == "x" then
  if not int(tok) then return {"corrupt", "released record without a valid token"} end
  -- Released, but still bound to its payload for the window: another payload
  -- under the same key is a different operation, refused like a live one.
  if (fp or "") ~= ARGV[4] then return {"mismatch"} end
  return claim(0, tok, f[11], touched)
end
if (state ~= "p" and state ~= "d") or not tok or not ts then
  return {"corrupt", "record hash without a valid state, token or claim time"}
end
if state == "p" and (not le or not int(tok)) then
  return {"corrupt", "in-progress record without a valid lease expiry or token"}
end
-- A key bound to a payload answers only that payload; a key claimed without
-- one answers no claim that brings one, and the reverse (a caller cannot
-- reach a bound key's result by leaving its fingerprint out).
if (fp or "") ~= ARGV[4] then
  return {"mismatch"}
end
local stored_window = int(f[8]) or window
if state == "d" then
  return {"dup", "d", f[7] or "", ts, ts + stored_window, f[9] or ""}
end
if nonce ~= "" and f[10] == nonce then
  -- Our own claim, sent again after its reply was lost: the same claim.
  ready()
  redis.call("HSET", key, "le", now + lease)
  redis.call("PEXPIREAT", key,
             math.max(ts + stored_window, now + lease + stored_window, int(f[11]) or 0))
  local told = 0
  if touched or f[13] == "1" then told = 1 end
  return {"new", tok, ts, ts + stored_window, told, ""}
end
if now < le then
  return {"dup", "p", f[6] or "", ts, ts + stored_window, ""}
end
-- In progress but the lease has expired: the owner is presumed dead.
return claim(1, tok, f[11], touched)
