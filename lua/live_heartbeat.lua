-- Records this instance as seen now, on the server's clock, and forgets
-- the instances not seen for a while (src/store/redis/live.rs).
--
-- KEYS[1]  the instances (a hash: id -> "started last_seen address")
-- ARGV[1]  this instance's id
-- ARGV[2]  when it started, in Unix milliseconds
-- ARGV[3]  its address
-- ARGV[4]  how long an instance not seen is kept, in milliseconds
--
-- Returns {now in Unix milliseconds, the instances kept as
-- id, "started last_seen address" pairs}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. now .. ' ' .. ARGV[3])
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local seen = tonumber(string.match(all[i + 1], '^%d+ (%d+)')) or 0
  if now - seen > tonumber(ARGV[4]) then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return { now, out }
