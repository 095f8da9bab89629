-- Writes one live change and moves the version on, at once
-- (src/store/redis/live.rs).
--
-- KEYS[1]  the version (a counter)
-- KEYS[2]  the change's table (a hash)
-- ARGV[1]  the field
-- ARGV[2]  the value; absent to delete the field
--
-- Returns the new version.

if ARGV[2] then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return redis.call('INCR', KEYS[1])
