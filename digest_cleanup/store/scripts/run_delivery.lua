-- Count one delivery of a batch attempt; returns how many it has had (more than one is
-- a duplicate delivery, which the run counts).
--
-- KEYS: deliveries run
--   deliveries  deliveries by claim (a hash)
-- ARGV: claim
local n = redis.call('HINCRBY', deliveries, claim, 1)
if n > 1 and redis.call('EXISTS', run) == 1 then
  redis.call('HINCRBY', run, 'duplicates', 1)
end
return n
