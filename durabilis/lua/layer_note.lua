--[[ layer_note: keep the layer's in-flight index and its counters.

The in-flight index lists the claims in progress, scored by when their lease
ends, so that recover_orphans finds those whose worker died without scanning
every idempotency record. Each entry is owned by ONE claim: its member is
"<idempotency key>|<claim nonce>", so an old owner removing its entry never
touches a newer owner's. The counters are the fleet-wide totals an operator
(and the demo) reads back.

KEYS[1]  in-flight sorted set        (<ns>:layer:{layer}:inflight)
KEYS[2]  counters hash               (<ns>:layer:{layer}:stats)
KEYS[3]  optional, Cluster: settled  (<ns>:layer:{layer}:settled) the members their
                                     owners removed in the last MARK_MS, scored by when
                                     the mark ends: with "rem"/"leave", the members are
                                     marked; with "back", a marked member is not added
                                     (a put-back lands within MARK_MS of the renewal it
                                     was decided on: one round trip, unless its thread
                                     stalls that long; one landing later lists a settled
                                     claim again, until recovery drops it with one look)
ARGV[1]  mode                        "add" | "rem" | "leave" | "renew" | "at" | "back" | "none"
                                     ("leave": a process's batch of settled claims'
                                     removals, first sent: "rem" whose counts always go;
                                     "back": the keep-alive puts back the entries of
                                     claims it just renewed, on Cluster, where recovery
                                     may have dropped one whose claim step came late;
                                     a claim that settled meanwhile stays out, in
                                     whatever order its removal and this land)
ARGV[2]  lease_ms                    with "add"/"renew"/"back": the lease, counted from
                                     now; with "at": the score itself (ms, when the lease ends)
ARGV[3]  n                           how many members follow
ARGV[4..3+n] members                 "<key>|<nonce>"
ARGV[4+n..] field, increment, ...    counters to add to; with "rem", only when
                                     an entry was removed (a "rem" sent again
                                     after a lost reply counts nothing twice)

Returns the number of entries added, removed or renewed.

@acks: replicas, none when ARGV[1] in rem|leave|none
              (an addition or renewal is confirmed; a removal or a count lost
              in a failover is safe: recovery drops such entries with one look
              each, and a count is a count)
]]
local mode = ARGV[1]
local n = tonumber(ARGV[3])
local done = 0
local settled = KEYS[3]
local MARK_MS = 10000  -- how long a removed member stays marked settled
local function clock()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
ready()
if mode == "add" or mode == "renew" or mode == "back" then
  local now = clock()
  local lease = tonumber(ARGV[2])
  for i = 4, 3 + n do
    if mode == "add" then
      done = done + redis.call("ZADD", KEYS[1], now + lease, ARGV[i])
    elseif mode == "back" then
      -- (the settled set unreadable, foreign data: put back, as before it existed;
      -- the next removal drops that data)
      local mark = settled and redis.pcall("ZSCORE", settled, ARGV[i])
      if type(mark) ~= "string" then
        done = done + redis.call("ZADD", KEYS[1], now + lease, ARGV[i])
      end
    else
      done = done + redis.call("ZADD", KEYS[1], "XX", "CH", now + lease, ARGV[i])
    end
  end
  if mode ~= "renew" then
    -- Entries of workers that died are removed by recover_orphans; if nobody
    -- ever runs it, the whole index still goes a week after the last claim.
    redis.call("PEXPIRE", KEYS[1], math.max(lease * 4, 604800000))
  end
elseif mode == "at" then
  for i = 4, 3 + n do
    done = done + redis.call("ZADD", KEYS[1], "XX", "CH", tonumber(ARGV[2]), ARGV[i])
  end
elseif mode == "rem" or mode == "leave" then
  -- One ZREM per thousand members (a batch of a process's settled claims).
  for first = 4, 3 + n, 1000 do
    done = done + redis.call("ZREM", KEYS[1], unpack(ARGV, first, math.min(first + 999, 3 + n)))
  end
  if settled and n > 0 then
    -- Marked settled, removed now or not (a put-back may land after this).
    -- The set is this script's alone: foreign data there (another type) is
    -- dropped, not left to switch the marks off for good. Its size: the
    -- fleet's removals of MARK_MS (~170 B a member).
    local now = clock()
    local keep = MARK_MS
    if type(redis.pcall("ZREMRANGEBYSCORE", settled, "-inf", now)) ~= "number" then
      redis.call("DEL", settled)
    end
    for first = 4, 3 + n, 500 do
      local marks = {}
      for i = first, math.min(first + 499, 3 + n) do
        marks[#marks + 1] = now + keep
        marks[#marks + 1] = ARGV[i]
      end
      redis.call("ZADD", settled, unpack(marks))
    end
    redis.call("PEXPIRE", settled, keep)
  end
  -- A batch first sent ("leave") counts whatever recover_orphans dropped of
  -- it meanwhile (a lease shorter than the batch's wait); a "rem" sent again
  -- after a lost reply counts only what it removes now.
  if mode == "rem" and done == 0 and n > 0 then return 0 end
end
for i = 4 + n, #ARGV, 2 do
  redis.call("HINCRBY", KEYS[2], ARGV[i], tonumber(ARGV[i + 1]))
end
return done
