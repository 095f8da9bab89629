-- GCRA over one or more limits of one identity, decided together: a call
-- passes only if every limit admits it, and a denied call stores nothing.
-- Transcribes src/algorithm/gcra.rs function by function (check, peek,
-- charge, refund, defer); keep the two in step. Runs after
-- lua/prelude.lua, whose clock, idiv and put it uses.
--
-- A limit's state is its TAT (theoretical arrival time) in one key; a key
-- expires once its TAT has passed, at the whole second after it (see
-- tat_until; and slack_ms past that with the caller's clock: see clock in
-- the prelude). Arithmetic in doubles stays exact: times are below 2^53, and
-- a TAT at most 2^50 past now (gcra::MAX_DEBT).

-- Until when a key holding `tat` matters: the whole second after it (see
-- put in the prelude: a busy identity's TAT moves on with every call, and
-- so its key keeps one expiry for a second of calls).
local function tat_until(tat)
  return (math.floor(tat / 1000000) + 1) * 1000000
end

-- The until the TAT read from a key implies (see put in the prelude), or
-- nil for a key that held none.
local function tat_kept(stored)
  if stored > 0 then return tat_until(stored) end
end

-- gcra::check of every call of the script, in order, at one instant
-- (calls queued behind a busy connection travel together; see
-- src/store/redis/batch.rs), each as a script of its own would decide it.
-- With `store` false, gcra::peek: what a check would answer, storing
-- nothing (a denied check stores nothing either, so a peek's denial is
-- exactly the check's); the store sends one call a peek.
--
-- A call's limits are the set (emission interval T and tolerance of each
-- in turn, in microseconds) whose TAT keys follow keys[k]. An admitted
-- call's TATs are stored at once. A shared call's keys (keys another call
-- of the script has too: a busy identity) are read once per script, kept
-- in `known` as the calls before left them (`first`: what the key held),
-- and stored once each at the end, after every call that moved them: one
-- GET and one SET per identity, and for the other calls no table of keys.
-- A key that cannot be read (it holds another type) fails its call alone.
-- Everything is in this one function, as a loop rather than calls of
-- smaller ones: it runs for every decision, and Redis' Lua pays for each
-- call and each value returned (BENCHMARKS.md, Redis CPU per decision).
--
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        number of limit sets (a batch's distinct policies, each
--                sent once however many of its calls travel together)
-- then, for each limit set:
--   n            number of limits, negated for a set with a penalty box
--   n pairs      emission interval T and tolerance (burst * T) of each
--                limit, in microseconds
--   n blocks     (a set with a penalty box only) each limit's block in
--                microseconds, 0 for none (see blocked and block in the
--                prelude)
-- then, for each call in order, to the end of ARGV:
--   set          its limit set (1-based), negated for a shared call
--   cost         never above the smallest burst: checked by the caller
--   max wait     in microseconds (0 outside reserve mode)
-- KEYS           each call's n TAT keys in order, then, for a set with a
--                penalty box, its box's key (one call's keys share one
--                hash tag)
--
-- Returns five values per call, one list for all of them (a list per call
-- costs Redis a table each): allowed (1/0, or 2 for a refusal by the
-- penalty box), the deciding limit (1-based), remaining, reset_us, and
-- retry_after_us when denied / wait_us when allowed; or, for a call that
-- failed alone, the text of its error (a string, not an error reply: one
-- error inside the list would fail the whole reply in clients) and four
-- zeros. A blocked call reads none of its TATs; a refusal by a limit with
-- a block, a peek's too, stores the box.
local function decide_all(keys, argv, now, slack_ms, store)
  local sets, a = {}, 3
  for i = 1, tonumber(argv[2]) do
    local set, n = {}, tonumber(argv[a])
    local has_box = n < 0
    if has_box then n = -n end
    for j = 1, 2 * n do set[j] = tonumber(argv[a + j]) end
    a = a + 1 + 2 * n
    if has_box then
      local blocks = {}
      for j = 1, n do blocks[j] = tonumber(argv[a + j - 1]) end
      set.blocks, a = blocks, a + n
    end
    sets[i] = set
  end
  local tats, stored, known, first, dirty = {}, {}, {}, {}, {}
  local replies, k, r = {}, 0, 0
  for c = a, #argv, 3 do
    local index, cost, max_wait = tonumber(argv[c]), tonumber(argv[c + 1]), tonumber(argv[c + 2])
    local shared = index < 0
    local set = sets[shared and -index or index]
    local n = #set / 2
    local worst, worst_delay, tight, tight_remaining, wait = 0, -1, 1, -1, 0
    local failed, held, held_limit
    local blocks = set.blocks
    local box = blocks and keys[k + n + 1]
    if box then
      local ok, until_us, limit = pcall(blocked, box, now)
      if not ok then
        failed = type(until_us) == 'table' and until_us.err or tostring(until_us)
      end
      held, held_limit = ok and until_us, limit
    end
    local reads = n
    if failed or held then reads = 0 end
    for i = 1, reads do
      local emission = set[2 * i - 1]
      local key = keys[k + i]
      local tat = shared and known[key]
      if not tat then
        local value = redis.pcall('GET', key)
        if type(value) == 'table' and value.err then
          failed = value.err
          break
        end
        tat = tonumber(value or 0) or 0
        if shared then known[key], first[key] = tat, tat end
      end
      stored[i] = tat
      if tat < now then tat = now end
      tats[i] = tat
      local allow_at = tat + cost * emission - set[2 * i]
      if allow_at > now then
        local delay = allow_at - now
        if delay > max_wait then
          if delay > worst_delay then worst, worst_delay = i, delay end
        else
          if delay > wait then wait = delay end
          if tight_remaining ~= 0 then tight, tight_remaining = i, 0 end
        end
      else
        local remaining = idiv(now - allow_at, emission)
        if tight_remaining < 0 or remaining < tight_remaining then
          tight, tight_remaining = i, remaining
        end
      end
    end

    if failed then
      replies[r + 1], replies[r + 2], replies[r + 3], replies[r + 4], replies[r + 5] =
        failed, 0, 0, 0, 0
    elseif held then
      replies[r + 1], replies[r + 2], replies[r + 3], replies[r + 4], replies[r + 5] =
        2, math.min(held_limit, n), 0, held - now, held - now
    elseif worst > 0 and blocks and blocks[worst] > 0 then
      local until_us = block(box, worst, blocks[worst], worst_delay, now, slack_ms)
      replies[r + 1], replies[r + 2], replies[r + 3], replies[r + 4], replies[r + 5] =
        2, worst, 0, until_us - now, until_us - now
    elseif worst > 0 then
      -- Whole calls of cost 1 that would pass now.
      local tat = tats[worst]
      local room = now + set[2 * worst] - tat
      local remaining = 0
      if room > 0 then remaining = idiv(room, set[2 * worst - 1]) end
      replies[r + 1], replies[r + 2], replies[r + 3], replies[r + 4], replies[r + 5] =
        0, worst, remaining, tat - now, worst_delay
    else
      local reset
      for i = 1, n do
        local key, tat = keys[k + i], tats[i] + cost * set[2 * i - 1]
        if i == tight then reset = tat - now end
        if shared then
          known[key], dirty[key] = tat, true
        elseif store then
          put(key, string.format('%d', tat), tat_until(tat), tat_kept(stored[i]), now, slack_ms)
        end
      end
      replies[r + 1], replies[r + 2], replies[r + 3], replies[r + 4], replies[r + 5] =
        1, tight, tight_remaining, reset, wait
    end
    k = k + n
    if box then k = k + 1 end
    r = r + 5
  end
  if store then
    for key in pairs(dirty) do
      local tat = known[key]
      put(key, string.format('%d', tat), tat_until(tat), tat_kept(first[key]), now, slack_ms)
    end
  end
  return replies
