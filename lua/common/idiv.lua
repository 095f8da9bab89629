-- Integer division, for the scripts that count whole units of time.
-- Defines idiv; needs nothing from the including script.

-- floor(a / b) for non-negative integers, immune to division rounding.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
