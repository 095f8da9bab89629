-- Stores a call of the sliding log: logs cost entries at now and trims
-- what has left every window. Comes after lua/sliding_log.lua in the
-- check (then lua/common/admit.lua) and after lua/sliding_log_charge.lua
-- in a charge; needs key, fmt, last (the newest entry, read before any
-- write), longest and top from either, and cost.
-- Transcribes log_store in src/window.rs.

-- Entries already logged at now exist only if the newest (read before any
-- write) is at now or later: most calls skip the count.
local seq = 0
if last[2] and tonumber(last[2]) >= now then
  seq = redis.call('ZCOUNT', key, fmt(now), fmt(now))
end
local j = 0
while j < cost do
  local members = {}
  local upto = math.min(cost, j + 500)
  while j < upto do
    members[#members + 1] = fmt(now)
    members[#members + 1] = fmt(now) .. '-' .. fmt(seq + j)
    j = j + 1
  end
  redis.call('ZADD', key, unpack(members))
end
-- The trim comes after the ZADD: on a master past maxmemory Redis refuses
-- a script's first write only if it is one that takes memory, and lets
-- every later write through, so a trim first would let the entries in.
-- Trim what has left every window, and with the caller's clock only what
-- has left them slack_ms ago: an entry this caller no longer counts may
-- still be inside the window of another whose clock lags. (The entries
-- just logged are at now, which the trim leaves alone.)
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - longest - slack_ms * 1000))
-- Once the newest entry has left the longest window the log means nothing.
local ttl_ms = math.ceil((top + longest - now) / 1000)
if ttl_ms < 1 then ttl_ms = 1 end
redis.call('PEXPIRE', key, ttl_ms + slack_ms)
