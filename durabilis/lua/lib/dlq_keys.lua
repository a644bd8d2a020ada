-- lib/dlq_keys.lua: the opening of the scripts given the DLQ's eight keys in
-- KEYS[1..8] (dlq_cleanup, dlq_purge): names them S (stream), E (expiry index),
-- P (pending index), PO (pending-by-operation index), C (counts hash), BK
-- (by-key hash), LOG (log stream), RQ (requeue index); sets LOG_MAX (the log
-- stream's approximate cap) and now (the server's time, ms); and returns
-- {"corrupt", key, detail} from the script, before any write, when one of the
-- eight holds another type than the DLQ keeps there (lib/dlq_types.lua).
--@include lib/dlq_types.lua
local S, E, P, PO, C, BK, LOG, RQ = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
  KEYS[7], KEYS[8]
local LOG_MAX = 10000
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local checks = {S, "stream", E, "zset", P, "zset", PO, "zset", C, "hash", BK, "hash",
                LOG, "stream", RQ, "zset"}
local bad = wrong_type(checks)
if bad then return bad end
