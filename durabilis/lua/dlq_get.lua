--[[ dlq_get: read DLQ records (read-only), judged by the server clock.

One consistent snapshot of several records: each record hash, and its
stream entry when asked. A record whose expiry has passed reads as absent,
even before cleanup_expired removes it.

KEYS[1]  stream                     (<ns>:dlq:{dlq}:stream)
KEYS[2..n+1] record hashes          (<ns>:dlq:{dlq}:rec:<dlq_id>)
ARGV[1]  with_stream                "1" = include each record's stream entry

Returns a list with one item per record hash, in KEYS order:
  {"ok", record hash as a flat field/value list, stream entry as a flat
   field/value list (empty when not asked)}
  {"none"}                          no live record
  {"corrupt", key, detail}

@acks: none   (a read, at most dropping stale index entries: a replica down
              must not stop an operator or a caller reading)
]]
local S = KEYS[1]
local with_stream = ARGV[1] == "1"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local skind = redis.call("TYPE", S)["ok"]
local out = {}
for i = 2, #KEYS do
  local H = KEYS[i]
  local kind = redis.call("TYPE", H)["ok"]
  if kind == "none" then
    out[#out + 1] = {"none"}
  elseif kind ~= "hash" then
    out[#out + 1] = {"corrupt", H, "a " .. kind .. " where a DLQ record (hash) belongs"}
  else
    local f = redis.call("HMGET", H, "exp", "sid")
    local exp, sid = tonumber(f[1]), f[2]
    if not exp or not sid then
      out[#out + 1] = {"corrupt", H, "record hash without a valid expiry or stream id"}
    elseif exp <= now then
      out[#out + 1] = {"none"}
    elseif not with_stream then
      out[#out + 1] = {"ok", redis.call("HGETALL", H), {}}
    elseif skind ~= "stream" then
      out[#out + 1] = {"corrupt", S, "a " .. skind .. " where the DLQ keeps a stream"}
    else
      local entry = redis.call("XRANGE", S, sid, sid)
      if #entry == 0 then
        out[#out + 1] = {"corrupt", S, "stream entry " .. sid .. " of a live record is missing"}
      else
        out[#out + 1] = {"ok", redis.call("HGETALL", H), entry[1][2]}
      end
    end
  end
end
return out