end

-- A peek stores no TAT, but a refusal it sees may start a penalty box,
-- kept by the caller's clock as any write is: it needs the slack too.
local function peek(keys, argv, now, slack_ms)
  return decide_all(keys, argv, now, slack_ms, false)
end

local function check(keys, argv, now, slack_ms)
  return decide_all(keys, argv, now, slack_ms, true)
end

-- The KEYS and ARGV of charge and refund:
--
-- KEYS[i]        TAT key of limit i (all keys share one hash tag)
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        cost
-- ARGV[1+2i]     emission interval T of limit i, in microseconds
-- ARGV[2+2i]     tolerance (burst * T) of limit i, in microseconds
-- ARGV[2+2n+i]   (charge only) horizon of limit i (n limits): its
--                tolerance and 16 periods of its rate or an hour,
--                whichever is longer, in microseconds, at most 2^50
--                (gcra::debt_horizon)

-- gcra::charge: cost after the fact, taken from every limit
-- unconditionally (no admission test, no cap at the burst), into debt if
-- need be:
--
--   tat = min(max(stored, now) + cost * T, now + horizon), never below
--         the stored one
--
-- A debt is repaid at the limit's rate like any TAT, and cut to what the
-- limit refills in that time, so that a huge charge holds the identity
-- back that long at most (a product past 2^53 is inexact, but then far
-- past the cut).
--
-- Returns the figures of now for a call of cost 1: {allowed (1/0),
-- deciding limit (1-based), remaining, reset_us, retry_after_us when
-- denied / 0 when allowed}; denied, the limit with the longest retry;
-- allowed, the limit with the least remaining.
local function charge(keys, argv, now, slack_ms)
  local cost, n = tonumber(argv[2]), #keys
  local tats, stored = {}, {}
  for i = 1, n do
    local emission = tonumber(argv[1 + 2 * i])
    local horizon = tonumber(argv[2 + 2 * n + i])
    local old = tonumber(redis.call('GET', keys[i]) or 0) or 0
    local tat = old
    if tat < now then tat = now end
    local charged = tat + cost * emission
    if charged > now + horizon then charged = now + horizon end
    if charged < old then charged = old end
    tats[i], stored[i] = charged, old
  end
  for i = 1, n do
    put(keys[i], string.format('%d', tats[i]), tat_until(tats[i]), tat_kept(stored[i]), now,
      slack_ms)
  end

  local worst, worst_retry = 0, -1
  local tight, tight_remaining = 1, math.huge
  for i = 1, n do
    local emission = tonumber(argv[1 + 2 * i])
    local horizon = now + tonumber(argv[2 + 2 * i])
    local next = tats[i] + emission
    if next > horizon then
      if next - horizon > worst_retry then worst, worst_retry = i, next - horizon end
    else
      local remaining = idiv(horizon - tats[i], emission)
      if remaining < tight_remaining then tight, tight_remaining = i, remaining end
    end
  end
  if worst > 0 then
    return {0, worst, 0, tats[worst] - now, worst_retry}
  end
  return {1, tight, tight_remaining, tats[tight] - now, 0}
