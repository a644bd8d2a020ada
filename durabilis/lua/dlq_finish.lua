--[[ dlq_finish: move a pending DLQ record to a final status (replayed or abandoned).

The state machine is pending -> replayed | abandoned, both final: a record
that is already final is left untouched. With a token (a replay that claimed
the record), only the current claim holder may finish it (fencing): a
replayer whose claim was taken over after it expired is refused. Without a
token, an operator's mark_replayed clears any live claim; an operator's
abandon of a record a running replay holds (live claim) is refused ("busy"),
as dlq_purge refuses it: the replay's outcome lands first, then the operator
decides (the hold lasts at most the claim's TTL).
A record kept while pending (field "kt", DlqConfig.keep_pending: its expiry
is the "never" sentinel) gets its lifetime ("kt" ms) from now on: its
expiry, the hash's TTL and its expiry-index score.

KEYS[1]  expiry index, zset         (see dlq_enqueue.lua for members)
KEYS[2]  pending index, lex zset
KEYS[3]  pending-by-op, lex zset
KEYS[4]  counts hash
KEYS[5]  the record hash
KEYS[6]  by-key hash                (its entry for the record's operation is removed)
KEYS[7]  log stream                 (the change is appended)
KEYS[8]  requeue index, lex zset    (optional) the record's requeue entry is removed
ARGV[1]  dlq_id
ARGV[2]  target                     "replayed" | "abandoned"
ARGV[3]  token                      claim token, "" = none (operator action)
ARGV[4]  by                         who finished it, "" = unknown
ARGV[5]  merge key                  "" = none; else finish only if the by-key hash
                                    names this record for that key (an operation
                                    that completed settles its own parked record)
ARGV[6]  expected                   (optional) "" = none; else "<stream id> <parkings>":
                                    the record as the caller saw it (the console's
                                    confirmation); finished only while its stream id
                                    and parking count ("pk") are those: a record
                                    parked again since under the same id (new stream
                                    id) or into it (a merge: pk + 1) is {"changed"}

Returns one of
  {"ok", finished_ms}
  {"none"}                          no live record (unknown id or expired)
  {"final", status}                 already final: nothing changed
  {"busy", owner, claim_expires_ms} (abandon without a token) a replay holds a live
                                    claim on it: nothing changed
  {"lost"}                          the token does not hold the claim
  {"miss", dlq_id}                  with a merge key: the key's record is another
  {"changed"}                       with an expectation: not the record the caller
                                    saw: nothing changed
  {"corrupt", key, detail}

@acks: replicas
]]
local E, P, PO, C, H, BK, LOG = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local RQ = KEYS[8]
local id, target, token, by, mk = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5] or ""
local esid, epk = string.match(ARGV[6] or "", "^(%d+%-%d+) (%d+)$")
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

--@include lib/dlq_types.lua

local checks = {E, "zset", P, "zset", PO, "zset", C, "hash", H, "hash", BK, "hash",
                LOG, "stream"}
local bad = wrong_type(checks)
if bad then return bad end
if mk ~= "" then
  local current = redis.call("HGET", BK, mk)
  if not current then return {"none"} end
  if current ~= id then return {"miss", current} end
end
if redis.call("EXISTS", H) == 0 then return {"none"} end

local f = redis.call("HMGET", H, "st", "op", "sid", "exp", "ct", "co", "ce", "pk")
local st, op, sid, exp, ct = f[1], f[2], f[3], tonumber(f[4]), f[5]
local co, ce, pk = f[6], tonumber(f[7]), f[8] or "1"
if (st ~= "pending" and st ~= "replayed" and st ~= "abandoned") or not op or not exp
    or not sid or not string.match(sid, "^%d+%-%d+$") then
  return {"corrupt", H, "record hash without a valid status, operation type, expiry or stream id"}
end
if exp <= now then return {"none"} end
if esid and (esid ~= sid or epk ~= pk) then return {"changed"} end
if st ~= "pending" then return {"final", st} end
if token ~= "" and ct ~= token then return {"lost"} end
if token == "" and target == "abandoned" and co and ce and ce > now then
  return {"busy", co, ce}
end

--@include lib/dlq_bump.lua
--@include lib/dlq_unindex.lua

ready()  -- a fused step (an operation's success settling its record): checks done
local kt = tonumber(redis.call("HGET", H, "kt") or "")
if kt then
  exp = now + kt
  redis.call("HSET", H, "exp", exp)
  redis.call("HDEL", H, "kt")
  redis.call("PEXPIREAT", H, exp)
end
local code = "r"
if target == "replayed" then
  redis.call("HSET", H, "st", "replayed", "rat", now)
  if by ~= "" then redis.call("HSET", H, "rby", by) end
else
  code = "a"
  redis.call("HSET", H, "st", "abandoned", "aat", now)
  if by ~= "" then redis.call("HSET", H, "aby", by) end
end
redis.call("HDEL", H, "co", "ct", "ce")
local mkey = redis.call("HGET", H, "ik")
if mkey and redis.call("HGET", BK, mkey) == id then redis.call("HDEL", BK, mkey) end
redis.call("XADD", LOG, "MAXLEN", "~", 10000, "*", "dlq_id", id, "change", target, "by", by)

-- Add before removing: a key emptied by the removal would be recreated
-- without its TTL.
redis.call("ZADD", E, exp, sid .. "|" .. id .. "|" .. code .. "|" .. op)
redis.call("ZREM", E, sid .. "|" .. id .. "|p|" .. op)
bump(target .. "|" .. op, 1)
bump("pending|" .. op, -1)
unindex(sid, id, op)

-- (a day past the latest record, as dlq_enqueue.lua: a cleanup reports what expired)
local horizon = tonumber(redis.call("ZRANGE", E, -1, -1, "WITHSCORES")[2]) + 86400000
for _, key in ipairs({E, C, LOG}) do
  local pttl = redis.call("PTTL", key)
  if pttl == -1 or (pttl >= 0 and now + pttl < horizon) then
    redis.call("PEXPIREAT", key, horizon)
  end
end
return {"ok", now}
