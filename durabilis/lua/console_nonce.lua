--[[ console_nonce: spend a web console confirmation's nonce (each confirmation acts once).

Every confirmation page of the console (requeue, abandon, purge; one record or
a filter's) carries a random nonce and its issue time, signed with the rest of
the form. The POST that acts spends the nonce here first, in one step: the
first POST finds no key and creates it, any later POST of the same form (a
refresh, back and resubmit, a replayed request) finds it and is refused. The
key is counted up (INCR: the operator's documented ACL has no SET) and lives
ARGV[1] ms, no shorter than the age after which the console refuses a
confirmation anyway (its signed issue time).

KEYS[1]  the nonce's key            (<ns>:layer:{layer}:console-nonce:<nonce>), a string
ARGV[1]  ttl, ms                    of the key (integer >= 1)

Returns {"ok", 1} (spent now: act), {"ok", 0} (spent before: refuse),
or {"corrupt", key, detail} (nothing written).

@acks: replicas
]]
local K, ttl = KEYS[1], tonumber(ARGV[1])
local kind = redis.call("TYPE", K)["ok"]
if kind ~= "none" and kind ~= "string" then
  return {"corrupt", K, "a " .. kind .. " where a console nonce (string) belongs"}
end
if not ttl or ttl < 1 then return {"corrupt", K, "ttl must be a whole number of ms >= 1"} end
if kind == "string" then return {"ok", 0} end
ready()
redis.call("INCR", K)
redis.call("PEXPIRE", K, math.floor(ttl))
return {"ok", 1}
