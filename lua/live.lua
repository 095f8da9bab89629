-- The fleet's live changes (src/store/redis/live.rs): a version, a
-- counter that every instance polls and reads the tables again when it
-- moves on; six tables of changes (hashes); and the instances seen, with
-- their heartbeats. Every key shares the {live} hash tag. Runs after
-- lua/prelude.lua, and needs nothing from it: the heartbeat reads the
-- server's clock in milliseconds itself, whatever clock the store uses.
--
-- KEYS[1]        the version (a counter), but for heartbeat

-- Reads the version and every table at once.
--
-- KEYS[2..]      the tables, in Table::ALL's order
--
-- Returns {version, HGETALL of each table}.
local function load(keys, argv)
  local out = { tonumber(redis.call('GET', keys[1]) or '0') }
  for i = 2, #keys do out[i] = redis.call('HGETALL', keys[i]) end
  return out
end

-- The version, 0 when there is none yet: a script rather than a GET, so
-- that it shares the store's timeout, reconnection and metrics with every
-- other call.
local function version(keys, argv)
  return tonumber(redis.call('GET', keys[1]) or '0')
end

-- Writes one change and moves the version on, at once; first deletes the
-- fields a deny or allow list's writer found ended, each only if it still
-- holds the value the writer saw (another instance may have listed it
-- again meanwhile).
--
-- KEYS[2]        the change's table
-- ARGV[1]        the field
-- ARGV[2]        the value; empty to delete the field (no table stores an
--                empty value)
-- ARGV[3..]      ended fields to delete, as field, value pairs
--
-- Returns the new version.
local function write(keys, argv)
  for i = 3, #argv - 1, 2 do
    if redis.call('HGET', keys[2], argv[i]) == argv[i + 1] then
      redis.call('HDEL', keys[2], argv[i])
    end
  end
  if argv[2] ~= '' then
    redis.call('HSET', keys[2], argv[1], argv[2])
  else
    redis.call('HDEL', keys[2], argv[1])
  end
  return redis.call('INCR', keys[1])
end

-- Moves the version on alone, so that every instance reads the tables
-- again. Returns the new version.
local function bump(keys, argv)
  return redis.call('INCR', keys[1])
end

-- Records this instance as seen now, on the server's clock, with the
-- limits it publishes, and forgets the instances not seen for a while.
--
-- KEYS[1]        the instances (a hash: id -> "started last_seen address")
-- KEYS[2]        their published limits (a hash: id -> "name=limit ...")
-- ARGV[1]        this instance's id
-- ARGV[2]        when it started, in Unix milliseconds
-- ARGV[3]        its address
-- ARGV[4]        how long an instance not seen is kept, in milliseconds
-- ARGV[5]        its limits, "name=limit" pairs separated by spaces (may
--                be empty)
--
-- Returns {now in Unix milliseconds, the instances kept as
-- id, "started last_seen address" pairs, their limits as id, text pairs}.
local function heartbeat(keys, argv)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', keys[1], argv[1], argv[2] .. ' ' .. now .. ' ' .. argv[3])
  if argv[5] ~= '' then
    redis.call('HSET', keys[2], argv[1], argv[5])
  else
    redis.call('HDEL', keys[2], argv[1])
  end
  local all = redis.call('HGETALL', keys[1])
  local out, limits = {}, {}
  for i = 1, #all, 2 do
    local seen = tonumber(string.match(all[i + 1], '^%d+ (%d+)')) or 0
    if now - seen > tonumber(argv[4]) then
      redis.call('HDEL', keys[1], all[i])
      redis.call('HDEL', keys[2], all[i])
    else
      out[#out + 1] = all[i]
      out[#out + 1] = all[i + 1]
      local published = redis.call('HGET', keys[2], all[i])
      if published then
        limits[#limits + 1] = all[i]
        limits[#limits + 1] = published
      end
    end
  end
  redis.call('PEXPIRE', keys[1], argv[4])
  if #limits > 0 then redis.call('PEXPIRE', keys[2], argv[4]) end
  return { now, out, limits }
end
