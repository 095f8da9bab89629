-- Cost after the fact for GCRA: takes cost from every limit of one
-- identity unconditionally (no admission test, no cap at the burst), into
-- debt if need be, and returns the figures of now for a call of cost 1.
-- Transcribes gcra::charge in src/gcra.rs; keep the two in step.
--
-- KEYS[i]        TAT key of limit i (all keys share one hash tag)
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        cost
-- ARGV[1+2i]     emission interval T of limit i, in microseconds
-- ARGV[2+2i]     tolerance (burst * T) of limit i, in microseconds
-- ARGV[2+2n+i]   horizon of limit i (n limits): its tolerance and 16
--                periods of its rate or an hour, whichever is longer, in
--                microseconds, at most 2^50 (gcra::debt_horizon)
--
-- tat = min(max(stored, now) + cost * T, now + horizon), never below the
-- stored one: a debt is repaid at the limit's rate like any TAT, and cut
-- to what the limit refills in that time, so that a huge charge holds
-- the identity back that long at most (a product past 2^53 is inexact,
-- but then far past the cut). Keys expire once their TAT has passed.
--
-- Returns {allowed (1/0), deciding limit (1-based), remaining, reset_us,
-- retry_after_us when denied / 0 when allowed}, as lua/gcra.lua does.

-- Runs after lua/common/clock.lua and idiv.lua (joined in
-- src/store/redis/adjust.rs): now, slack_ms and idiv come from there.

local cost = tonumber(ARGV[2])

local tats = {}
for i = 1, #KEYS do
  local emission = tonumber(ARGV[1 + 2 * i])
  local horizon = tonumber(ARGV[2 + 2 * #KEYS + i])
  local stored = tonumber(redis.call('GET', KEYS[i]) or 0) or 0
  local tat = stored
  if tat < now then tat = now end
  local charged = tat + cost * emission
  if charged > now + horizon then charged = now + horizon end
  if charged < stored then charged = stored end
  tats[i] = charged
end
for i = 1, #KEYS do
  local ttl_ms = math.ceil((tats[i] - now) / 1000)
  if ttl_ms < 1 then ttl_ms = 1 end
  redis.call('SET', KEYS[i], string.format('%d', tats[i]), 'PX', ttl_ms + slack_ms)
end

-- The figures of now for a call of cost 1: denied, the limit with the
-- longest retry; allowed, the limit with the least remaining.
local worst, worst_retry = 0, -1
local tight, tight_remaining = 1, -1
for i = 1, #KEYS do
  local emission = tonumber(ARGV[1 + 2 * i])
  local tolerance = tonumber(ARGV[2 + 2 * i])
  local tat = tats[i]
  local next = tat + emission
  local horizon = now + tolerance
  if next > horizon then
    local retry = next - horizon
    if retry > worst_retry then worst, worst_retry = i, retry end
  else
    local remaining = idiv(horizon - tat, emission)
    if tight_remaining < 0 or remaining < tight_remaining then
      tight, tight_remaining = i, remaining
    end
  end
end
if worst > 0 then
  return {0, worst, 0, tats[worst] - now, worst_retry}
end
return {1, tight, tight_remaining, tats[tight] - now, 0}
