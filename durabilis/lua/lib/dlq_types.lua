-- lib/dlq_types.lua: wrong_type({key, type, key, type, ...}), the DLQ scripts'
-- check of their keys before any write: {"corrupt", key, detail} for the first
-- key holding another type than the DLQ keeps there, or nil (all absent or
-- right) and the type found per key ("none": absent), so that a script needs
-- no EXISTS of a key it checked. A key named twice is checked once.
local function wrong_type(checks)
  local kinds = {}
  for i = 1, #checks, 2 do
    if not kinds[checks[i]] then
      local kind = redis.call("TYPE", checks[i])["ok"]
      if kind ~= "none" and kind ~= checks[i + 1] then
        return {"corrupt", checks[i], "a " .. kind .. " where the DLQ keeps a " .. checks[i + 1]}
      end
      kinds[checks[i]] = kind
    end
  end
  return nil, kinds
end
