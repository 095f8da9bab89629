-- Clears one identity's state under one policy (or concurrency limit)
-- name: every limit's GCRA TAT and hold, the sliding log, every window's
-- counters, every calendar quota's tally, the lease set and its wait
-- marker. The keys all share the identity's hash tag, so this one script
-- runs on the one node that owns them, on a Redis Cluster too. Runs after lua/prelude.lua, and needs nothing from it.
--
-- KEYS[i]   every key the identity may have under the name, for as many
--           limits as a policy may hold (RedisStore::reset_keys in
--           src/store/redis/run.rs)
--
-- Returns how many of the keys existed.
local function reset(keys, argv)
  return redis.call('DEL', unpack(keys))
end
