-- The end of the GCRA check (lua/gcra.lua): stores every TAT an admitted
-- call moved, and returns the replies. The peek script ends with
-- lua/gcra_peek.lua instead, which stores nothing.

for key in pairs(dirty) do
  local tat = known[key]
  -- Expire the key when the limit has refilled: the state means nothing then.
  local ttl_ms = math.ceil((tat - now) / 1000)
  if ttl_ms < 1 then ttl_ms = 1 end
  redis.call('SET', key, string.format('%d', tat), 'PX', ttl_ms + slack_ms)
end
return replies
