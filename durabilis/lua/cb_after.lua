--[[ cb_after: report the outcome of an admitted call (circuit breaker).

One atomic step for the whole fleet.
- A permit from another generation than the current one is stale: ignored,
  so old results never pollute the current window.
- CLOSED: the result enters the window (sorted set, one member per result,
  score = a strictly increasing server-clock score: ms * 1000 + tie-breaker).
  Results older than window_ms (if > 0) and beyond the newest window_size leave
  it. With at least min_requests results, the breaker trips when the failure
  rate > threshold, or the slow-call rate > slow_threshold (slow rule on), and,
  when min_reporters > 1, at least min_reporters distinct replicas reported a
  bad result (failure or slow) still inside the window.
- HALF_OPEN: only a probe in flight counts (its slot is freed); a report naming
  no live probe is a stray and is ignored. A probe admitted probe_timeout_ms or
  more ago is presumed abandoned: its report is not credited (its slot is
  freed, the report ignored), even before a caller re-arms the slots. A failed
  (or slow) probe reopens with the reset timer restarted; probe_cap successes
  close with an empty window. HALF_OPEN results never enter the window.
  Without a permit (seed API), the oldest probe in flight admitted less than
  probe_timeout_ms ago is credited.
- OPEN: every report is a stray.
Outcome "r" (release) frees a probe slot without a result (cancelled call); a
release naming a probe id without a permit generation (permit_gen "") frees
that slot in HALF_OPEN if it is live and is ignored otherwise.
Checks first, then ready(), then writes (see durabilis/_scripts.py): foreign
data, stale reports and strays that free nothing return before ready() and
write nothing; every report that writes (an abandoned probe's freed slot
included) or counts calls ready(), the hot path too (it writes nothing).

KEYS[1]  state hash      <ns>:cb:{<name>}
KEYS[2]  window zset     <ns>:cb:{<name>}:window    member <score><flag>, flag s|f|S|F
                                                    (S/F = slow success/failure)
KEYS[3]  probes hash     <ns>:cb:{<name>}:probes    probe id -> admitted at (ms)
KEYS[4]  events stream   <ns>:cb:{<name>}:events
KEYS[5]  reporters zset  <ns>:cb:{<name>}:reporters replica -> score of its last bad result,
                                                    only replicas whose last bad result is
                                                    still in the window (trimmed with it)
ARGV[1]  config, fields joined by "|" (one argument: fewer to encode per call):
         window_size       newest results kept
         window_ms         results older than this leave the window (ms), 0 = off
         slow_ms           a call slower than this is slow (ms), -1 = slow rule off
         ttl_ms            idle TTL of the breaker's keys (ms)
         threshold         failure rate that trips when exceeded, (0, 1]
         min_requests      results needed before a rate exists
         slow_threshold    slow-call rate that trips when exceeded
         min_reporters     distinct replicas with a bad result needed to trip
         probe_cap         probe successes that close (probe_success_required)
         reset_ms          reset timeout (ms), written to the events stream
         events_maxlen     approximate cap of the events stream (entries)
         probe_timeout_ms  a probe admitted this long ago is presumed abandoned (ms)
         replica           id of the reporting process (the rest of the argument)
ARGV[2]  report, fields joined by "|":
         permit_gen        generation of the permit, "" = no permit
         probe_id          the permit's probe id, "" = not a probe
         outcome           "s" success, "f" failure, "r" release
         duration_ms       how long the call took (ms), -1 = unknown
         check             "1": check whether the TTLs are due (each process asks
                           about once a second; other reports read no clock)
         or, for a plain success (not a probe, not slow, count-based window, no
         TTL check), "+<window_size>|<permit_gen>": the hot path tests it with
         one HMGET and no parsing of ARGV[1].

Returns one of
  1                                    counted while CLOSED, no transition (the hot path)
  {"counted", state, generation [, transition]}
  {"released", state, generation}      a probe slot was freed, no result
  {"ignored", state, generation}       stray: no live probe / OPEN / nothing to free /
                                       a probe admitted probe_timeout_ms or more ago
  {"stale", state, generation}         the permit is from another generation
  {"corrupt", key_index, detail}       KEYS[key_index] holds foreign data
transition = {from, to, at_ms, failures, requests, slow, reason, generation, stream_id}
TTLs: the state hash, window and reporters are re-armed to ttl_ms when created
and then at most every ttl_ms / 4 (field tx), so an idle breaker expires after
3/4 to 1 ttl.
Hot path: while a full count-based window holds only successes, one more plain
success leaves the same last-N results, so nothing is written (one HMGET).

@acks: replicas
]]
local sk, wk, pk, ek, rk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local h = redis.pcall("HMGET", sk, "st", "g", "n", "f", "sl", "ls", "tx")
if h.err then return {"corrupt", 1, h.err} end
local st = h[1] or "C"
local g = tonumber(h[2] or 0)
if not g then return {"corrupt", 1, "field g is not a number"} end
if st ~= "C" and st ~= "O" and st ~= "H" then
  return {"corrupt", 1, "unknown breaker state " .. st}
