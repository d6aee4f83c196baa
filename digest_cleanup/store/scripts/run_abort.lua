-- End a running run as failed ('aborted'), taking its sweep lease away; returns
-- 'aborted', 'missing', or the status of a run that was not running (left as it was).
--
-- KEYS: run lease
--   lease  the run's sweep lease
-- ARGV: message now
-- include: sweep_lease.lua
if redis.call('EXISTS', run) == 0 then return 'missing' end
local status = redis.call('HGET', run, 'status')
-- A failed run still deletes what an operator redrives; aborting it stops that too.
local reason = redis.call('HGET', run, 'reason')
if status ~= 'running' and not (status == 'failed' and reason ~= 'aborted') then
  return status
end
redis.call('HSET', run, 'status', 'failed', 'reason', 'aborted', 'message', message,
           'ended_at', now, 'sweep_done', 1)
end_lease(lease)
return 'aborted'
