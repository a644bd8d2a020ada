--[[ retry_budget: record a call, or ask to spend one retry, in an operation type's
fleet-wide retry budget.

One atomic step over a sliding window kept as buckets of the Redis server clock:
a retry is granted only if, counting it, the window's retries stay within
    ratio * calls + min_retries
where calls are the operations started (first attempts) in the window.

KEYS[1]  the budget hash            (<ns>:retry:{<operation_type>}:budget)
ARGV[1]  mode                       "call": record one call; "retry": spend one retry if allowed
ARGV[2]  bucket_ms                  width of one bucket (ms, >= 1)
ARGV[3]  buckets                    buckets in the window (window = buckets * bucket_ms)
ARGV[4]  ratio_ppm                  retries allowed per call, in millionths (200000 = 20 %)
ARGV[5]  min_retries                retries allowed per window whatever the traffic

Returns one of
  {"ok", calls, retries}            the call was recorded / the retry was granted
  {"denied", calls, retries}        the retry was refused: the budget is spent
  {"corrupt", detail}               the key holds something durabilis did not write
(calls and retries: totals in the window after this step)

Fields of the hash: b bucket_ms the buckets were made with, c<n> calls and
r<n> retries of bucket n = floor(server_ms / bucket_ms). Stale buckets are
deleted here, buckets ahead of the server clock (it stepped back) are moved
into the current one; the key expires one window after its last write.
]]
local key = KEYS[1]
local mode = ARGV[1]
local bucket_ms = tonumber(ARGV[2])
local buckets = tonumber(ARGV[3])
local ratio_ppm = tonumber(ARGV[4])
local min_retries = tonumber(ARGV[5])
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = math.floor(now / bucket_ms)
local oldest = current - buckets + 1

local kind = redis.call("TYPE", key)["ok"]
if kind ~= "none" and kind ~= "hash" then
  return {"corrupt", "a " .. kind .. " where a retry budget (hash) belongs"}
end

local calls, retries = 0, 0
local stale = {}
-- Buckets AHEAD of the current one were written before the server clock
-- stepped back (an NTP correction, a failover to a replica with a slower
-- clock): still counted, and moved into the current bucket (below), so they
-- leave the window one window from now instead of only once the clock has
-- caught up with them (a spent budget would not come back for that long).
local ahead = {}
if kind == "hash" then
  local flat = redis.call("HGETALL", key)
  local made_with = nil
  for i = 1, #flat, 2 do
    if flat[i] == "b" then made_with = tonumber(flat[i + 1]) end
  end
  if made_with ~= bucket_ms then
    -- Buckets of another width (a changed window) cannot be summed with ours: start afresh.
    if made_with == nil and #flat > 0 then
      return {"corrupt", "retry budget hash without its bucket width field"}
    end
    stale = nil  -- drop the whole hash (after the checks, below)
    flat = {}
  end
  for i = 1, #flat, 2 do
    local name, text = flat[i], flat[i + 1]
    if name ~= "b" then
      local what, n = string.match(name, "^([cr])(%d+)$")
      -- Digits only, as HINCRBY reads them (tonumber also takes "5.0", "1e1", "0x3").
      local value = string.match(text, "^%d+$") and #text <= 15 and tonumber(text)
      if not what or not value then
        return {"corrupt", "unexpected field " .. name .. " in a retry budget"}
      end
      n = tonumber(n)
      if n < oldest then
        stale[#stale + 1] = name
      else
        if n > current then
          ahead[#ahead + 1] = {name, what, value}
        end
        if what == "c" then
          calls = calls + value
        else
          retries = retries + value
        end
      end
    end
  end
end
if mode ~= "call" and mode ~= "retry" then
  return redis.error_reply("retry_budget: unknown mode " .. tostring(mode))
end
ready()
if stale == nil then
  redis.call("DEL", key)
elseif #stale > 0 then
  redis.call("HDEL", key, unpack(stale))
end
for _, moved in ipairs(ahead) do
  redis.call("HDEL", key, moved[1])
  redis.call("HINCRBY", key, moved[2] .. current, string.format("%d", moved[3]))
end

local tag = "ok"
if mode == "call" then
  redis.call("HINCRBY", key, "c" .. current, 1)
  calls = calls + 1
elseif mode == "retry" then
  -- Integers only (ppm), so the comparison is exact: (retries + 1) <= ratio * calls + min.
  if (retries + 1) * 1000000 <= ratio_ppm * calls + min_retries * 1000000 then
    redis.call("HINCRBY", key, "r" .. current, 1)
    retries = retries + 1
  else
    tag = "denied"
  end
end
if tag == "ok" or #ahead > 0 then  -- (a denial that moved buckets wrote them too)
  redis.call("HSET", key, "b", bucket_ms)
  redis.call("PEXPIRE", key, (buckets + 1) * bucket_ms)
end
return {tag, calls, retries}
