-- Replace an entry with 'merged' (its keys and a new message's), and take that message
-- off the queue; only if neither changed since they were read.  Returns 1 or 0.
--
-- KEYS: queue entries stats digests copies
-- ARGV: raw id existing merged digest added
--   raw       the new message as read; existing the entry as read
--   merged    the entry with the new message's keys; digest the digest of its keys
--   added     how many keys the new message added
if redis.call('LINDEX', queue, -1) ~= raw then return 0 end
if redis.call('HGET', entries, id) ~= existing then return 0 end
redis.call('RPOP', queue)
redis.call('HSET', entries, id, merged)
redis.call('HSET', digests, id, digest)
redis.call('HINCRBY', copies, id, 1)
redis.call('HINCRBY', stats, 'keys', tonumber(added))
return 1