end
local pgen, probe, outcome, duration, check
if string.byte(ARGV[2]) == 43 then
  -- "+<window_size>|<permit_gen>": a plain success (see ARGV[2]).
  local wsize
  wsize, pgen = string.match(ARGV[2], "^%+(%d+)|(%d*)$")
  if pgen ~= "" and tonumber(pgen) ~= g then return {"stale", st, g} end
  if st == "C" and h[3] == wsize and h[4] == "0" and h[5] == "0" then
    -- A full count-based window of successes plus one more success is the same
    -- last-N results: nothing changes, nothing is written (the healthy hot path).
    ready()
    return 1
  end
  probe, outcome, duration, check = "", "s", "-1", "0"
else
  pgen, probe, outcome, duration, check =
    string.match(ARGV[2], "^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$")
  if pgen ~= "" and tonumber(pgen) ~= g then return {"stale", st, g} end
end
if st == "O" then return {"ignored", "O", g} end
local window_size, window_ms, slow_ms = string.match(ARGV[1], "^(%d+)|(%d+)|([^|]*)|")
window_size, slow_ms, duration = tonumber(window_size), tonumber(slow_ms), tonumber(duration)
local failed = outcome == "f"
local is_slow = slow_ms >= 0 and duration >= 0 and duration > slow_ms
local n, fc, sc, ls, tx
if st == "C" then
  if outcome == "r" or probe ~= "" then return {"ignored", "C", g} end
  n, fc, sc = tonumber(h[3] or 0), tonumber(h[4] or 0), tonumber(h[5] or 0)
  ls, tx = tonumber(h[6] or 0), tonumber(h[7] or 0)
  if not (n and fc and sc and ls and tx) then
    return {"corrupt", 1, "a window counter field is not a number"}
  end
end

local ttl, threshold, min_requests, slow_threshold, min_reporters, probe_cap, reset_ms, maxlen,
  probe_timeout, replica = string.match(ARGV[1],
  "^[^|]*|[^|]*|[^|]*|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$")
threshold, min_reporters = tonumber(threshold), tonumber(min_reporters)
probe_timeout = tonumber(probe_timeout)
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Foreign data where the events stream belongs (checked before ready() by
-- every report that will append a transition), else nil.
local function foreign_events()
  local kind = redis.call("TYPE", ek)["ok"]
  if kind ~= "none" and kind ~= "stream" then
    return "a " .. kind .. " where the events stream belongs"
  end
  return nil
end

-- Appends a transition to the events stream (checked by foreign_events()).
local function transition(from, to, failures, requests, slow, reason, gen)
  local NAMES = {C = "closed", O = "open", H = "half_open"}
  local rate = ""
  if reason == "failure_rate" or reason == "slow_call_rate" then
    rate = string.format("%.6g", failures / requests)
  end
  local id = redis.call("XADD", ek, "MAXLEN", "~", maxlen, "*",
    "time", string.format("%d", now), "from", NAMES[from], "to", NAMES[to],
    "reason", reason, "failures", failures, "requests", requests, "slow", slow,
    "failure_rate", rate, "reset_timeout_ms", reset_ms, "replica", replica,
    "generation", gen)
  redis.call("PEXPIRE", ek, ttl)
  return {from, to, now, failures, requests, slow, reason, gen, id}
end

-- Counts results, failures and slow calls in the whole window; nil if foreign.
local function recount()
  local n, f, s = 0, 0, 0
  for _, m in ipairs(redis.call("ZRANGE", wk, 0, -1)) do
    local c = string.sub(m, -1)
    n = n + 1
    if c == "f" then f = f + 1
    elseif c == "S" then s = s + 1
    elseif c == "F" then f, s = f + 1, s + 1
    elseif c ~= "s" then return nil end
  end
  return n, f, s
end

