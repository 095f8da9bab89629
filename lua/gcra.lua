-- GCRA over one or more limits of one identity, decided together: a call
-- passes only if every limit admits it, and a denied call stores nothing.
-- One script decides one or more calls, in order, at one instant (calls
-- queued behind a busy connection travel together; see
-- src/store/redis/batch.rs). Transcribes src/gcra.rs; keep the two in step.
--
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        number of limit sets (a batch's distinct policies, each
--                sent once however many of its calls travel together)
-- then, for each limit set:
--   n            number of limits
--   n pairs      emission interval T and tolerance (burst * T) of each
--                limit, in microseconds
-- then, for each call in order, to the end of ARGV:
--   set          its limit set (1-based)
--   cost         never above the smallest burst: checked by the caller
--   max wait     in microseconds (0 outside reserve mode)
-- KEYS           each call's n TAT keys in order (one call's keys share
--                one hash tag)
--
-- Returns five values per call, one list for all of them (a list per call
-- costs Redis a table each): allowed (1/0), deciding limit (1-based),
-- remaining, reset_us, retry_after_us when denied / wait_us when allowed;
-- or, for a call that failed alone, the text of its error and four zeros
-- (a string, not an error reply: one error inside the list would fail the
-- whole reply in clients).
-- Times stay integral microseconds, below 2^53, so Lua's doubles hold them
-- exactly; stored values are formatted with %d to keep every digit.

-- Runs after lua/common/clock.lua and idiv.lua (joined in
-- src/store/redis.rs): now, slack_ms and idiv come from there. Ends with
-- lua/gcra_store.lua (the check: stores what the admitted calls moved) or
-- lua/gcra_peek.lua (a peek: what a check would answer, storing nothing;
-- see src/store/redis/adjust.rs).

-- Each key is read at most once and written at most once per script, so
-- calls of one identity that travel together cost one GET and one SET. A
-- key that cannot be read (it holds another type) fails the calls that
-- name it, and only those: their reply is the error's text (and four
-- zeros).
local known, dirty = {}, {}
local function tat_of(key)
  local tat = known[key]
  if tat == nil then
    local stored = redis.pcall('GET', key)
    if type(stored) == 'table' and stored.err then return nil, stored.err end
    tat = tonumber(stored or 0) or 0
    known[key] = tat
  end
  if tat < now then tat = now end
  return tat
end

local replies, r = {}, 0
local function reply(allowed, limit, remaining, reset, delay)
  replies[r + 1], replies[r + 2], replies[r + 3] = allowed, limit, remaining
  replies[r + 4], replies[r + 5] = reset, delay
  r = r + 5
end

-- One call of the limit set `set` (emission, tolerance, emission, ...),
-- whose keys start after KEYS[k]. `tats` is scratch, reused by every call.
local tats = {}
local function decide(k, set, cost, max_wait)
  local n = #set / 2
  local worst, worst_delay = 0, -1
  local tight, tight_remaining = 1, -1
  local wait = 0
  for i = 1, n do
    local emission, tolerance = set[2 * i - 1], set[2 * i]
    local tat, err = tat_of(KEYS[k + i])
    if err then return reply(err, 0, 0, 0, 0) end
    tats[i] = tat
    local allow_at = tat + cost * emission - tolerance
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

  if worst > 0 then
    local emission, tolerance = set[2 * worst - 1], set[2 * worst]
    local tat = tats[worst]
    local room = now + tolerance - tat
    local remaining = 0
    if room > 0 then remaining = idiv(room, emission) end
    return reply(0, worst, remaining, tat - now, worst_delay)
  end

  local reset = 0
  for i = 1, n do
    local key = KEYS[k + i]
    local new_tat = tats[i] + cost * set[2 * i - 1]
    dirty[key] = true
    known[key] = new_tat
    if i == tight then reset = new_tat - now end
  end
  return reply(1, tight, tight_remaining, reset, wait)
end

local sets, a = {}, 3
for s = 1, tonumber(ARGV[2]) do
  local set = {}
  for i = 1, 2 * tonumber(ARGV[a]) do set[i] = tonumber(ARGV[a + i]) end
  sets[s] = set
  a = a + 1 + #set
end
local k = 0
for c = a, #ARGV, 3 do
  local set = sets[tonumber(ARGV[c])]
  decide(k, set, tonumber(ARGV[c + 1]), tonumber(ARGV[c + 2]))
  k = k + #set / 2
end
