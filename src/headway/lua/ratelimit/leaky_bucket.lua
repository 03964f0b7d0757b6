-- Leaky bucket as a meter: a fragment of ratelimit/decide.lua and decide_one.lua (not run
-- alone).
-- NEEDS       from ratelimit/common.lua: idiv, algorithms
-- REGISTERS   algorithms[2] (kind 2 in ratelimit/algorithms.py)
-- STATE  "<l>:<t>": l = level (us of leaking left), t = server us when measured; the
--        bucket is empty when the level has leaked away, so the state matters until then.
-- a    interval_us: microseconds to leak one unit
-- b    capacity: units the bucket holds
-- check(state, key, now, cost, a, b), with state the STATE the main read from the
-- string key (false if none), returns what common.lua says (reset: until empty), and
-- for its commit x = the new level, y = the state read (false if none).
-- commit returns the STATE to write, the TTL its key gets: the longest a state can matter
-- (a full bucket's leak, a * b; a key that outlives its state reads as an empty bucket),
-- and the us its state matters, for decide_one.lua to keep a TTL that covers them (when
-- a key was read).
-- Sized for its three fields at once (one allocation, no rehash as functions are added).
local leaky_bucket = { string_state = true, check = nil, commit = nil }

function leaky_bucket.check(state, key, now, cost, a, b)
  local full = a * b
  local level, stamp = 0, now
  if state then
    local l, t = string.match(state, '^(%d+):(%d+)$')
    level, stamp = l + 0, t + 0
  end
  local elapsed = now - stamp
  if elapsed < 0 then elapsed = 0 end
  level = level - elapsed
  if level < 0 then level = 0 end
  local new_level = level + cost * a
  -- A level past full is debt (a settled reservation, settle.lua): nothing remains.
  local room = full - level
  if room < 0 then room = 0 end
  local remaining = idiv(room, a)
  if new_level > full then
    return false, remaining, level, new_level - full, remaining, level
  end
  return true, remaining, level, 0, idiv(full - new_level, a), new_level, new_level, state
end

function leaky_bucket.commit(_, now, _, a, b, new_level, stored)
  return string.format('%d:%d', new_level, now), a * b, stored and new_level
end

algorithms[2] = leaky_bucket
