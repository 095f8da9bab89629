-- The fleet's live-change version (src/store/redis/live.rs). A script
-- rather than a GET, so that it shares the store's timeout, reconnection
-- and metrics with every other call.
--
-- KEYS[1]  the version (a counter)
--
-- Returns the version, 0 when there is none yet.

return tonumber(redis.call('GET', KEYS[1]) or '0')
