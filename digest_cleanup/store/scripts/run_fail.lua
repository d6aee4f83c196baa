-- End a run as failed with a reason code and a sentence for humans; 0 if it is missing.
--
-- KEYS: run
-- ARGV: reason message now
if redis.call('EXISTS', run) == 0 then return 0 end
redis.call('HSET', run, 'status', 'failed', 'reason', reason, 'message', message,
           'ended_at', now, 'sweep_done', 1)
return 1
