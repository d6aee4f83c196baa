-- Fragment of the delete budget (store/budget.py): now() is Redis's clock in seconds;
-- state(key, ceiling, increase_every, increase_share) reads a budget as it stands at
-- that moment, its rate raised by the steps of increase since it last changed, and
-- returns t, rate, tat, paused_until, epoch, changed_at.  Every budget script includes it.
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function state(key, ceiling, increase_every, increase_share)
  local h = redis.call('HMGET', key, 'rate', 'tat', 'paused_until', 'epoch', 'changed_at',
                       'ceiling')
  local t = now()
  local rate = tonumber(h[1])
  local changed = tonumber(h[5]) or t
  if rate == nil or tonumber(h[6]) ~= ceiling or rate > ceiling then
    rate, changed = ceiling, t
  elseif rate < ceiling and t - changed >= increase_every then
    local steps = math.floor((t - changed) / increase_every)
    rate = math.min(ceiling, rate + steps * increase_share * ceiling)
    changed = changed + steps * increase_every
  end
  return t, rate, tonumber(h[2]) or 0, tonumber(h[3]) or 0, tonumber(h[4]) or 0, changed
end
