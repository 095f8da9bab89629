-- Cost after the fact for sliding-window counters: reads what
-- lua/sliding_counter_store.lua needs to add the charge to every window's
-- current count unconditionally, past its count if need be. Transcribes
-- the sliding part of window::charge in src/window.rs; keep the two in
-- step.
--
-- KEYS and ARGV as lua/sliding_counter.lua takes them, with ARGV[2] the
-- cost charged. The overdraft then weighs as the previous window's count
-- over the next window, less and less as the sliding window leaves it.

-- Runs after lua/common/clock.lua, idiv.lua, windows.lua and window_call.lua,
-- and before lua/sliding_counter_store.lua, lua/common/recheck.lua,
-- lua/sliding_counter.lua and lua/common/standing.lua (joined in
-- src/store/redis/adjust.rs).

local starts, currs, prevs = {}, {}, {}
for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
  local start = idiv(now, length) * length
  local curr, prev = 0, 0
  local stored = redis.call('GET', KEYS[i])
  if stored then
    local s, c, p = string.match(stored, '^(%d+):(%d+):(%d+)$')
    if not s then return redis.error_reply('fleetgate: unreadable window state') end
    s, c, p = tonumber(s), tonumber(c), tonumber(p)
    if s >= start then
      start, curr, prev = s, c, p
    elseif s == start - length then
      prev = c
    end
  end
  starts[i], currs[i], prevs[i] = start, curr, prev
end
