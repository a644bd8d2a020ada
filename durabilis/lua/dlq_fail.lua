--[[ dlq_fail: record a failed replay; the record stays pending.

Only the holder of the current claim token may report: the attempt count
goes up by one, the new error is kept, and the claim is released so the
record can be replayed again at once.

KEYS[1]  the record hash            (<ns>:dlq:{dlq}:rec:<dlq_id>)
KEYS[2]  log stream                 (<ns>:dlq:{dlq}:log; the change is appended)
KEYS[3]  requeue index, lex zset    (optional) a counted failure ends the record's
                                    requeue mark: the fleet replays it once per
                                    `dlq requeue`, it does not loop on a failing record.
                                    The mark (field "rq") goes from the record, and
                                    the record's index entry with it (the entry of its
                                    stream id, and with ARGV[8] the entry the replay
                                    was claimed through, whatever stream id it names)
ARGV[1]  token                      claim token from dlq_claim
ARGV[2]  error                      text of the replay's error
ARGV[3]  dlq_id                     (for the log entry)
ARGV[4]  mode                       "defer": the replay did not run (the operation
                                    in progress elsewhere, a breaker open): only
                                    the claim is released, nothing counted;
                                    "np": the replay claimed the record without
                                    its payload; filled in since (no "np" in the
                                    hash, another stream entry), its failure is
                                    stale: as "defer";
                                    "config": the replaying process lacks config
                                    (a durabilis ConfigError / DependencyNotFound):
                                    the claim is released, nothing counted, the
                                    original error kept; the text goes to "lre"
                                    (last replay error, at "lrat") and to a
                                    "replay_config_error" log entry; the requeue
                                    mark stays (a replica with the config replays it);
                                    the log entry is written only when this replayer
                                    ("lrby") or the text ("lre") differs from the last
                                    one noted, or ARGV[7] ms passed since the last entry
                                    ("lrlog"): a replica meeting it pass after pass
                                    does not flood the capped log
ARGV[5]  stream id                  ("np") the entry the replay claimed
ARGV[6]  replayer                   ("config") who met the error (for the log entry)
ARGV[7]  quiet, ms                  ("config") how long the same replayer's same error
                                    is not logged again
ARGV[8]  index member               (optional, with KEYS[3]) the requeue-index entry
                                    the replay was claimed through; removed as well
                                    if it names this dlq_id

Returns one of
  {"ok", replay_attempts}
  {"filled", replay_attempts}       ("np") filled in meanwhile: released, not counted
  {"none"}                          no live record (unknown id or expired)
  {"final", status}                 finished meanwhile (e.g. an operator abandoned it)
  {"lost"}                          the token does not hold the claim
  {"corrupt", key, detail}

@acks: replicas
]]
local H = KEYS[1]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local kind = redis.call("TYPE", H)["ok"]
if kind == "none" then return {"none"} end
if kind ~= "hash" then
  return {"corrupt", H, "a " .. kind .. " where a DLQ record (hash) belongs"}
end
local f = redis.call("HMGET", H, "st", "exp", "ct")
local st, exp, ct = f[1], tonumber(f[2]), f[3]
if (st ~= "pending" and st ~= "replayed" and st ~= "abandoned") or not exp then
  return {"corrupt", H, "record hash without a valid status or expiry"}
end
if exp <= now then return {"none"} end
if st ~= "pending" then return {"final", st} end
if ct ~= ARGV[1] then return {"lost"} end

local stale = ARGV[4] == "np" and redis.call("HEXISTS", H, "np") == 0
  and redis.call("HGET", H, "sid") ~= ARGV[5]
if ARGV[4] == "config" then  -- not run for want of config here: counted nowhere
  local lkind = redis.call("TYPE", KEYS[2])["ok"]
  if lkind ~= "none" and lkind ~= "stream" then
    return {"corrupt", KEYS[2], "a " .. lkind .. " where the DLQ keeps its log (stream)"}
  end
  redis.call("HDEL", H, "co", "ct", "ce")
  local last = redis.call("HMGET", H, "lre", "lrby", "lrlog")
  local by = ARGV[6] or ""
  local logged = tonumber(last[3] or "")
  local quiet = tonumber(ARGV[7] or "0") or 0
  redis.call("HSET", H, "lre", ARGV[2], "lrat", now, "lrby", by)
  if last[1] ~= ARGV[2] or last[2] ~= by or not logged or now - logged >= quiet then
    redis.call("HSET", H, "lrlog", now)
    redis.call("XADD", KEYS[2], "MAXLEN", "~", 10000, "*", "dlq_id", ARGV[3] or "",
      "change", "replay_config_error", "error", ARGV[2], "by", by)
    if redis.call("PTTL", KEYS[2]) == -1 then redis.call("PEXPIREAT", KEYS[2], exp) end
  end
  return {"ok", tonumber(redis.call("HGET", H, "ra") or "0")}
end
if ARGV[4] == "defer" or stale then  -- it did not run: release the claim, count nothing
  redis.call("HDEL", H, "co", "ct", "ce")
  return {stale and "filled" or "ok", tonumber(redis.call("HGET", H, "ra") or "0")}
end
local lkind = redis.call("TYPE", KEYS[2])["ok"]
if lkind ~= "none" and lkind ~= "stream" then
  return {"corrupt", KEYS[2], "a " .. lkind .. " where the DLQ keeps its log (stream)"}
end
local attempts = redis.call("HINCRBY", H, "ra", 1)
redis.call("XADD", KEYS[2], "MAXLEN", "~", 10000, "*", "dlq_id", ARGV[3] or "",
  "change", "replay_failed", "error", ARGV[2])
if redis.call("PTTL", KEYS[2]) == -1 then redis.call("PEXPIREAT", KEYS[2], exp) end
redis.call("HSET", H, "le", ARGV[2], "lat", now)
redis.call("HDEL", H, "co", "ct", "ce")
if KEYS[3] then  -- (marked or not: an entry left behind goes too)
  redis.call("HDEL", H, "rq")
  local op, sid = redis.call("HGET", H, "op"), redis.call("HGET", H, "sid")
  local ms, seq = string.match(sid or "", "^(%d+)%-(%d+)$")
  if op and ms then
    redis.call("ZREM", KEYS[3], op .. "\0" .. string.rep("0", 15 - #ms) .. ms .. "-"
      .. string.char(96 + #seq) .. seq .. "|" .. (ARGV[3] or ""))
  end
  local via = ARGV[8] or ""
  if via ~= "" and string.sub(via, -(#(ARGV[3] or "") + 1)) == "|" .. (ARGV[3] or "") then
    redis.call("ZREM", KEYS[3], via)
  end
end
return {"ok", attempts}
