--[[ ckpt_save: write a checkpoint (a save, a fork or a rewind) as ONE step.

The new record becomes the current checkpoint of (task, agent, phase); the one
it replaces leaves the live indexes but keeps its record (and TTL) so lineage
stays walkable. The namespace-wide cap evicts the oldest live checkpoints of
ANY task in the same step. Nothing is written unless the whole save succeeds.

Members of the global indexes are "<id>:<task>" (ids never hold ":"), so an
eviction victim names its own task. Keys of other tasks can only be touched
when declared in KEYS, so the caller passes, for each eviction candidate it
expects, its record and task index keys (KEYS[8..], pairs) and its member
(ARGV[13..]); when the real victims are not among them the script writes
nothing and answers "miss" with the members to pass next time.

KEYS[1]  the new record hash        (<ns>:ckpt:{ckpt}:rec:<id>)
KEYS[2]  the task's current index   (hash "<escaped agent>:<phase>" -> id)
KEYS[3]  the task's replaced ids    (zset id -> expires ms; for clear_task)
KEYS[4]  live                       (zset member -> expires ms; current checkpoints)
KEYS[5]  order                      (zset member -> sequence; current checkpoints)
KEYS[6]  seq                        (string counter: fleet-wide creation order)
KEYS[7]  source record hash         (fork/rewind; any key otherwise, unused)
KEYS[8..] per candidate: its record hash, its task's current index
ARGV[1]  id                         new checkpoint id (no ":")
ARGV[2]  task_id
ARGV[3]  agent_id                   (save only; fork/rewind copy the source's)
ARGV[4]  phase                      (save only)
ARGV[5]  state                      msgpack bytes (save only)
ARGV[6]  ttl_ms                     > 0
ARGV[7]  max_checkpoints            cap on live current checkpoints
ARGV[8]  check                      "1" = compare ARGV[9] with the task's latest
ARGV[9]  expected                   expected latest id, "" = no checkpoint
ARGV[10] mode                       "save" | "fork" | "rewind"
ARGV[11] source_id                  fork/rewind source id
ARGV[12] hint_n                     how many next-eviction candidates to return
ARGV[13..] eviction candidate members

Returns one of
  {"ok", id, created_ms, expires_ms, parent ("" = none), agent, phase,
   state ("" for a save: the caller has it), {next candidate members},
   {evicted members}}
  {"conflict", actual latest id ("" = none)}
  {"notfound"}                      fork/rewind source missing, expired or (rewind) of another task
  {"miss", {members}}               eviction candidates were stale; nothing written
  {"exists"}                        the id is already taken; nothing written
  {"corrupt", key, detail}

Record fields: t task, a agent, p phase, s state, c created ms, e expires ms,
q sequence, pa parent id (absent = none).
]]
local rec, cur, old, live, order, seqk, src = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id, task, agent, phase, state = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ttl = tonumber(ARGV[6])
local max = tonumber(ARGV[7])
local check, expected = ARGV[8] == "1", ARGV[9]
local mode, source_id = ARGV[10], ARGV[11]
local hint_n = tonumber(ARGV[12])
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function kind(k) return redis.call("TYPE", k)["ok"] end
for _, spec in ipairs({{cur, "hash"}, {old, "zset"}, {live, "zset"}, {order, "zset"}, {seqk, "string"}}) do
  local ty = kind(spec[1])
  if ty ~= "none" and ty ~= spec[2] then
    return {"corrupt", spec[1], "a " .. ty .. " where a checkpoint " .. spec[2] .. " belongs"}
  end
end
if kind(rec) ~= "none" then
  -- Already saved under this id: a step sent again after its reply was lost
  -- (ids are fresh UUIDv7s). Nothing to refuse, nothing to write.
  ready()
  return {"exists"}
end

local function alive(member)
  local e = redis.call("ZSCORE", live, member)
  return e ~= false and tonumber(e) > now
end

-- Every check (and refusal) comes before the first write: in a fused step a
-- refusal must leave nothing written (see ready() in durabilis/_scripts.py).
-- Housekeeping found on the way is done after ready().
local stale_fields = {}

if mode ~= "save" then
  local ty = kind(src)
  if ty == "none" then return {"notfound"} end
  if ty ~= "hash" then
    return {"corrupt", src, "a " .. ty .. " where a checkpoint record (hash) belongs"}
  end
  local f = redis.call("HMGET", src, "t", "a", "p", "s", "e")
  if not (f[1] and f[2] and f[3] and f[4] and tonumber(f[5])) then
    return {"corrupt", src, "checkpoint record without task, agent, phase, state or expiry"}
  end
  if tonumber(f[5]) <= now then return {"notfound"} end
  if mode == "rewind" and f[1] ~= task then return {"notfound"} end
  agent, phase, state = f[2], f[3], f[4]
end

-- Same escaping as durabilis._keys.escape_part: the agent part never holds ":".
local function escape(s)
  return (s:gsub("%%", "%%25"):gsub(":", "%%3A"):gsub("{", "%%7B"):gsub("}", "%%7D"))
end
local field = escape(agent) .. ":" .. phase

local entries = redis.call("HGETALL", cur)
local latest, latest_seq, replaced = nil, -1, nil
for i = 1, #entries, 2 do
  local f, cid = entries[i], entries[i + 1]
  if alive(cid .. ":" .. task) then
    local q = tonumber(redis.call("ZSCORE", order, cid .. ":" .. task)) or 0
    if q > latest_seq then latest, latest_seq = cid, q end
    if f == field then replaced = cid end
  else
    stale_fields[#stale_fields + 1] = f
  end
end

if check and (latest or "") ~= expected then
  return {"conflict", latest or ""}
end

local parent = source_id
if mode == "save" then parent = latest or "" end

local self_member = id .. ":" .. task
local replaced_member = replaced and (replaced .. ":" .. task)

-- The members of the `want` oldest live current checkpoints, skipping `skip`.
local function oldest(want, skip)
  local out, start = {}, 0
  while #out < want do
    local batch = redis.call("ZRANGE", order, start, start + 99)
    if #batch == 0 then break end
    for _, m in ipairs(batch) do
      if m ~= skip and alive(m) then
        out[#out + 1] = m
        if #out >= want then break end
      end
    end
    start = start + 100
  end
  return out
end

local n = redis.call("ZCOUNT", live, "(" .. now, "+inf")
if replaced then n = n - 1 end
local excess = n + 1 - max
local victims = {}
local cand = {}
if excess > 0 then
  for i = 13, #ARGV do cand[ARGV[i]] = 2 * (i - 13) + 8 end
  victims = oldest(excess, replaced_member)
  for _, m in ipairs(victims) do
    if not string.find(m, ":", 1, true) then
      return {"corrupt", order, "member " .. m .. " is not <id>:<task>"}
    end
    if not cand[m] then return {"miss", oldest(excess + hint_n, replaced_member)} end
  end
end

ready()
-- Entries whose record expired are dropped here (bounded; the rest are
-- skipped by every reader and dropped by later calls).
local dead = redis.call("ZRANGEBYSCORE", live, "-inf", now, "LIMIT", 0, 1000)
if #dead > 0 then
  redis.call("ZREM", live, unpack(dead))
  redis.call("ZREM", order, unpack(dead))
end
redis.call("ZREMRANGEBYSCORE", old, "-inf", now)
if #stale_fields > 0 then redis.call("HDEL", cur, unpack(stale_fields)) end

if excess > 0 then
  for _, m in ipairs(victims) do
    local vrec, vidx = KEYS[cand[m]], KEYS[cand[m] + 1]
    local vid = string.sub(m, 1, string.find(m, ":", 1, true) - 1)
    if redis.call("TYPE", vrec)["ok"] == "hash" and redis.call("TYPE", vidx)["ok"] == "hash" then
      local f = redis.call("HMGET", vrec, "a", "p")
      if f[1] and f[2] then
        local vfield = escape(f[1]) .. ":" .. f[2]
        if redis.call("HGET", vidx, vfield) == vid then redis.call("HDEL", vidx, vfield) end
      end
    end
    redis.call("DEL", vrec)
    redis.call("ZREM", live, m)
    redis.call("ZREM", order, m)
  end
end

if replaced then
  local re = redis.call("ZSCORE", live, replaced_member)
  redis.call("ZREM", live, replaced_member)
  redis.call("ZREM", order, replaced_member)
  redis.call("ZADD", old, re, replaced)
end

local seq = redis.call("INCR", seqk)
local exp = now + ttl
redis.call("HSET", rec, "t", task, "a", agent, "p", phase, "s", state, "c", now, "e", exp, "q", seq)
if parent ~= "" then redis.call("HSET", rec, "pa", parent) end
redis.call("PEXPIREAT", rec, exp)
redis.call("ZADD", live, exp, self_member)
redis.call("ZADD", order, seq, self_member)
redis.call("HSET", cur, field, id)

-- Index keys live as long as the longest-lived record they point to.
local function extend(k)
  local p = redis.call("PTTL", k)
  if p == -2 then return end
  if p == -1 or now + p < exp then redis.call("PEXPIREAT", k, exp) end
end
for _, k in ipairs({cur, old, live, order, seqk}) do extend(k) end

local returned_state = ""
if mode ~= "save" then returned_state = state end
return {"ok", id, now, exp, parent, agent, phase, returned_state, oldest(hint_n, nil), victims}
