-- GCRA over one or more limits of one identity, decided together:
-- the call passes only if every limit admits it, and a denied call
-- stores nothing. Transcribes src/gcra.rs; keep the two in step.
--
-- KEYS[i]        TAT key of limit i (all keys share one hash tag)
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        cost (never above the smallest burst: checked by the caller)
-- ARGV[3]        max wait in microseconds (0 outside reserve mode)
-- ARGV[2+2i]     emission interval T of limit i, in microseconds
-- ARGV[3+2i]     tolerance (burst * T) of limit i, in microseconds
--
-- Returns {allowed (1/0), deciding limit (1-based), remaining,
--          reset_us, retry_after_us when denied / wait_us when allowed}.
-- Times stay integral microseconds, below 2^53, so Lua's doubles hold
-- them exactly; stored values are formatted with %d to keep every digit.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local cost = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])

-- floor(a / b) for non-negative integers, immune to division rounding.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local n = #KEYS
local tats = {}
local worst, worst_delay = 0, -1
local tight, tight_remaining = 1, -1
local wait = 0
for i = 1, n do
  local emission = tonumber(ARGV[2 + 2 * i])
  local tolerance = tonumber(ARGV[3 + 2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or 0) or 0
  if tat < now then tat = now end
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
  local emission = tonumber(ARGV[2 + 2 * worst])
  local tolerance = tonumber(ARGV[3 + 2 * worst])
  local tat = tats[worst]
  local room = now + tolerance - tat
  local remaining = 0
  if room > 0 then remaining = idiv(room, emission) end
  return {0, worst, remaining, tat - now, worst_delay}
end

local reset = 0
for i = 1, n do
  local emission = tonumber(ARGV[2 + 2 * i])
  local new_tat = tats[i] + cost * emission
  -- Expire the key when the limit has refilled: the state means nothing then.
  local ttl_ms = math.ceil((new_tat - now) / 1000)
  if ttl_ms < 1 then ttl_ms = 1 end
  redis.call('SET', KEYS[i], string.format('%d', new_tat), 'PX', ttl_ms)
  if i == tight then reset = new_tat - now end
end
return {1, tight, tight_remaining, reset, wait}
