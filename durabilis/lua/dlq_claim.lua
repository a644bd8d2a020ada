--[[ dlq_claim: claim a pending DLQ record for replay.

One atomic step: a pending, live record that nobody holds (or whose holder's
claim has expired: the replayer died) gets a new claim with a fencing token;
anyone else is told who holds it. Only the holder of the current token may
then mark the record replayed (dlq_finish) or report the failure (dlq_fail).

A claim keeps the record alive at least as long as the claim: a record that
would expire sooner gets its expiry (field "exp", the hash's TTL and its
expiry-index score) pushed to the claim's expiry, so that the replay's
outcome lands (no cleanup reports the record "expired" mid-replay). The
stream entry's readable "expires_at" keeps the parking's. (The shared keys
outlive the latest record by a day, and a claim lasts at most a day.)

KEYS[1]  stream                     (<ns>:dlq:{dlq}:stream)
KEYS[2]  the record hash            (<ns>:dlq:{dlq}:rec:<dlq_id>)
KEYS[3]  expiry index, zset         (see dlq_enqueue.lua for members)
KEYS[4]  requeue index, lex zset    (optional) when the claim pushes a marked record's
                                    expiry (any claim, a requeue pass's or not), the
                                    index's TTL is pushed to at least that plus a day
ARGV[1]  owner                      who replays (readable: host:pid:...)
ARGV[2]  claim_ms                   how long the claim is held, in milliseconds
ARGV[3]  nonce                      (optional) this claim's own random id, kept as the
                                    token's last part: a claim sent again after a lost
                                    reply that finds its own earlier try holding the
                                    record gets that claim back ("ok", same token)
ARGV[4]  stream id                  (optional) the record's stream entry, as its
                                    pending-index member names it (a replay pass): a
                                    record gone while that entry is still there
                                    expired unreplayed, awaiting cleanup ("expired")
ARGV[5]  dlq_id                     the record's id (with ARGV[4], the id that entry
                                    must name)
ARGV[6]  pass                       (optional) "rq": a requeue pass claiming through the
                                    requeue-index entry naming stream id ARGV[4]; the
                                    mark lives on the record (field "rq"), the index
                                    only finds it: a record without the mark, or whose
                                    stream id is not ARGV[4] (another incarnation
                                    of the id, or an entry left behind), is refused
                                    ("unmarked"; the caller prunes that entry)

Returns one of
  {"ok", token, taken_over (0|1), record hash as a flat field/value list,
   stream entry as a flat field/value list}
  {"none"}                          no live record (unknown id or expired)
  {"expired"}                       (with ARGV[4]) the record expired while pending and
                                    its cleanup has not run yet (it reports it)
  {"final", status}                 already replayed or abandoned
  {"busy", owner, claim_expires_ms} another replayer holds a live claim
  {"unmarked"}                      (ARGV[6] "rq") the pending record carries no
                                    requeue mark for that entry: not claimed
  {"corrupt", key, detail}

Record hash fields: st status, op operation type, sid stream entry id, ts failed
ms, exp expires ms, ra replay attempts, le last replay error, lat last replay
attempt ms, rat/rby replayed at/by, aat/aby abandoned at/by, co claim owner,
ct claim token, ce claim expiry ms, cn claims made.

@acks: replicas
]]
local S, H = KEYS[1], KEYS[2]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local skind = redis.call("TYPE", S)["ok"]
if skind ~= "none" and skind ~= "stream" then
  return {"corrupt", S, "a " .. skind .. " where the DLQ keeps a stream"}
end
local ekind = redis.call("TYPE", KEYS[3])["ok"]
if ekind ~= "none" and ekind ~= "zset" then
  return {"corrupt", KEYS[3], "a " .. ekind .. " where the DLQ keeps a zset"}
end
-- A pending record whose TTL passed: its hash is gone (or going), its stream
-- entry stays until the cleanup that reports it.
local function gone()
  local sid = ARGV[4] or ""
  if sid ~= "" and skind == "stream" then
    local e = redis.call("XRANGE", S, sid, sid)[1]
    if e then
      for i = 1, #e[2], 2 do
        if e[2][i] == "dlq_id" and e[2][i + 1] == ARGV[5] then return {"expired"} end
      end
    end
  end
  return {"none"}
end
local kind = redis.call("TYPE", H)["ok"]
if kind == "none" then return gone() end
if kind ~= "hash" then
  return {"corrupt", H, "a " .. kind .. " where a DLQ record (hash) belongs"}
end

local f = redis.call("HMGET", H, "st", "exp", "sid", "co", "ce", "ct")
local st, exp, sid, co, ce, ct = f[1], tonumber(f[2]), f[3], f[4], tonumber(f[5]), f[6]
local nonce = ARGV[3] or ""
if (st ~= "pending" and st ~= "replayed" and st ~= "abandoned") or not exp or not sid then
  return {"corrupt", H, "record hash without a valid status, expiry or stream id"}
end
if exp <= now then
  if st == "pending" then return gone() end
  return {"none"}
end
if st ~= "pending" then return {"final", st} end
local marked = redis.call("HEXISTS", H, "rq") == 1
if ARGV[6] == "rq" and (not marked or sid ~= ARGV[4]) then return {"unmarked"} end
local mine = co and ce and ce > now and nonce ~= "" and ct
  and string.sub(ct, -(#nonce + 1)) == "-" .. nonce
if co and ce and ce > now and not mine then return {"busy", co, ce} end

local entry = redis.call("XRANGE", S, sid, sid)
if #entry == 0 then
  return {"corrupt", S, "stream entry " .. sid .. " of this record is missing"}
end
if mine then return {"ok", ct, 0, redis.call("HGETALL", H), entry[1][2]} end
local taken_over = 0
if co then taken_over = 1 end
local token = string.format("%d-%d", redis.call("HINCRBY", H, "cn", 1), now)
if nonce ~= "" then token = token .. "-" .. nonce end
local ce = now + tonumber(ARGV[2])
redis.call("HSET", H, "co", ARGV[1], "ct", token, "ce", ce)
if exp < ce then  -- (a kept record's "never" is later than any claim)
  redis.call("HSET", H, "exp", ce)
  redis.call("PEXPIREAT", H, ce)
  local op = redis.call("HGET", H, "op") or ""
  redis.call("ZADD", KEYS[3], "XX", ce, sid .. "|" .. ARGV[5] .. "|p|" .. op)
  -- The index that finds a marked record lives at least as long as the record.
  if marked and KEYS[4] then
    local pttl = redis.call("PTTL", KEYS[4])
    if pttl >= 0 and now + pttl < ce + 86400000 then
      redis.call("PEXPIREAT", KEYS[4], ce + 86400000)
    end
  end
end
return {"ok", token, taken_over, redis.call("HGETALL", H), entry[1][2]}
