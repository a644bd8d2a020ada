--[[ idem_record: store the outcome of a claimed operation.

With a token, only the current owner may record: a stale owner (whose lease
expired and was taken over, or who released) is refused and overwrites
nothing. The claim's nonce also names its owner: a claim reclaimed by
recovery (same nonce, new token) but not parked yet still takes the outcome
its worker knows (the token becomes the worker's; recovery's release then
finds the record done). Sending the same record again (its reply was lost)
answers "ok" again. Without a token the result is stored as is (the seed's
record()).

The completed record is written afresh (DEL, then one HSET of the fields a
done record keeps): a claim's payload or placeholder above
hash-max-listpack-value turns its hash into a hashtable for good, and a fresh
hash of short fields is a listpack again (about half the memory). The first
write is that DEL: it frees memory, and Redis refuses a write for maxmemory
(noeviction) only as a script's FIRST write, so the outcome of an operation
that has run is always recorded.

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  result                     msgpack bytes ("" with ARGV[4])
ARGV[2]  token                      fencing token from the claim, "" = none
ARGV[3]  window_ms                  dedup window, used when no claim exists
ARGV[4]  not_stored                 "" = store ARGV[1]; else why the result is not stored
ARGV[5]  nonce                      the claim's nonce, "" = none (optional)
ARGV[6]  hold_ms                    optional: the done record lives at least this
                                    long from now ("hd"; a run that took over an
                                    operation under another secret's key, whose
                                    dead claim recovery may park later)
ARGV[7]  mode                       optional: "orphan" = record onto a claim whose
                                    lease has run out, whoever holds it (the same
                                    operation's key under another secret: its dead
                                    claim is then done, never parked and replayed);
                                    anything else there answers {"lost"}

Returns one of
  {"ok", claimed_ms, window_expires_ms}
  {"lost"}                          the token does not hold the claim
  {"corrupt", detail}

@acks: replicas
]]
local key = KEYS[1]
local token = ARGV[2]
local not_stored = ARGV[4] or ""
local INT_LIMIT = 1e15  -- int()'s bound (stored milliseconds)
--@include lib/idem_clock.lua

local function outcome()
  if not_stored ~= "" then return "ns", not_stored end
  return "r", ARGV[1]
end

-- One read for the checks and for the fields a done record keeps. A key of
-- another type answers an error here; only then is TYPE asked, to name it.
local f = redis.pcall("HMGET", key, "s", "tok", "ts", "w", "cn", "fp", "to", "hd")
if f.err then
  return {"corrupt", "a " .. redis.call("TYPE", key)["ok"]
    .. " where an idempotency record (hash) belongs"}
end
local state = f[1]
local missing = not state and redis.call("EXISTS", key) == 0
if (ARGV[7] or "") == "orphan" then
  if state ~= "p" then return {"lost"} end
  local le = int(redis.call("HGET", key, "le"))
  if not le or le > now then return {"lost"} end
  token = f[2] or ""  -- recorded as its (dead) owner would have
  if token == "" then return {"lost"} end
end
if missing or state == "x" then
  if token ~= "" then return {"lost"} end
  local window = tonumber(ARGV[3])
  local field, value = outcome()
  -- A tombstone's hold (a parked operation's DLQ record) is kept, as below.
  local held = state == "x" and int(f[8]) or nil
  ready()
  if state == "x" then redis.call("DEL", key) end
  local fields = {"s", "d", "tok", "", "ts", now, "w", window, field, value}
  if held then fields[#fields + 1] = "hd"; fields[#fields + 1] = held end
  redis.call("HSET", key, unpack(fields))
  redis.call("PEXPIREAT", key, math.max(now + window, held or 0))
  return {"ok", now, now + window}
end

local tok, ts, window = f[2], int(f[3]), int(f[4])
if (state ~= "p" and state ~= "d") or not ts or not window then
  return {"corrupt", "record hash without a valid state, claim time or window"}
end
local nonce = ARGV[5] or ""
local by_nonce = nonce ~= "" and state == "p" and f[5] == nonce
if token ~= "" and tok ~= token and not by_nonce then
  return {"lost"}
end
if token ~= "" and state == "d" then
  ready()  -- recorded already, by this owner (a step sent again): accepted, nothing to write
  return {"ok", ts, ts + window}
end
local field, value = outcome()
ready()
-- Kept: the token (the worker's, when it took the outcome by its nonce), the
-- claim time and window, the fingerprint, the taken-over mark, the hold.
-- Dropped: the lease, payload, placeholder and nonce of the claim.
local fields = {"s", "d", "tok", (by_nonce and tok ~= token) and token or (tok or ""),
                "ts", f[3], "w", f[4], field, value}
for i, name in ipairs({"fp", "to", "hd"}) do
  local v = f[5 + i]
  if v then fields[#fields + 1] = name; fields[#fields + 1] = v end
end
redis.call("DEL", key)
redis.call("HSET", key, unpack(fields))
-- The window counts from the claim; a result recorded after the window has
-- already passed (a very slow operation) is still kept for one second. A
-- record held for a parked operation ("hd") lasts as long as its DLQ record:
-- should the settle that follows the record be lost (Cluster: a step of its
-- own), a replay after the window still finds the operation done.
local expires = math.max(ts + window, now + 1000, int(f[8]) or 0)
local hold = int(ARGV[6] or "")
if hold and hold > 0 and now + hold > expires then
  expires = now + hold
  redis.call("HSET", key, "hd", expires)
end
redis.call("PEXPIREAT", key, expires)
return {"ok", ts, ts + window}
