-- lib/idem_clock.lua: t and now, the server's clock (TIME; now in ms), and
-- int(v), a stored integer or nil: tonumber() alone also accepts "inf", "nan"
-- and fractions, which would poison every comparison and TTL. Needs a local
-- INT_LIMIT: int() accepts -INT_LIMIT < n < INT_LIMIT (1e15 for milliseconds,
-- 1e16 where fencing tokens in microseconds are read too).
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function int(v)
  local n = tonumber(v)
  if n and n == n and n > -INT_LIMIT and n < INT_LIMIT and n == math.floor(n) then return n end
  return nil
end
