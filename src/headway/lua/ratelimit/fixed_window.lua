-- Fixed window: a fragment of ratelimit/decide.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: idiv, algorithms
-- REGISTERS   algorithms[3] (kind 3 in ratelimit/algorithms.py)
-- STATE  "<w>:<c>": w = window index (floor(server us / window_us)), c = units
--        charged in it; it matters until the window ends.
-- a    window_us
-- b    limit: units per window
-- check(state, key, now, cost, a, b), with state the STATE decide.lua read from the
-- string key (false if none), returns the fields decide.lua reports:
--   ok, remaining, remaining_after, reset (until the window ends), reset_after, retry.
-- commit returns the STATE to write and how long it matters (us).
local fixed_window = { string_state = true }

function fixed_window.check(state, key, now, cost, a, b)
  local index = idiv(now, a)
  local count = 0
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

function fixed_window.commit(_, _, r)
  return string.format('%d:%d', r.index, r.count), r.reset
end

algorithms[3] = fixed_window
