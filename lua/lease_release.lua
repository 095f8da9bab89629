-- Gives a concurrency lease back. Releasing a lease that is not held
-- (released already, expired, never acquired) does nothing. An emptied set
-- disappears with its last member.
--
-- KEYS[1]   the key's lease set (see lease_acquire.lua)
-- ARGV[1]   the lease id
--
-- Returns 1 if the lease was held, else 0.

return redis.call('ZREM', KEYS[1], ARGV[1])
