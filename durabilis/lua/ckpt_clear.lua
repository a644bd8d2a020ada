--[[ ckpt_clear: delete checkpoints of one task, current and replaced.

Record keys must be declared, so the caller passes the ids it knows of
(KEYS[7..], ids in ARGV[1..]); the script deletes those that belong to the
task (and their entries in the children index) and returns the ids still
left, which the caller passes next (an empty list means the task is clear).

KEYS[1]  the task's current index   (hash "<escaped agent>:<phase>" -> id)
KEYS[2]  the task's replaced ids    (zset id -> expires ms)
KEYS[3]  live                       (zset "<id>:<task>" -> expires ms)
KEYS[4]  order                      (zset "<id>:<task>" -> sequence)
KEYS[5]  children                   (hash parent id -> its children's tokens: ckpt_save.lua)
KEYS[6]  children expiry            (zset parent id -> the parent's expiry ms)
KEYS[7..] record hashes of ARGV[1..]
ARGV[1..n] ids (n = #KEYS - 6)
ARGV[n+1] batch                    how many remaining ids to return at most
ARGV[n+2] task_id

Returns one of
  {"ok", removed_current (live current checkpoints deleted), {remaining ids}}
  {"corrupt", key, detail}

@acks: replicas
]]
local cur, old, live, order, kids, kidsx = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local batch = tonumber(ARGV[#ARGV - 1])
local task = ARGV[#ARGV]
--@include lib/ckpt_types.lua
local bad = wrong_type({{cur, "hash"}, {old, "zset"}, {live, "zset"}, {order, "zset"},
                        {kids, "hash"}, {kidsx, "zset"}})
if bad then return bad end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local field_of = {}
local entries = redis.call("HGETALL", cur)
for i = 1, #entries, 2 do field_of[entries[i + 1]] = entries[i] end

local removed = 0
for i = 1, #ARGV - 2 do
  local cid, rkey = ARGV[i], KEYS[i + 6]
  local f = field_of[cid]
  if f then
    local member = cid .. ":" .. task
    local e = redis.call("ZSCORE", live, member)
    if e and tonumber(e) > now then removed = removed + 1 end
    redis.call("ZREM", live, member)
    redis.call("ZREM", order, member)
    redis.call("HDEL", cur, f)
    field_of[cid] = nil
    redis.call("DEL", rkey)
    redis.call("HDEL", kids, cid)
    redis.call("ZREM", kidsx, cid)
  elseif redis.call("ZSCORE", old, cid) then
    redis.call("ZREM", old, cid)
    redis.call("DEL", rkey)
    redis.call("HDEL", kids, cid)
    redis.call("ZREM", kidsx, cid)
  end
end

local left = {}
for cid, _ in pairs(field_of) do
  if #left >= batch then break end
  left[#left + 1] = cid
end
if #left < batch then
  local more = redis.call("ZRANGE", old, 0, batch - #left - 1)
  for _, cid in ipairs(more) do left[#left + 1] = cid end
end
return {"ok", removed, left}
