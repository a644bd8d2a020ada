--@include lib/sortkey.lua
-- lib/dlq_unindex.lua: unindex(sid, rid, op), drop a pending record's entries
-- from the pending index, the pending-by-op index and (when the script has it)
-- the requeue index. Needs locals P, PO and RQ (the keys; RQ may be nil).
local function unindex(sid, rid, op)
  local pm = sortkey(sid) .. "|" .. rid
  redis.call("ZREM", P, pm)
  redis.call("ZREM", PO, op .. "\0" .. pm)
  if RQ then redis.call("ZREM", RQ, op .. "\0" .. pm) end
end
