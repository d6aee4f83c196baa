-- Fragment of the run part (store/run_records.py): finish(run, now) ends the run if
-- the sweep is done and nothing is in flight, and returns 1 when it did.  The final
-- status is 'failed' when the counts do not add up, 'complete_with_failures' when a key
-- was dead-lettered or more than the run's max_skipped_share of its expired keys was
-- skipped, else 'complete'.  Recording a batch and saving a checkpoint include it, since
-- either can be the step that ends a run.
--
-- A run opened before max_skipped_share existed is held to the default, 0.1, which is
-- DEFAULT_MAX_SKIPPED_SHARE (targets.py); the reason is SKIPPED_SHARE_EXCEEDED
-- (model/run_view.py).  tests/unit/test_scripts.py holds both equal to this file.
local function finish(run, now)
  local h = redis.call('HMGET', run, 'status', 'sweep_done', 'inflight', 'expired',
                       'deleted', 'dead_lettered', 'skipped', 'max_skipped_share')
  if h[2] ~= '1' or tonumber(h[3]) ~= 0 or h[1] ~= 'running' then return 0 end
  local expired, deleted = tonumber(h[4]), tonumber(h[5])
  local dead, skipped = tonumber(h[6]), tonumber(h[7])
  local share = tonumber(h[8]) or 0.1
  local status = 'complete'
  if expired ~= deleted + dead + skipped then
    status = 'failed'
    redis.call('HSET', run, 'reason', 'accounting_mismatch',
      'message', 'expired (' .. expired .. ') != deleted + dead_lettered + skipped (' ..
      (deleted + dead + skipped) .. ')')
  elseif skipped > share * expired then
    status = 'complete_with_failures'
    redis.call('HSET', run, 'reason', 'max_skipped_share_exceeded',
      'message', 'skipped ' .. skipped .. ' of ' .. expired .. ' expired keys, more than ' ..
      'max_skipped_share (' .. share .. ') allows; the audit report ' ..
      'lists each with its code (not_deleted.jsonl): find what rewrites them, or raise ' ..
      'max_skipped_share on the target')
  elseif dead > 0 then
    status = 'complete_with_failures'
  end
  redis.call('HSET', run, 'status', status, 'ended_at', now)
  return 1
end
