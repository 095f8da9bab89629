-- Upstream feedback for GCRA: hold back every limit of one identity so
-- that at most `remaining` calls of cost 1 are admitted before
-- now + pause (with remaining 0: its next call comes no earlier than
-- that). Transcribes gcra::defer in src/gcra.rs; keep the two in step.
--
-- The k-th call of cost 1 passes from tat + k*T - tolerance on, so each
-- TAT is raised to at least now + pause + tolerance - (remaining + 1)*T,
-- and never lowered; a floor at or before now holds nothing back. With
-- remaining > 0 the floor is raised by the slots reserved since the last
-- hold that lie after the report was written, age before now
-- (tat - max(now - age + tolerance, hold)): the upstream may not have
-- counted them yet. A TAT that moves sets its hold: to
-- the new TAT, or with none left that far before it that the pending
-- slots stay pending.
-- Keys expire when that TAT has passed, as in gcra.lua.
--
-- Exact in doubles: a floor past now is below now + pause + tolerance
-- plus a pending advance (each at most 2^50 past a Unix time in
-- microseconds), and so is the credit (remaining + 1)*T it subtracts; a
-- larger credit, rounded or not, puts the floor before now, as the signed
-- Rust does.
--
-- KEYS[i]        TAT key of limit i, for i = 1..n (all keys share one
--                hash tag)
-- KEYS[n+i]      hold key of limit i: the TAT the last hold left
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        pause in microseconds
-- ARGV[3]        remaining calls before the pause ends
-- ARGV[4]        age of the report in microseconds
-- ARGV[3+2i]     emission interval T of limit i, in microseconds
-- ARGV[4+2i]     tolerance (burst * T) of limit i, in microseconds
--
-- Returns how many limits were moved (0 when every limit already held
-- back enough).

-- Runs after lua/common/clock.lua (joined in src/store/redis/defer.rs):
-- now and slack_ms come from there.

local pause = tonumber(ARGV[2])
local remaining = tonumber(ARGV[3])
local since = now - tonumber(ARGV[4])
if since < 0 then since = 0 end
local n = #KEYS / 2

local moved = 0
for i = 1, n do
  local emission = tonumber(ARGV[3 + 2 * i])
  local tolerance = tonumber(ARGV[4 + 2 * i])
  local floor = now + pause + tolerance - (remaining + 1) * emission
  local tat = tonumber(redis.call('GET', KEYS[i]) or 0) or 0
  local hold = tonumber(redis.call('GET', KEYS[n + i]) or 0) or 0
  local pending = tat - math.max(since + tolerance, hold)
  if pending < 0 then pending = 0 end
  -- Some left: pending slots count against it, and are settled. None
  -- left: they stay pending for the next report.
  local settled = pending
  if remaining > 0 then
    floor = floor + pending
    settled = 0
  end
  if floor > now and tat < floor then
    local ttl_ms = math.ceil((floor - now) / 1000)
    if ttl_ms < 1 then ttl_ms = 1 end
    redis.call('SET', KEYS[i], string.format('%d', floor), 'PX', ttl_ms + slack_ms)
    redis.call('SET', KEYS[n + i], string.format('%d', floor - settled), 'PX', ttl_ms + slack_ms)
    moved = moved + 1
  end
end
return moved
