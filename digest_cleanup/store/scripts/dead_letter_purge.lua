-- Remove one entry for good, leaving an audit record; returns 1, or 0 when it was no
-- longer there.
--
-- KEYS: entries order copies stats digests by_run by_target audit
--   audit  the operators' audit log (a list, newest first)
-- ARGV: id record key_count
--   record  the audit record, JSON
-- include: dead_letter_take.lua
local raw = take(entries, order, copies, stats, digests, by_run, by_target, id,
  tonumber(key_count))
if not raw then return 0 end
redis.call('LPUSH', audit, record)
return 1
