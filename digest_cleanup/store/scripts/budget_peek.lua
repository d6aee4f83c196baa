-- The budget as it stands, written nowhere: {rate, paused_until - now} as strings.
--
-- KEYS: budget
-- ARGV: ceiling increase_every increase_share
-- include: budget_state.lua
local t, rate, tat, paused = state(budget, tonumber(ceiling), tonumber(increase_every),
                                   tonumber(increase_share))
return {tostring(rate), tostring(math.max(paused - t, 0))}
