--[[ dlq_stats: counts of live DLQ records (read-only), judged by the server clock.

Bounded work per call, however large the expired backlog. The counts hash
includes records that have expired but are not cleaned up yet: the first
ARGV[1] of them (earliest expiry first) are read from the expiry index and
returned so the caller subtracts them, and ZCOUNT (O(log n)) says how many
there are in all. When there are more than ARGV[1] ("capped"), the caller
cannot subtract the ones not read and says its counts are upper bounds.

The oldest live pending record is the first pending-index member that has not
expired. Uncapped, every expired record was read: the first member not among
them is it (at most ARGV[1] + 64 members are looked at). Capped, a member not
among them is checked (its stream entry names its operation type, hence its
expiry-index member and score): up to 64 members in order, then a binary
search of the rest for the first live one (exact when expiry follows enqueue
order, as with one TTL for every record; else a live pending record, maybe not
the oldest). At most 64 + 2 * log2(pending) members are checked.

KEYS[1]  expiry index, zset         (see dlq_enqueue.lua for members)
KEYS[2]  pending index, lex zset
KEYS[3]  counts hash                "<status>|<op>" -> records (live or awaiting cleanup);
                                    "expired|<op>" -> pending records reported expired
                                    (returned as they are: the caller adds the pending
                                    ones read among the expired to them)
KEYS[4]  stream                     (read only when capped)
ARGV[1]  scan limit                 read at most this many expired members

Returns one of
  {"ok", now_ms, counts as a flat "<status>|<op>"/n list, expired records read
   as a flat "<status>|<op>"/n list, oldest live pending member ("" = none),
   expired records in all, expired records read}
  {"corrupt", key, detail}

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local E, P, C, S = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
--@include lib/dlq_types.lua

local checks = {E, "zset", P, "zset", C, "hash", S, "stream"}
local bad = wrong_type(checks)
if bad then return bad end
local limit = math.max(1, math.floor(tonumber(ARGV[1]) or 1000))
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

--@include lib/sortkey.lua
local STATUS = {p = "pending", r = "replayed", a = "abandoned"}

local read = redis.call("ZRANGEBYSCORE", E, "-inf", now, "LIMIT", 0, limit)
local expired = #read
if expired >= limit then expired = redis.call("ZCOUNT", E, "-inf", now) end
local capped = expired > #read
local backlog, expired_pending = {}, {}
for _, m in ipairs(read) do
  local sid, rid, code, rop = string.match(m, "^(%d+%-%d+)|([^|]+)|([pra])|(.*)$")
  if sid then
    local field = STATUS[code] .. "|" .. rop
    backlog[field] = (backlog[field] or 0) + 1
    if code == "p" then expired_pending[sortkey(sid) .. "|" .. rid] = true end
  end
end
local flat = {}
for field, n in pairs(backlog) do
  flat[#flat + 1] = field
  flat[#flat + 1] = n
end

-- Whether a pending-index member "<sort key>|<dlq_id>" is a live record.
local function live(m)
  if expired_pending[m] then return false end
  if not capped then return true end
  local ms, seq, rid = string.match(m, "^0*(%d+)%-%a(%d+)|(.+)$")
  if not ms then return false end
  local sid = ms .. "-" .. seq
  local entry = redis.call("XRANGE", S, sid, sid)
  if #entry == 0 then return false end
  local fields, op = entry[1][2], nil
  for i = 1, #fields, 2 do
    if fields[i] == "operation_type" then op = fields[i + 1] break end
  end
  if not op then return false end
  local score = redis.call("ZSCORE", E, sid .. "|" .. rid .. "|p|" .. op)
  return score ~= false and score ~= nil and tonumber(score) > now
end
local function at(rank)
  return redis.call("ZRANGE", P, rank, rank)[1]
end

local oldest, rank, checked = "", 0, 0
while oldest == "" and rank <= limit + 63 and checked < 64 do
  local page = redis.call("ZRANGE", P, rank, rank + 63)
  for _, m in ipairs(page) do
    if live(m) then oldest = m break end
    if not expired_pending[m] then checked = checked + 1 end
    rank = rank + 1
    if checked >= 64 then break end
  end
  if #page < 64 then break end
end
if oldest == "" and capped then
  local lo, hi = rank, redis.call("ZCARD", P)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if live(at(mid)) then hi = mid else lo = mid + 1 end
  end
  local m = at(lo)
  if m and live(m) then oldest = m end
end
return {"ok", now, redis.call("HGETALL", C), flat, oldest, expired, #read}
