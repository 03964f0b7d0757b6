-- Leaky bucket as a meter (kind 2), included by rl_decide.lua (not run alone).
-- KEY  hash: l = level (us of leaking left), t = server us when measured;
--      the bucket is empty when the level has leaked away, so the key expires then.
-- a    interval_us: microseconds to leak one unit
-- b    capacity: units the bucket holds
-- check(key, now, cost, a, b) returns the fields rl_decide.lua reports:
--   ok, remaining, remaining_after, reset (until empty), reset_after, retry.
local leaky_bucket = {}

function leaky_bucket.check(key, now, cost, a, b)
  local full = a * b
  local state = redis.call('HMGET', key, 'l', 't')
  local level = tonumber(state[1]) or 0
  local elapsed = now - (tonumber(state[2]) or now)
  if elapsed < 0 then elapsed = 0 end
  level = level - elapsed
  if level < 0 then level = 0 end
  local new_level = level + cost * a
  local r = {
    ok = new_level <= full,
    remaining = idiv(full - level, a),
    reset = level,
    reset_after = new_level,
    retry = 0,
    new_level = new_level,
  }
  if r.ok then
    r.remaining_after = idiv(full - new_level, a)
  else
    r.remaining_after = r.remaining
    r.retry = new_level - full
  end
  return r
end

function leaky_bucket.commit(key, now, r, grace_ms)
  redis.call('HSET', key, 'l', fmt(r.new_level), 't', fmt(now))
  redis.call('PEXPIRE', key, ttl_ms(r.new_level, grace_ms))
end

algorithms[2] = leaky_bucket
