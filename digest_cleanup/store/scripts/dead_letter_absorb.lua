-- Move the oldest queued message into the index, if it is still the one read: a new
-- entry, or a copy of one already there with the same keys.  Returns 1 when it moved,
-- 0 when the queue's tail changed meanwhile, -1 when the id holds other keys (the
-- caller merges the two first, so such a message never reaches this script).
--
-- KEYS: queue entries order copies stats digests by_run by_target
--   queue      the queue workers publish dead letters to
--   entries    each entry's message, by entry id
--   order      entry ids, scored by arrival
--   copies     how many more copies of each entry arrived
--   stats      totals, such as 'keys'
--   digests    a digest of each entry's keys, by entry id
--   by_run     the ids of the entry's run; by_target those of its target
-- ARGV: raw id now key_count digest
--   raw        the message as read; key_count how many keys it holds
if redis.call('LINDEX', queue, -1) ~= raw then return 0 end
local known = redis.call('HGET', digests, id)
if known and known ~= digest then return -1 end
redis.call('RPOP', queue)
if known then
  redis.call('HINCRBY', copies, id, 1)
  return 1
end
redis.call('HSET', entries, id, raw)
redis.call('HSET', digests, id, digest)
redis.call('ZADD', order, now, id)
redis.call('SADD', by_run, id)
redis.call('SADD', by_target, id)
redis.call('HINCRBY', stats, 'keys', tonumber(key_count))
return 1
