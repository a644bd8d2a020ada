--[[ dlq_expired: list expired DLQ records awaiting cleanup (read-only).

The first step of cleanup_expired: the caller turns the members into record
hash keys and passes them to dlq_cleanup (key names are never built here).

KEYS[1]  expiry index, zset         (see dlq_enqueue.lua for members)
ARGV[1]  limit                      at most this many members

Returns {"ok", member, member, ...} (oldest expiry first) or {"corrupt", key, detail}.

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local E = KEYS[1]
local kind = redis.call("TYPE", E)["ok"]
if kind ~= "none" and kind ~= "zset" then
  return {"corrupt", E, "a " .. kind .. " where the DLQ keeps a sorted set"}
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {"ok"}
for _, m in ipairs(redis.call("ZRANGEBYSCORE", E, "-inf", now, "LIMIT", 0, tonumber(ARGV[1]))) do
  out[#out + 1] = m
end
return out
