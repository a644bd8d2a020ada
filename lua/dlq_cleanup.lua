--[[ dlq_cleanup: remove expired DLQ records from every structure.

One atomic step per batch: for each given expiry-index member whose expiry
has passed (checked again here, by the server clock), delete its stream entry
(XDEL), its record hash, its index entries and its count. A member that is
no longer in the index (another cleaner got there first) is skipped. A
record hash is deleted only if it still belongs to that member (same stream
id): a caller-chosen dlq_id may have been enqueued again since.

KEYS[1]  stream                     (<ns>:dlq:{dlq}:stream)
KEYS[2]  expiry index, zset         score expires_ms, member "<sid>|<dlq_id>|<p|r|a>|<op>"
KEYS[3]  pending index, lex zset
KEYS[4]  pending-by-op, lex zset
KEYS[5]  counts hash
KEYS[5+i] the record hash of ARGV[i]
ARGV[i]  expiry-index member (from dlq_expired)

Returns {"ok", removed} or {"corrupt", key, detail}.
]]
local S, E, P, PO, C = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local checks = {S, "stream", E, "zset", P, "zset", PO, "zset", C, "hash"}
for i = 1, #checks, 2 do
  local kind = redis.call("TYPE", checks[i])["ok"]
  if kind ~= "none" and kind ~= checks[i + 1] then
    return {"corrupt", checks[i], "a " .. kind .. " where the DLQ keeps a " .. checks[i + 1]}
  end
end

local function sortkey(sid)
  local ms, seq = string.match(sid, "^(%d+)%-(%d+)$")
  return string.rep("0", 15 - #ms) .. ms .. "-" .. string.char(96 + #seq) .. seq
end
local function bump(field, by)
  if redis.call("HINCRBY", C, field, by) <= 0 then redis.call("HDEL", C, field) end
end
local STATUS = {p = "pending", r = "replayed", a = "abandoned"}

local removed = 0
for i, member in ipairs(ARGV) do
  local score = tonumber(redis.call("ZSCORE", E, member))
  if score and score <= now then
    redis.call("ZREM", E, member)
    removed = removed + 1
    local sid, rid, code, rop = string.match(member, "^(%d+%-%d+)|([^|]+)|([pra])|(.*)$")
    if sid then
      redis.call("XDEL", S, sid)
      if code == "p" then
        local pm = sortkey(sid) .. "|" .. rid
        redis.call("ZREM", P, pm)
        redis.call("ZREM", PO, rop .. "\0" .. pm)
      end
      bump(STATUS[code] .. "|" .. rop, -1)
      local H = KEYS[5 + i]
      if redis.call("TYPE", H)["ok"] == "hash" and redis.call("HGET", H, "sid") == sid then
        redis.call("DEL", H)
      end
    end
  end
end
return {"ok", removed}
