"""The Lua of the dead-letter queue's transitions, one script per transition.

Only :class:`~digest_cleanup.store.dead_letters.DeadLetterQueue`
registers and runs them: each moves one entry, or one batch of arriving
messages, atomically, so no entry is ever in two places or in none.
"""

#: Move the oldest queued message into the index, if it is still the one read:
#: a new entry, or a copy of one already there with the same keys (``digests``
#: holds a digest of each entry's keys).  Another message with the same id but
#: other keys is merged by the caller first, so it never reaches this script.
ABSORB_LUA = """
local queue, entries, order, copies, stats, digests, by_run, by_target = unpack(KEYS)
local raw, id, now, keys, digest = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
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
redis.call('HINCRBY', stats, 'keys', keys)
return 1
"""

#: Replace an entry with ``merged`` (its keys and a new message's), and take that
#: message off the queue; only if neither changed since they were read.
MERGE_LUA = """
local queue, entries, stats, digests, copies = unpack(KEYS)
local raw, id, existing, merged, digest, added = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
  tonumber(ARGV[6])
if redis.call('LINDEX', queue, -1) ~= raw then return 0 end
if redis.call('HGET', entries, id) ~= existing then return 0 end
redis.call('RPOP', queue)
redis.call('HSET', entries, id, merged)
redis.call('HSET', digests, id, digest)
redis.call('HINCRBY', copies, id, 1)
redis.call('HINCRBY', stats, 'keys', added)
return 1
"""

#: Move up to ARGV[1] queued messages that carry their index headers, oldest first;
#: stops at the first without them, or with headers of the wrong shape (a forged or
#: damaged message: one bad header must not fail every read), or whose id holds other
#: keys already, which :meth:`DeadLetterQueue.absorb` handles itself.
ABSORB_INDEXED_LUA = """
local queue, entries, order, copies, stats, digests = unpack(KEYS)
local limit, now, prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local function text(v) return type(v) == 'string' and v ~= '' end
local moved = 0
while moved < limit do
  local raw = redis.call('LINDEX', queue, -1)
  if not raw then break end
  local ok, msg = pcall(cjson.decode, raw)
  local h = ok and type(msg) == 'table' and type(msg.headers) == 'table' and msg.headers
  if not (h and text(h.id) and type(h.dc_run) == 'string' and type(h.dc_target) == 'string'
          and type(h.dc_keys) == 'number' and h.dc_keys >= 0 and h.dc_keys < 1e9
          and h.dc_keys % 1 == 0
          and text(h.dc_digest)) then
    break
  end
  local id = h.id
  local known = redis.call('HGET', digests, id)
  if known and known ~= h.dc_digest then break end
  redis.call('RPOP', queue)
  moved = moved + 1
  if known then
    redis.call('HINCRBY', copies, id, 1)
  else
    redis.call('HSET', entries, id, raw)
    redis.call('HSET', digests, id, h.dc_digest)
    -- Index keys built here (a single Redis, not a cluster): one set per run and target.
    redis.call('ZADD', order, now, id)
    redis.call('SADD', prefix .. 'run:' .. h.dc_run, id)
    redis.call('SADD', prefix .. 'target:' .. h.dc_target, id)
    redis.call('HINCRBY', stats, 'keys', tonumber(h.dc_keys))
  end
end
return moved
"""

#: Remove one entry from the index; shared by redrive and purge, with ``raw`` set.
TAKE_LUA = """
local function take(entries, order, copies, stats, digests, by_run, by_target, id, keys)
  local raw = redis.call('HGET', entries, id)
  if not raw then return nil end
  redis.call('HDEL', entries, id)
  redis.call('HDEL', digests, id)
  redis.call('HDEL', copies, id)
  redis.call('ZREM', order, id)
  redis.call('SREM', by_run, id)
  redis.call('SREM', by_target, id)
  redis.call('HINCRBY', stats, 'keys', -keys)
  return raw
end
"""

REDRIVE_LUA = (
    TAKE_LUA
    + """
local entries, order, copies, stats, digests, by_run, by_target = unpack(KEYS)
local work, run, pending, redriven, chains = KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local id, n, now_epoch, batch, now = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local exchange, routing_key = ARGV[6], ARGV[7]
local raw = take(entries, order, copies, stats, digests, by_run, by_target, id, n)
if not raw then return 0 end
local msg = cjson.decode(raw)
-- kombu restores an unacknowledged message to the queue its delivery_info
-- names, so point it at the work queue or a killed worker would send it back here.
msg.properties.delivery_info.exchange = exchange
msg.properties.delivery_info.routing_key = routing_key
redis.call('LPUSH', work, cjson.encode(msg))
if n > 0 and redis.call('EXISTS', run) == 1 then
  redis.call('HINCRBY', run, 'redriven', n)
  redis.call('HINCRBY', run, 'dead_lettered', -n)
  -- A redrive is one more chain of attempts in flight for its batch (see RunStore.record).
  redis.call('HINCRBY', run, 'inflight', 1)
  redis.call('HINCRBY', chains, batch, 1)
  redis.call('ZADD', pending, now_epoch, batch)
  redis.call('SADD', redriven, batch)
  redis.call('HSET', run, 'last_redrive_at', now)
  if redis.call('HGET', run, 'status') == 'failed' then
    -- A failed run never listed everything: its dead letters are deleted, but it
    -- stays failed, and says so, until a new run lists what it missed.
    local message = redis.call('HGET', run, 'message') or ''
    if not string.find(message, ARGV[8], 1, true) then
      redis.call('HSET', run, 'message', message .. ' ' .. ARGV[8])
    end
  else
    redis.call('HSET', run, 'status', 'running')
    redis.call('HDEL', run, 'ended_at', 'reason', 'message', 'finalized_at')
  end
end
return 1
"""
)

PURGE_LUA = (
    TAKE_LUA
    + """
local entries, order, copies, stats, digests, by_run, by_target, audit = unpack(KEYS)
local raw = take(entries, order, copies, stats, digests, by_run, by_target, ARGV[1],
  tonumber(ARGV[3]))
if not raw then return 0 end
redis.call('LPUSH', audit, ARGV[2])
return 1
"""
)
