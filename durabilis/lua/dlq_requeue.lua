--[[ dlq_requeue: mark pending DLQ records for redelivery by the fleet (or prune marks).

An operator (`durabilis dlq requeue`) needs no handler: the records are marked
here, and the replicas that have the handlers replay them (a replay pass over
the requeue index, each record claimed by dlq_claim as any replay is).

Mode "mark": each given record that is pending and live gets the fields "rq"
(requeued at, ms) and "rqb" (by whom), an entry "<op>\0<sortkey(sid)>|<dlq_id>"
in the requeue index (a lex zset: by operation type, then enqueue order) and a
"requeued" entry in the log stream. Marking a record marked already changes
nothing ("already"); a replayed or abandoned record is refused ("final").

The mark lives on the record (field "rq"); the index only finds it: a pass
claims through an entry only a record carrying the mark with that entry's
stream id (dlq_claim.lua, pass "rq"), and every script that removes or moves a
record (finish, fail, cleanup, purge, enqueue's purge and fill-in) removes or
moves its entry.

Mode "prune": each given index member is removed unless it names a live,
pending, marked record with the same stream entry (a record that expired,
was finished or was parked again under the same id since).

Work per call is bounded by the number of ids (members) given.

KEYS[1]  requeue index, lex zset    (<ns>:dlq:{dlq}:requeued)
KEYS[2]  log stream                 (<ns>:dlq:{dlq}:log), capped
KEYS[2+i] the record hash of the i-th id (member)
ARGV[1]  mode                       "mark" | "prune"
ARGV[2]  by                         who requeues ("" = unknown; mode "mark")
ARGV[2+i] mode "mark": a dlq_id, or "<dlq_id> <stream id> <parkings>": the
                                    record as the caller saw it (the console's
                                    confirmation), marked only while its stream id and
                                    parking count ("pk") are those (else {"changed"}: it
                                    was parked again since, under its id or into it);
          mode "prune": an index member

Returns (mode "mark") {"ok", reply_1, reply_2, ...}, one per id, each one of
  {"ok", requeued_ms}               marked now
  {"already", requeued_ms, by}      marked before: nothing changed
  {"final", status}                 replayed or abandoned: refused
  {"none"}                          no live record (unknown id or expired)
  {"changed"}                       not the record the caller saw: nothing changed
(mode "prune") {"ok", removed}; or {"corrupt", key, detail}.

@acks: replicas
]]
local IDX, LOG = KEYS[1], KEYS[2]
local mode, by = ARGV[1], ARGV[2] or ""
local LOG_MAX, GRACE = 10000, 86400000
local KEEP = 253402300799999  -- "never" (DlqConfig.keep_pending)
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

--@include lib/dlq_types.lua
--@include lib/sortkey.lua

local bad = wrong_type({IDX, "zset", LOG, "stream"})
if bad then return bad end
-- The record's live fields, or nil (gone or expired); raises on foreign data.
local function read(H)
  local kind = redis.call("TYPE", H)["ok"]
  if kind == "none" then return nil end
  if kind ~= "hash" then return false, {"corrupt", H, "a " .. kind .. " where a DLQ record (hash) belongs"} end
  local f = redis.call("HMGET", H, "st", "op", "sid", "exp", "rq", "rqb", "pk")
  local exp = tonumber(f[4])
  if (f[1] ~= "pending" and f[1] ~= "replayed" and f[1] ~= "abandoned") or not f[2]
      or not exp or not f[3] or not string.match(f[3], "^%d+%-%d+$") then
    return false, {"corrupt", H, "record hash without a valid status, operation type, expiry or stream id"}
  end
  if exp <= now then return nil end
  return {st = f[1], op = f[2], sid = f[3], exp = exp, rq = f[5], rqb = f[6], pk = f[7] or "1"}
end

if mode == "prune" then
  local removed = 0
  for i = 3, #ARGV do
    local member = ARGV[i]
    local r, err = read(KEYS[i])
    if r == false then return err end
    local id = string.match(member, "|([^|]+)$")
    local keep = id and r and r.st == "pending" and r.rq
      and member == r.op .. "\0" .. sortkey(r.sid) .. "|" .. id
    if not keep then removed = removed + redis.call("ZREM", IDX, member) end
  end
  return {"ok", removed}
end
if mode ~= "mark" then return {"corrupt", IDX, "unknown mode " .. tostring(mode)} end

-- Checks first (a foreign key refuses the whole batch, nothing written).
local recs, ids, seen = {}, {}, {}
for i = 3, #ARGV do
  local r, err = read(KEYS[i])
  if r == false then return err end
  recs[i] = r
  local id, esid, epk = string.match(ARGV[i], "^(%S+) (%d+%-%d+) (%d+)$")
  ids[i] = id or ARGV[i]
  if id then seen[i] = {sid = esid, pk = epk} end
end
ready()
local fresh = redis.call("ZCARD", IDX) == 0
local out, horizon = {"ok"}, nil
for i = 3, #ARGV do
  local r, id, H, e = recs[i], ids[i], KEYS[i], seen[i]
  if not r then
    out[#out + 1] = {"none"}
  elseif e and (e.sid ~= r.sid or e.pk ~= r.pk) then
    out[#out + 1] = {"changed"}
  elseif r.st ~= "pending" then
    out[#out + 1] = {"final", r.st}
  elseif r.rq then
    out[#out + 1] = {"already", r.rq, r.rqb or ""}
  else
    redis.call("HSET", H, "rq", now, "rqb", by)
    redis.call("ZADD", IDX, 0, r.op .. "\0" .. sortkey(r.sid) .. "|" .. id)
    redis.call("XADD", LOG, "MAXLEN", "~", LOG_MAX, "*", "dlq_id", id, "change", "requeued",
      "by", by)
    out[#out + 1] = {"ok", now}
    local h = math.min(KEEP, r.exp + GRACE)
    if not horizon or h > horizon then horizon = h end
  end
end
-- The index lives as long as its longest-lived record (a day more, as the others).
if horizon then
  -- (a kept record's horizon is "never", KEEP ms, as dlq_fail.lua sets the log's)
  for _, key in ipairs({IDX, LOG}) do
    local pttl = redis.call("PTTL", key)
    if (key == IDX and fresh) or (key == LOG and pttl == -1)
        or (pttl >= 0 and now + pttl < horizon) then
      redis.call("PEXPIREAT", key, horizon)
    end
  end
end
return out
