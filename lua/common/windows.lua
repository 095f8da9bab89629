-- What the window scripts (sliding_log.lua, sliding_counter.lua,
-- fixed_window.lua) share: their arguments, the figures each window gives
-- and how the deciding window and the reply are built from them. Defined
-- once per script, before the batch of a check (lua/common/batch_open.lua)
-- and before lua/common/window_call.lua, which reads each call's
--
-- ARGV[2]        cost
-- ARGV[1+2i]     length of window i, in microseconds
-- ARGV[2+2i]     count of window i
--
-- into cost, n (the number of windows) and args (the call's ARGV). The
-- including script fills, for every window i of the call before calling
-- pick or reply:
--   admits[i]      whether window i admits the call
--   remaining[i]   its remaining after the call (when it admits it, else
--                  as now)
--   reset[i]       its reset after the call, likewise, in microseconds
--   retry[i]       when it denies the call, how long until it admits it;
--                  0 when it admits it
--   remaining0[i], reset0[i]
--                  its figures of now, before the call
-- The lists and the functions pick and reply below serve every call of a
-- batch in turn (made once, not per call: Redis' Lua pays for each table
-- and function it makes). So each call fills entries 1..n before reading
-- them: entries past n may be an earlier call's. The functions read the
-- call's arguments through args, never ARGV (in a batch, the whole
-- batch's).
local cost, n, args
-- The most a counter holds (2^50): charges saturate there, so that every
-- count stays exact in Lua's doubles (see MAX_COUNTED in src/window.rs).
local most = 1125899906842624
local admits, remaining, reset, retry, remaining0, reset0 = {}, {}, {}, {}, {}, {}

-- The reply: the deciding window's figures, then every window's when there
-- are several, then hold_us. One window's is made whole at once (a table
-- grown after it is made is made again).
local function reply(allowed, i, retry_us, hold_us)
  if n == 1 then return {allowed, i, remaining[i], reset[i], retry_us, hold_us} end
  local out = {allowed, i, remaining[i], reset[i], retry_us}
  -- A denied call charges nothing: every window's figures of now.
  local r, t = remaining, reset
  if allowed == 0 then r, t = remaining0, reset0 end
  for j = 1, n do
    out[#out + 1] = r[j]
    out[#out + 1] = t[j]
  end
  out[#out + 1] = hold_us
  return out
end

-- The deciding window: worst, the window with the longest retry, when one
-- denies the call (else 0); tight, the one with the least remaining, when
-- all admit it. On ties the longest window, then the first.
local function longer(i, j) return tonumber(args[1 + 2 * i]) > tonumber(args[1 + 2 * j]) end
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
