-- Fragment of the run part (store/run_records.py): what a saved checkpoint changes in
-- its run.  The sweep's checkpoint includes it.
--   sweep_counted(run, c, now)   the checkpoint c's counts, and no sweep errors since
--   enter_flight(run, chains, pending, batch, now_epoch)
--                                one more batch in flight, one chain of attempts open
--   sweep_finished(run, now)     the sweep is done; returns finish(run, now)
-- include: finish.lua
local function sweep_counted(run, c, now)
  redis.call('HSET', run, 'listed', c.listed, 'expired', c.expired, 'batches', c.seq,
             'sweep_heartbeat', now)
  redis.call('HSET', run, 'sweep_errors', 0)
end
local function enter_flight(run, chains, pending, batch, now_epoch)
  redis.call('HINCRBY', run, 'inflight', 1)
  redis.call('HSET', chains, batch, 1)
  redis.call('ZADD', pending, now_epoch, batch)
end
local function sweep_finished(run, now)
  redis.call('HSET', run, 'sweep_done', 1, 'swept_at', now)
  return finish(run, now)
end
