-- Leaky bucket as a meter (kind 2), included by rl_decide.lua (not run alone).
-- KEY  string "<l>:<t>": l = level (us of leaking left), t = server us when measured;
--      the bucket is empty when the level has leaked away, so the key expires then.
-- a    interval_us: microseconds to leak one unit
-- b    capacity: units the bucket holds
-- check(key, now, cost, a, b) returns the fields rl_decide.lua reports:
--   ok, remaining, remaining_after, reset (until empty), reset_after, retry.
local leaky_bucket = {}

function leaky_bucket.check(key, now, cost, a, b)
  local full = a * b
  local level, stamp = 0, now
  local state = redis.call('GET', key)
  if state then
    local l, t = string.match(state, '^(%d+):(%d+)$')
    level, stamp = tonumber(l), tonumber(t)
  end
  local elapsed = now - stamp
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
  local state = fmt(r.new_level) .. ':' .. fmt(now)
  redis.call('SET', key, state, 'PX', ttl_ms(r.new_level, grace_ms))
end

algorithms[2] = leaky_bucket
