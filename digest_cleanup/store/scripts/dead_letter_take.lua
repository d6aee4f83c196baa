-- Fragment of the dead-letter queue (store/dead_letters.py): take(entries, order,
-- copies, stats, digests, by_run, by_target, id, keys) removes one entry from the index
-- and returns its message, or nil when it is not there.  Redrive and purge include it.
local function take(entries, order, copies, stats, digests, by_run, by_target, id, keys)
  local raw = redis.call('HGET', entries, id)
  if not raw then return nil end
  redis.call('HDEL', entries, id)
  redis.call('HDEL', digests, id)
  redis.call('HDEL', copies, id)
  redis.call('ZREM', order, id)
  redis.call('SREM', by_run, id)
  redis.call('SREM', by_target, id)
  -- Lua 5.1 writes -0 as '-0', which HINCRBY refuses: an entry of no keys moves nothing.
  if keys ~= 0 then redis.call('HINCRBY', stats, 'keys', 0 - keys) end
  return raw
end
