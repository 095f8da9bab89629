-- Sliding-window counters over one or more limits of one identity,
-- decided together: the call passes only if every window admits it, and a
-- denied call stores nothing. Transcribes src/algorithm/sliding_window.rs
-- function by function; keep the two in step, down to the order of every
-- floating-point operation, so that both stores decide alike. Its check,
-- peek, charge and refund are the window operations of lua/prelude.lua run
-- on the parts below (the prelude says what they take and answer).
--
-- KEYS[i]        counters of window i: "<fixed window start>:<its cost so
--                far>:<the previous fixed window's cost>"
-- ARGV           a window call's (see lua/prelude.lua)
--
-- The estimate of a sliding window of length W ending now is the current
-- fixed window's cost plus the previous one's, weighted by the share of it
-- the sliding window still covers: est = prev * (min(r, W) / W), r = time
-- left in the current fixed window. Admitted when est <= count - curr -
-- cost. The stored start only moves forward: a caller whose clock is
-- still in an earlier window than the stored one (TimeSource::Client,
-- clocks apart) is decided in the stored window, where r exceeds W by its
-- lag and its reset and retry run to that window's end on its own clock.
-- A charge past the count weighs as the previous window's count over the
-- next window, less and less as the sliding window leaves it.

-- The most a counter holds (2^50): charges saturate there, so that every
-- count stays exact in Lua's doubles (MAX_COUNTED in
-- src/algorithm/window.rs).
local most = 1125899906842624

local function lists()
  return {remaining = {}, reset = {}, retry = {}, remaining0 = {}, reset0 = {}, start = {},
    count = {}, prev = {}, current = {}}
end

-- Counter::window_at and counts: the fixed window a call now is decided
-- in, its count so far and the previous window's.
local function read(keys, argv, n, now, w)
  for i = 1, n do
    local length = tonumber(argv[1 + 2 * i])
    local start, curr, prev, current = idiv(now, length) * length, 0, 0, false
    local stored = redis.call('GET', keys[i])
    if stored then
      local s, c, p = string.match(stored, '^(%d+):(%d+):(%d+)$')
      if not s then return redis.error_reply('fleetgate: unreadable window state') end
      s, c, p = tonumber(s), tonumber(c), tonumber(p)
      -- A stored start later than ours: another caller's clock is ahead.
      -- Decide in that window, never moving the start back.
      if s >= start then
        start, curr, prev, current = s, c, p, true
      elseif s == start - length then
        prev = c
      end
    end
    w.start[i], w.count[i], w.prev[i], w.current[i] = start, curr, prev, current
  end
end

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

-- sliding_window::verdicts: what each window says about a call of cost.
local function verdicts(keys, argv, n, now, cost, w)
  for i = 1, n do
    local length = tonumber(argv[1 + 2 * i])
    local count = tonumber(argv[2 + 2 * i])
    local curr, prev = w.count[i], w.prev[i]
    local finish = w.start[i] + length
    -- r is more than a window for a lagging caller: the previous window
    -- then weighs in full.
    local r = finish - now
    local rw = r
    if rw > length then rw = length end
    local weight = rw / length
    local est = prev * weight
    local room = count - curr - cost
    local remaining0 = math.floor(count - curr - est)
    if remaining0 < 0 then remaining0 = 0 end
    local reset0 = 0
    if curr > 0 then
      reset0 = finish + length - now
    elseif prev > 0 then
      reset0 = r
    end
    w.remaining0[i], w.reset0[i] = remaining0, reset0
    if est <= room then
      w.remaining[i], w.reset[i], w.retry[i] = math.floor(room - est), finish + length - now, 0
    else
      w.remaining[i], w.reset[i] = remaining0, reset0
      w.retry[i] = wait_for(r, length, count, curr, prev, cost)
    end
  end
end

-- sliding_window::store: adds cost to every window's current count,
-- saturating at `most` (only a charge can get there). The key outlives
-- its window, whose count is the next one's "previous".
local function store(keys, argv, n, now, slack_ms, cost, w)
  for i = 1, n do
    local count = w.count[i]
    if count then
      local until_us = w.start[i] + 2 * tonumber(argv[1 + 2 * i])
      local value = string.format('%d:%d:%d', w.start[i], math.min(count + cost, most), w.prev[i])
      put(keys[i], value, until_us, nil, now, slack_ms)
    end
  end
end

-- After a denial: a window's remaining grows as its previous window
-- weighs less; it reaches m + 1 when a call of cost m + 1 would fit.
-- Until the first window gets there only the resets move, counting down.
local function held(keys, argv, i, now, w)
  local length = tonumber(argv[1 + 2 * i])
  local count = tonumber(argv[2 + 2 * i])
  local curr, prev = w.count[i], w.prev[i]
  if w.remaining0[i] < count and (curr > 0 or prev > 0) then
    return wait_for(w.start[i] + length - now, length, count, curr, prev, w.remaining0[i] + 1)
  end
end

-- The parts of sliding_window::check, ::peek, ::charge and ::refund.
local sliding_window = {lists = lists, read = read, verdicts = verdicts, held = held,
  store = store}
