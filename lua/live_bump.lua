-- Moves the fleet's live-change version on, so that every instance
-- reads the tables again (src/store/redis/live.rs).
--
-- KEYS[1]  the version (a counter)
--
-- Returns the new version.

return redis.call('INCR', KEYS[1])
