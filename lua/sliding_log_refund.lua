-- A refund for the sliding log: drops up to cost of the newest entries
-- still inside the longest window. Transcribes the log part of
-- window::refund in src/window.rs; keep the two in step.
--
-- The log keeps no record of which call logged which entry (members are
-- "<time>-<seq>", one per unit of cost), so a refund cannot find its own
-- call's entries: it takes the newest, those a refund made soon after its
-- charge most likely matches, and the room that leaves the windows last.
-- Among the entries of one instant it drops the highest seqs first, so
-- that those left are "<time>-0" to "<time>-<m-1>" and the next call at
-- that instant numbers its entries after them (lua/sliding_log_store.lua
-- counts them); a member named otherwise is popped as the highest of the
-- set instead.
--
-- KEYS and ARGV as lua/sliding_log.lua takes them, with ARGV[2] the cost
-- given back. Returns how many entries went.

-- Runs after lua/common/clock.lua, windows.lua and window_call.lua (joined in
-- src/store/redis/adjust.rs): now, cost and n come from there.

local key = KEYS[1]

local function fmt(x) return string.format('%d', x) end

local longest = 0
for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
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
