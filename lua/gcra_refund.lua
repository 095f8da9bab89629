-- A refund for GCRA: gives cost back to every limit of one identity.
-- Transcribes gcra::refund in src/gcra.rs; keep the two in step.
--
-- tat = max(now, tat - cost * T) where tat > now; a limit already full is
-- left alone. Never below now: a refund gives no more than a fresh state
-- has (the full burst). A TAT brought back to now is a fresh state: its
-- key is deleted.
--
-- KEYS[i]        TAT key of limit i (all keys share one hash tag)
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        cost
-- ARGV[1+2i]     emission interval T of limit i, in microseconds
-- ARGV[2+2i]     tolerance (burst * T) of limit i (unused here)
--
-- Returns how many limits were moved.

-- Runs after lua/common/clock.lua (joined in src/store/redis/adjust.rs):
-- now and slack_ms come from there.

local cost = tonumber(ARGV[2])

local tats, moved = {}, 0
for i = 1, #KEYS do
  local emission = tonumber(ARGV[1 + 2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or 0) or 0
  tats[i] = false
  if tat > now then
    local back = cost * emission
    tat = tat - back
    if tat < now then tat = now end
    tats[i] = tat
    moved = moved + 1
  end
end
for i = 1, #KEYS do
  local tat = tats[i]
  if tat and tat > now then
    local ttl_ms = math.ceil((tat - now) / 1000)
    if ttl_ms < 1 then ttl_ms = 1 end
    redis.call('SET', KEYS[i], string.format('%d', tat), 'PX', ttl_ms + slack_ms)
  elseif tat then
    redis.call('DEL', KEYS[i])
  end
end
return moved
