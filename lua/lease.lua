-- Concurrency leases: one sorted set per key and limit name, member = lease
-- id, score = expiry in microseconds. Follows the rules in
-- src/store/lease.rs, as the memory store does (src/store/memory/lease.rs);
-- keep them in step. Runs after lua/prelude.lua, whose clock acquire and
-- renew read (release only for an undo, below).
--
-- A release can reach Redis before the acquire it undoes: a caller that
-- gives up on an acquire (or sees it fail) releases its lease at once, and
-- the acquire may still be sent again after that release (its script was
-- missing from Redis' cache: `SCRIPT LOAD`, then the call again). So such
-- a release (an undo: its acquire was never answered) that finds no lease
-- leaves a tombstone, the id scored minus the instant it may go, for as
-- long as such an acquire may still come (a few store timeouts, passed by
-- the caller); an acquire that finds its id's tombstone is refused and
-- takes nothing. Tombstones score below zero: never counted as held, and
-- trimmed, once past, by the same ZREMRANGEBYSCORE as expired leases.
--
-- KEYS[1]        the key's lease set
-- KEYS[2]        the set's wait marker, `<KEYS[1]>:w` (acquire and release;
--                the same hash tag, so a script stays in one cluster slot):
--                present while a refused caller waits for a slot
-- ARGV[1]        now in microseconds, or "" to read the server clock (not
--                for release)
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
local function take(key, marker, capacity, ttl, id, wait_ms, now, slack_ms)
  -- Only unexpired leases count: an expired one's holder vanished.
  local after = '(' .. string.format('%d', now)
  local held = redis.call('ZCOUNT', key, after, '+inf')
  if held >= capacity then
    local oldest = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    local wait = 0
    if oldest[2] then wait = tonumber(oldest[2]) - now end
    local wait_for = wait_ms and tonumber(wait_ms)
    -- The marker lives until the last waiter's wait ends: never shortened
    -- (a PTTL of -2, no marker, or -1, none set, is always shorter).
    if wait_for and wait_for > 0 and redis.call('PTTL', marker) < wait_for then
      redis.call('SET', marker, '1', 'PX', wait_ms)
    end
    return {0, held, wait}
  end
  -- The ZADD is the first write: on a master past maxmemory Redis refuses
  -- a script's first write only if it is one that takes memory, and lets
  -- every later write through, so the trim must not come first. Leases
  -- whose holder vanished, and tombstones past, are dropped here, in the
  -- same call: no separate trimming round trip.
  if redis.call('ZADD', key, 'NX', string.format('%d', now + ttl), id) == 0 then
    local score = tonumber(redis.call('ZSCORE', key, id))
    if score < 0 and -score > now then
      -- Released already, by a caller that gave up on it.
      redis.call('ZREM', key, id)
      return {0, held, 0}
    end
    -- A tombstone past, or held by this id already (an acquire sent
    -- twice): taken anew.
    redis.call('ZADD', key, string.format('%d', now + ttl), id)
    if score > now then held = held - 1 end
  end
  redis.call('ZREMRANGEBYSCORE', key, string.format('%d', -now), string.format('%d', now))
  local ttl_ms = math.ceil(ttl / 1000) + slack_ms
  if redis.call('PTTL', key) < ttl_ms then
    redis.call('PEXPIRE', key, ttl_ms)
  end
  return {1, held + 1, 0}
end

local function acquire(keys, argv, now, slack_ms)
  return take(keys[1], keys[2], tonumber(argv[2]), tonumber(argv[3]), argv[4], argv[5], now,
    slack_ms)
end

-- Extends a lease that is still held and unexpired to now + ttl. An
-- expired lease is dropped, never revived: its slot may have gone to
-- someone else.
--
-- ARGV[2]        lease TTL in microseconds
-- ARGV[3]        the lease id
--
-- Returns 1 if renewed, 0 if the lease is not held (any more; a
-- tombstone, scored below zero, counts as expired and goes).
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
-- already, expired, never acquired) changes nothing, but for an undo's
-- tombstone (see the top of this file). An emptied set disappears with
-- its last member; a set left with tombstones only expires by itself. A
-- release that frees a slot of a set some refused caller waits for (its
-- marker, KEYS[2], exists) is announced: `PUBLISH <ARGV[2]> <KEYS[1]>`, which every instance's
-- subscriber hears (on a Redis Cluster, through any node). The
-- announcement is best effort: a PUBLISH the server refuses (an ACL user
-- without the channel) leaves the release as it is, done and answered.
-- Leases that expire, or that a renewal finds expired, are announced by
-- nobody: the waiters also try again when the oldest lease expires.
--
-- ARGV[1]        the lease id
-- ARGV[2]        the channel releases are announced on
-- ARGV[3]        now in microseconds, or "" to read the server clock (read
--                by an undo only)
-- ARGV[4]        for an undo, how long its tombstone lasts, in
--                milliseconds; "" or absent for the release of a granted
--                lease, which leaves none
--
-- Returns 1 if the lease was held, else 0.
local function give_back(key, marker, id, channel)
  local held = redis.call('ZREM', key, id)
  if held == 1 and channel and redis.call('EXISTS', marker) == 1 then
    redis.pcall('PUBLISH', channel, key)
  end
  return held
