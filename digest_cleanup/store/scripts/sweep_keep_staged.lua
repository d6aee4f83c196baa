-- Keep the first 'keep' staged batches and drop the rest (all of them for 0), fenced
-- like the checkpoint; returns 0, or -1 when the caller no longer holds the sweep lease.
--
-- KEYS: staged lease
-- ARGV: fence keep
if redis.call('GET', lease) ~= fence then return -1 end
local n = tonumber(keep)
if n <= 0 then redis.call('DEL', staged) else redis.call('LTRIM', staged, 0, n - 1) end
return 0
