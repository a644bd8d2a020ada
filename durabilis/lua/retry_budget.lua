--[[ retry_budget: record a call, or ask to spend one retry, in an operation type's
fleet-wide retry budget.

One atomic step over sliding windows of the Redis server clock. A setting is
(ratio, min_retries, window); under a setting a retry is granted only if,
counting it, the window's retries stay within
    ratio * calls + min_retries
where calls are the operations started (first attempts) in the window.

Replicas may disagree about the setting (a rolling deploy, a lagging config
sync, a CLI run with another file): the hash remembers every setting seen with
when it was last used, and a retry is granted only if EVERY live setting (the
caller's own, and each one used within its own window) allows it. So the fleet
never grants more than the strictest setting in use would; a stricter setting
stops binding one of its windows after the last replica using it stops.

Counts live in buckets named by their absolute start and width (ms), whatever
the caller's window: changing the window keeps what was spent. A setting's
width is the largest power of two <= its window / 10; new counts go to
buckets of the finest live width, so every live setting counts them exactly.
Powers of two nest: an old bucket is merged into the widest bucket holding it
(up to the coarsest live width) that no finer setting counts any more, so the
hash keeps a few buckets per doubling of age (a retry then counts a little
longer, a call a little shorter, for coarse settings only: never more budget).
Counting is conservative for every setting of window W, at server time now:
  a call bucket counts if its start >= now - W        (a call never counts past W)
  a retry bucket counts if its end > now - W          (a retry counts for >= W)

KEYS[1]  the budget hash            (<ns>:retry:{<operation_type>}:budget2)
ARGV[1]  mode                       "call": record one call; "retry": spend one retry if allowed
ARGV[2]  window_ms                  the caller's window (ms, integer >= 10)
ARGV[3]  ratio_ppm                  retries allowed per call, in millionths (200000 = 20 %)
ARGV[4]  min_retries                retries allowed per window whatever the traffic

Returns one of
  {"ok", calls, retries}            the call was recorded / the retry was granted
  {"denied", calls, retries}        the retry was refused: some live setting's budget is spent
  {"corrupt", detail}               the key holds something durabilis did not write
(calls and retries: totals in the caller's own window after this step)

Fields of the hash (every value ASCII digits):
  c<start>:<width>                  calls of the bucket [start, start + width) ms
  r<start>:<width>                  retries of that bucket
  s<ratio_ppm>:<min_retries>:<window_ms>   a setting -> when it was last used (ms)
Stale buckets and settings are deleted here; buckets and settings ahead of the
server clock (it stepped back) are moved to now, so a spent budget comes back
one window from now, not once the clock has caught up with them. At most 64
settings are remembered (more: the caller's own still applies to its call).
The key expires once nothing in it can count any more (longest live window +
its bucket width after the last write).

@acks: replicas
]]
local key = KEYS[1]
local mode = ARGV[1]
local window = tonumber(ARGV[2])
local ratio_ppm = tonumber(ARGV[3])
local min_retries = tonumber(ARGV[4])
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local MAX_SETTINGS = 64
local MAX_WINDOW = 3600000  -- RetryBudget.window_seconds' maximum (durabilis._limits), in ms

local function width_of(w)  -- the largest power of two <= w / 10 (at least 1)
  local width = 1
  while width * 2 <= w / 10 do width = width * 2 end
  return width
end

local kind = redis.call("TYPE", key)["ok"]
if kind ~= "none" and kind ~= "hash" then
  return {"corrupt", "a " .. kind .. " where a retry budget (hash) belongs"}
end
if mode ~= "call" and mode ~= "retry" then
  return redis.error_reply("retry_budget: unknown mode " .. tostring(mode))
end

local own = string.format("s%d:%d:%d", ratio_ppm, min_retries, window)
local settings = {}   -- the live ones: {field, ratio_ppm, min_retries, window_ms, width, seen}
local buckets = {}    -- {field, what, start, width, count}
local drop = {}       -- fields to delete
local seen_own = false
if kind == "hash" then
  local flat = redis.call("HGETALL", key)
  for i = 1, #flat, 2 do
    local name, text = flat[i], flat[i + 1]
    -- Digits only, as HINCRBY reads them (tonumber also takes "5.0", "1e1", "0x3").
    local value = string.match(text, "^%d+$") and #text <= 15 and tonumber(text)
    if not value then
      return {"corrupt", "unexpected value of field " .. name .. " in a retry budget"}
    end
    local what, a, b = string.match(name, "^([cr])(%d+):(%d+)$")
    if what and #a <= 15 and #b <= 15 then
      local start, width = tonumber(a), tonumber(b)
      if width < 1 or width > MAX_WINDOW or width_of(width * 10) ~= width
          or start % width ~= 0 then
        return {"corrupt", "unexpected bucket " .. name .. " in a retry budget"}
      end
      buckets[#buckets + 1] = {name, what, start, width, value}
    else
      local r, m, w = string.match(name, "^s(%d+):(%d+):(%d+)$")
      if not r or #r > 15 or #m > 15 or #w > 15 or tonumber(w) < 1
          or tonumber(w) > MAX_WINDOW then
        return {"corrupt", "unexpected field " .. name .. " in a retry budget"}
      end
      w = tonumber(w)
      if name == own then
        seen_own = true  -- rewritten below with now
      elseif value > now - w then  -- used within its window (or ahead: clamped to now)
        if value > now then value = now end
        settings[#settings + 1] = {name, tonumber(r), tonumber(m), w, width_of(w), value}
      else
        drop[#drop + 1] = name  -- its last replica stopped a window ago
      end
    end
  end
end
local record_own = seen_own or #settings < MAX_SETTINGS
settings[#settings + 1] = {own, ratio_ppm, min_retries, window, width_of(window), now}

local longest, finest, coarsest = 0, nil, 0
for _, s in ipairs(settings) do
  if s[4] > longest then longest = s[4] end
  if finest == nil or s[5] < finest then finest = s[5] end
  if s[5] > coarsest then coarsest = s[5] end
end

-- Re-home each bucket: ahead of the clock -> its current bucket; stale -> gone;
-- old enough that no finer setting counts a wider bucket holding it -> that one.
local counts = {}     -- field -> count, after re-homing
local order = {}      -- {field, what, start, width}
local function put(name, what, start, width, n)
  if counts[name] == nil then
    order[#order + 1] = {name, what, start, width}
    counts[name] = 0
  end
  counts[name] = counts[name] + n
end
local moved = false
for _, bk in ipairs(buckets) do
  local name, what, start, width, n = bk[1], bk[2], bk[3], bk[4], bk[5]
  if start > now then start = now - now % width end
  if start + width <= now - longest then
    drop[#drop + 1] = name
    moved = true
  else
    -- The widest power of two (up to the coarsest live width) whose bucket
    -- holding this one no finer setting counts any more: old buckets merge
    -- into ever wider ones, a few per doubling of age.
    local cand = width * 2
    while cand <= coarsest do
      local from = start - start % cand
      local ok = true
      for _, s in ipairs(settings) do
        if s[5] < cand and from + cand > now - s[4] then ok = false; break end
      end
      if not ok then break end  -- (a wider one holds this one: counted too)
      width, start = cand, from
      cand = cand * 2
    end
    local target = what .. string.format("%d:%d", start, width)
    if target ~= name then moved = true end
    put(target, what, start, width, n)
  end
end

-- What each live setting counts; the caller's own totals are what it is told.
local function totals(s)
  local calls, retries = 0, 0
  for _, bk in ipairs(order) do
    local what, start, width = bk[2], bk[3], bk[4]
    if what == "c" and start >= now - s[4] then calls = calls + counts[bk[1]] end
    if what == "r" and start + width > now - s[4] then retries = retries + counts[bk[1]] end
  end
  return calls, retries
end

-- New counts go to the finest live width: every live setting counts them exactly.
local current = now - now % finest
local tag = "ok"
local calls, retries = totals(settings[#settings])
if mode == "call" then
  calls = calls + 1
else
  for _, s in ipairs(settings) do
    local c, r = totals(s)
    -- Integers only (ppm), so the comparison is exact: (retries + 1) <= ratio * calls + min.
    if (r + 1) * 1000000 > s[2] * c + s[3] * 1000000 then tag = "denied" end
  end
  if tag == "ok" then retries = retries + 1 end
end

ready()
if moved then
  -- A bucket re-homed or dropped: rewrite the buckets as counted above.
  for _, bk in ipairs(buckets) do
    if counts[bk[1]] == nil or counts[bk[1]] ~= bk[5] then drop[#drop + 1] = bk[1] end
  end
end
for i = 1, #drop, 1000 do  -- in chunks: unpack() has a stack limit
  redis.call("HDEL", key, unpack(drop, i, math.min(i + 999, #drop)))
end
if moved then
  for _, bk in ipairs(order) do
    redis.call("HSET", key, bk[1], string.format("%d", counts[bk[1]]))
  end
end
for _, s in ipairs(settings) do
  if s[1] ~= own and s[6] == now then
    redis.call("HSET", key, s[1], string.format("%d", now))  -- one that was ahead of the clock
  end
end
if record_own then redis.call("HSET", key, own, string.format("%d", now)) end
if mode == "call" then
  redis.call("HINCRBY", key, string.format("c%d:%d", current, finest), 1)
elseif tag == "ok" then
  redis.call("HINCRBY", key, string.format("r%d:%d", current, finest), 1)
end
redis.call("PEXPIRE", key, string.format("%d", longest + width_of(longest)))
return {tag, calls, retries}
