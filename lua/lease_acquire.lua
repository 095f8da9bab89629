-- Takes a concurrency lease when the key holds fewer unexpired leases than
-- its capacity. Follows the rules in src/store/lease.rs, as the memory
-- store does (src/store/memory/lease.rs); keep them in step.
--
-- KEYS[1]   the key's lease set: a ZSET, member = lease id, score = expiry
-- ARGV[1]   now in microseconds, or "" to read the server clock
-- ARGV[2]   capacity
-- ARGV[3]   lease TTL in microseconds
-- ARGV[4]   the new lease's id (unique: chosen by the caller)
--
-- Returns {acquired (1/0), leases held after the call,
--          microseconds until the oldest lease expires (when refused, else 0)}.
-- Times stay integral microseconds below 2^53, exact in Lua's doubles and
-- in ZSET scores; they are written with %d to keep every digit.

-- Runs after lua/common/clock.lua (joined in src/store/redis/lease.rs):
-- now and slack_ms come from there. With the caller's clock the set still
-- expires on Redis' own: it lives slack_ms past its longest lease.

local capacity = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])

-- Only unexpired leases count: an expired one's holder vanished.
local after = '(' .. string.format('%d', now)
local held = redis.call('ZCOUNT', KEYS[1], after, '+inf')
if held >= capacity then
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], after, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local wait = 0
  if oldest[2] then wait = tonumber(oldest[2]) - now end
  return {0, held, wait}
end

-- The ZADD is the first write: on a master past maxmemory Redis refuses a
-- script's first write only if it is one that takes memory, and lets every
-- later write through, so the trim must not come first.
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[4])
-- Leases whose holder vanished are dropped here, in the same call: no
-- separate trimming round trip.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
-- The set lives as long as its longest lease.

local ttl_ms = math.ceil(ttl / 1000) + slack_ms
if redis.call('PTTL', KEYS[1]) < ttl_ms then
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
end
return {1, held + 1, 0}
