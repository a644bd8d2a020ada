--[[ ckpt_get: read one checkpoint record by id, judged by the server clock.

When the caller knows the task, a record that is gone while the live index
still lists it (deleted by an operator or by a volatile-* maxmemory policy) is
dropped from the index here, so the count and the cap stop counting it.

KEYS[1]  the record hash            (<ns>:ckpt:{ckpt}:rec:<id>)
KEYS[2]  live                       (zset "<id>:<task>" -> expires ms)
KEYS[3]  order                      (zset "<id>:<task>" -> sequence)
ARGV[1]  id
ARGV[2]  task_id                    "" = unknown (no index repair)

Returns one of
  {"ok", task, agent, phase, state, created_ms, expires_ms, parent ("" = none)}
  {"none"}
  {"corrupt", key, detail}

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local rec, live, order = KEYS[1], KEYS[2], KEYS[3]
local ty = redis.call("TYPE", rec)["ok"]
if ty == "none" then
  if ARGV[2] ~= "" then
    local member = ARGV[1] .. ":" .. ARGV[2]
    if redis.call("TYPE", live)["ok"] == "zset" then redis.call("ZREM", live, member) end
    if redis.call("TYPE", order)["ok"] == "zset" then redis.call("ZREM", order, member) end
  end
  return {"none"}
end
if ty ~= "hash" then
  return {"corrupt", rec, "a " .. ty .. " where a checkpoint record (hash) belongs"}
end
local f = redis.call("HMGET", rec, "t", "a", "p", "s", "c", "e", "pa")
if not (f[1] and f[2] and f[3] and f[4] and tonumber(f[5]) and tonumber(f[6])) then
  return {"corrupt", rec, "checkpoint record without task, agent, phase, state or timestamps"}
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(f[6]) <= now then return {"none"} end
return {"ok", f[1], f[2], f[3], f[4], f[5], f[6], f[7] or ""}
