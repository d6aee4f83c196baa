-- Reserve 'keys' keys of budget, unless the wait would pass max_wait seconds.  Returns
-- {granted (1/0), wait, epoch, rate}, numbers as strings (Lua would truncate them).
--
-- KEYS: budget
--   budget  the target's delete budget (a hash)
-- ARGV: keys max_wait ceiling burst increase_every increase_share ttl
--   ceiling  the target's keys per second; burst seconds of budget one moment may spend
--   ttl      milliseconds an idle budget is kept
-- include: budget_state.lua
local keys, max_wait, ceiling = tonumber(keys), tonumber(max_wait), tonumber(ceiling)
local burst, ttl = tonumber(burst), tonumber(ttl)
local t, rate, tat, paused, epoch, changed = state(budget, ceiling, tonumber(increase_every),
                                                   tonumber(increase_share))
local start = math.max(tat, t, paused)
local after = start + keys / rate
local wait = math.max(after - burst - t, paused - t, 0)
if wait > max_wait then
  redis.call('HSET', budget, 'rate', rate, 'changed_at', changed, 'ceiling', ceiling)
  redis.call('HINCRBY', budget, 'deferred', 1)
  redis.call('PEXPIRE', budget, ttl)
  return {0, tostring(wait), tostring(epoch), tostring(rate)}
end
redis.call('HSET', budget, 'rate', rate, 'changed_at', changed, 'ceiling', ceiling,
           'tat', after)
redis.call('HINCRBY', budget, 'reserved_keys', keys)
if wait > 0 then
  redis.call('HINCRBY', budget, 'waits', 1)
  redis.call('HINCRBYFLOAT', budget, 'wait_seconds', wait)
end
redis.call('PEXPIRE', budget, ttl)
return {1, tostring(wait), tostring(epoch), tostring(rate)}
