-- A refund for fixed windows: every window's count goes down by cost, not
-- below 0, in the window a check now is decided in (the stored one if it
-- is later, as in lua/fixed_window.lua); a count of a window that has
-- ended is left as it is. Transcribes the counter part of window::refund
-- in src/window.rs; keep the two in step.
--
-- KEYS and ARGV as lua/fixed_window.lua takes them, with ARGV[2] the cost
-- given back. Returns how much was given back, over all windows.

-- Runs after lua/common/clock.lua, idiv.lua, windows.lua and window_call.lua
-- (joined in src/store/redis/adjust.rs): now, slack_ms, idiv, cost and n come
-- from there.

local starts, used = {}, {}
for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
  local start = idiv(now, length) * length
  local stored = redis.call('GET', KEYS[i])
  starts[i] = false
  if stored then
    local s, c = string.match(stored, '^(%d+):(%d+)$')
    if not s then return redis.error_reply('fleetgate: unreadable window state') end
    s = tonumber(s)
    if s >= start then starts[i], used[i] = s, tonumber(c) end
  end
end

local back = 0
for i = 1, n do
  if starts[i] then
    local length = tonumber(ARGV[1 + 2 * i])
    local less = cost
    if less > used[i] then less = used[i] end
    local ttl_ms = math.ceil((starts[i] + length - now) / 1000)
    if ttl_ms < 1 then ttl_ms = 1 end
    local value = string.format('%d:%d', starts[i], used[i] - less)
    redis.call('SET', KEYS[i], value, 'PX', ttl_ms + slack_ms)
    back = back + less
  end
end
return back
