-- The start of every script. A script is this prelude, one file of lua/
-- (an algorithm's, lease.lua, live.lua or reset.lua) and one line that
-- calls an operation of that file, such as
--
--   return charge(KEYS, ARGV, clock(ARGV[1]))
--
-- (src/store/redis/scripts.rs puts them together). The prelude and the
-- files only define things at their top level (`local function`, `local
-- name =`); what a script does is in the function that line calls, with
-- everything it needs passed to it. Redis' Lua makes every function a
-- script defines anew on each call of the script, so a script keeps only
-- the definitions its line reaches (src/store/redis/prune.rs).
--
-- Times are integral microseconds below 2^53, exact in Lua's doubles;
-- stored values are formatted with %d to keep every digit.

-- now (in microseconds) and slack_ms, for a script whose ARGV[1] is `arg`:
-- now in microseconds, or "" to read the server clock.
--
-- With the caller's clock, keys still expire on Redis' own: each lives a
-- minute (slack_ms) past the moment its state stops mattering, so that a
-- caller's clock that falls behind Redis' (another instance's lags, a test
-- clock stands still) by less than that never finds its state gone early.
-- One function for every script keeps it equal in all of them; see
-- TimeSource::Client in src/store/redis/mod.rs.
local function clock(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
  end
  local slack_ms = 60000
  return tonumber(arg), slack_ms
end

-- floor(a / b) for non-negative integers, immune to division rounding.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- What a counted window says about a call of cost, into w for window i
-- (see the window parts below): a counter of `used` out of `count`, whose
-- count starts again in `reset` microseconds, admits the call if it fits, and a
-- call that does not fits again then. The fixed window's and the
-- calendar quota's verdicts (src/algorithm/fixed_window.rs, calendar.rs).
local function counted(w, i, count, used, reset, cost)
  local remaining0 = math.max(count - used, 0)
  w.reset[i], w.reset0[i], w.remaining0[i] = reset, reset, remaining0
  if used + cost <= count then
    w.remaining[i], w.retry[i] = count - used - cost, 0
  else
    w.remaining[i], w.retry[i] = remaining0, reset
  end
end

-- A counted window's figures after a denial hold until its count starts
-- again (the resets counting down): its `held` part (see the window
-- parts below).
local function held_to_reset(keys, argv, i, now, w)
  return w.reset[i]
end

-- Stores `value` at `key` until `until_us`. `kept_us` is the until the
-- value read from the key implies, or nil: when it is `until_us`, the key
-- already carries its expiry. Only a state whose until follows from its
-- value alone can say so: GCRA's (its TAT rounded up to a whole second, so
-- that a busy identity's key keeps one expiry for a second of calls); a
-- window's until depends on its length too, which a live change of the
-- policy may have changed since the key was written.
--
-- With Redis' clock (slack_ms 0) the expiry is absolute, on that clock,
-- and a key that already carries it keeps it (KEEPTTL): a write that sets
-- no expiry costs Redis markedly less than one that does (BENCHMARKS.md).
-- With the caller's clock the expiry is relative, slack_ms past until_us
-- on the caller's clock, at least a millisecond.
local function put(key, value, until_us, kept_us, now, slack_ms)
  if slack_ms == 0 then
    if until_us == kept_us then
      redis.call('SET', key, value, 'KEEPTTL')
    else
      local at_ms = math.ceil(until_us / 1000)
      if at_ms * 1000 <= now then at_ms = math.floor(now / 1000) + 1 end
      redis.call('SET', key, value, 'PXAT', at_ms)
    end
    return
  end
  local ttl_ms = math.ceil((until_us - now) / 1000)
  if ttl_ms < 1 then ttl_ms = 1 end
  redis.call('SET', key, value, 'PX', ttl_ms + slack_ms)
end

-- The penalty box (src/algorithm/block.rs): one key per identity and
-- policy, holding the block's end in microseconds, a multiple of 16, plus
-- the index (0-based) of the limit that started it; it expires at the
-- end. `blocked` answers the block the box at `key` holds now: its end
-- and limit (1-based; the caller keeps it within the policy's limits, which
-- a live change may have cut), or nil. A key of another type is an error,
-- as for the algorithm's own keys.
local function blocked(key, now)
  local value = tonumber(redis.call('GET', key) or 0) or 0
  local slot = value % 16
  local until_us = value - slot
  if until_us > now then return until_us, slot + 1 end
end

-- block::start: after a refusal by limit i (1-based) whose block is
-- `block_us` and whose own retry is `retry_us`, stores the box and
-- returns the block's end: now + block rounded down to 16, or now + retry
-- rounded up if that is later.
local function block(key, i, block_us, retry_us, now, slack_ms)
  local until_us = math.max(math.floor((now + block_us) / 16) * 16,
    math.ceil((now + retry_us) / 16) * 16)
  put(key, string.format('%d', until_us + i - 1), until_us, nil, now, slack_ms)
  return until_us
end

-- What the window algorithms (sliding_log.lua, sliding_window.lua,
-- fixed_window.lua, calendar.lua) share: their check, peek and charge,
-- made from an algorithm's own parts, and the counter algorithms' refund
-- (refund_counts in src/algorithm/window.rs). Each of those files ends
-- with a table of its parts, such as
--
--   local fixed_window = {lists = lists, read = read, verdicts = verdicts,
--     held = held_to_reset, store = store}
--
-- and its scripts' lines call window_check, window_peek, window_charge
-- and window_refund below with it (the sliding log has a refund of its
-- own).
--
-- A window call's KEYS are the algorithm's; its ARGV:
--
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        cost (never above the smallest count in a check: checked
--                by the caller)
-- ARGV[1+2i]     length of window i, in microseconds
-- ARGV[2+2i]     count of window i
--
-- The parts, for a call of n windows, with w the lists of the script
-- (each part fills or reads entries 1..n: entries past n may be an
-- earlier call's):
--   lists()      makes w: the lists below, and the algorithm's own
--   read(keys, argv, n, now, w)
--                reads the state of the call's windows into w; returns an
--                error reply, or nil. The counter algorithms read
--                w.start[i], w.count[i] (and w.prev[i]), as Counter in
--                src/algorithm/window.rs has them, and w.current[i]:
--                whether the stored counter is that of the window a call
--                now is decided in
--   verdicts(keys, argv, n, now, cost, w)
--                what each window says about a call of cost, after read:
--                w.retry[i], 0 when window i admits the call, else how
--                long until it does (at least 1); w.remaining[i] and
--                w.reset[i], its figures after the call when it admits
--                it, else those of now; w.remaining0[i] and w.reset0[i],
--                its figures of now. Returns an error reply, or nil
--   held(keys, argv, i, now, w)
--                after a denial: until when window i's figures hold while
--                nobody else writes (its resets counting down), or nil
--                when they hold past the retry
--   store(keys, argv, n, now, slack_ms, cost, w)
--                stores a call of cost, after read; the counter
--                algorithms add cost to every w.count[i] but those that
--                are false, which they leave alone
--
-- A check's reply, and a peek's and a charge's:
--   {allowed (1/0), deciding window (1-based), remaining, reset_us,
--    retry_after_us (0 when allowed)}, then, for several windows,
--   remaining and reset_us of each window in order, then hold_us: when
--   denied, how long every figure of the reply stays true while nobody
--   else writes (the resets counting down), at most the retry; 0 when
--   allowed. The deny cache of the Redis store answers the same call from
--   it (src/store/redis/deny_cache.rs).

-- combine in src/algorithm/window.rs, and the hold Redis adds: the reply
-- to a call from its windows' verdicts in w, and whether every window
-- admits it. The deciding window: when one denies the call, the one with
-- the longest retry; else the one with the least remaining; on ties the
-- longest window, then the first. With `standing` (a charge's figures of
-- now, standing in src/algorithm/window.rs), an admitted call reports
-- every window's figures before it: what is left, the call is not made.
-- A window's remaining before a call of cost 1 is its remaining after it
-- plus one, so the deciding window is the same.
local function combine(alg, keys, argv, n, now, w, standing)
  local remaining, retry = w.remaining, w.retry
  local worst, tight = 0, 0
  for i = 1, n do
    if retry[i] > 0 then
      if worst == 0 or retry[i] > retry[worst] or (retry[i] == retry[worst]
          and tonumber(argv[1 + 2 * i]) > tonumber(argv[1 + 2 * worst])) then
        worst = i
      end
    elseif tight == 0 or remaining[i] < remaining[tight] or (remaining[i] == remaining[tight]
        and tonumber(argv[1 + 2 * i]) > tonumber(argv[1 + 2 * tight])) then
      tight = i
    end
  end
  -- A denied call charges nothing: every window's figures of now (a
  -- window that denies it reports those already).
  local allowed, i, hold = 1, tight, 0
  local r, t = remaining, w.reset
  if worst > 0 then
    allowed, i, hold = 0, worst, retry[worst]
    for j = 1, n do
      local until_j = alg.held(keys, argv, j, now, w)
      if until_j and until_j < hold then hold = until_j end
    end
  end
  if worst > 0 or standing then r, t = w.remaining0, w.reset0 end
  -- One window's reply is made whole at once (a table grown after it is
  -- made is made again).
  if n == 1 then return {allowed, i, r[i], t[i], retry[i], hold}, allowed == 1 end
  local out = {allowed, i, r[i], t[i], retry[i]}
  for j = 1, n do
    out[#out + 1] = r[j]
    out[#out + 1] = t[j]
  end
  out[#out + 1] = hold
  return out, allowed == 1
end

-- A refusal by the penalty box, as a window call's reply (see combine):
-- nothing remains of any window until the block's end, `left` from now.
local function boxed(n, i, left)
  if n == 1 then return {2, i, 0, left, left, left} end
  local out = {2, i, 0, left, left}
  for j = 1, n do
    out[#out + 1] = 0
    out[#out + 1] = left
  end
  out[#out + 1] = left
  return out
end

-- check of one call: what peek answers, then (with `store`) the call
-- stored if every window admits it. With a penalty box (its key `box`,
-- each window's block in `blocks`), a blocked call is refused without
-- reading its windows, and a refusal by a window with a block stores the
-- box, a peek's too (see block in src/algorithm/block.rs).
local function check_one(alg, keys, argv, n, now, slack_ms, w, store, box, blocks)
  if box then
    local until_us, limit = blocked(box, now)
    -- A policy changed since may have fewer limits than the box names.
    if until_us then return boxed(n, math.min(limit, n), until_us - now) end
  end
  local cost = tonumber(argv[2])
  local err = alg.read(keys, argv, n, now, w) or alg.verdicts(keys, argv, n, now, cost, w)
  if err then return err end
  local out, admitted = combine(alg, keys, argv, n, now, w, false)
  if admitted then
    if store then alg.store(keys, argv, n, now, slack_ms, cost, w) end
  elseif box and blocks[out[2]] > 0 then
    local until_us = block(box, out[2], blocks[out[2]], out[5], now, slack_ms)
    return boxed(n, out[2], until_us - now)
  end
  return out
end

-- The check: one or more calls decided in order (calls queued behind a
-- busy connection travel together; see src/store/redis/batch.rs), each
-- as a script of its own would decide it, as if they had reached Redis
-- back to back at one instant. With `store` false, the peek: what a
-- check would answer, storing nothing but a penalty box's block (a
-- denied check stores nothing else either, so a peek's denial is exactly
-- the check's); the store sends one call a peek.
--
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        number of calls
-- then, for each call in order:
--   keys         how many keys the call has, negated for a call with a
--                penalty box: then its last key is the box's
--   arguments    how many arguments it has, then those arguments: a
--                window call's ARGV, less its first (now), then, with a
--                penalty box, each window's block in microseconds (0 for
--                none)
-- KEYS           each call's keys in order (one call's keys share one
--                hash tag)
--
-- Returns one reply (a list) per call, or the text of the error that
-- failed it (a string, not an error reply: one error inside the list
-- would fail the whole reply in clients). A refusal by the penalty box
-- says 2 where a reply says allowed.
local function window_decide(alg, keys, argv, now, slack_ms, store)
  local w, replies = alg.lists(), {}
  local k, a = 0, 3
  -- Each call's own KEYS and ARGV, "now" first as a window call has it,
  -- written over the last call's: entries past a call's own are an
  -- earlier call's, which its windows (1..n) never reach.
  local call_keys, call_argv = {}, {argv[1]}
  for c = 1, tonumber(argv[2]) do
    local nk, na = tonumber(argv[a]), tonumber(argv[a + 1])
    local box, blocks
    local n = (na - 1) / 2
    if nk < 0 then
      nk = -nk
      box = keys[k + nk]
      n = (na - 1) / 3
      blocks = {}
      for i = 1, n do blocks[i] = tonumber(argv[a + 2 + 2 * n + i]) end
    end
    for i = 1, nk do call_keys[i] = keys[k + i] end
    for i = 1, 1 + 2 * n do call_argv[i + 1] = argv[a + 1 + i] end
    local ok, reply = pcall(check_one, alg, call_keys, call_argv, n, now, slack_ms, w, store,
      box, blocks)
    if not ok then
      -- A key of another type fails its call alone; what the call wrote
      -- before failing stays, as for a script of its own. Any other
      -- error (READONLY on a demoted master, OOM, NOREPLICAS) is the
      -- server's, not the call's: it fails the script, as it would a
      -- script of one call, so that the store sees it and acts (a
      -- failover, a reconnect). The text of an error is the err field
      -- of a table (redis.error_reply, and redis.call on Redis 7), or
      -- the error itself.
      local text = type(reply) == 'table' and reply.err or tostring(reply)
      if not string.find(text, 'WRONGTYPE', 1, true) then error(reply) end
      reply = text
    elseif type(reply) == 'table' and reply.err then
      -- Unreadable state, returned by the call itself: its own.
      reply = reply.err
    end
    replies[c] = reply
    k = k + nk
    a = a + 2 + na
  end
  return replies
end

local function window_check(alg, keys, argv, now, slack_ms)
  return window_decide(alg, keys, argv, now, slack_ms, true)
end

local function window_peek(alg, keys, argv, now, slack_ms)
  return window_decide(alg, keys, argv, now, slack_ms, false)
end

-- charge: takes cost from every window whatever it holds, past its count
-- if need be, then answers with the figures of now for a call of cost 1,
-- read again from what was stored.
local function window_charge(alg, keys, argv, now, slack_ms)
  local n, w = (#argv - 2) / 2, alg.lists()
  local err = alg.read(keys, argv, n, now, w)
  if err then return err end
  alg.store(keys, argv, n, now, slack_ms, tonumber(argv[2]), w)
  err = alg.read(keys, argv, n, now, w) or alg.verdicts(keys, argv, n, now, 1, w)
  if err then return err end
  return (combine(alg, keys, argv, n, now, w, true))
end

-- refund, for the counter algorithms: every window's count goes down by
-- cost, not below 0, in the window a check now is decided in (the stored
-- one if it is later); a count of a window that has ended is left as it
-- is. Returns how much was given back, over all windows.
local function window_refund(alg, keys, argv, now, slack_ms)
  local n, cost, w = (#argv - 2) / 2, tonumber(argv[2]), alg.lists()
  local err = alg.read(keys, argv, n, now, w)
  if err then return err end
  local back, count = 0, w.count
  for i = 1, n do
    if w.current[i] then
      local less = math.min(cost, count[i])
      count[i] = count[i] - less
      back = back + less
    else
      count[i] = false
    end
  end
  alg.store(keys, argv, n, now, slack_ms, 0, w)
  return back
end
