-- Stores a call of the sliding-window counters: adds cost to every
-- window's current count, saturating at 2^50 (only a charge can get
-- there). Comes after lua/sliding_counter.lua in the check (then
-- lua/common/admit.lua) and after lua/sliding_counter_charge.lua in a
-- charge; needs starts, currs and prevs from either, and cost.
-- Transcribes sliding_store in src/window.rs.

for i = 1, n do
  local length = tonumber(ARGV[1 + 2 * i])
  -- The count must outlive its window: it is the next one's "previous".
  local ttl_ms = math.ceil((starts[i] + 2 * length - now) / 1000)
  if ttl_ms < 1 then ttl_ms = 1 end
  local count = currs[i] + cost
  if count > most then count = most end
  local value = string.format('%d:%d:%d', starts[i], count, prevs[i])
  redis.call('SET', KEYS[i], value, 'PX', ttl_ms + slack_ms)
end
