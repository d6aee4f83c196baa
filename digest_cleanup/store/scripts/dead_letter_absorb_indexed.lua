-- Move up to 'limit' queued messages that carry their index headers, oldest first;
-- returns how many moved.  Stops at the first without them, or with headers of the
-- wrong shape (a forged or damaged message: one bad header must not fail every read),
-- or whose id holds other keys already, which DeadLetterQueue.absorb handles itself.
--
-- KEYS: queue entries order copies stats digests
-- ARGV: limit now prefix
--   prefix  what the per-run and per-target sets' names start with (see store/keys.py):
--           a single Redis, not a cluster, so this script may name them itself
local most = tonumber(limit)
local function text(v) return type(v) == 'string' and v ~= '' end
local moved = 0
while moved < most do
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
    redis.call('ZADD', order, now, id)
    redis.call('SADD', prefix .. 'run:' .. h.dc_run, id)
    redis.call('SADD', prefix .. 'target:' .. h.dc_target, id)
    redis.call('HINCRBY', stats, 'keys', tonumber(h.dc_keys))
  end
end
return moved
