--[[ dlq_purge: remove DLQ records for good, an operator's bulk action (`dlq purge`).

For each given record that is live, not held by a running replay's claim and
(with a status filter) in that status: its stream entry (XDEL), its record
hash, its index entries (expiry, pending, pending-by-op, requeue), its count
and its by-key entry (when it names this record) go, and a "purged" entry
with who did it is appended to the log stream. Other records are left as
they are and answered why. Work per call is bounded by the number of ids.

KEYS[1]  stream                     (<ns>:dlq:{dlq}:stream)
KEYS[2]  expiry index, zset         member "<sid>|<dlq_id>|<p|r|a>|<op>"
KEYS[3]  pending index, lex zset    member "<sortkey(sid)>|<dlq_id>"
KEYS[4]  pending-by-op, lex zset    member "<op>\0<sortkey(sid)>|<dlq_id>"
KEYS[5]  counts hash                field "<status>|<op>" -> live records
KEYS[6]  by-key hash                merge key -> dlq_id of its current record
KEYS[7]  log stream                 (<ns>:dlq:{dlq}:log), capped
KEYS[8]  requeue index, lex zset    member "<op>\0<sortkey(sid)>|<dlq_id>"
KEYS[8+i] the record hash of ARGV[2+i]
ARGV[1]  by                         who purges ("" = unknown)
ARGV[2]  status                     "" = any; "pending" | "replayed" | "abandoned";
                                    "requeued" (pending and marked for redelivery)
ARGV[2+i] a dlq_id, or "<dlq_id> <stream id> <parkings>": the record as the caller
                                    saw it (the console's confirmation); acted on only
                                    while its stream id and parking count ("pk") are
                                    those: a record parked again since under the same
                                    id (new stream id) or into it (a merge: pk + 1) is
                                    kept and answered {"changed"}

Returns {"ok", reply_1, reply_2, ...}, one per id, each one of
  {"ok", status}                    removed (it was in that status)
  {"none"}                          no live record (unknown id or expired)
  {"other", status}                 not in the status asked for: kept
  {"busy", owner}                   a replay holds a live claim on it: kept
  {"changed"}                       not the record the caller saw (see ARGV[2+i]): kept
or {"corrupt", key, detail} (nothing removed).

@acks: replicas
]]
local by, want = ARGV[1] or "", ARGV[2] or ""
--@include lib/dlq_keys.lua
local recs, ids, seen = {}, {}, {}
for i = 3, #ARGV do
  local id, esid, epk = string.match(ARGV[i], "^(%S+) (%d+%-%d+) (%d+)$")
  ids[i] = id or ARGV[i]
  if id then seen[i] = {sid = esid, pk = epk} end
  local H = KEYS[6 + i]
  local kind = redis.call("TYPE", H)["ok"]
  if kind ~= "none" and kind ~= "hash" then
    return {"corrupt", H, "a " .. kind .. " where a DLQ record (hash) belongs"}
  end
  if kind == "hash" then
    local f = redis.call("HMGET", H, "st", "op", "sid", "exp", "rq", "co", "ce", "ik", "pk")
    local exp = tonumber(f[4])
    if (f[1] ~= "pending" and f[1] ~= "replayed" and f[1] ~= "abandoned") or not f[2]
        or not exp or not f[3] or not string.match(f[3], "^%d+%-%d+$") then
      return {"corrupt", H, "record hash without a valid status, operation type, expiry or stream id"}
    end
    if exp > now then
      recs[i] = {st = f[1], op = f[2], sid = f[3], rq = f[5], co = f[6],
                 ce = tonumber(f[7]), ik = f[8], pk = f[9] or "1"}
    end
  end
end

--@include lib/dlq_bump.lua
--@include lib/dlq_unindex.lua
local CODE = {pending = "p", replayed = "r", abandoned = "a"}

ready()
local out = {"ok"}
for i = 3, #ARGV do
  local r, id, e = recs[i], ids[i], seen[i]
  local status = r and ((r.st == "pending" and r.rq) and "requeued" or r.st)
  if not r then
    out[#out + 1] = {"none"}
  elseif want ~= "" and want ~= status and not (want == "pending" and status == "requeued") then
    out[#out + 1] = {"other", status}
  elseif e and (e.sid ~= r.sid or e.pk ~= r.pk) then
    out[#out + 1] = {"changed"}
  elseif r.st == "pending" and r.co and r.ce and r.ce > now then
    out[#out + 1] = {"busy", r.co}
  else
    redis.call("XDEL", S, r.sid)
    redis.call("DEL", KEYS[6 + i])
    redis.call("ZREM", E, r.sid .. "|" .. id .. "|" .. CODE[r.st] .. "|" .. r.op)
    unindex(r.sid, id, r.op)
    bump(r.st .. "|" .. r.op, -1)
    if r.ik and redis.call("HGET", BK, r.ik) == id then redis.call("HDEL", BK, r.ik) end
    redis.call("XADD", LOG, "MAXLEN", "~", LOG_MAX, "*", "dlq_id", id, "change", "purged",
      "operation_type", r.op, "status", r.st, "by", by)
    out[#out + 1] = {"ok", status}
  end
end
return out
