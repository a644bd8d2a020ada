--[[ dlq_stats: counts of live DLQ records (read-only), judged by the server clock.

The counts hash includes records that have expired but are not cleaned up
yet; they are read from the expiry index and returned separately so the
caller subtracts them (this costs O(expired backlog), which enqueue and
cleanup_expired keep short). The oldest live pending record is the first
pending-index member that has not expired.

KEYS[1]  expiry index, zset         (see dlq_enqueue.lua for members)
KEYS[2]  pending index, lex zset
KEYS[3]  counts hash

Returns one of
  {"ok", now_ms, counts as a flat "<status>|<op>"/n list, expired backlog as a
   flat "<status>|<op>"/n list, oldest live pending member ("" = none)}
  {"corrupt", key, detail}
]]
local E, P, C = KEYS[1], KEYS[2], KEYS[3]
local checks = {E, "zset", P, "zset", C, "hash"}
for i = 1, #checks, 2 do
  local kind = redis.call("TYPE", checks[i])["ok"]
  if kind ~= "none" and kind ~= checks[i + 1] then
    return {"corrupt", checks[i], "a " .. kind .. " where the DLQ keeps a " .. checks[i + 1]}
  end
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function sortkey(sid)
  local ms, seq = string.match(sid, "^(%d+)%-(%d+)$")
  return string.rep("0", 15 - #ms) .. ms .. "-" .. string.char(96 + #seq) .. seq
end
local STATUS = {p = "pending", r = "replayed", a = "abandoned"}

local backlog, expired_pending = {}, {}
for _, m in ipairs(redis.call("ZRANGEBYSCORE", E, "-inf", now)) do
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

local oldest, offset = "", 0
while oldest == "" do
  local page = redis.call("ZRANGE", P, offset, offset + 63)
  if #page == 0 then break end
  for _, m in ipairs(page) do
    if not expired_pending[m] then oldest = m break end
  end
  offset = offset + 64
end
return {"ok", now, redis.call("HGETALL", C), flat, oldest}
