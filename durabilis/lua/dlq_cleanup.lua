--[[ dlq_cleanup: remove expired DLQ records from every structure.

One atomic step per batch: for each given expiry-index member whose expiry
has passed (checked again here, by the server clock), delete its stream entry
(XDEL), its record hash, its index entries and its count. A member that is
no longer in the index (another cleaner got there first) is skipped. A
record hash is deleted only if it still belongs to that member (same stream
id): a caller-chosen dlq_id may have been enqueued again since.

A removed pending record's requeue-index entry goes with it (a record made
again under its id carries no mark). NOTHING LEAVES SILENTLY. A removed record that was still PENDING expired
unreplayed: it is reported, exactly once (the member's ZREM decides who
reports it, whatever the number of cleaners): an "expired" entry in the log
stream (dlq_id, operation_type, idempotency_key and agent_id, read from its
stream entry before the entry goes), the count "expired|<op>" in the counts
hash (kept at least ARGV[1] ms from now), its by-key entry dropped (when it
still names this record: its id, and no record hash of that id from another
stream entry), and the record in the reply, so the caller logs
the event. Work per call is bounded by the number of members given.

KEYS[1]  stream                     (<ns>:dlq:{dlq}:stream)
KEYS[2]  expiry index, zset         score expires_ms, member "<sid>|<dlq_id>|<p|r|a>|<op>"
KEYS[3]  pending index, lex zset
KEYS[4]  pending-by-op, lex zset
KEYS[5]  counts hash                field "<status>|<op>" -> live records, "expired|<op>"
                                    -> pending records reported expired
KEYS[6]  by-key hash                merge key -> dlq_id of its current record
KEYS[7]  log stream                 (<ns>:dlq:{dlq}:log), capped
KEYS[8]  requeue index, lex zset    member "<op>\0<sortkey(sid)>|<dlq_id>": a removed
                                    pending record's entry goes (a record made again
                                    under its id is not marked)
KEYS[8+i] the record hash of ARGV[1+i]
ARGV[1]  keep_ms                    the counts hash and log stream live at least this
                                    long after a report, in milliseconds (the DLQ's TTL)
ARGV[1+i] expiry-index member (from dlq_expired)

Returns {"ok", removed, expired} or {"corrupt", key, detail}; expired is a flat
list dlq_id, operation type, idempotency key ("" = none), agent_id per pending
record reported.

@acks: replicas
]]
local keep_ms = tonumber(ARGV[1]) or 86400000
--@include lib/dlq_keys.lua
--@include lib/dlq_expire.lua

local removed = 0
for i = 2, #ARGV do
  local member = ARGV[i]
  local score = tonumber(redis.call("ZSCORE", E, member))
  if score and score <= now then
    removed = removed + 1
    purge(member, KEYS[7 + i])  -- (lib/dlq_expire.lua)
  end
end
if #expired > 0 then
  for _, key in ipairs({C, LOG}) do
    local pttl = redis.call("PTTL", key)
    if pttl == -1 or (pttl >= 0 and pttl < keep_ms) then
      redis.call("PEXPIRE", key, keep_ms)
    end
  end
end
return {"ok", removed, expired}
