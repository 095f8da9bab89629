-- Fixed windows over one or more limits of one identity, decided together:
-- the call passes only if every window admits it, and a denied call
-- stores nothing. Transcribes fixed_window in src/window.rs; keep the two
-- in step.
--
-- KEYS[i]        counter of window i: "<window start>:<cost so far>"
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        cost (never above the smallest count: checked by the caller)
-- ARGV[1+2i]     length of window i, in microseconds
-- ARGV[2+2i]     count of window i
--
-- Windows are aligned to the clock's epoch: [k·length, (k+1)·length).
-- The stored start says which window a count belongs to, so a count is
-- never read into the next window, whatever the key's TTL. It only moves
-- forward: a caller whose clock is still in an earlier window than the
-- stored one (TimeSource::Client, clocks apart) is decided in the stored
-- window, its reset and retry running to that window's end on the
-- caller's clock.
--
-- Returns {allowed (1/0), deciding window (1-based), remaining, reset_us,
--          retry_after_us (0 when allowed)}, then, for several windows,
--          remaining and reset_us of each window in order, then hold_us:
--          when denied, how long every figure of the reply stays true
--          while nobody else writes (the resets counting down), at most
--          the retry; 0 when allowed. The deny cache of the Redis store
--          answers the same call from it (src/store/deny_cache.rs).

-- With the caller's clock, keys still expire on Redis' own: each lives a
-- minute (slack_ms) past the moment its state stops mattering, so that a
-- caller's clock that falls behind Redis' (another instance's lags, a test
-- clock stands still) by less than that never finds its state gone early.
-- Keep it equal in every script; see TimeSource::Client in src/store/redis.rs.
local now, slack_ms
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  slack_ms = 0
else
  now = tonumber(ARGV[1])
  slack_ms = 60000
end
local cost = tonumber(ARGV[2])
local n = #KEYS

-- floor(a / b) for non-negative integers, immune to division rounding.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- remaining0 and reset0: each window's figures of now, before the call.
local admits, remaining, reset, starts, used = {}, {}, {}, {}, {}
local remaining0, reset0 = {}, {}
for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
  local count = tonumber(ARGV[2 + 2 * i])
  local start = idiv(now, length) * length
  used[i] = 0
  local stored = redis.call('GET', KEYS[i])
  if stored then
    local s, c = string.match(stored, '^(%d+):(%d+)$')
    if not s then return redis.error_reply('fleetgate: unreadable window state') end
    s = tonumber(s)
    -- A stored start later than ours: another caller's clock is ahead and
    -- has begun a later window. Decide in that window (its count, its
    -- end) and never move the start back: a lagging clock must not read
    -- a fresh window into a full one.
    if s >= start then start, used[i] = s, tonumber(c) end
  end
  starts[i] = start
  reset[i] = start + length - now
  reset0[i] = reset[i]
  remaining0[i] = count - used[i]
  if remaining0[i] < 0 then remaining0[i] = 0 end
  admits[i] = used[i] + cost <= count
  if admits[i] then
    remaining[i] = count - used[i] - cost
  else
    remaining[i] = remaining0[i]
  end
end

-- The reply: the deciding window's figures, then every window's when there
-- are several.
local function reply(allowed, i, retry_us, hold_us)
  local out = {allowed, i, remaining[i], reset[i], retry_us}
  if n > 1 then
    -- A denied call charges nothing: every window's figures of now.
    local r, t = remaining, reset
    if allowed == 0 then r, t = remaining0, reset0 end
    for j = 1, n do
      out[#out + 1] = r[j]
      out[#out + 1] = t[j]
    end
  end
  out[#out + 1] = hold_us
  return out
end

-- Denied: the window with the longest retry. Admitted: the one with the
-- least remaining. On ties the longest window, then the first.
local function longer(i, j) return tonumber(ARGV[1 + 2 * i]) > tonumber(ARGV[1 + 2 * j]) end
local worst, tight = 0, 0
for i = 1, n do
  if not admits[i] then
    if worst == 0 or reset[i] > reset[worst]
        or (reset[i] == reset[worst] and longer(i, worst)) then
      worst = i
    end
  elseif tight == 0 or remaining[i] < remaining[tight]
      or (remaining[i] == remaining[tight] and longer(i, tight)) then
    tight = i
  end
end
if worst > 0 then
  -- Every figure holds until the first window ends (the resets counting
  -- down), then that window's count starts again.
  local hold = reset[worst]
  for i = 1, n do
    if reset[i] < hold then hold = reset[i] end
  end
  return reply(0, worst, reset[worst], hold)
end

for i = 1, n do
  -- The key lives until its window ends.
  local ttl_ms = math.ceil(reset[i] / 1000)
  if ttl_ms < 1 then ttl_ms = 1 end
  local value = string.format('%d:%d', starts[i], used[i] + cost)
  redis.call('SET', KEYS[i], value, 'PX', ttl_ms + slack_ms)
end
return reply(1, tight, 0, 0)
