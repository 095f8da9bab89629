-- The clock, shared by every script that reads one: the including script
-- takes "now" in ARGV[1], in microseconds, or "" to read the server clock.
-- Defines now (microseconds) and slack_ms.
--
-- With the caller's clock, keys still expire on Redis' own: each lives a
-- minute (slack_ms) past the moment its state stops mattering, so that a
-- caller's clock that falls behind Redis' (another instance's lags, a test
-- clock stands still) by less than that never finds its state gone early.
-- One part for every script keeps it equal in all of them; see
-- TimeSource::Client in src/store/redis.rs.
local now, slack_ms
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  slack_ms = 0
else
  now = tonumber(ARGV[1])
  slack_ms = 60000
end
