-- Concurrency leases: one sorted set per key and limit name, member = lease
-- id, score = expiry in microseconds. Follows the rules in
-- src/store/lease.rs, as the memory store does (src/store/memory/lease.rs);
-- keep them in step. Runs after lua/prelude.lua, whose clock acquire and
-- renew read.
--
-- KEYS[1]        the key's lease set
-- ARGV[1]        now in microseconds, or "" to read the server clock (not
--                for release, which reads no clock)
--
-- Times stay integral microseconds below 2^53, exact in Lua's doubles and
-- in ZSET scores, written with %d to keep every digit. The set lives as
-- long as its longest lease; with the caller's clock it still expires on
-- Redis' own, slack_ms later.

-- Takes a lease when the key holds fewer unexpired leases than its
-- capacity.
--
-- ARGV[2]        capacity
-- ARGV[3]        lease TTL in microseconds
-- ARGV[4]        the new lease's id (unique: chosen by the caller)
--
-- Returns {acquired (1/0), leases held after the call,
--          microseconds until the oldest lease expires (when refused, else 0)}.
local function acquire(keys, argv, now, slack_ms)
  local key, capacity, ttl = keys[1], tonumber(argv[2]), tonumber(argv[3])
  -- Only unexpired leases count: an expired one's holder vanished.
  local after = '(' .. string.format('%d', now)
  local held = redis.call('ZCOUNT', key, after, '+inf')
  if held >= capacity then
    local oldest = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    local wait = 0
    if oldest[2] then wait = tonumber(oldest[2]) - now end
    return {0, held, wait}
  end
  -- The ZADD is the first write: on a master past maxmemory Redis refuses
  -- a script's first write only if it is one that takes memory, and lets
  -- every later write through, so the trim must not come first. Leases
  -- whose holder vanished are dropped here, in the same call: no separate
  -- trimming round trip.
  redis.call('ZADD', key, string.format('%d', now + ttl), argv[4])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
  local ttl_ms = math.ceil(ttl / 1000) + slack_ms
  if redis.call('PTTL', key) < ttl_ms then
    redis.call('PEXPIRE', key, ttl_ms)
  end
  return {1, held + 1, 0}
end

-- Extends a lease that is still held and unexpired to now + ttl. An
-- expired lease is dropped, never revived: its slot may have gone to
-- someone else.
--
-- ARGV[2]        lease TTL in microseconds
-- ARGV[3]        the lease id
--
-- Returns 1 if renewed, 0 if the lease is not held (any more).
local function renew(keys, argv, now, slack_ms)
  local key, ttl, id = keys[1], tonumber(argv[2]), argv[3]
  local expiry = redis.call('ZSCORE', key, id)
  if not expiry then return 0 end
  if tonumber(expiry) <= now then
    redis.call('ZREM', key, id)
    return 0
  end
  redis.call('ZADD', key, string.format('%d', now + ttl), id)
  local ttl_ms = math.ceil(ttl / 1000) + slack_ms
  if redis.call('PTTL', key) < ttl_ms then
    redis.call('PEXPIRE', key, ttl_ms)
  end
  return 1
end

-- Gives a lease back. Releasing a lease that is not held (released
-- already, expired, never acquired) does nothing. An emptied set
-- disappears with its last member.
--
-- ARGV[1]        the lease id (release reads no clock)
--
-- Returns 1 if the lease was held, else 0.
local function release(keys, argv)
  return redis.call('ZREM', keys[1], argv[1])
end
