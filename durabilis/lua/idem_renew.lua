--[[ idem_renew: extend the lease of in-progress claims still held (keep-alive).

A live worker renews its claims so that a slow operation is never taken over.
Many claims are renewed in one call (one per KEYS entry); on Redis Cluster the
caller groups keys by slot, one call per key.

The keep-alive names its claims by their nonce (it holds a claim from the
moment the claim step is sent, before the token is known). A worker that
confirms its claim before an attempt names it by its token: a claim reclaimed
by recovery (same nonce, new token) is then no longer its own.

KEYS[i]  record hashes              (<ns>:idem:{<key>})
ARGV[i]  nonce (or token) of KEYS[i]
ARGV[#KEYS+1]  lease_ms             new lease, counted from now
ARGV[#KEYS+2]  by                   "nonce" | "token" (default "token")

Returns a table of 1 (renewed) / 0 (no longer held), one per key.

@acks: replicas
]]
local INT_LIMIT = 1e15  -- int()'s bound (stored milliseconds)
--@include lib/idem_clock.lua
local lease = tonumber(ARGV[#KEYS + 1])
local field = ARGV[#KEYS + 2] == "nonce" and "cn" or "tok"
local out = {}
ready()  -- nothing to refuse: renewing is best effort, key by key
for i, key in ipairs(KEYS) do
  out[i] = 0
  if redis.call("TYPE", key)["ok"] == "hash" then
    local f = redis.call("HMGET", key, "s", field, "ts", "w", "hd")
    local ts, window = int(f[3]), int(f[4])
    -- A record with garbage times is left as it is (foreign data): not renewed.
    if f[1] == "p" and f[2] == ARGV[i] and ARGV[i] ~= "" and ts and window then
      -- PEXPIREAT first: it does not count as growing memory, so under
      -- maxmemory (noeviction) the renewal still goes through. Never before
      -- the hold ("hd": a parked operation's DLQ record still names the key),
      -- and a window past the lease's end (idem_claim: recovery's window).
      redis.call("PEXPIREAT", key, math.max(ts + window, now + lease + window, int(f[5]) or 0))
      redis.call("HSET", key, "le", now + lease)
      out[i] = 1
    end
  end
end
return out
