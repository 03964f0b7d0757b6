-- Leaky bucket as a meter: a fragment of ratelimit/decide.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: idiv, algorithms
-- REGISTERS   algorithms[2] (kind 2 in ratelimit/algorithms.py)
-- STATE  "<l>:<t>": l = level (us of leaking left), t = server us when measured; the
--        bucket is empty when the level has leaked away, so the state matters until then.
-- a    interval_us: microseconds to leak one unit
-- b    capacity: units the bucket holds
-- check(state, key, now, cost, a, b), with state the STATE decide.lua read from the
-- string key (false if none), returns the fields decide.lua reports:
--   ok, remaining, remaining_after, reset (until empty), reset_after, retry.
-- commit returns the STATE to write and how long it matters (us).
local leaky_bucket = { string_state = true }

function leaky_bucket.check(state, key, now, cost, a, b)
  local full = a * b
  local level, stamp = 0, now
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

function leaky_bucket.commit(_, now, r)
  return string.format('%d:%d', r.new_level, now), r.new_level
end

algorithms[2] = leaky_bucket
