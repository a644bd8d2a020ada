--[[ idem_release: give an in-progress claim back after a failed operation.

Only the current owner's token releases, and only while in progress: a
recorded result is never deleted here.

KEYS[1]  the record hash            (<ns>:idem:{<key>})
ARGV[1]  token                      fencing token from the claim

Returns 1 when released, 0 when the token does not hold an in-progress claim.
]]
local key = KEYS[1]
if redis.call("TYPE", key)["ok"] ~= "hash" then return 0 end
local f = redis.call("HMGET", key, "s", "tok")
if f[1] == "p" and f[2] == ARGV[1] then
  redis.call("DEL", key)
  return 1
end
return 0