end

-- Leaves the tombstone of lease `id`, not held, for `life_ms`. Best
-- effort against memory, and the script's first write when it runs alone:
-- a master past maxmemory refuses it, and the release is done and
-- answered all the same.
local function bury(key, id, now, slack_ms, life_ms)
  -- With the caller's clock, another instance's may run ahead of it by up
  -- to slack_ms: the tombstone lasts that much longer, so that such an
  -- instance's acquire does not trim it early.
  local life = tonumber(life_ms) + slack_ms
  local added = redis.pcall('ZADD', key, string.format('%d', -(now + life * 1000)), id)
  if type(added) == 'table' and added.err and string.sub(added.err, 1, 4) ~= 'OOM ' then
    -- Not for want of memory (READONLY on a demoted master, a set of
    -- another type): the server's or the call's, as for any write.
    error(added)
  end
  if added == 1 then
    local key_ms = life
    if redis.call('PTTL', key) < key_ms then
      redis.call('PEXPIRE', key, key_ms)
    end
  end
end

-- An undo: gives the lease back if it is held, else leaves its tombstone
-- (a tombstone already there stays as it is).
local function undo(key, marker, id, channel, now, slack_ms, life_ms)
  local score = redis.call('ZSCORE', key, id)
  if not score then
    bury(key, id, now, slack_ms, life_ms)
    return 0
  end
  if tonumber(score) < 0 then return 0 end
  return give_back(key, marker, id, channel)
end

local function release(keys, argv)
  if argv[4] and argv[4] ~= '' then
    local now, slack_ms = clock(argv[3])
    return undo(keys[1], keys[2], argv[1], argv[2], now, slack_ms, argv[4])
  end
  return give_back(keys[1], keys[2], argv[1], argv[2])
end

-- Acquires and releases queued together (src/store/redis/batch.rs), in
-- order, each as a script of its own would run it: a release queued
-- before an acquire of the same set frees its slot for it.
--
-- KEYS           each operation's set and wait marker, in order
-- ARGV[1]        now in microseconds, or "" to read the server clock (read
--                once, whatever the operations)
-- ARGV[2]        the channel releases are announced on
-- then, for each operation in order:
--   "a"          an acquire, followed by its capacity, TTL, id and wait
--                (ARGV[2..5] of acquire)
--   "r"          a release, followed by its lease id and tombstone life
--                (ARGV[1] and ARGV[4] of release)
--
-- Returns one reply per operation: acquire's list or release's number;
-- or, for an operation whose set holds another type or whose first write
-- a master past maxmemory refused (it wrote nothing), the text of that
-- error (a string, not an error reply: one error inside the list would
-- fail the whole reply in clients), so that the releases beside it still
-- land (a release only deletes, which such a master takes). Any other
-- error (READONLY, NOREPLICAS) is the server's and fails the script, as
-- it would a script of one call, so that the store sees it and acts. A
-- write already made lets later ones through past maxmemory, as in any
-- script: an acquire behind a release may then be granted where alone
-- it would have been refused.
local function batch(keys, argv, now, slack_ms)
  local replies, channel, a = {}, argv[2], 3
  for c = 1, #keys / 2 do
    local key, marker = keys[2 * c - 1], keys[2 * c]
    local ok, reply
    if argv[a] == 'a' then
      ok, reply = pcall(take, key, marker, tonumber(argv[a + 1]), tonumber(argv[a + 2]),
        argv[a + 3], argv[a + 4], now, slack_ms)
      a = a + 5
    else
      local id, life_ms = argv[a + 1], argv[a + 2]
      if life_ms ~= '' then
        ok, reply = pcall(undo, key, marker, id, channel, now, slack_ms, life_ms)
      else
        ok, reply = pcall(give_back, key, marker, id, channel)
      end
      a = a + 3
    end
    if not ok then
      local text = type(reply) == 'table' and reply.err or tostring(reply)
      if not (string.find(text, 'WRONGTYPE', 1, true) or string.sub(text, 1, 4) == 'OOM ') then
        error(reply)
      end
      reply = text
    end
    replies[c] = reply
  end
  return replies
end
