-- One call of a window script, after lua/common/windows.lua: its
-- arguments, as windows.lua describes them.
args = ARGV
cost = tonumber(ARGV[2])
n = (#ARGV - 2) / 2
