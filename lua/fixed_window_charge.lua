-- Cost after the fact for fixed windows: reads what
-- lua/fixed_window_store.lua needs to add the charge to every window's
-- count unconditionally, past its count if need be. Transcribes the fixed
-- part of window::charge in src/window.rs; keep the two in step.
--
-- KEYS and ARGV as lua/fixed_window.lua takes them, with ARGV[2] the cost
-- charged. The window is the one a check now is decided in (the stored
-- one if it is later, as in lua/fixed_window.lua); an overdraft is
-- forgotten with the rest of the count when that window ends.

-- Runs after lua/common/clock.lua, idiv.lua, windows.lua and window_call.lua,
-- and before lua/fixed_window_store.lua, lua/common/recheck.lua,
-- lua/fixed_window.lua and lua/common/standing.lua (joined in
-- src/store/redis/adjust.rs).

local starts, used = {}, {}
for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
  local start = idiv(now, length) * length
  used[i] = 0
  local stored = redis.call('GET', KEYS[i])
  if stored then
    local s, c = string.match(stored, '^(%d+):(%d+)$')
    if not s then return redis.error_reply('fleetgate: unreadable window state') end
    s = tonumber(s)
    if s >= start then start, used[i] = s, tonumber(c) end
  end
  starts[i] = start
end
