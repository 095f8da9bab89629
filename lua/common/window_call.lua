-- One call of a window script: its arguments, as lua/common/windows.lua
-- describes them. Must follow windows.lua in the same script, whose locals
-- these are (otherwise they would be globals, which Redis refuses).
args = ARGV
cost = tonumber(ARGV[2])
n = (#ARGV - 2) / 2
