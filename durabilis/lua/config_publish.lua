--[[ config_publish: store (or remove) one fleet-wide config entry and bump the version.

The fleet config is ONE hash, readable with redis-cli HGETALL:
  "v"                       version, bumped by every change (replicas poll it)
  "t"                       server time of the last change (ms); replicas poll
                            the pair (v, t): should the hash be lost, later
                            publishes count v from 0 again
  "retry:<operation_type>"  a retry policy as JSON text
  "breaker:<name>"          a circuit breaker config as JSON text
Every change is also appended to a capped log stream (what, who, when).
Neither key has a TTL: the fleet config lives as long as the namespace
(the documented exception to "every key expires", see docs/production.md).

KEYS[1]  fleet config hash   <ns>:config:{config}:fleet
KEYS[2]  change log stream   <ns>:config:{config}:log
ARGV[1]  mode                "set" | "del"
ARGV[2]  field               "retry:<operation_type>" | "breaker:<name>"
ARGV[3]  json                the entry as JSON text ("" with "del")
ARGV[4]  replica             who makes the change (for the log)
ARGV[5]  log_maxlen          approximate cap of the log stream (entries)

Returns one of
  {"ok", version, at_ms}     stored / removed; the version was bumped
  {"same", version}          "set" of the value already stored, or "del" of a
                             missing field: nothing written, version unchanged
  {"corrupt", key, detail}   foreign data at one of the keys (nothing written)

@acks: replicas
]]
local fleet, log = KEYS[1], KEYS[2]
local mode, field, json = ARGV[1], ARGV[2], ARGV[3]

local kind = redis.call("TYPE", fleet)["ok"]
if kind ~= "none" and kind ~= "hash" then
  return {"corrupt", fleet, "a " .. kind .. " where the fleet config hash belongs"}
end
kind = redis.call("TYPE", log)["ok"]
if kind ~= "none" and kind ~= "stream" then
  return {"corrupt", log, "a " .. kind .. " where the config change log stream belongs"}
end
local cur = redis.call("HMGET", fleet, "v", field)
local v = 0
if cur[1] then
  -- Digits only, as replicas read it (tonumber would also take "1e3", "0x10").
  v = string.match(cur[1], "^%d+$") and tonumber(cur[1])
  if not v or v >= 1e15 then
    return {"corrupt", fleet, "field v is not a version number"}
  end
end

if mode == "set" then
  if cur[2] == json then return {"same", v} end
elseif not cur[2] then
  return {"same", v}
end

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
v = v + 1
local vs, ts = string.format("%d", v), string.format("%d", now)
if mode == "set" then
  redis.call("HSET", fleet, field, json, "v", vs, "t", ts)
else
  redis.call("HDEL", fleet, field)
  redis.call("HSET", fleet, "v", vs, "t", ts)
end
redis.call("XADD", log, "MAXLEN", "~", ARGV[5], "*",
  "version", vs, "mode", mode, "field", field, "by", ARGV[4], "json", json)
return {"ok", v, now}
