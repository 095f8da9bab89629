-- Sliding-window counters over one or more limits of one identity, decided
-- together: the call passes only if every window admits it, and a denied
-- call stores nothing. Transcribes sliding_counter in src/window.rs; keep
-- the two in step, down to the order of every floating-point operation,
-- so that both stores decide alike.
--
-- KEYS[i]        counters of window i: "<fixed window start>:<its cost so
--                far>:<the previous fixed window's cost>"
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        cost (never above the smallest count: checked by the caller)
-- ARGV[1+2i]     length of window i, in microseconds
-- ARGV[2+2i]     count of window i
--
-- The estimate of a sliding window of length W ending now is the current
-- fixed window's cost plus the previous one's, weighted by the share of it
-- the sliding window still covers: est = prev * (min(r, W) / W), r = time
-- left in the current fixed window. Admitted when est <= count - curr -
-- cost. The stored start only moves forward: a caller whose clock is
-- still in an earlier window than the stored one (TimeSource::Client,
-- clocks apart) is decided in the stored window, where r exceeds W by its
-- lag and its reset and retry run to that window's end on its own clock.
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

-- How long until a call of `cost` fits in a window of `length` and `count`
-- holding curr and prev, with r left of its fixed window, where it does not
-- fit now: while the previous window weighs too much, until it weighs
-- little enough, prev * (r - d) / W <= room; otherwise in the next window,
-- where curr becomes the previous one: curr * (W - e) / W <= count - cost.
local function wait_for(r, length, count, curr, prev, cost)
  local room = count - curr - cost
  local wait
  if room >= 0 then
    local x = room * length / prev
    wait = math.ceil(r - x)
  else
    local room2 = count - cost
    if curr <= room2 then
      wait = r
    else
      local x = room2 * length / curr
      wait = r + math.ceil(length - x)
    end
  end
  if wait < 1 then wait = 1 end
  return wait
end

local starts, currs, prevs = {}, {}, {}
for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
  local count = tonumber(ARGV[2 + 2 * i])
  local start = idiv(now, length) * length
  local curr, prev = 0, 0
  local stored = redis.call('GET', KEYS[i])
  if stored then
    local s, c, p = string.match(stored, '^(%d+):(%d+):(%d+)$')
    if not s then return redis.error_reply('fleetgate: unreadable window state') end
    s, c, p = tonumber(s), tonumber(c), tonumber(p)
    -- A stored start later than ours: another caller's clock is ahead.
    -- Decide in that window, never moving the start back.
    if s >= start then
      start, curr, prev = s, c, p
    elseif s == start - length then
      prev = c
    end
  end
  local finish = start + length
  starts[i], currs[i], prevs[i] = start, curr, prev
  -- r is more than a window for a lagging caller: the previous window
  -- then weighs in full.
  local r = finish - now
  local rw = r
  if rw > length then rw = length end
  local weight = rw / length
  local est = prev * weight
  local room = count - curr - cost
  remaining0[i] = math.floor(count - curr - est)
  if remaining0[i] < 0 then remaining0[i] = 0 end
  if curr > 0 then
    reset0[i] = finish + length - now
  elseif prev > 0 then
    reset0[i] = r
  else
    reset0[i] = 0
  end
  if est <= room then
    admits[i] = true
    remaining[i] = math.floor(room - est)
    reset[i] = finish + length - now
    retry[i] = 0
  else
    admits[i] = false
    retry[i] = wait_for(r, length, count, curr, prev, cost)
    remaining[i], reset[i] = remaining0[i], reset0[i]
  end
end

local worst, tight = pick()
if worst > 0 then
  -- A window's remaining grows as its previous window weighs less; it
  -- reaches m + 1 when a call of cost m + 1 would fit. Until the first
  -- window gets there only the resets move, counting down.
  local hold = retry[worst]
  for i = 1, n do
    local length = tonumber(ARGV[1 + 2 * i])
    local count = tonumber(ARGV[2 + 2 * i])
    local curr, prev = currs[i], prevs[i]
    if remaining0[i] < count and (curr > 0 or prev > 0) then
      local r = starts[i] + length - now
      local h = wait_for(r, length, count, curr, prev, remaining0[i] + 1)
      if h < hold then hold = h end
    end
  end
  return reply(0, worst, retry[worst], hold)
end

