-- lib/dlq_bump.lua: bump(field, by), add to a field of the DLQ's counts hash,
-- dropping the field when it reaches 0. Needs a local C (the counts hash key).
local function bump(field, by)
  if redis.call("HINCRBY", C, field, by) <= 0 then redis.call("HDEL", C, field) end
end
