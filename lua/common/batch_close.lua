end

-- The text of an error raised or returned by a call: a table with an err
-- field (redis.error_reply, and redis.call on Redis 7) or a string.
local function error_text(err)
  if type(err) == 'table' and err.err then return err.err end
  return tostring(err)
end

local replies = {}
local k, a = 0, 2
for c = 1, tonumber(ARGV[1]) do
  local nk, na = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local keys, argv = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do argv[i] = ARGV[a + 1 + i] end
  -- A call that fails (a key of another type, unreadable state) fails
  -- alone; what it wrote before failing stays, as for a script of its own.
  local ok, reply = pcall(decide, keys, argv)
  if not ok or (type(reply) == 'table' and reply.err) then
    reply = error_text(reply)
  end
  replies[c] = reply
  k = k + nk
  a = a + 2 + na
end
return replies
