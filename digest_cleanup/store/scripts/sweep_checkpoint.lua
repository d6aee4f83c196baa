-- Save the sweep's checkpoint and its counts in the run, and put the batches it
-- published in flight (the run's side through run_sweep.lua); returns 'saved',
-- 'finished' (the sweep is done and nothing was left in flight), 'fenced' (the caller
-- lost the sweep lease) or 'missing'.
--
-- KEYS: run checkpoint pending lease published chains
--   checkpoint  the sweep's checkpoint, JSON
--   pending     batches in flight, scored by when they were published
--   lease       the sweep lease; its value is the fence of the slice holding it
--   published   each published batch's digest, by batch id: what a worker may delete
--   chains      chains of attempts still open, by batch id
-- ARGV: state now now_epoch fence lease_ms batches...
--   state     the checkpoint, a JSON object (listed, expired, seq, done)
--   now       ISO time; now_epoch the same in epoch seconds
--   fence     the caller's lease token; lease_ms how long writing renews the lease for
--   batches   (batch id, published digest) pairs entering flight
-- include: run_sweep.lua
if redis.call('EXISTS', run) == 0 then return 'missing' end
-- The fence: only the slice holding the sweep lease may write, and writing renews it.
if redis.call('GET', lease) ~= fence then return 'fenced' end
redis.call('PEXPIRE', lease, lease_ms)
local c = cjson.decode(state)
redis.call('SET', checkpoint, state)
sweep_counted(run, c, now)
-- A batch enters flight, and is counted in it, once: a chunk sent again keeps the
-- digest it was first published with.
for i = batches_from, #ARGV, 2 do
  if redis.call('HSETNX', published, ARGV[i], ARGV[i + 1]) == 1 then
    enter_flight(run, chains, pending, ARGV[i], now_epoch)
  end
end
if c.done then
  if sweep_finished(run, now) == 1 then return 'finished' end
end
return 'saved'
