-- Fixed window (kind 3), included by rl_decide.lua (not run alone).
-- KEY  string "<w>:<c>": w = window index (floor(server us / window_us)), c = units
--      charged in it; it expires when the window ends.
-- a    window_us
-- b    limit: units per window
-- check(key, now, cost, a, b) returns the fields rl_decide.lua reports:
--   ok, remaining, remaining_after, reset (until the window ends), reset_after, retry.
local fixed_window = {}

function fixed_window.check(key, now, cost, a, b)
  local index = idiv(now, a)
  local count = 0
  local state = redis.call('GET', key)
  if state then
    local w, c = string.match(state, '^(%d+):(%d+)$')
    if tonumber(w) == index then count = tonumber(c) end
  end
  local reset = (index + 1) * a - now
  local r = {
    ok = count + cost <= b,
    remaining = b - count,
    reset = reset,
    reset_after = reset,
    retry = 0,
    index = index,
    count = count + cost,
  }
  if r.ok then
    r.remaining_after = b - count - cost
  else
    r.remaining_after = r.remaining
    r.retry = reset
  end
  return r
end

function fixed_window.commit(key, now, r, grace_ms)
  redis.call('SET', key, fmt(r.index) .. ':' .. fmt(r.count), 'PX', ttl_ms(r.reset, grace_ms))
end

algorithms[3] = fixed_window
