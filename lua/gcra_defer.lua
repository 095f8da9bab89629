-- Upstream feedback for GCRA: hold back every limit of one identity so
-- that its next call of cost 1 is admitted no earlier than now + pause.
-- Transcribes gcra::defer in src/gcra.rs; keep the two in step.
--
-- A call of cost 1 passes from tat + T - tolerance on, so each TAT is
-- raised to at least now + pause + tolerance - T, and never lowered. Keys
-- expire when that TAT has passed, as in gcra.lua.
--
-- KEYS[i]        TAT key of limit i (all keys share one hash tag)
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        pause in microseconds
-- ARGV[1+2i]     emission interval T of limit i, in microseconds
-- ARGV[2+2i]     tolerance (burst * T) of limit i, in microseconds
--
-- Returns how many limits were moved (0 when every limit already reached
-- past the pause).

-- Runs after lua/common/clock.lua (joined in src/store/redis/defer.rs):
-- now and slack_ms come from there.

local pause = tonumber(ARGV[2])

local moved = 0
for i = 1, #KEYS do
  local emission = tonumber(ARGV[1 + 2 * i])
  local tolerance = tonumber(ARGV[2 + 2 * i])
  local floor = now + pause + tolerance - emission
  local tat = tonumber(redis.call('GET', KEYS[i]) or 0) or 0
  if tat < floor then
    local ttl_ms = math.ceil((floor - now) / 1000)
    if ttl_ms < 1 then ttl_ms = 1 end
    redis.call('SET', KEYS[i], string.format('%d', floor), 'PX', ttl_ms + slack_ms)
    moved = moved + 1
  end
end
return moved
