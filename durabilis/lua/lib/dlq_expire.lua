--@include lib/dlq_bump.lua
--@include lib/dlq_unindex.lua
-- lib/dlq_expire.lua: purge(member, H), remove a record whose expiry passed
-- (dlq_cleanup, and dlq_enqueue's bounded purge before it adds): its expiry-index
-- member "<sid>|<dlq_id>|<p|r|a>|<op>" and stream entry go, a pending one's index
-- entries too, its count drops; a record that expired pending is reported
-- (report_expired: its log entry, with what its stream entry says, its
-- "expired|<op>" count, its by-key entry, and the flat list `expired` the script
-- returns: dlq_id, operation type, idempotency key ("" = none), agent_id).
-- H: the record hash, when the script has it in KEYS (dlq_cleanup): it goes
-- only while it is this record's (no record of that id made since). nil
-- (dlq_enqueue): its own TTL, equal to the expiry, has already removed it.
-- Needs locals S, E, P, PO, C, BK, LOG, RQ (keys) and LOG_MAX.
local STATUS = {p = "pending", r = "replayed", a = "abandoned"}

local expired = {}
local function report_expired(sid, rid, rop, H)
  local ik, agent = "", ""
  local e = redis.call("XRANGE", S, sid, sid)[1]
  if e then
    for i = 1, #e[2], 2 do
      if e[2][i] == "meta:idempotency_key" then ik = e[2][i + 1] end
      if e[2][i] == "agent_id" then agent = e[2][i + 1] end
    end
  end
  -- The entry goes only if it names this record: rid, and no live hash of rid
  -- from another stream entry (a record of that id made since). Without H
  -- (dlq_enqueue) that is exact already: an id whose record expired pending is
  -- never given to a new record while the key's entry names it.
  if ik ~= "" and redis.call("HGET", BK, ik) == rid
      and (not H or redis.call("TYPE", H)["ok"] ~= "hash"
           or redis.call("HGET", H, "sid") == sid) then
    redis.call("HDEL", BK, ik)
  end
  redis.call("XADD", LOG, "MAXLEN", "~", LOG_MAX, "*", "dlq_id", rid, "change", "expired",
    "operation_type", rop, "idempotency_key", ik, "agent_id", agent)
  redis.call("HINCRBY", C, "expired|" .. rop, 1)
  for _, v in ipairs({rid, rop, ik, agent}) do expired[#expired + 1] = v end
end

local function purge(member, H)
  redis.call("ZREM", E, member)
  local sid, rid, code, rop = string.match(member, "^(%d+%-%d+)|([^|]+)|([pra])|(.*)$")
  if not sid then return end
  if code == "p" then report_expired(sid, rid, rop, H) end
  redis.call("XDEL", S, sid)
  if code == "p" then unindex(sid, rid, rop) end
  bump(STATUS[code] .. "|" .. rop, -1)
  if H and redis.call("TYPE", H)["ok"] == "hash" and redis.call("HGET", H, "sid") == sid then
    redis.call("DEL", H)
  end
end
