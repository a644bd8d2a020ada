--[[ ckpt_find: the live current checkpoints of one task (optionally one agent).

Index entries whose checkpoint expired, was evicted or cleared are never
returned, and are dropped from the task's index here (lazy cleanup).

KEYS[1]  the task's current index   (hash "<escaped agent>:<phase>" -> id)
KEYS[2]  live                       (zset "<id>:<task>" -> expires ms)
KEYS[3]  order                      (zset "<id>:<task>" -> sequence)
ARGV[1]  field prefix               "<escaped agent>:" to keep one agent, "" = every agent
ARGV[2]  task_id
ARGV[3]  limit (optional)           most entries to return (integer >= 1): the index is
                                    read with HSCAN (COUNT ARGV[3]) from its start; for
                                    every agent (ARGV[1] ""), at most 4 * ARGV[3] entries
                                    examined in at most 8 HSCAN calls (a bounded read,
                                    the web console's); for one agent, until that many
                                    of its entries are found (the scan may go through the
                                    whole index, as without ARGV[3], but at most ARGV[3]
                                    entries are returned); absent: the whole index (HGETALL)

Returns one of
  {"ok", {field, id, sequence, field, id, sequence, ...}}
  {"ok", {...}, more}               (with ARGV[3]) more = 1 when the index may hold
                                    entries not returned, else 0
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
-- One index entry: listed when live (and the agent's), dropped when stale.
local function visit(f, cid)
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

local limit = tonumber(ARGV[3] or "")
if not limit then
  local entries = redis.call("HGETALL", cur)
  for i = 1, #entries, 2 do visit(entries[i], entries[i + 1]) end
  return {"ok", out}
end
limit = math.max(1, math.floor(limit))
local cursor, examined, more, calls = "0", 0, 0, 0
local capped = prefix == ""  -- one agent: scan on until its entries are found
repeat
  calls = calls + 1
  local page = redis.call("HSCAN", cur, cursor, "COUNT", limit)
  cursor = page[2] and page[1] or "0"
  local entries = page[2] or {}
  for i = 1, #entries, 2 do
    if #out >= 3 * limit or (capped and examined >= 4 * limit) then more = 1; break end
    examined = examined + 1
    visit(entries[i], entries[i + 1])
  end
until more == 1 or cursor == "0" or #out >= 3 * limit
  or (capped and (examined >= 4 * limit or calls >= 8))
if cursor ~= "0" then more = 1 end
return {"ok", out, more}
