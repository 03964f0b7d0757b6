-- Fixed window: a fragment of ratelimit/decide.lua and decide_one.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: idiv, algorithms
-- REGISTERS   algorithms[3] (kind 3 in ratelimit/algorithms.py)
-- STATE  "<w>:<c>": w = window index (floor(server us / window_us)), c = units
--        charged in it; it matters until the window ends.
-- a    window_us
-- b    limit: units per window
-- check(state, key, now, cost, a, b), with state the STATE the main read from the
-- string key (false if none), returns what common.lua says (reset: until the window
-- ends), and for its commit x = the window index, y = the units charged in it so far.
-- commit returns the STATE to write, how long it matters (us), and whether the key's
-- TTL covers it already: every charge in a window sets it to the window's end.
-- Sized for its three fields at once (one allocation, no rehash as functions are added).
local fixed_window = { string_state = true, check = nil, commit = nil }

function fixed_window.check(state, key, now, cost, a, b)
  local index = idiv(now, a)
  local count = 0
  if state then
    local w, c = string.match(state, '^(%d+):(%d+)$')
    if w + 0 == index then count = c + 0 end
  end
  local reset = (index + 1) * a - now
  if count + cost > b then
    -- A count past the limit is debt (a settled reservation, settle.lua): nothing remains.
    local left = b - count
    if left < 0 then left = 0 end
    return false, left, reset, reset, left, reset
  end
  return true, b - count, reset, 0, b - count - cost, reset, index, count
end

function fixed_window.commit(_, now, cost, a, _, index, count)
  return string.format('%d:%d', index, count + cost), (index + 1) * a - now, count > 0
end

algorithms[3] = fixed_window
