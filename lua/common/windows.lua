-- What the window scripts (sliding_log.lua, sliding_counter.lua,
-- fixed_window.lua) share: their arguments, the figures each window gives
-- and how the deciding window and the reply are built from them. Comes
-- before the including script, which takes
--
-- ARGV[2]        cost
-- ARGV[1+2i]     length of window i, in microseconds
-- ARGV[2+2i]     count of window i
--
-- Defines cost, n (the number of windows) and, for the including script to
-- fill for every window i before calling pick or reply:
--   admits[i]      whether window i admits the call
--   remaining[i]   its remaining after the call (when it admits it, else
--                  as now)
--   reset[i]       its reset after the call, likewise, in microseconds
--   retry[i]       when it denies the call, how long until it admits it;
--                  0 when it admits it
--   remaining0[i], reset0[i]
--                  its figures of now, before the call
-- and the functions pick and reply below.
local cost = tonumber(ARGV[2])
local n = (#ARGV - 2) / 2
-- The most a counter holds (2^50): charges saturate there, so that every
-- count stays exact in Lua's doubles (see MAX_COUNTED in src/window.rs).
local most = 1125899906842624
local admits, remaining, reset, retry, remaining0, reset0 = {}, {}, {}, {}, {}, {}

-- The reply: the deciding window's figures, then every window's when there
-- are several.
local function reply(allowed, i, retry_us, hold_us)
  local out = {allowed, i, remaining[i], reset[i], retry_us}
  if n > 1 then
    -- A denied call charges nothing: every window's figures of now.
    local r, t = remaining, reset
    if allowed == 0 then r, t = remaining0, reset0 end
    for j = 1, n do
      out[#out + 1] = r[j]
      out[#out + 1] = t[j]
    end
  end
  out[#out + 1] = hold_us
  return out
end

-- The deciding window: worst, the window with the longest retry, when one
-- denies the call (else 0); tight, the one with the least remaining, when
-- all admit it. On ties the longest window, then the first.
local function longer(i, j) return tonumber(ARGV[1 + 2 * i]) > tonumber(ARGV[1 + 2 * j]) end
local function pick()
  local worst, tight = 0, 0
  for i = 1, n do
    if not admits[i] then
      if worst == 0 or retry[i] > retry[worst]
          or (retry[i] == retry[worst] and longer(i, worst)) then
        worst = i
      end
    elseif tight == 0 or remaining[i] < remaining[tight]
        or (remaining[i] == remaining[tight] and longer(i, tight)) then
      tight = i
    end
  end
  return worst, tight
end
