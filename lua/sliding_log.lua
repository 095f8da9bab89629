-- Sliding-window log over one or more windows of one identity, all kept in
-- one sorted set (trimmed to the longest window) and decided together: the
-- call passes only if every window admits it, and a denied call is not
-- logged. Transcribes src/algorithm/sliding_log.rs function by function;
-- keep the two in step. Its check, peek and charge are the window
-- operations of lua/prelude.lua run on the parts below (the prelude says
-- what they take and answer).
--
-- KEYS[1]        the log: score = admission time in microseconds, one
--                member per unit of cost
-- ARGV           a window call's (see lua/prelude.lua)
--
-- Members are "<time>-<seq>", seq counting the members already logged at
-- that same microsecond. The script runs atomically on the one server that
-- holds the key, so members are unique whichever process or machine calls,
-- and two calls in one microsecond both count. A charge logs at most the
-- largest window's count: every entry logged at one instant leaves a
-- window at the same time, so entries past that count would change no
-- decision, only memory.

local function fmt(x) return string.format('%d', x) end

local function lists()
  return {remaining = {}, reset = {}, retry = {}, remaining0 = {}, reset0 = {}}
end

-- The newest entry, read before any write, into w.last: {member, score},
-- or {} when the log is empty.
local function read(keys, argv, n, now, w)
  w.last = redis.call('ZRANGE', keys[1], -1, -1, 'WITHSCORES')
end

-- sliding_log::verdicts: what each window says about a call of cost.
local function verdicts(keys, argv, n, now, cost, w)
  local key, last = keys[1], w.last
  -- The newest logged time: the reset is when it leaves a window. After
  -- an admitted call it is at least now.
  local newest = now
  if last[2] then newest = tonumber(last[2]) end
  local top = newest
  if top < now then top = now end
  for i = 1, n do
    local length = tonumber(argv[1 + 2 * i])
    local count = tonumber(argv[2 + 2 * i])
    local after = '(' .. fmt(now - length)
    local used = redis.call('ZCOUNT', key, after, '+inf')
    if used + cost <= count then
      w.remaining[i], w.reset[i], w.retry[i] = count - used - cost, top + length - now, 0
      w.remaining0[i], w.reset0[i] = count - used, 0
      if last[2] then
        w.reset0[i] = newest + length - now
        if w.reset0[i] < 0 then w.reset0[i] = 0 end
      end
    else
      -- The k-th oldest entry in the window must leave before the call
      -- fits.
      local k = used + cost - count
      local entry = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
      if not entry[2] then return redis.error_reply('fleetgate: sliding log changed under the script') end
      -- Denied, so the window holds entries: the newest is one.
      local remaining, reset = count - used, newest + length - now
      if remaining < 0 then remaining = 0 end
      w.remaining[i], w.reset[i], w.retry[i] = remaining, reset, tonumber(entry[2]) + length - now
      w.remaining0[i], w.reset0[i] = remaining, reset
    end
  end
end

-- After a denial a window's remaining changes when its oldest entry
-- leaves it; until then only the resets move, counting down.
local function held(keys, argv, i, now, w)
  local length = tonumber(argv[1 + 2 * i])
  local oldest = redis.call('ZRANGEBYSCORE', keys[1], '(' .. fmt(now - length), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  if oldest[2] then return tonumber(oldest[2]) + length - now end
end

-- sliding_log::store: logs cost entries at now (at most the largest
-- window's count) and trims what has left every window.
local function store(keys, argv, n, now, slack_ms, cost, w)
  local key, last = keys[1], w.last
  local longest, largest = 0, 0
  for i = 1, n do
    local length = tonumber(argv[1 + 2 * i])
    local count = tonumber(argv[2 + 2 * i])
    if length > longest then longest = length end
    if count > largest then largest = count end
  end
  if cost > largest then cost = largest end
  -- The newest logged time, or now: the log means something until it has
  -- left the longest window.
  local top = now
  if last[2] and tonumber(last[2]) > top then top = tonumber(last[2]) end
  -- Entries already logged at now exist only if the newest (read before
  -- any write) is at now or later: most calls skip the count.
  local seq = 0
  if last[2] and tonumber(last[2]) >= now then
    seq = redis.call('ZCOUNT', key, fmt(now), fmt(now))
  end
  local j = 0
  while j < cost do
    local members = {}
    local upto = math.min(cost, j + 500)
    while j < upto do
      members[#members + 1] = fmt(now)
      members[#members + 1] = fmt(now) .. '-' .. fmt(seq + j)
      j = j + 1
    end
    redis.call('ZADD', key, unpack(members))
  end
  -- The trim comes after the ZADD: on a master past maxmemory Redis
  -- refuses a script's first write only if it is one that takes memory,
  -- and lets every later write through, so a trim first would let the
  -- entries in. Trim what has left every window, and with the caller's
  -- clock only what has left them slack_ms ago: an entry this caller no
  -- longer counts may still be inside the window of another whose clock
  -- lags. (The entries just logged are at now, which the trim leaves
  -- alone.) Entries that have left every window count for nothing (every
  -- read above starts after now - length), so a busy log is trimmed once
  -- an eighth of its longest window at most, when a call is the first of
  -- such a slot: what has left lingers no longer than that (a slot's worth
  -- of entries more, at most), and most calls spare Redis the command.
  local slot = math.max(math.floor(longest / 8), 1)
  if last[2] and idiv(now, slot) ~= idiv(tonumber(last[2]), slot) then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - longest - slack_ms * 1000))
  end
  -- Once the newest entry has left the longest window the log means
  -- nothing.
  local ttl_ms = math.ceil((top + longest - now) / 1000)
  if ttl_ms < 1 then ttl_ms = 1 end
  redis.call('PEXPIRE', key, ttl_ms + slack_ms)
end

-- The parts of sliding_log::check, ::peek and ::charge.
local sliding_log = {lists = lists, read = read, verdicts = verdicts, held = held, store = store}

-- sliding_log::refund: drops up to cost of the newest entries still
-- inside the longest window. Returns how many entries went.
--
-- The log keeps no record of which call logged which entry (members are
-- "<time>-<seq>", one per unit of cost), so a refund cannot find its own
-- call's entries: it takes the newest, those a refund made soon after its
-- charge most likely matches, and the room that leaves the windows last.
-- Among the entries of one instant it drops the highest seqs first, so
-- that those left are "<time>-0" to "<time>-<m-1>" and the next call at
-- that instant numbers its entries after them (store counts them); a
-- member named otherwise is popped as the highest of the set instead.
local function refund(keys, argv, now, slack_ms)
  local key, n, cost = keys[1], (#argv - 2) / 2, tonumber(argv[2])
  local longest = 0
  for i = 1, n do
    local length = tonumber(argv[1 + 2 * i])
    if length > longest then longest = length end
  end

  local left = cost
  while left > 0 do
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if not last[2] then break end
    local t = tonumber(last[2])
    if t <= now - longest then break end
    local m = redis.call('ZCOUNT', key, fmt(t), fmt(t))
    local take = m
    if take > left then take = left end
    local j = m
    while j > m - take do
      local names = {}
      local lowest = math.max(m - take, j - 500)
      while j > lowest do
        j = j - 1
        names[#names + 1] = fmt(t) .. '-' .. fmt(j)
      end
      local gone = redis.call('ZREM', key, unpack(names))
      if gone < #names then redis.call('ZPOPMAX', key, #names - gone) end
    end
    left = left - take
  end
  return cost - left
end
