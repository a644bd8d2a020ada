-- lib/sortkey.lua: sortkey(sid), a stream id "ms-seq" as a fixed-width ms and a
-- length-prefixed seq, so that byte order (ZRANGEBYLEX) is enqueue order
-- ("...-a9" < "...-b10"): the DLQ's lex indexes order their members by it.
local function sortkey(sid)
  local ms, seq = string.match(sid, "^(%d+)%-(%d+)$")
  return string.rep("0", 15 - #ms) .. ms .. "-" .. string.char(96 + #seq) .. seq
end
