-- lib/cb_fields.lua: reading a breaker's state hash, raising {corrupt = detail}
-- on foreign data (the script turns it into {"corrupt", key_index, detail}).
-- int(v, field): a number field (absent: 0). state(v): the state letter
-- C | O | H (absent: "C", a breaker never opened).
local function int(v, field)
  if not v then return 0 end
  local x = tonumber(v)
  if not x then error({corrupt = "field " .. field .. " is not a number"}) end
  return x
end

local function state(v)
  local st = v or "C"
  if st ~= "C" and st ~= "O" and st ~= "H" then
    error({corrupt = "unknown breaker state " .. st})
  end
  return st
end
