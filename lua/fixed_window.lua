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

-- Runs after lua/common/clock.lua, idiv.lua, windows.lua and window_call.lua
-- (joined in src/store/redis/window.rs): now, slack_ms, idiv, cost, n, the
-- figures of each window and pick and reply come from there.

local starts, used = {}, {}
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
    retry[i] = 0
  else
    remaining[i] = remaining0[i]
    -- The call fits once the window ends and its count starts again.
    retry[i] = reset[i]
  end
end

local worst, tight = pick()
if worst > 0 then
  -- Every figure holds until the first window ends (the resets counting
  -- down), then that window's count starts again.
  local hold = retry[worst]
  for i = 1, n do
    if reset[i] < hold then hold = reset[i] end
  end
  return reply(0, worst, retry[worst], hold)
end

