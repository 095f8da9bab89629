-- Sliding-window log over one or more windows of one identity, all kept in
-- one sorted set (trimmed to the longest window) and decided together: the
-- call passes only if every window admits it, and a denied call is not
-- logged. Transcribes sliding_log in src/window.rs; keep the two in step.
--
-- KEYS[1]        the log: score = admission time in microseconds, one
--                member per unit of cost
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        cost (never above the smallest count: checked by the caller)
-- ARGV[1+2i]     length of window i, in microseconds
-- ARGV[2+2i]     count of window i
--
-- Members are "<time>-<seq>", seq counting the members already logged at
-- that same microsecond. The script runs atomically on the one server that
-- holds the key, so members are unique whichever process or machine calls,
-- and two calls in one microsecond both count.
--
-- Returns {allowed (1/0), deciding window (1-based), remaining, reset_us,
--          retry_after_us (0 when allowed)}, then, for several windows,
--          remaining and reset_us of each window in order, then hold_us:
--          when denied, how long every figure of the reply stays true
--          while nobody else writes (the resets counting down), at most
--          the retry; 0 when allowed. The deny cache of the Redis store
--          answers the same call from it (src/store/deny_cache.rs).

-- Runs after lua/common/clock.lua, windows.lua and window_call.lua (joined in
-- src/store/redis/window.rs): now, slack_ms, cost, n, the figures of each
-- window and pick and reply come from there.

local key = KEYS[1]

local function fmt(x) return string.format('%d', x) end

-- The newest logged time: the reset is when it leaves a window. After an
-- admitted call it is at least now.
local newest = now
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then newest = tonumber(last[2]) end
local top = newest
if top < now then top = now end

local longest = 0
for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
  local count = tonumber(ARGV[2 + 2 * i])
  if length > longest then longest = length end
  local after = '(' .. fmt(now - length)
  local used = redis.call('ZCOUNT', key, after, '+inf')
  if used + cost <= count then
    reset[i] = top + length - now
    admits[i] = true
    remaining[i] = count - used - cost
    retry[i] = 0
    remaining0[i] = count - used
    reset0[i] = 0
    if last[2] then
      reset0[i] = newest + length - now
      if reset0[i] < 0 then reset0[i] = 0 end
    end
  else
    -- The k-th oldest entry in the window must leave before the call fits.
    local k = used + cost - count
    local entry = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
    if not entry[2] then return redis.error_reply('fleetgate: sliding log changed under the script') end
    admits[i] = false
    -- Denied, so the window holds entries: the newest is one.
    reset[i] = newest + length - now
    remaining[i] = count - used
    if remaining[i] < 0 then remaining[i] = 0 end
    retry[i] = tonumber(entry[2]) + length - now
    remaining0[i], reset0[i] = remaining[i], reset[i]
  end
end

local worst, tight = pick()
if worst > 0 then
  -- A window's remaining changes when its oldest entry leaves it; until
  -- then only the resets move, counting down.
  local hold = retry[worst]
  for i = 1, n do
    local length = tonumber(ARGV[1 + 2 * i])
    local oldest = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - length), '+inf',
      'WITHSCORES', 'LIMIT', 0, 1)
    if oldest[2] then
      local leaves = tonumber(oldest[2]) + length - now
      if leaves < hold then hold = leaves end
    end
  end
  return reply(0, worst, retry[worst], hold)
end

