-- Fixed windows over one or more limits of one identity, decided together:
-- the call passes only if every window admits it, and a denied call
-- stores nothing. Transcribes src/algorithm/fixed_window.rs function by
-- function; keep the two in step. Its check, peek, charge and refund are
-- the window operations of lua/prelude.lua run on the parts below (the
-- prelude says what they take and answer).
--
-- KEYS[i]        counter of window i: "<window start>:<cost so far>"
-- ARGV           a window call's (see lua/prelude.lua)
--
-- Windows are aligned to the clock's epoch: [k·length, (k+1)·length).
-- The stored start says which window a count belongs to, so a count is
-- never read into the next window, whatever the key's TTL. It only moves
-- forward: a caller whose clock is still in an earlier window than the
-- stored one (TimeSource::Client, clocks apart) is decided in the stored
-- window, its reset and retry running to that window's end on the
-- caller's clock. A charge past the count lets nothing pass until the
-- window ends; the overdraft goes with the rest of the count.

-- The most a counter holds (2^50): charges saturate there, so that every
-- count stays exact in Lua's doubles (MAX_COUNTED in
-- src/algorithm/window.rs).
local most = 1125899906842624

local function lists()
  return {remaining = {}, reset = {}, retry = {}, remaining0 = {}, reset0 = {}, start = {},
    count = {}, current = {}}
end

-- Counter::window_at and counts: the window a call now is decided in, and
-- its count so far.
local function read(keys, argv, n, now, w)
  for i = 1, n do
    local length = tonumber(argv[1 + 2 * i])
    local start, used, current = idiv(now, length) * length, 0, false
    local stored = redis.call('GET', keys[i])
    if stored then
      local s, c = string.match(stored, '^(%d+):(%d+)$')
      if not s then return redis.error_reply('fleetgate: unreadable window state') end
      s = tonumber(s)
      -- A stored start later than ours: another caller's clock is ahead
      -- and has begun a later window. Decide in that window (its count,
      -- its end) and never move the start back: a lagging clock must not
      -- read a fresh window into a full one.
      if s >= start then start, used, current = s, tonumber(c), true end
    end
    w.start[i], w.count[i], w.current[i] = start, used, current
  end
end

-- fixed_window::verdicts: what each window says about a call of cost;
-- the call fits once the window ends and its count starts again.
local function verdicts(keys, argv, n, now, cost, w)
  for i = 1, n do
    local reset = w.start[i] + tonumber(argv[1 + 2 * i]) - now
    counted(w, i, tonumber(argv[2 + 2 * i]), w.count[i], reset, cost)
  end
end

-- fixed_window::store: adds cost to every window's count, saturating at
-- `most` (only a charge can get there); the key lives until its window
-- ends.
local function store(keys, argv, n, now, slack_ms, cost, w)
  for i = 1, n do
    if w.count[i] then
      local value = string.format('%d:%d', w.start[i], math.min(w.count[i] + cost, most))
      put(keys[i], value, w.start[i] + tonumber(argv[1 + 2 * i]), nil, now, slack_ms)
    end
  end
end

-- The parts of fixed_window::check, ::peek, ::charge and ::refund.
local fixed_window = {lists = lists, read = read, verdicts = verdicts, held = held_to_reset,
  store = store}
