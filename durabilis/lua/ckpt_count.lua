--[[ ckpt_count: how many current checkpoints are live in the namespace.

KEYS[1]  live                       (zset "<id>:<task>" -> expires ms)
KEYS[2]  order                      (zset "<id>:<task>" -> sequence)

Returns the count (integer), or {"corrupt", key, detail}.

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local live, order = KEYS[1], KEYS[2]
for _, k in ipairs({live, order}) do
  local ty = redis.call("TYPE", k)["ok"]
  if ty ~= "none" and ty ~= "zset" then
    return {"corrupt", k, "a " .. ty .. " where a checkpoint zset belongs"}
  end
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call("ZRANGEBYSCORE", live, "-inf", now, "LIMIT", 0, 1000)
if #dead > 0 then
  redis.call("ZREM", live, unpack(dead))
  redis.call("ZREM", order, unpack(dead))
end
return redis.call("ZCOUNT", live, "(" .. now, "+inf")
