-- Cost after the fact for the sliding log: reads what lua/sliding_log_store.lua
-- needs to log the charge unconditionally. Transcribes the log part of
-- window::charge in src/window.rs; keep the two in step.
--
-- KEYS and ARGV as lua/sliding_log.lua takes them, with ARGV[2] the cost
-- charged. At most the largest window's count is logged: every entry
-- logged at one instant leaves a window at the same time, so entries past
-- that count would change no decision, only memory.

-- Runs after lua/common/clock.lua, windows.lua and window_call.lua, and before
-- lua/sliding_log_store.lua, lua/common/recheck.lua, lua/sliding_log.lua
-- and lua/common/standing.lua (joined in src/store/redis/adjust.rs).

local key = KEYS[1]

local function fmt(x) return string.format('%d', x) end

-- The newest logged time, or now: the log means something until it has
-- left the longest window.
local top = now
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] and tonumber(last[2]) > top then top = tonumber(last[2]) end

local longest, largest = 0, 0
for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
  local count = tonumber(ARGV[2 + 2 * i])
  if length > longest then longest = length end
  if count > largest then largest = count end
end
if cost > largest then cost = largest end
