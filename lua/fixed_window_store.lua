-- Stores a call of the fixed windows: adds cost to every window's count,
-- saturating at 2^50 (only a charge can get there). Comes after
-- lua/fixed_window.lua in the check (then lua/common/admit.lua) and after
-- lua/fixed_window_charge.lua in a charge; needs starts and used from
-- either, and cost. Transcribes fixed_store in src/window.rs.

for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
  -- The key lives until its window ends.
  local ttl_ms = math.ceil((starts[i] + length - now) / 1000)
  if ttl_ms < 1 then ttl_ms = 1 end
  local count = used[i] + cost
  if count > most then count = most end
  local value = string.format('%d:%d', starts[i], count)
  redis.call('SET', KEYS[i], value, 'PX', ttl_ms + slack_ms)
end
