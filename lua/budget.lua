-- Retry budgets: `take` in src/algorithm/budget.rs, transcribed; keep them
-- in step. Runs after lua/prelude.lua, whose clock and idiv it uses.
--
-- KEYS[1]        the budget's key: `newest:t1:...:t10`, the newest slot's
--                index (time / slot length) and each slot's tokens in
--                thousandths, every number written with %d
-- ARGV[1]        now in microseconds, or "" to read the server clock
-- ARGV[2]        thousandths of a token credited per first attempt
-- ARGV[3]        thousandths of a token credited per slot
-- ARGV[4]        a slot's length in microseconds (at least 1)
-- ARGV[5]        first attempts reported
-- ARGV[6]        tokens wanted
--
-- Returns {tokens granted, whole tokens left}. The key lives as long as
-- its slots matter (ten slots), slack_ms more with the caller's clock.
local function take(keys, argv, now, slack_ms)
  local ratio, minimum = tonumber(argv[2]), tonumber(argv[3])
  local slot_us, deposits, want = tonumber(argv[4]), tonumber(argv[5]), tonumber(argv[6])
  local current = idiv(now, slot_us)
  local newest, tokens = nil, {}
  local stored = redis.call('GET', keys[1])
  if stored then
    for n in string.gmatch(stored, '%d+') do
      if newest == nil then newest = tonumber(n) else tokens[#tokens + 1] = tonumber(n) end
    end
  end
  -- Lua's tables count from 1: slot s of the Rust code is tokens[s + 1].
  if newest == nil or #tokens ~= 10 or current >= newest + 10 or newest > current + 10 then
    newest = current
    for i = 1, 10 do tokens[i] = 0 end
    tokens[current % 10 + 1] = minimum
  end
  while newest < current do
    newest = newest + 1
    tokens[newest % 10 + 1] = minimum
  end
  local at = newest % 10 + 1
  tokens[at] = tokens[at] + deposits * ratio
  local total = 0
  for i = 1, 10 do total = total + tokens[i] end
  local whole = idiv(total, 1000)
  local granted = math.min(want, whole)
  local owed = granted * 1000
  for i = 1, 10 do
    local s = (newest + i) % 10 + 1
    local used = math.min(owed, tokens[s])
    tokens[s] = tokens[s] - used
    owed = owed - used
  end
  local parts = {string.format('%d', newest)}
  for i = 1, 10 do parts[i + 1] = string.format('%d', tokens[i]) end
  put(keys[1], table.concat(parts, ":"), (newest + 10) * slot_us, nil, now, slack_ms)
  return {granted, whole - granted}
end
