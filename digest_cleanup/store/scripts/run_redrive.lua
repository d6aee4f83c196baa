-- Fragment of the run part (store/run_records.py): count_redrive(run, pending, redriven,
-- chains, batch, n, now_epoch, now, failed_note) folds a redriven dead letter of n keys
-- back into its run, if the run is still there.  The dead-letter redrive includes it.
local function count_redrive(run, pending, redriven, chains, batch, n, now_epoch, now,
                             failed_note)
  if not (n > 0 and redis.call('EXISTS', run) == 1) then return end
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
