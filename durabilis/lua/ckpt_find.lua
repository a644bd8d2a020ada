--[[ ckpt_find: the live current checkpoints of one task (optionally one agent).

Index entries whose checkpoint expired, was evicted or cleared are never
returned, and are dropped from the task's index here (lazy cleanup).

KEYS[1]  the task's current index   (hash "<escaped agent>:<phase>" -> id)
KEYS[2]  live                       (zset "<id>:<task>" -> expires ms)
KEYS[3]  order                      (zset "<id>:<task>" -> sequence)
ARGV[1]  field prefix               "<escaped agent>:" to keep one agent, "" = every agent
ARGV[2]  task_id

Returns one of
  {"ok", {field, id, sequence, field, id, sequence, ...}}
  {"corrupt", key, detail}

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local cur, live, order = KEYS[1], KEYS[2], KEYS[3]
local prefix, task = ARGV[1], ARGV[2]
--@include lib/ckpt_types.lua
local bad = wrong_type({{cur, "hash"}, {live, "zset"}, {order, "zset"}})
if bad then return bad end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local out = {}
local entries = redis.call("HGETALL", cur)
for i = 1, #entries, 2 do
  local f, cid = entries[i], entries[i + 1]
  local member = cid .. ":" .. task
  local e = redis.call("ZSCORE", live, member)
  if e and tonumber(e) > now then
    if prefix == "" or string.sub(f, 1, #prefix) == prefix then
      out[#out + 1] = f
      out[#out + 1] = cid
      out[#out + 1] = redis.call("ZSCORE", order, member) or "0"
    end
  else
    redis.call("HDEL", cur, f)
  end
end
return {"ok", out}
