-- Extends a concurrency lease that is still held and unexpired to
-- now + ttl. An expired lease is dropped, never revived: its slot may have
-- gone to someone else. Follows src/store/lease.rs, as the memory store
-- does; keep them in step.
--
-- KEYS[1]   the key's lease set (see lease_acquire.lua)
-- ARGV[1]   now in microseconds, or "" to read the server clock
-- ARGV[2]   lease TTL in microseconds
-- ARGV[3]   the lease id
--
-- Returns 1 if renewed, 0 if the lease is not held (any more).

-- Runs after lua/common/clock.lua (joined in src/store/redis/lease.rs):
-- now and slack_ms come from there. With the caller's clock the set still
-- expires on Redis' own: it lives slack_ms past its longest lease.

local ttl = tonumber(ARGV[2])

local expiry = redis.call('ZSCORE', KEYS[1], ARGV[3])
if not expiry then return 0 end
if tonumber(expiry) <= now then
  redis.call('ZREM', KEYS[1], ARGV[3])
  return 0
end
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[3])
local ttl_ms = math.ceil(ttl / 1000) + slack_ms
if redis.call('PTTL', KEYS[1]) < ttl_ms then
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
end
return 1
