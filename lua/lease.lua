-- Concurrency leases: one sorted set per key and limit name, member = lease
-- id, score = expiry in microseconds. Follows the rules in
-- src/store/lease.rs, as the memory store does (src/store/memory/lease.rs);
-- keep them in step. Runs after lua/prelude.lua, whose clock acquire and
-- renew read.
--
-- KEYS[1]        the key's lease set
-- KEYS[2]        the set's wait marker, `<KEYS[1]>:w` (acquire and release;
--                the same hash tag, so a script stays in one cluster slot):
--                present while a refused caller waits for a slot
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
-- ARGV[5]        how long the caller waits in a queue if refused, in whole
--                milliseconds; "", "0" or absent: it does not wait
--
-- A refused caller that waits marks the set (KEYS[2]) for as long as it
-- waits, so that the releases meanwhile are announced to it (see
-- release). The marker is a refused call's only write: on a read-only
-- replica, or on a master past maxmemory (the SET is the script's first
-- write and takes memory), a refused acquire that waits fails instead of
-- answering; one that does not wait writes nothing and is answered.
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
    local wait_ms = argv[5] and tonumber(argv[5])
    -- The marker lives until the last waiter's wait ends: never shortened
    -- (a PTTL of -2, no marker, or -1, none set, is always shorter).
    if wait_ms and wait_ms > 0 and redis.call('PTTL', keys[2]) < wait_ms then
      redis.call('SET', keys[2], '1', 'PX', argv[5])
    end
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
-- disappears with its last member. A release that frees a slot of a set
-- some refused caller waits for (its marker, KEYS[2], exists) is
-- announced: `PUBLISH <ARGV[2]> <KEYS[1]>`, which every instance's
-- subscriber hears (on a Redis Cluster, through any node). The
-- announcement is best effort: a PUBLISH the server refuses (an ACL user
-- without the channel) leaves the release as it is, done and answered.
-- Leases that expire, or that a renewal finds expired, are announced by
-- nobody: the waiters also try again when the oldest lease expires.
--
-- ARGV[1]        the lease id (release reads no clock)
-- ARGV[2]        the channel releases are announced on
--
-- Returns 1 if the lease was held, else 0.
local function release(keys, argv)
  local held = redis.call('ZREM', keys[1], argv[1])
  if held == 1 and argv[2] and redis.call('EXISTS', keys[2]) == 1 then
    redis.pcall('PUBLISH', argv[2], keys[1])
  end
  return held
end
