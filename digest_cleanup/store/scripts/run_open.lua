-- Open a run unless it exists; returns 'created', or the status of the run already there.
--
-- KEYS: run runs latest
--   run     the run's hash
--   runs    every run id, scored by when it opened (a sorted set)
--   latest  the id of the target's most recent run
-- ARGV: fields opened_at run_id
--   fields     the new run's fields, a JSON object
--   opened_at  epoch seconds, the run's score in runs
if redis.call('EXISTS', run) == 1 then return redis.call('HGET', run, 'status') end
local decoded = cjson.decode(fields)
for k, v in pairs(decoded) do redis.call('HSET', run, k, v) end
redis.call('ZADD', runs, opened_at, run_id)
redis.call('SET', latest, run_id)
return 'created'
