-- Reads the fleet's live changes at once: the version and every table
-- (src/store/redis/live.rs).
--
-- KEYS[1]    the version (a counter)
-- KEYS[2..5] the four tables (hashes), in Table::ALL's order
--
-- Returns {version, HGETALL of each table}, read atomically.

local out = { tonumber(redis.call('GET', KEYS[1]) or '0') }
for i = 2, 5 do out[i] = redis.call('HGETALL', KEYS[i]) end
return out
