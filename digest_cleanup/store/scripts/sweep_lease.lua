-- Fragment of the sweep part (store/sweeps.py): end_lease(lease) takes the sweep lease
-- away from whichever slice holds it.  Aborting a run includes it.
local function end_lease(lease)
  redis.call('DEL', lease)
end
