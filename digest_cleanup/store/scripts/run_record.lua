-- Count one batch attempt once, keyed by its claim; returns 'recorded', 'finished'
-- (this attempt ended the run), 'duplicate' (the claim was counted before) or 'missing'.
--
-- KEYS: run claims pending retry_codes latency timings retried_codes skipped_keys progress chains
--   claims         the claims of attempts already counted (a set)
--   pending        batches in flight, scored by when they were published
--   retry_codes    keys that failed, by error code (a hash)
--   latency        the target's enqueue-to-acknowledgement histogram (a hash)
--   timings        the target's recent attempts, newest first: "attempt_s delete_s keys"
--   retried_codes  attempts that published a retry, by code (a hash)
--   skipped_keys   the keys the run left alone on purpose, one JSON line each
--   progress       the console's chart: "epoch deleted done", one an attempt
--   chains         chains of attempts still open, by batch id (a hash)
-- ARGV: claim attempt now now_epoch progress_samples
--   attempt           what the attempt came to, a JSON object (see RunRecords.record)
--   now               ISO time; now_epoch the same in epoch seconds
--   progress_samples  how many progress samples to keep
-- include: finish.lua
if redis.call('EXISTS', run) == 0 then return 'missing' end
if redis.call('SADD', claims, claim) == 0 then return 'duplicate' end
local r = cjson.decode(attempt)
redis.call('HINCRBY', run, 'deleted', r.deleted)
redis.call('HINCRBY', run, 'dead_lettered', r.dead_lettered)
redis.call('HINCRBY', run, 'skipped', r.skipped)
redis.call('HINCRBY', run, 'retries', r.retries)
redis.call('HSET', run, 'last_batch_at', now)
for code, n in pairs(r.codes) do redis.call('HINCRBY', retry_codes, code, n) end
for _, code in ipairs(r.retried) do redis.call('HINCRBY', retried_codes, code, 1) end
for _, line in ipairs(r.skipped_keys) do redis.call('RPUSH', skipped_keys, line) end
if r.bucket ~= '' then
  redis.call('HINCRBY', latency, r.bucket, 1)
  redis.call('HINCRBY', latency, 'count', 1)
  redis.call('HINCRBYFLOAT', latency, 'sum', r.latency)
end
if r.service >= 0 then
  redis.call('LPUSH', timings, r.service .. ' ' .. r.delete_seconds .. ' ' .. r.items)
  redis.call('LTRIM', timings, 0, 1999)
end
-- The console's progress chart: the counts just written, one sample an attempt.
local h = redis.call('HMGET', run, 'deleted', 'dead_lettered', 'skipped')
local done = tonumber(h[1]) + tonumber(h[2] or 0) + tonumber(h[3] or 0)
redis.call('RPUSH', progress, now_epoch .. ' ' .. h[1] .. ' ' .. done)
redis.call('LTRIM', progress, -tonumber(progress_samples), -1)
local ttl = redis.call('TTL', run)
if ttl > 0 then redis.call('EXPIRE', progress, ttl) end
-- A batch is in flight once per chain of attempts: the sweep's, and one per redrive
-- (chains counts them).  A chain ends once: a second terminal attempt of it (a
-- redelivery that overlapped its own retry, or a forgery) moves nothing more.
if r.terminal then
  local left = -1
  if redis.call('HEXISTS', chains, r.batch_id) == 1 then
    left = redis.call('HINCRBY', chains, r.batch_id, -1)
    if left < 0 then redis.call('HSET', chains, r.batch_id, 0) end
  elseif redis.call('ZSCORE', pending, r.batch_id) then
    left = 0  -- a run from before chains were counted: one chain per batch
  end
  if left >= 0 then
    redis.call('HINCRBY', run, 'inflight', -1)
    if r.first_generation then redis.call('HINCRBY', run, 'batches_done', 1) end
    if left == 0 then redis.call('ZREM', pending, r.batch_id) end
    if finish(run, now) == 1 then return 'finished' end
  end
end
return 'recorded'