if st == "C" then
  -- (tx in the future: the server clock stepped back; refresh now, not after the jump)
  local refresh = not h[1] or now - tx >= tonumber(ttl) / 4 or tx > now
  -- The window's size, read at every report: it is also the check of the
  -- window key's type, before any write. When the counters do not match it (a
  -- key lost or touched from outside), recount, so the rate is always the window's.
  local card = redis.pcall("ZCARD", wk)
  if type(card) == "table" then return {"corrupt", 2, card.err} end
  local n0, fc0, sc0 = n, fc, sc  -- as stored
  if card ~= n then
    n, fc, sc = recount()
    if not n then return {"corrupt", 2, "window member without a result flag"} end
  end
  local bad = failed or is_slow
  local score = math.max(now * 1000, ls + 1)
  -- A time-based window whose newest result is over a second "in the future":
  -- the server clock stepped back. Like every breaker time found in the
  -- future, the window is set to now: its newest result counts as recorded
  -- now and the others keep their ages relative to it (the window and the
  -- reporters are rescored by -shift after ready()), so results leave the
  -- window window_ms after that, not after the whole jump.
  local shift = 0
  if window_ms ~= "0" and ls > now * 1000 + 1000000 then
    shift = ls - now * 1000
    score = now * 1000 + 1
  end
  local drop = 0
  if window_ms ~= "0" then
    drop = redis.call("ZCOUNT", wk, "-inf",
      string.format("(%d", (now - window_ms) * 1000 + shift))
  end
  if card - drop + 1 > window_size then drop = card + 1 - window_size end
  local dropped_bad = false  -- a failure or slow call leaves the window
  if drop > 0 then
    -- The oldest results leave the window: counted out now, removed after ready().
    for _, m in ipairs(redis.call("ZRANGE", wk, 0, drop - 1)) do
      local c = string.sub(m, -1)
      if c == "f" then fc = fc - 1
      elseif c == "S" then sc = sc - 1
      elseif c == "F" then fc, sc = fc - 1, sc - 1 end
      if c ~= "s" then dropped_bad = true end
    end
    n = n - drop
  end
  -- The reporters set is read (and its type checked) before ready() whenever
  -- it will be written: a bad result joins it, a bad result leaving trims it.
  local mine = false
  if bad or dropped_bad or min_reporters > 1 or shift > 0 then
    mine = redis.pcall("ZSCORE", rk, replica)
    if type(mine) == "table" then return {"corrupt", 5, mine.err} end
  end
  n = n + 1
  if failed then fc = fc + 1 end
  if is_slow then sc = sc + 1 end

  local reason = nil
  if n >= tonumber(min_requests) then
    if fc / n > threshold then reason = "failure_rate"
    elseif slow_ms >= 0 and sc / n > tonumber(slow_threshold) then reason = "slow_call_rate" end
  end
  if reason and min_reporters > 1 then
    -- Distinct replicas whose latest bad result is still in the window.
    local oldest = score + shift  -- (the reporters' scores are not rescored yet)
    if n > 1 then oldest = tonumber(redis.call("ZRANGE", wk, drop, drop, "WITHSCORES")[2]) end
    local distinct = redis.call("ZCOUNT", rk, string.format("%d", oldest), "+inf")
    if bad and not (mine and tonumber(mine) >= oldest) then distinct = distinct + 1 end
    if distinct < min_reporters then reason = nil end
  end
  if reason then
    local foreign = foreign_events()
    if foreign then return {"corrupt", 4, foreign} end
  end

  ready()
  if drop > 0 then redis.call("ZREMRANGEBYRANK", wk, 0, drop - 1) end
  if shift > 0 then  -- bounded: the window holds at most window_size results
    -- A window member is named by its score ("<score><flag>"): renamed with
    -- it, so the new results' names (above every shifted score) never meet an
    -- old one's. Oldest first: a new name can only be one already renamed.
    local all = redis.call("ZRANGE", wk, 0, -1, "WITHSCORES")
    for i = 1, #all, 2 do
      local moved = string.format("%d", tonumber(all[i + 1]) - shift)
      redis.call("ZREM", wk, all[i])
      redis.call("ZADD", wk, moved, moved .. string.sub(all[i], -1))
    end
    all = redis.call("ZRANGE", rk, 0, -1, "WITHSCORES")
    for i = 1, #all, 2 do
      redis.call("ZADD", rk, string.format("%d", tonumber(all[i + 1]) - shift), all[i])
    end
  end
  local tr, g2 = nil, g
  if reason then
    g2 = g + 1
    tr = transition("C", "O", fc, n, sc, reason, g2)
  end
  local flag = "s"
  if failed and is_slow then flag = "F" elseif failed then flag = "f" elseif is_slow then flag = "S" end
  local sscore = string.format("%d", score)
  redis.call("ZADD", wk, sscore, sscore .. flag)
  refresh = refresh or n == 1
  if bad then
    -- A new set gets the idle TTL; then it is re-armed with the state hash.
    if redis.call("ZADD", rk, sscore, replica) == 1 and not (refresh or reason)
        and redis.call("PTTL", rk) == -1 then
      redis.call("PEXPIRE", rk, ttl)
    end
  end
  if bad or dropped_bad then
    -- Reporters leave with their results: keep only those whose latest bad
    -- result is still in the window, so the set never holds more than
    -- window_size replicas. Bounded: at most window_size + 1 leave per report
    -- (a set grown larger before shrinks by that much per report).
    local low = redis.call("ZRANGE", wk, 0, 0, "WITHSCORES")[2]
    local gone = redis.call("ZRANGEBYSCORE", rk, "-inf", "(" .. low, "LIMIT", 0, window_size + 1)
    if #gone > 0 then redis.call("ZREM", rk, unpack(gone)) end
  end
  if reason then
    redis.call("HSET", sk, "st", "O", "g", g2, "oa", string.format("%d", now), "ps", 0,
      "n", n, "f", fc, "sl", sc, "ls", sscore)
    redis.call("DEL", pk)
  elseif refresh then
    redis.call("HSET", sk, "st", "C", "g", g, "n", n, "f", fc, "sl", sc, "ls", sscore,
      "tx", string.format("%d", now))
  elseif n == n0 and fc == fc0 and sc == sc0 then
    redis.call("HSET", sk, "ls", sscore)
  else
    redis.call("HSET", sk, "n", n, "f", fc, "sl", sc, "ls", sscore)
  end
  if refresh or reason then
    redis.call("PEXPIRE", sk, ttl)
    redis.call("PEXPIRE", wk, ttl)
    redis.call("PEXPIRE", rk, ttl)
  end
  if tr then return {"counted", "O", g2, tr} end
  return 1
end

-- HALF_OPEN
if pgen ~= "" and probe == "" then return {"ignored", "H", g} end
local pid = probe
local abandoned = false
if pid == "" then
  -- No permit (seed API): credit the oldest probe in flight, if any, among
  -- those admitted less than probe_timeout_ms ago.
  local all = redis.pcall("HGETALL", pk)
  if all.err then return {"corrupt", 3, all.err} end
  local oldest = nil
  for i = 1, #all, 2 do
    local at = tonumber(all[i + 1])
    if not at then return {"corrupt", 3, "probe admission time is not a number"} end
    if now - at < probe_timeout and (oldest == nil or at < oldest) then
      oldest, pid = at, all[i]
    end
  end
else
  local at = redis.pcall("HGET", pk, pid)
  if type(at) == "table" then return {"corrupt", 3, at.err} end
  if not at then
    pid = ""
  else
    at = tonumber(at)
    if not at then return {"corrupt", 3, "probe admission time is not a number"} end
    abandoned = now - at >= probe_timeout
  end
end
if pid == "" then return {"ignored", "H", g} end
if outcome == "r" then
  ready()
  redis.call("HDEL", pk, pid)
  return {"released", "H", g}
end
if abandoned then
  -- Admitted probe_timeout_ms or more ago: presumed abandoned, never credited.
  ready()
  redis.call("HDEL", pk, pid)
  return {"ignored", "H", g}
end
local ps = tonumber(redis.call("HGET", sk, "ps") or 0)
if not ps then return {"corrupt", 1, "field ps is not a number"} end
ps = ps + 1
if not (failed or is_slow) and ps < tonumber(probe_cap) then
  ready()
  redis.call("HDEL", pk, pid)
  redis.call("HSET", sk, "ps", ps)
  redis.call("PEXPIRE", sk, ttl)
  return {"counted", "H", g}
end
local foreign = foreign_events()
if foreign then return {"corrupt", 4, foreign} end
ready()
local g2 = g + 1
local tr
if failed or is_slow then
  tr = transition("H", "O", 1, ps, is_slow and 1 or 0, "probe_failed", g2)
  redis.call("HSET", sk, "st", "O", "g", g2, "oa", string.format("%d", now), "ps", 0)
else
  tr = transition("H", "C", 0, ps, 0, "probes_succeeded", g2)
  redis.call("HSET", sk, "st", "C", "g", g2, "ps", 0, "n", 0, "f", 0, "sl", 0,
    "tx", string.format("%d", now))
  redis.call("DEL", wk, rk)
end
redis.call("DEL", pk)
redis.call("PEXPIRE", sk, ttl)
return {"counted", tr[2], g2, tr}
