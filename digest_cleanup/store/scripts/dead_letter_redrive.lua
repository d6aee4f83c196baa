-- Move one entry back onto the work queue, and its counts back into its run; returns 1,
-- or 0 when the entry was no longer there.
--
-- KEYS: entries order copies stats digests by_run by_target work run pending redriven chains
--   work      the work queue the entry's message goes back to
--   run       the entry's run's hash; pending, redriven and chains its keys that a
--             redrive changes, through the run part's count_redrive
-- ARGV: id key_count now_epoch batch now exchange routing_key failed_note
--   batch               the entry's batch id
--   exchange            what the message's delivery_info names, with routing_key
--   failed_note         what a failed run's message gains
-- include: dead_letter_take.lua
-- include: run_redrive.lua
local n = tonumber(key_count)
local raw = take(entries, order, copies, stats, digests, by_run, by_target, id, n)
if not raw then return 0 end
local msg = cjson.decode(raw)
-- kombu restores an unacknowledged message to the queue its delivery_info
-- names, so point it at the work queue or a killed worker would send it back here.
msg.properties.delivery_info.exchange = exchange
msg.properties.delivery_info.routing_key = routing_key
redis.call('LPUSH', work, cjson.encode(msg))
count_redrive(run, pending, redriven, chains, batch, n, now_epoch, now, failed_note)
return 1
