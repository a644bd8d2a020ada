-- lib/ckpt_types.lua: wrong_type({{key, type}, ...}), the checkpoint scripts'
-- check of their keys before any write: {"corrupt", key, detail} for the first
-- key holding another type than a checkpoint keeps there, or nil.
local function wrong_type(specs)
  for _, spec in ipairs(specs) do
    local ty = redis.call("TYPE", spec[1])["ok"]
    if ty ~= "none" and ty ~= spec[2] then
      return {"corrupt", spec[1], "a " .. ty .. " where a checkpoint " .. spec[2] .. " belongs"}
    end
  end
  return nil
end
