end

-- The text of an error raised or returned by a call: a table with an err
-- field (redis.error_reply, and redis.call on Redis 7) or a string.
local function error_text(err)
  if type(err) == 'table' and err.err then return err.err end
  return tostring(err)
end

local replies = {}
local k, a = 0, 3
for c = 1, tonumber(ARGV[2]) do
  local nk, na = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  -- The call's own ARGV, "now" first as its one-call script takes it.
  local keys, argv = {}, {ARGV[1]}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do argv[i + 1] = ARGV[a + 1 + i] end
  local ok, reply = pcall(decide, keys, argv)
  if not ok then
    -- A key of another type fails its call alone; what the call wrote
    -- before failing stays, as for a script of its own. Any other error
    -- (READONLY on a demoted master, OOM, NOREPLICAS) is the server's, not
    -- the call's: it fails the script, as it would a script of one call,
    -- so that the store sees it and acts (a failover, a reconnect).
    local text = error_text(reply)
    if not string.find(text, 'WRONGTYPE', 1, true) then error(reply) end
    reply = text
  elseif type(reply) == 'table' and reply.err then
    -- Unreadable state, returned by the call itself: its own.
    reply = reply.err
  end
  replies[c] = reply
  k = k + nk
  a = a + 2 + na
end
return replies