end

-- gcra::refund: gives cost back to every limit, tat = max(now, tat - cost
-- * T) where tat > now; a limit already full is left alone. Never below
-- now: a refund gives no more than a fresh state has (the full burst). A
-- TAT brought back to now is a fresh state: its key is deleted. (The
-- tolerances in ARGV go unused.)
--
-- Returns how many limits were moved.
local function refund(keys, argv, now, slack_ms)
  local cost = tonumber(argv[2])
  local tats, stored, moved = {}, {}, 0
  for i = 1, #keys do
    local tat = tonumber(redis.call('GET', keys[i]) or 0) or 0
    tats[i], stored[i] = false, tat
    if tat > now then
      tat = tat - cost * tonumber(argv[1 + 2 * i])
      if tat < now then tat = now end
      tats[i] = tat
      moved = moved + 1
    end
  end
  for i = 1, #keys do
    local tat = tats[i]
    if tat and tat > now then
      put(keys[i], string.format('%d', tat), tat_until(tat), tat_kept(stored[i]), now, slack_ms)
    elseif tat then
      redis.call('DEL', keys[i])
    end
  end
  return moved
end

-- gcra::defer: upstream feedback, every limit of one identity held back
-- so that at most `remaining` calls of cost 1 are admitted before
-- now + pause (with remaining 0: its next call comes no earlier than
-- that).
--
-- The k-th call of cost 1 passes from tat + k*T - tolerance on, so each
-- TAT is raised to at least now + pause + tolerance - (remaining + 1)*T,
-- and never lowered; a floor at or before now holds nothing back. With
-- remaining > 0 the floor is raised by the slots reserved since the last
-- hold that lie after the report was written, age before now
-- (tat - max(now - age + tolerance, hold)): the upstream may not have
-- counted them yet. A TAT that moves sets its hold: to the new TAT, or
-- with none left that far before it that the pending slots stay pending.
--
-- Exact in doubles: a floor past now is below now + pause + tolerance
-- plus a pending advance (each at most 2^50 past a Unix time in
-- microseconds), and so is the credit (remaining + 1)*T it subtracts; a
-- larger credit, rounded or not, puts the floor before now, as the signed
-- Rust does.
--
-- KEYS[i]        TAT key of limit i, for i = 1..n (all keys share one
--                hash tag)
-- KEYS[n+i]      hold key of limit i: the TAT the last hold left
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        pause in microseconds
-- ARGV[3]        remaining calls before the pause ends
-- ARGV[4]        age of the report in microseconds
-- ARGV[3+2i]     emission interval T of limit i, in microseconds
-- ARGV[4+2i]     tolerance (burst * T) of limit i, in microseconds
--
-- Returns how many limits were moved (0 when every limit already held
-- back enough).
local function defer(keys, argv, now, slack_ms)
  local pause = tonumber(argv[2])
  local remaining = tonumber(argv[3])
  local since = now - tonumber(argv[4])
  if since < 0 then since = 0 end
  local n = #keys / 2

  local moved = 0
  for i = 1, n do
    local emission = tonumber(argv[3 + 2 * i])
    local tolerance = tonumber(argv[4 + 2 * i])
    local floor = now + pause + tolerance - (remaining + 1) * emission
    local tat = tonumber(redis.call('GET', keys[i]) or 0) or 0
    local hold = tonumber(redis.call('GET', keys[n + i]) or 0) or 0
    local pending = tat - math.max(since + tolerance, hold)
    if pending < 0 then pending = 0 end
    -- Some left: pending slots count against it, and are settled. None
    -- left: they stay pending for the next report.
    local settled = pending
    if remaining > 0 then
      floor = floor + pending
      settled = 0
    end
    if floor > now and tat < floor then
      put(keys[i], string.format('%d', floor), tat_until(floor), tat_kept(tat), now, slack_ms)
      put(keys[n + i], string.format('%d', floor - settled), tat_until(floor), nil, now, slack_ms)
      moved = moved + 1
    end
  end
  return moved
end
