--[[ dlq_enqueue: park a failed operation in the dead-letter queue.

One atomic step: append the readable entry to the stream (the ordered,
append-only log of failures), create the record hash holding the mutable
state, and index the record (expiry, pending, pending-by-operation-type,
counts). On the way it purges up to ARGV[3] records whose TTL has passed, so
the stream cannot grow without bound even if nobody runs cleanup_expired
(their record hashes are already gone: each carries a TTL = its expiry). A
purged record that was still PENDING expired unreplayed: it is reported as
dlq_cleanup.lua reports it (an "expired" log entry with its operation type,
idempotency key and agent, the count "expired|<op>", its by-key entry
dropped) and returned, so the caller logs the event.

KEEP PENDING. With ARGV[12] > 0 (DlqConfig.keep_pending), a new record made
while fewer than ARGV[12] records are pending never expires while pending:
its expiry is the KEEP sentinel (253402300799999 ms, 9999-12-31T23:59:59.999Z,
"never" in the stream entry) and its lifetime ARGV[2] is kept in "kt", to run
from the moment it is replayed or abandoned (dlq_finish). A record made
while ARGV[12] are pending gets its lifetime as usual (reply: kept 0).
Every key gets a TTL no earlier than the latest record expiry plus a day
(the grace in which a cleanup, scheduled or by hand, reports the records that
expired pending): a day after every record has expired, nothing of the DLQ
remains.

A record hash that already exists is never overwritten: enqueue with a
caller-chosen dlq_id is idempotent.

ONE RECORD PER OPERATION. With a merge key (the operation's idempotency key),
every parking of the same operation while its record is pending lands in that
record: its parking count goes up, its latest error and time are kept, and
the stream keeps the first failure. The by-key hash maps a merge key to its
record. A record id is never reused while the by-key entry names it: when the
entry names the candidate but its hash is gone (it expired pending, its index
members await cleanup), the new record takes this parking's id (ARGV[1]), so
the cleanup of the old one (which drops the entry only while it names that
id) never drops the new record's entry. Keys must be declared, so the caller
names the record it expects (the candidate: the first record of a key has the
id the caller derives from the key); when the by-key hash names another,
nothing is written and the answer is "miss" with that id, to send again with it. Each parking carries its own id
(the claim's), kept in the record ("pid:<id>": "c" for the parking that created
the record, 1 for one merged into it): a parking sent again after a
lost reply changes nothing, even once the record was settled meanwhile (the
operation's later success must not be followed by a new pending record that
a replay would run again). A record parked without its payload (metadata
"payload_error": recovery could not read the claim's) is marked "np"; the
first parking of the operation that carries a payload FILLS IT IN: the
record's stream entry is replaced by that parking's (payload, agent,
operation type, metadata), it gets a whole lifetime from now, its indexes
follow, and "np" goes (a replay holding it keeps its claim; its failure is
not noted: it saw no payload). Until then the record cannot be replayed.

Every change of state is also appended to the capped log stream (XRANGE it to
see, in order, what happened to the DLQ's records: parked, parked_again,
filled_in, replay_failed, replayed, abandoned, expired).

KEYS[1]  stream                     (<ns>:dlq:{dlq}:stream)
KEYS[2]  expiry index, zset         score expires_ms, member "<sid>|<dlq_id>|<p|r|a>|<op>"
KEYS[3]  pending index, lex zset    member "<sortkey(sid)>|<dlq_id>"
KEYS[4]  pending-by-op, lex zset    member "<op>\0<sortkey(sid)>|<dlq_id>"
KEYS[5]  counts hash                field "<status>|<op>" -> live records
KEYS[6]  the record hash            (<ns>:dlq:{dlq}:rec:<dlq_id>)
KEYS[7]  by-key hash                merge key -> dlq_id of its current record
KEYS[8]  candidate record hash      (<ns>:dlq:{dlq}:rec:<candidate>); KEYS[6] without merging
KEYS[9]  log stream                 (<ns>:dlq:{dlq}:log), capped
KEYS[10] requeue index, lex zset    member "<op>\0<sortkey(sid)>|<dlq_id>": a purged
                                    pending record's entry goes; a fill-in of a record
                                    marked for redelivery moves its entry to the new
                                    stream id and operation type, and pushes the index's
                                    TTL to at least the record's new expiry plus a day
ARGV[1]  dlq_id                     this parking's id (the record's, when one is created
                                    without a candidate)
ARGV[2]  ttl_ms                     record lifetime in milliseconds (>= 1)
ARGV[3]  purge_limit                expired records to purge on the way (0 = none)
ARGV[4]  agent_id
ARGV[5]  operation_type
ARGV[6]  retry_count                decimal text
ARGV[7]  last_error
ARGV[8]  payload field name         "original_operation" (JSON text) or
                                    "original_operation_msgpack" (msgpack bytes)
ARGV[9]  payload
ARGV[10] merge key                  "" = no merging
ARGV[11] candidate id               the record the merge key is expected to name
ARGV[12] keep_cap                   "0" = records expire while pending; n > 0 = keep
                                    pending records forever while fewer than n are pending
ARGV[13..] metadata field/value pairs, field names already prefixed "meta:"

Returns one of
  {"ok", sid, failed_ms, expires_ms, pending_index_size, dlq_id, kept (0|1),
   expired}                         a record created; expired: the pending records
                                    purged on the way, a flat list dlq_id, operation
                                    type, idempotency key, agent_id per record
  {"merged", sid, dlq_id, parkings} parked again into the operation's pending record
  {"exists", sid, dlq_id, made}     this parking is already in (a record with this
                                    dlq_id is live, or the record holds the parking);
                                    made 1: this very parking created it (a parking sent
                                    again after a lost reply)
  {"miss", dlq_id}                  the merge key names another record: nothing written
  {"corrupt", key, detail}          a key holds something durabilis did not write (each key
                                    is checked before the first write, when this parking
                                    reads or writes it: a merge checks the by-key hash, the
                                    records and the log only)

@acks: replicas
]]
local S, E, P, PO, C, H = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local BK, HC, LOG, RQ = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local id, ttl, purge_limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local mkey, cand = ARGV[10], ARGV[11]
local keep_cap = tonumber(ARGV[12]) or 0
local KEEP = 253402300799999  -- "never": 9999-12-31T23:59:59.999Z
local LOG_MAX = 10000
-- The shared keys outlive the latest record by a day, so that a cleanup run
-- meanwhile (scheduled: dlq cleanup_due) still finds and reports each record
-- that expired pending (their own hashes go at their expiry).
local GRACE = 86400000
local op = ARGV[5]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

--@include lib/dlq_types.lua
--@include lib/dlq_expire.lua

-- Every key is type-checked before the first write, each only when this
-- parking may write it: first the keys every path reads or writes, the rest
-- below once the path is known (a merge writes only the record and the log).
-- kinds: what each checked key holds ("none": absent; no EXISTS needed).
local bad, kinds = wrong_type({BK, "hash", HC, "hash", LOG, "stream"})
if bad then return bad end
local function check_also(more)
  local todo = {}
  for i = 1, #more, 2 do
    if not kinds[more[i]] then todo[#todo + 1] = more[i]; todo[#todo + 1] = more[i + 1] end
  end
  local b, k2 = wrong_type(todo)
  if b then return b end
  for k, v in pairs(k2) do kinds[k] = v end
  return nil
end

-- (purge(member), report_expired and `expired`: lib/dlq_expire.lua, as dlq_cleanup.lua)

-- iso_utc:begin  (tests evaluate this block on its own)
local function iso_utc(ms)
  local secs = math.floor(ms / 1000)
  local days = math.floor(secs / 86400)
  local sod = secs - days * 86400
  -- days -> civil date (H. Hinnant's algorithm, proleptic Gregorian)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return string.format("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", y, m, d,
    math.floor(sod / 3600), math.floor(sod % 3600 / 60), sod % 60, ms - secs * 1000)
end
-- iso_utc:end

-- The payload fingerprint of a caller's key (metadata "fingerprint"): parkings
-- merge only into a record of the same payload (a key reused with another
-- payload is another operation and gets its own record).
local fpr, nopay = "", false
for i = 13, #ARGV - 1, 2 do
  if ARGV[i] == "meta:fingerprint" then fpr = ARGV[i + 1] end
  if ARGV[i] == "meta:payload_error" then nopay = true end
end

-- Which record this parking goes to (checks only: nothing is written yet).
local target, TH, merge_into, fill, f = id, H, false, false, {}
if mkey ~= "" then
  local cur = redis.call("HGET", BK, mkey)
  if cur and cur ~= cand then return {"miss", cur} end
  if kinds[HC] ~= "none" then
    f = redis.call("HMGET", HC, "st", "exp", "sid", "fp", "np", "op", "pid:" .. id)
    local hexp = tonumber(f[2])
    -- This very parking landed in the record before (its reply lost, sent again):
    -- nothing changes, whatever became of the record since. Settled meanwhile
    -- (the operation since succeeded, or was replayed or abandoned), a parking
    -- sent again late must not park the operation anew.
    if f[7] then return {"exists", f[3] or "", cand, f[7] == "c" and 1 or 0} end
    if cur == cand and f[1] == "pending" and hexp and hexp > now and (f[4] or "") == fpr then
      merge_into, fill = true, f[5] and f[3] and not nopay
    end
  elseif cur ~= cand then
    target, TH = cand, HC  -- the operation's record takes the id derived from its key
  end
  -- (The key naming cand, whose hash is gone: that record expired pending and
  -- awaits its cleanup. Its id is not reused: the new record takes this
  -- parking's id, so that cleanup, dropping the key's entry only while it names
  -- cand, can never drop the new record's.)
end
if not merge_into then
  bad = check_also({TH, "hash"})  -- (checked already when it is HC)
  if bad then return bad end
  if kinds[TH] ~= "none" then
    local g = redis.call("HMGET", TH, "sid", "pid:" .. id)
    return {"exists", g[1] or "", target, g[2] == "c" and 1 or 0}
  end
end
-- A new record, or a fill-in, writes the stream, the indexes and the counts;
-- a new record first purges expired records (read here, purged after ready()).
local purging = {}
if not merge_into or fill then
  bad = check_also({S, "stream", E, "zset", P, "zset", PO, "zset", C, "hash"})
  if bad then return bad end
  if not merge_into and purge_limit > 0 then
    purging = redis.call("ZRANGEBYSCORE", E, "-inf", now, "LIMIT", 0, purge_limit)
  end
  if fill or #purging > 0 then
    bad = check_also({RQ, "zset"})
    if bad then return bad end
  end
end

-- The readable stream entry of record rid, expiring at e.
local function entry(rid, e)
  local fields = {
    "dlq_id", rid, "agent_id", ARGV[4], "operation_type", op, "retry_count", ARGV[6],
    "last_error", ARGV[7], "failed_at", iso_utc(now),
    "expires_at", e == KEEP and "never" or iso_utc(e), ARGV[8], ARGV[9],
  }
  for i = 13, #ARGV do fields[#fields + 1] = ARGV[i] end
  return redis.call("XADD", S, "*", unpack(fields))
end

-- The shared keys live as long as their longest-lived record. A key this
-- script made (absent before it: kinds) has no TTL yet: no PTTL needed.
local function extend_to(key, horizon)
  if kinds[key] == "none" then
    redis.call("PEXPIREAT", key, horizon)  -- (a no-op if the script did not make it)
    return
  end
  local pttl = redis.call("PTTL", key)
  if pttl == -1 or (pttl >= 0 and now + pttl < horizon) then
    redis.call("PEXPIREAT", key, horizon)
  end
end
local function extend_shared(floor)
  local top = tonumber(redis.call("ZRANGE", E, -1, -1, "WITHSCORES")[2] or "")
  local horizon = math.max(top or floor, floor) + GRACE
  for _, key in ipairs({S, E, P, PO, C, BK, LOG}) do
    -- (the by-key hash, absent and unwritten without a merge key, is skipped)
    if not (key == BK and mkey == "" and kinds[BK] == "none") then extend_to(key, horizon) end
  end
end
local function extend_log(floor) extend_to(LOG, floor + GRACE) end

ready()
if merge_into then
  local merged_sid, merged_exp = f[3], tonumber(f[2]) or now
  local parkings = redis.call("HINCRBY", HC, "pk", 1)
  redis.call("HSET", HC, "le", ARGV[7], "pat", now, "pid:" .. id, 1)
  local change = "parked_again"
  if fill then
    -- The payload-less record becomes this parking's: its entry, operation
    -- type and a whole lifetime from now (the payload was parked now). Each
    -- index entry is added before the old one goes: a key emptied on the way
    -- would come back without its TTL.
    local osid, oop, hexp = f[3], f[6] or "", now + ttl
    if redis.call("HEXISTS", HC, "kt") == 1 then hexp = KEEP end
    local sid = entry(cand, hexp)
    redis.call("ZADD", E, hexp, sid .. "|" .. cand .. "|p|" .. op)
    redis.call("ZREM", E, osid .. "|" .. cand .. "|p|" .. oop)
    redis.call("ZADD", P, 0, sortkey(sid) .. "|" .. cand)
    redis.call("ZREM", P, sortkey(osid) .. "|" .. cand)
    redis.call("ZADD", PO, 0, op .. "\0" .. sortkey(sid) .. "|" .. cand)
    redis.call("ZREM", PO, oop .. "\0" .. sortkey(osid) .. "|" .. cand)
    -- Its requeue mark (on the record) stays; the index entry that finds it follows.
    if redis.call("HEXISTS", HC, "rq") == 1 then
      redis.call("ZADD", RQ, 0, op .. "\0" .. sortkey(sid) .. "|" .. cand)
      local horizon = math.min(KEEP, hexp + GRACE)
      local pttl = redis.call("PTTL", RQ)
      if pttl == -1 or (pttl >= 0 and now + pttl < horizon) then
        redis.call("PEXPIREAT", RQ, horizon)
      end
    end
    redis.call("ZREM", RQ, oop .. "\0" .. sortkey(osid) .. "|" .. cand)
    bump("pending|" .. op, 1)
    bump("pending|" .. oop, -1)
    redis.call("XDEL", S, osid)
    redis.call("HSET", HC, "sid", sid, "op", op, "ts", now, "exp", hexp)
    merged_sid, merged_exp = sid, hexp
    -- A replay holding the record keeps its claim (a hand replay stays alone);
    -- its failure, about a record without payload, is then not noted (dlq_fail "np").
    redis.call("HDEL", HC, "np")
    redis.call("PEXPIREAT", HC, hexp)
    change = "filled_in"
  end
  redis.call("XADD", LOG, "MAXLEN", "~", LOG_MAX, "*", "dlq_id", cand, "change", change,
    "error", ARGV[7], "parkings", parkings)
  if fill then
    extend_shared(merged_exp)
  else
    -- Only the log was written: the record's expiry and its index entries are
    -- unchanged, so the other keys' TTLs (set when it was parked) still cover it.
    extend_log(tonumber(f[2]) or now)
  end
  return {"merged", merged_sid, cand, parkings}
end
for _, member in ipairs(purging) do purge(member) end

id = target
local exp, kept = now + ttl, 0
if keep_cap > 0 and redis.call("ZCARD", P) < keep_cap then exp, kept = KEEP, 1 end
local sid = entry(id, exp)
local pm = sortkey(sid) .. "|" .. id

local rec = {"st", "pending", "op", op, "sid", sid, "ts", now, "exp", exp, "ra", 0,
  "pk", 1, "pid:" .. ARGV[1], "c"}
local function put(k, v) rec[#rec + 1] = k; rec[#rec + 1] = v end
if nopay then put("np", 1) end
if kept == 1 then put("kt", ttl) end
if mkey ~= "" then
  put("ik", mkey)
  if fpr ~= "" then put("fp", fpr) end
end
redis.call("HSET", TH, unpack(rec))
if mkey ~= "" then redis.call("HSET", BK, mkey, id) end
redis.call("PEXPIREAT", TH, exp)
redis.call("XADD", LOG, "MAXLEN", "~", LOG_MAX, "*", "dlq_id", id, "change", "parked",
  "operation_type", op, "error", ARGV[7])
redis.call("ZADD", E, exp, sid .. "|" .. id .. "|p|" .. op)
redis.call("ZADD", P, 0, pm)
redis.call("ZADD", PO, 0, op .. "\0" .. pm)
bump("pending|" .. op, 1)

extend_shared(exp)
return {"ok", sid, now, exp, redis.call("ZCARD", P), id, kept, expired}
