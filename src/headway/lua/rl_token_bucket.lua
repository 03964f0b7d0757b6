-- Token bucket as GCRA (kind 1), included by rl_decide.lua (not run alone).
-- KEY  string: the theoretical arrival time (TAT, server us) of the next unit;
--      the bucket is full once the TAT is in the past, so the key expires then.
-- a    interval_us: microseconds per unit of refill
-- b    capacity: units admitted at once
-- check(key, now, cost, a, b) returns the fields rl_decide.lua reports:
--   ok, remaining, remaining_after, reset (until full), reset_after, retry.
local token_bucket = {}

function token_bucket.check(key, now, cost, a, b)
  local tau = a * b
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  local new_tat = tat + cost * a
  local r = {
    ok = new_tat - now <= tau,
    remaining = idiv(tau - (tat - now), a),
    reset = tat - now,
    reset_after = new_tat - now,
    retry = 0,
    new_tat = new_tat,
  }
  if r.ok then
    r.remaining_after = idiv(tau - (new_tat - now), a)
  else
    r.remaining_after = r.remaining
    r.retry = new_tat - tau - now
  end
  return r
end

function token_bucket.commit(key, now, r, grace_ms)
  redis.call('SET', key, fmt(r.new_tat), 'PX', ttl_ms(r.new_tat - now, grace_ms))
end

algorithms[1] = token_bucket
