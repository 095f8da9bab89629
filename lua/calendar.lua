-- Calendar quotas over one or more quotas of one identity, decided
-- together: the call passes only if every quota admits it, and a denied
-- call stores nothing. Transcribes src/algorithm/calendar.rs function by
-- function; keep the two in step. Its check, peek, charge and refund are
-- the window operations of lua/prelude.lua run on the parts below (which
-- also says what they take and answer): a quota is a fixed window whose
-- boundaries are calendar days or months.
--
-- KEYS[i]        tally of quota i: "<period start>:<period end>:<cost so far>"
-- ARGV           a window call's (see lua/prelude.lua), but with
-- ARGV[1+2i]     the nominal length of quota i's period (a day, 30 days):
--                what ties between quotas are broken by
-- ARGV[2+2i]     "<count>:<b0>:<b1>:<b2>:<b3>": its count, and the bounds
--                of the periods around the caller's clock
--                (Calendar::bounds), [b0, b1), [b1, b2) and [b2, b3), among
--                which period_at finds the one holding now on this
--                script's clock: no time-zone database is needed here.
--
-- The stored period keeps its end: a call whose clock is behind the one
-- that wrote it (a stored start later than its own period's) is decided
-- in the stored period, which never moves back, and its reset and retry
-- run to that period's end. A charge past the count lets nothing pass
-- until the period ends; the overdraft goes with the rest of the count.

-- period_at: the period holding now among the bounds; before b0 the first
-- one, and from b3 on (clocks a period apart) periods as long as the
-- last, counted on from b3.
local function period_at(b0, b1, b2, b3, now)
  if now < b1 then return b0, b1 end
  if now < b2 then return b1, b2 end
  if now < b3 then return b2, b3 end
  local length = math.max(b3 - b2, 1)
  local start = b3 + idiv(now - b3, length) * length
  return start, start + length
end

-- The most a tally holds (2^50): charges saturate there, so that every
-- count stays exact in Lua's doubles (MAX_COUNTED in
-- src/algorithm/window.rs).
local most = 1125899906842624

local function lists()
  return {remaining = {}, reset = {}, retry = {}, remaining0 = {}, reset0 = {}, start = {},
    stop = {}, quota = {}, count = {}, current = {}}
end

-- Tally::at: the period a call now is decided in and the cost used in it,
-- into w.start[i], w.stop[i] and w.count[i], with the quota's count in
-- w.quota[i]; w.current[i] says whether the stored tally is that
-- period's: its own period, or a later one that has not ended on this
-- clock. A later stored period that has ended here too was written under
-- another calendar (a policy changed from days to months, or its zone):
-- it is left behind.
local function read(keys, argv, n, now, w)
  for i = 1, n do
    local count, b0, b1, b2, b3 =
      string.match(argv[2 + 2 * i], '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
    if not count then return redis.error_reply('fleetgate: unreadable calendar bounds') end
    local start, stop = period_at(tonumber(b0), tonumber(b1), tonumber(b2), tonumber(b3), now)
    local used, current = 0, false
    local stored = redis.call('GET', keys[i])
    if stored then
      local s, e, c = string.match(stored, '^(%d+):(%d+):(%d+)$')
      if not s then return redis.error_reply('fleetgate: unreadable calendar state') end
      s, e = tonumber(s), tonumber(e)
      if (s == start and e == stop) or (s > start and now < e) then
        start, stop, used, current = s, e, tonumber(c), true
      end
    end
    w.quota[i], w.start[i], w.stop[i], w.count[i], w.current[i] =
      tonumber(count), start, stop, used, current
  end
end

-- calendar::verdicts: what each quota says about a call of cost; the
-- call fits once the period ends and its count starts again.
local function verdicts(keys, argv, n, now, cost, w)
  for i = 1, n do
    counted(w, i, w.quota[i], w.count[i], math.max(w.stop[i] - now, 0), cost)
  end
end

-- calendar::store: adds cost to every quota's tally (saturating at
-- `most`), but those that are false (a refund's periods that have
-- ended); the key lives until its period ends.
local function store(keys, argv, n, now, slack_ms, cost, w)
  for i = 1, n do
    if w.count[i] then
      local tally = math.min(w.count[i] + cost, most)
      local value = string.format('%d:%d:%d', w.start[i], w.stop[i], tally)
      put(keys[i], value, w.stop[i], nil, now, slack_ms)
    end
  end
end

-- The parts of calendar::check, ::peek, ::charge and ::refund.
local calendar = {lists = lists, read = read, verdicts = verdicts, held = held_to_reset,
  store = store}
