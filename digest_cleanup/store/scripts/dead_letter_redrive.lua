-- Move one entry back onto the work queue, and its counts back into its run; returns 1,
-- or 0 when the entry was no longer there.
--
-- KEYS: entries order copies stats digests by_run by_target work run pending redriven chains
--   work      the work queue the entry's message goes back to
--   run       the entry's run's hash; pending its batches in flight
--   redriven  the run's redriven batch ids; chains its open chains of attempts
-- ARGV: id key_count now_epoch batch now exchange routing_key failed_note
--   batch               the entry's batch id
--   exchange            what the message's delivery_info names, with routing_key
--   failed_note         what a failed run's message gains
-- include: dead_letter_take.lua
local n = tonumber(key_count)
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
  -- A redrive is one more chain of attempts in flight for its batch (see run_record.lua).
  redis.call('HINCRBY', run, 'inflight', 1)
  redis.call('HINCRBY', chains, batch, 1)
  redis.call('ZADD', pending, now_epoch, batch)
  redis.call('SADD', redriven, batch)
  redis.call('HSET', run, 'last_redrive_at', now)
  if redis.call('HGET', run, 'status') == 'failed' then
    -- A failed run never listed everything: its dead letters are deleted, but it
    -- stays failed, and says so, until a new run lists what it missed.
    local message = redis.call('HGET', run, 'message') or ''
    if not string.find(message, failed_note, 1, true) then
      redis.call('HSET', run, 'message', message .. ' ' .. failed_note)
    end
  else
    redis.call('HSET', run, 'status', 'running')
    redis.call('HDEL', run, 'ended_at', 'reason', 'message', 'finalized_at')
  end
end
return 1
