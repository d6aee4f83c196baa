-- S3 pushed back: lower the rate (at most once per 'every' seconds), pause 'pause'
-- seconds if over 0, and drop every outstanding reservation (their holders see the new
-- epoch).  Returns {rate, epoch, paused_until - now}, numbers as strings.
--
-- KEYS: budget
-- ARGV: ceiling factor floor_share every pause burst increase_every increase_share ttl
--   factor       what a decrease multiplies the rate by; floor_share the lowest share
-- include: budget_state.lua
local ceiling, factor, floor_share = tonumber(ceiling), tonumber(factor), tonumber(floor_share)
local every, pause, burst, ttl = tonumber(every), tonumber(pause), tonumber(burst),
  tonumber(ttl)
local t, rate, tat, paused, epoch, changed = state(budget, ceiling, tonumber(increase_every),
                                                   tonumber(increase_share))
redis.call('HINCRBY', budget, 'throttles', 1)
local bumped = false
local last = tonumber(redis.call('HGET', budget, 'decreased_at')) or 0
if t - last >= every then
  rate = math.max(ceiling * floor_share, rate * factor)
  changed = t
  redis.call('HSET', budget, 'decreased_at', t)
  redis.call('HINCRBY', budget, 'decreases', 1)
  bumped = true
end
if pause > 0 and t + pause > paused then
  paused = t + pause
  redis.call('HSET', budget, 'paused_until', paused)
  redis.call('HINCRBY', budget, 'pauses', 1)
  bumped = true
end
if bumped then
  epoch = epoch + 1
  -- No burst right after a throttle: the next batch waits one full interval.
  redis.call('HSET', budget, 'epoch', epoch, 'tat', math.max(t, paused) + burst)
end
redis.call('HSET', budget, 'rate', rate, 'changed_at', changed, 'ceiling', ceiling)
redis.call('PEXPIRE', budget, ttl)
return {tostring(rate), tostring(epoch), tostring(math.max(paused - t, 0))}
