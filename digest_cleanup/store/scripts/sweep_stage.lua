-- Append batches to the run's staged list, fenced like the checkpoint; returns the
-- list's length, or -1 when the caller no longer holds the sweep lease.
--
-- KEYS: staged lease
--   staged  the batches the guard pass staged, JSON each, in order
--   lease   the sweep lease
-- ARGV: fence batches...
if redis.call('GET', lease) ~= fence then return -1 end
for i = batches_from, #ARGV do redis.call('RPUSH', staged, ARGV[i]) end
return redis.call('LLEN', staged)
