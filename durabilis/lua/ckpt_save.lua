--[[ ckpt_save: write a checkpoint (a save, a fork or a rewind) as ONE step.

The new record becomes the current checkpoint of (task, agent, phase); the one
it replaces leaves the live indexes but keeps its record (and TTL) so lineage
stays walkable. The namespace-wide cap evicts the oldest live checkpoints of
ANY task in the same step. Nothing is written unless the whole save succeeds.

The lineage cap bounds the records one task keeps (live current + live
replaced): when this save would take the task over max_lineage, the task's
replaced records (superseded saves of a phase) that expire first (with one
TTL: the oldest) are deleted in the same step, at most LINEAGE_TRIM per save
(bounded work; a task over the cap by more, e.g. after the cap was lowered,
shrinks by that much per save). Current checkpoints are never deleted. A
rewind's source is never one of them, and the record this save replaces only
when no other replaced record is left. They are spliced out of the lineage:
EVERY child of a deleted record (a current checkpoint, a replaced one, a fork
copy in another task; the new record too) gets the deleted record's parent, so
no lineage ends at a trimmed record. Children are found in the namespace's
children index (KEYS[8]: parent id -> its children's ids, written by the save
that creates the child); the index entry of a parent lives until the parent's
expiry (KEYS[9]), and is swept after it (at most SWEEP per save). A record
with more than CHILD_MAX children is never deleted by the cap (bounded work),
and one save relinks at most CHILD_BUDGET children in all. The branch rule:
a record is deleted only when every lineage through it (a fork copy's, a
rewind branch's too) holds a newer record of its agent and phase, checked in
the children index (each child's token carries a mark of its agent and
phase, a replaced record's entry its own mark; see lineage_oldest), so no
lineage loses a phase by the splice; a record the check cannot clear within
its bounds is kept (the task may then hold more than max_lineage records).
The records deleted and their children must be declared: the caller passes the
ids it expects (bare ids, ARGV[13..], one record key each); when the real
victims or their children are not among them the script writes nothing and
answers "miss" with the ids to pass next time. Each "ok" reply names the ids
the task's next save will need (with LINEAGE_SLACK more), so a task saved in a
loop by one process needs one round trip per save.

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
KEYS[8]  children                   (hash parent id -> space-separated tokens: "<child id>/<mark>"
                                    per child, "=<mark>" its own once replaced; mark: 16 hex of
                                    SHA-1("<escaped agent>:<phase>"))
KEYS[9]  children expiry            (zset parent id -> the parent's expiry ms: when its entry goes)
KEYS[10..] per candidate, in ARGV order: an eviction candidate's record hash
          and its task's current index (two keys), a lineage candidate's record
          hash (one key)
ARGV[1]  id                         new checkpoint id (no ":")
ARGV[2]  task_id
ARGV[3]  agent_id                   (save only; fork/rewind copy the source's)
ARGV[4]  phase                      (save only)
ARGV[5]  state                      msgpack bytes (save only)
ARGV[6]  ttl_ms                     > 0
ARGV[7]  caps                       "<max_checkpoints>|<max_lineage>": cap on live
                                    current checkpoints (namespace) | cap on the
                                    records of one task (0 = no lineage cap)
ARGV[8]  check                      "1" = compare ARGV[9] with the task's latest
ARGV[9]  expected                   expected latest id, "" = no checkpoint
ARGV[10] mode                       "save" | "fork" | "rewind"
ARGV[11] source_id                  fork/rewind source id
ARGV[12] hint_n                     how many next-eviction candidates to return (returned
                                    only while the namespace holds more than max_checkpoints
                                    - 256 live current checkpoints: far below its cap no save
                                    evicts, and a later save that does answers "miss" once)
ARGV[13..] candidates: eviction candidate members ("<id>:<task>") and
          lineage candidate ids (bare ids: ids never hold ":"; the records the
          lineage cap deletes and their children), in any order

Returns one of
  {"ok", id, created_ms, expires_ms, parent ("" = none), agent, phase,
   state ("" for a save: the caller has it), {next candidate members},
   {evicted members}, {next lineage candidate ids}, {lineage ids deleted}}
  {"conflict", actual latest id ("" = none)}
  {"notfound"}                      fork/rewind source missing, expired or (rewind) of another task
  {"miss", {members}, {ids}}        eviction (members) or lineage (ids) candidates
                                    were stale; nothing written
  {"exists"}                        the id is already taken; nothing written
  {"corrupt", key, detail}

Record fields: t task, a agent, p phase, s state, c created ms, e expires ms,
q sequence, pa parent id (absent = none).

@acks: replicas
]]
local rec, cur, old, live, order, seqk, src = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local kids, kidsx = KEYS[8], KEYS[9]
local id, task, agent, phase, state = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ttl = tonumber(ARGV[6])
local max, max_lineage = string.match(ARGV[7], "^(%d+)|(%d+)$")
max, max_lineage = tonumber(max), tonumber(max_lineage)
-- Lineage records deleted at most per save, and extra ids in each lineage hint.
local LINEAGE_TRIM, LINEAGE_SLACK = 32, 2
-- Children relinked per save at most; a record with more is kept; index
-- entries of expired parents swept per save.
local CHILD_BUDGET, CHILD_MAX, SWEEP = 64, 64, 64
-- The branch rule (see lineage_oldest): children-index entries one check
-- reads at most, and in all per search; replaced records one search scans.
local WALK_MAX, WALK_BUDGET, SCAN = 256, 4096, 256
local check, expected = ARGV[8] == "1", ARGV[9]
local mode, source_id = ARGV[10], ARGV[11]
local hint_n = tonumber(ARGV[12])
local HINT_NEAR = 256
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function kind(k) return redis.call("TYPE", k)["ok"] end
--@include lib/ckpt_types.lua
-- The task's current index, live and (with a lineage cap) the replaced ids are
-- type-checked by their first read, before any write (checked_read below);
-- the other keys by a TYPE each.
local type_checks = {{order, "zset"}, {seqk, "string"}, {kids, "hash"}, {kidsx, "zset"}}
if max_lineage == 0 then type_checks[#type_checks + 1] = {old, "zset"} end
local bad = wrong_type(type_checks)
if bad then return bad end
-- A read that is also its key's type check (no TYPE before it): WRONGTYPE
-- becomes the reply wrong_type gives.
local function checked_read(ty, cmd, k, ...)
  local r = redis.pcall(cmd, k, ...)
  if type(r) == "table" and r.err then
    if string.find(r.err, "WRONGTYPE", 1, true) then
      return nil, {"corrupt", k, "a " .. kind(k) .. " where a checkpoint " .. ty .. " belongs"}
    end
    error(r.err)
  end
  return r
end
if kind(rec) ~= "none" then
  -- Already saved under this id: a step sent again after its reply was lost
  -- (ids are fresh UUIDv7s). Nothing to refuse, nothing to write.
  ready()
  return {"exists"}
end

-- The scores of `members` in zset k, in order (false: none): one ZMSCORE per
-- 1000 members instead of a ZSCORE each.
-- A user whose ACL predates ZMSCORE (the line documented before this release
-- had no +zmscore) gets a ZSCORE each: the save must not fail mid-upgrade.
local function scores(k, members)
  local out = {}
  for i = 1, #members, 1000 do
    local last = math.min(i + 999, #members)
    local part = redis.pcall("ZMSCORE", k, unpack(members, i, last))
    if type(part) == "table" and part.err then
      if string.find(part.err, "WRONGTYPE", 1, true) then error(part) end
      part = {}
      for j = i, last do part[#part + 1] = redis.call("ZSCORE", k, members[j]) end
    end
    for _, v in ipairs(part) do out[#out + 1] = v end
  end
  return out
end
local function live_at(e) return e ~= false and tonumber(e) > now end

-- Every check (and refusal) comes before the first write: in a fused step a
-- refusal must leave nothing written (see ready() in durabilis/_scripts.py).
-- Housekeeping found on the way is done after ready().
local stale_fields = {}
local source_exp = nil

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
  source_exp = tonumber(f[5])
end

-- Same escaping as durabilis._keys.escape_part: the agent part never holds ":".
local function escape(s)
  return (s:gsub("%%", "%%25"):gsub(":", "%%3A"):gsub("{", "%%7B"):gsub("}", "%%7D"))
end
local field = escape(agent) .. ":" .. phase

local live_n, bad_live = checked_read("zset", "ZCOUNT", live, "(" .. now, "+inf")
if not live_n then return bad_live end
local entries, bad_cur = checked_read("hash", "HGETALL", cur)
if not entries then return bad_cur end
local cur_members = {}
for i = 2, #entries, 2 do cur_members[#cur_members + 1] = entries[i] .. ":" .. task end
local cur_exps, cur_seqs = scores(live, cur_members), scores(order, cur_members)
local latest, latest_seq, replaced = nil, -1, nil
local latest_exp, replaced_score = nil, nil
local live_current = 0
for i = 1, #entries, 2 do
  local f, cid, e = entries[i], entries[i + 1], cur_exps[(i + 1) / 2]
  if live_at(e) then
    live_current = live_current + 1
    local q = tonumber(cur_seqs[(i + 1) / 2]) or 0
    if q > latest_seq then latest, latest_seq, latest_exp = cid, q, tonumber(e) end
    if f == field then replaced, replaced_score = cid, e end
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

-- The members of the `want` oldest live current checkpoints, skipping `skip`
-- (pages of want + 16: expired entries not yet swept are skipped).
local function oldest(want, skip)
  local out, start = {}, 0
  local page = math.min(want + 16, 100)
  while #out < want do
    local batch = redis.call("ZRANGE", order, start, start + page - 1)
    if #batch == 0 then break end
    local exps = scores(live, batch)
    for i, m in ipairs(batch) do
      if m ~= skip and live_at(exps[i]) then
        out[#out + 1] = m
        if #out >= want then break end
      end
    end
    if #batch < page then break end
    start = start + page
  end
  return out
end

-- The candidates the caller declared: members (two keys each) and ids (one key).
local cand, lcand, lids = {}, {}, {}
local ki = 10
for i = 13, #ARGV do
  if string.find(ARGV[i], ":", 1, true) then
    cand[ARGV[i]] = ki
    ki = ki + 2
  else
    lcand[ARGV[i]] = ki
    lids[#lids + 1] = ARGV[i]
    ki = ki + 1
  end
end
local missed = false

local n = live_n
if replaced then n = n - 1 end
local excess = n + 1 - max
local victims = {}
local evicted_here = 0  -- eviction victims of this very task
if excess > 0 then
  victims = oldest(excess, replaced_member)
  for _, m in ipairs(victims) do
    local sep = string.find(m, ":", 1, true)
    if not sep then
      return {"corrupt", order, "member " .. m .. " is not <id>:<task>"}
    end
    if not cand[m] then missed = true end
    if string.sub(m, sep + 1) == task then evicted_here = evicted_here + 1 end
  end
end

local skip = ""  -- a fork's or rewind's source is never deleted by the lineage cap
if mode ~= "save" then skip = source_id end

-- The children index: a parent's entry is space-separated tokens, one per
-- child, "<id>/<mark>" where mark names the child's task, agent and phase (8
-- hex digits of the SHA-1 of the task, then 16 of the SHA-1 of "<escaped
-- agent>:<phase>"; a bare "<id>" when unknown), and, once the parent is a
-- replaced record, "=<mark>": its own.
-- memory:// (fakeredis) has no redis.sha1hex: there a mark is a stand-in
-- digest (two polynomial hashes of other bases, exact in Lua's doubles, each
-- 8 hex digits mixing both: two short texts collide in one only). Marks are
-- only compared with marks this same server wrote, so the two never meet.
local hex = redis.sha1hex or function(s)
  local a, b = 5381, 2166136
  for i = 1, #s do
    local c = string.byte(s, i)
    a = (a * 33 + c) % 4294967296
    b = (b * 131 + c + i) % 4294967291
  end
  return string.format("%08x%08x%08x", (a * 7 + b) % 4294967296, (b * 3 + a) % 4294967296, a)
end
local function mark(tk, f)
  return string.sub(hex(tk), 1, 8) .. string.sub(hex(f), 1, 16)
end
-- The new record's token in its parent's entry, until this save writes it.
local pending = nil
if parent ~= "" then pending = id .. "/" .. mark(task, field) end
local function tok_id(tok) return (string.match(tok, "^[^/]+")) end
local function tok_mark(tok) return string.match(tok, "/(.+)$") end
-- Entries read once while the index is unchanged (emptied where it changes:
-- at ready(), whose housekeeping sweeps it, and after the writes below).
local kids_read = {}
-- A parent's children (tokens), its own mark (nil: unknown) and whether it
-- has an entry at all.
local function children_of(cid)
  local v = kids_read[cid]
  if v == nil then
    v = redis.call("HGET", kids, cid)
    kids_read[cid] = v
  end
  local out, own = {}, nil
  if v then
    for c in string.gmatch(v, "%S+") do
      if string.sub(c, 1, 1) == "=" then own = string.sub(c, 2) else out[#out + 1] = c end
    end
  end
  return out, own, v ~= false
end

-- The `want` replaced records of the task the lineage cap deletes first: the
-- live ones that expire first, never a rewind's source nor a record with more
-- than CHILD_MAX children; the one this save replaces only when no other is
-- left (`with_replaced`). Stops early rather than relink more than
-- CHILD_BUDGET children. Returns the records, their children, and the ids a
-- save deleting them must declare (both, each once); or nil and a bad member.
--
-- The branch rule: a record is deleted only when every lineage through it
-- holds a newer record of its agent and phase, so that no lineage loses a
-- phase by the splice. The check follows the children index down from the
-- record (its marks, no record read) and succeeds when each branch below
-- reaches a record of the record's agent and phase (of its task, or a fork
-- copy of the record itself) before anything else: a branch that ends first
-- (a rewind's branch, a tip of another phase), that enters another task (a
-- fork: the copy's task may start its lineage at any of its records), a
-- child of unknown mark, or more than WALK_MAX entries read (WALK_BUDGET in
-- all) keeps the record. Why within one task is enough: a lineage starts at
-- an agent's newest checkpoint of its task, and a newer record of the
-- agent in the same task below it would be newer still. Linear saves pass;
-- a record of an earlier version (no entry) is deleted as before.
local function lineage_oldest(want, with_replaced)
  local out, children, declare, seen = {}, {}, {}, {}
  local budget = CHILD_BUDGET
  local walk_left = WALK_BUDGET
  -- children as indexed, plus the new record while this save has not written it
  local function below(cid)
    local ch, own, has = children_of(cid)
    if pending and cid == parent then ch[#ch + 1] = pending; has = true end
    return ch, own, has
  end
  local function covered(cid, own)  -- true: every lineage through cid has a newer record of its mark
    local ch, self_mark, has = below(cid)
    if not has then return true end  -- no entry: no child indexed (an earlier version's record)
    own = own or self_mark
    if not own then return false end
    local stack, visited, used = {}, {[cid] = true}, 0
    for _, c in ipairs(ch) do
      local m = tok_mark(c)
      -- a child in another task is a fork copy of cid: of cid's agent and phase
      if not (m and string.sub(m, 9) == string.sub(own, 9)) then stack[#stack + 1] = c end
    end
    while #stack > 0 do
      local tok = table.remove(stack)
      local m, nid = tok_mark(tok), tok_id(tok)
      if m ~= own and not visited[nid] then
        if not m or string.sub(m, 1, 8) ~= string.sub(own, 1, 8) then return false end
        visited[nid] = true
        used = used + 1
        walk_left = walk_left - 1
        if used > WALK_MAX or walk_left < 0 then return false end
        local next_ch = below(nid)
        if #next_ch == 0 then return false end  -- a lineage through cid starts here without its mark
        for _, c in ipairs(next_ch) do stack[#stack + 1] = c end
      end
    end
    return true
  end
  local function add(cid)
    if not seen[cid] then
      seen[cid] = true
      declare[#declare + 1] = cid
    end
  end
  local function take(cid, own)  -- false: stop here
    local ch = children_of(cid)
    if #ch > CHILD_MAX then return true end
    if #ch > budget then return false end
    if not covered(cid, own) then return true end
    budget = budget - #ch
    out[#out + 1] = cid
    add(cid)
    for _, c in ipairs(ch) do
      c = tok_id(c)
      children[#children + 1] = c
      add(c)
    end
    return true
  end
  local start, page = 0, 64
  local going = true
  while going and #out < want and start < want + SCAN do
    local ids = redis.call("ZRANGEBYSCORE", old, "(" .. now, "+inf", "LIMIT", start, page)
    for _, cid in ipairs(ids) do
      if #out >= want then break end
      if string.find(cid, ":", 1, true) then return nil, cid end
      if cid ~= skip and cid ~= replaced and not take(cid, nil) then going = false; break end
    end
    if #ids < page then break end
    start = start + page
  end
  if going and with_replaced and #out < want and replaced ~= skip then take(replaced, mark(task, field)) end
  return out, children, declare
end

-- The task's records once this save is done, before the lineage cap.
local lineage_total = 0
local lineage_victims, lineage_children = {}, {}
if max_lineage > 0 then
  local old_n, bad_old = checked_read("zset", "ZCOUNT", old, "(" .. now, "+inf")
  if not old_n then return bad_old end
  lineage_total = live_current + 1 - evicted_here + old_n
  local want = math.min(lineage_total - max_lineage, LINEAGE_TRIM)
  if want > 0 then
    local victims_or_nil, children_or_bad = lineage_oldest(want, replaced ~= nil)
    if not victims_or_nil then
      return {"corrupt", old, "member " .. children_or_bad .. " is not a checkpoint id"}
    end
    lineage_victims, lineage_children = victims_or_nil, children_or_bad
    for _, cid in ipairs(lineage_victims) do
      if not lcand[cid] then missed = true end
    end
    for _, cid in ipairs(lineage_children) do
      if not lcand[cid] then missed = true end
    end
  end
end

if missed then
  local members = {}
  if excess > 0 then members = oldest(excess + hint_n, replaced_member) end
  local ids = {}
  if #lineage_victims > 0 then
    local _, _, declare = lineage_oldest(#lineage_victims + LINEAGE_SLACK, replaced ~= nil)
    ids = declare or lineage_victims
  end
  return {"miss", members, ids}
end

-- Deleted records are spliced out of the lineage, so it skips them instead of
-- ending there: every child of a deleted record (from the children index,
-- declared above) gets the deleted record's parent, and moves to that
-- parent's children; so does the new record. A child whose record is gone is
-- dropped from the index.
local pa_of = {}        -- declared record id -> parent ("" = none), false = no record
local function pa(cid)
  if pa_of[cid] == nil then
    -- One read for "is it a record" and its parent: every record has "t";
    -- anything else at the key (pcall: another type) is no record.
    local f = redis.pcall("HMGET", KEYS[lcand[cid]], "pa", "t")
    if f.err or not f[2] then
      pa_of[cid] = false
    else
      pa_of[cid] = f[1] or ""
    end
  end
  return pa_of[cid]
end
local kid_lists, kid_own, kid_dirty, kid_dirty_ids = {}, {}, {}, {}
local function klist(cid)  -- tokens; kid_own[cid]: its own mark (false: none)
  if kid_lists[cid] == nil then
    local l, own = children_of(cid)
    kid_lists[cid], kid_own[cid] = l, own or false
  end
  return kid_lists[cid]
end
local function touch(cid)
  if not kid_dirty[cid] then
    kid_dirty[cid] = true
    kid_dirty_ids[#kid_dirty_ids + 1] = cid
  end
end
local function list_add(p, tok)
  local l, c = klist(p), tok_id(tok)
  for _, x in ipairs(l) do if tok_id(x) == c then return end end
  l[#l + 1] = tok
  touch(p)
end
local function list_remove(p, c)
  local l, keep = klist(p), {}
  for _, x in ipairs(l) do if tok_id(x) ~= c then keep[#keep + 1] = x end end
  kid_lists[p] = keep
  touch(p)
end
local relinked, relink_ids = {}, {}
local gone = {}
for _, v in ipairs(lineage_victims) do gone[v] = true end
for _, v in ipairs(lineage_victims) do
  local up = pa(v)
  for _, tok in ipairs(klist(v)) do
    local c = tok_id(tok)
    local cp = pa(c)
    if cp == v and up ~= false then
      pa_of[c] = up
      if not relinked[c] then
        relinked[c] = true
        relink_ids[#relink_ids + 1] = c
      end
      if up ~= "" then list_add(up, tok) end
    end
  end
  if up and up ~= "" then list_remove(up, v) end
  kid_lists[v] = {}
  touch(v)
  if parent == v then parent = up or "" end
end
ready()
kids_read = {}
pending = nil  -- written below: the index holds it from here on
-- Entries whose record expired are dropped here (bounded; the rest are
-- skipped by every reader and dropped by later calls).
local dead = redis.call("ZRANGEBYSCORE", live, "-inf", now, "LIMIT", 0, 1000)
if #dead > 0 then
  redis.call("ZREM", live, unpack(dead))
  redis.call("ZREM", order, unpack(dead))
end
redis.call("ZREMRANGEBYSCORE", old, "-inf", now)
-- Children-index entries of parents that expired (bounded; the rest next time).
local swept = redis.call("ZRANGEBYSCORE", kidsx, "-inf", now, "LIMIT", 0, SWEEP)
if #swept > 0 then
  redis.call("HDEL", kids, unpack(swept))
  redis.call("ZREM", kidsx, unpack(swept))
end
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

local replaced_deleted = false
for _, cid in ipairs(lineage_victims) do
  redis.call("DEL", KEYS[lcand[cid]])
  if cid == replaced then
    replaced_deleted = true
  else
    redis.call("ZREM", old, cid)
  end
end
for _, cid in ipairs(relink_ids) do
  if not gone[cid] then
    if pa_of[cid] == "" then
      redis.call("HDEL", KEYS[lcand[cid]], "pa")
    else
      redis.call("HSET", KEYS[lcand[cid]], "pa", pa_of[cid])
    end
  end
end

local replaced_exp = nil
if replaced then
  local re = replaced_score
  redis.call("ZREM", live, replaced_member)
  redis.call("ZREM", order, replaced_member)
  if not replaced_deleted then
    redis.call("ZADD", old, re, replaced)
    -- its own mark, for the branch rule (its entry lives while it does)
    klist(replaced)
    kid_own[replaced] = mark(task, field)
    touch(replaced)
    replaced_exp = tonumber(re)
  end
end

local seq = redis.call("INCR", seqk)
local exp = now + ttl
local fields = {"t", task, "a", agent, "p", phase, "s", state, "c", now, "e", exp, "q", seq}
if parent ~= "" then fields[#fields + 1] = "pa"; fields[#fields + 1] = parent end
redis.call("HSET", rec, unpack(fields))
redis.call("PEXPIREAT", rec, exp)

-- The new record is its parent's child; the entry lives while the parent does.
local parent_exp = nil
if parent ~= "" then
  list_add(parent, id .. "/" .. mark(task, field))
  if parent == latest then
    parent_exp = latest_exp
  elseif mode ~= "save" and parent == source_id then
    parent_exp = source_exp
  end
end
-- The entries that stay, their expiries read at once (one ZMSCORE), then
-- written with one HSET and one ZADD (and one HDEL, one ZREM for those that go).
local kid_keep, kid_drop = {}, {}
for _, cid in ipairs(kid_dirty_ids) do
  if gone[cid] or (#kid_lists[cid] == 0 and not kid_own[cid]) then
    kid_drop[#kid_drop + 1] = cid
  else
    kid_keep[#kid_keep + 1] = cid
  end
end
if #kid_drop > 0 then
  redis.call("HDEL", kids, unpack(kid_drop))
  redis.call("ZREM", kidsx, unpack(kid_drop))
end
local kid_horizon = exp  -- the latest expiry an entry written here has
if #kid_keep > 0 then
  local knowns = scores(kidsx, kid_keep)
  local hset, zadd = {}, {}
  for i, cid in ipairs(kid_keep) do
    local l, own = kid_lists[cid], kid_own[cid]
    -- drop children whose record is known to be gone
    local keep = {}
    if own then keep[1] = "=" .. own end
    for _, c in ipairs(l) do if pa_of[tok_id(c)] ~= false then keep[#keep + 1] = c end end
    hset[#hset + 1] = cid
    hset[#hset + 1] = table.concat(keep, " ")
    local known = tonumber(knowns[i])
    local want_exp = known or exp
    if cid == replaced and not known and replaced_exp then want_exp = replaced_exp end
    if cid == parent and parent_exp and parent_exp > want_exp then want_exp = parent_exp end
    if known ~= want_exp then
      zadd[#zadd + 1] = want_exp
      zadd[#zadd + 1] = cid
    end
    if want_exp > kid_horizon then kid_horizon = want_exp end
  end
  redis.call("HSET", kids, unpack(hset))
  if #zadd > 0 then redis.call("ZADD", kidsx, unpack(zadd)) end
end
redis.call("ZADD", live, exp, self_member)
redis.call("ZADD", order, seq, self_member)
redis.call("HSET", cur, field, id)

-- Index keys live as long as the longest-lived record they point to. Only
-- the keys this save wrote can point to a record living longer than they do
-- (every save extends what it writes); a key this save created (the task's
-- first current index, the first sequence number) has no TTL yet.
local function extend(k, until_ms, created)
  if created then redis.call("PEXPIREAT", k, until_ms) return end
  local p = redis.call("PTTL", k)
  if p == -2 then return end
  if p == -1 or now + p < until_ms then redis.call("PEXPIREAT", k, until_ms) end
end
extend(cur, exp, #entries == 0)
extend(live, exp, false)
extend(order, exp, false)
extend(seqk, exp, seq == 1)
if replaced and not replaced_deleted then
  -- the replaced-ids index lives as long as the longest-lived record it lists
  extend(old, math.max(exp, replaced_exp or exp), false)
end
if #kid_keep > 0 then
  extend(kids, kid_horizon, false)
  extend(kidsx, kid_horizon, false)
end

kids_read = {}
-- The lineage ids the task's next save will need (each save adds one record).
local lineage_hint = {}
if max_lineage > 0 then
  local need = math.min(lineage_total - #lineage_victims + 1 - max_lineage, LINEAGE_TRIM)
  if need > 0 then
    replaced = nil  -- (the next save's own replaced record is not known here)
    local _, _, declare = lineage_oldest(need + LINEAGE_SLACK, false)
    lineage_hint = declare or {}
  end
end

local returned_state = ""
if mode ~= "save" then returned_state = state end
-- Next-eviction candidates only near the cap (see ARGV[12]).
local hint = {}
if n + 1 - #victims + HINT_NEAR > max then hint = oldest(hint_n, nil) end
return {"ok", id, now, exp, parent, agent, phase, returned_state, hint, victims,
  lineage_hint, lineage_victims}
