-- Sliding counter: a fragment of ratelimit/decide.lua and decide_one.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: idiv, algorithms
-- REGISTERS   algorithms[5] (kind 5 in ratelimit/algorithms.py)
-- STATE  "<w>:<c>:<p>": w = current window index, c = units charged in it, p = units
--        in the window before; it matters until the current window's count stops
--        weighing (the end of the next window).
-- a    window_us
-- b    limit
-- A request is admitted when p * (W - e) + (c + cost) * W <= limit * W, with e the
-- time elapsed in the current window (integers: the weighted estimate, times W).
-- check(state, key, now, cost, a, b, charging), with state the STATE the main read from
-- the string key (false if none), returns what common.lua says (reset: until the
-- estimate is 0; left out when charging and admitted), and for its commit x = the window
-- index, y = c, z = p (before the charge).
-- commit returns the STATE to write, how long it matters (us), and whether the key's
-- TTL covers it already: every charge in a window sets it to the next window's end.
-- Sized for its three fields at once (one allocation, no rehash as functions are added).
local sliding_counter = { string_state = true, check = nil, commit = nil }

local function counter_reset(index, a, now, c, p)
  if c > 0 then return (index + 2) * a - now end
  if p > 0 then return (index + 1) * a - now end
  return 0
end

function sliding_counter.check(state, key, now, cost, a, b, charging)
  local index = idiv(now, a)
  local e = now - index * a
  local c, p = 0, 0
  if state then
    local sw, sc, sp = string.match(state, '^(%d+):(%d+):(%d+)$')
    local w = sw + 0
    if w == index then
      c, p = sc + 0, sp + 0
    elseif w == index - 1 then
      p = sc + 0
    end
  end
  -- Room left, in units times W: admitted when the charge fits in it (the inequality above).
  local free = b * a - p * (a - e) - c * a
  local remaining = 0
  if free > 0 then remaining = idiv(free, a) end
  local charged = free - cost * a
  if charged >= 0 then
    -- After a charge the current window counts, so the estimate lasts to the next one's end.
    -- Charging, the answer before the charge is not reported: its reset is left out.
    local reset = 0
    if not charging then reset = counter_reset(index, a, now, c, p) end
    local after = (index + 2) * a - now
    -- Nothing charged now or before (a reservation's estimate of 0): as before the call.
    if c + cost == 0 then after = counter_reset(index, a, now, 0, p) end
    return true, remaining, reset, 0, idiv(charged, a), after, index, c, p
  end
  local reset = counter_reset(index, a, now, c, p)
  local retry
  if c + cost <= b then
    retry = a - idiv((b - c - cost) * a, p) - e
  else
    local wait = a - idiv((b - cost) * a, c)
    if wait < 0 then wait = 0 end
    retry = a - e + wait
  end
  return false, remaining, reset, retry, remaining, reset
end

function sliding_counter.commit(_, now, cost, a, _, index, c, p)
  return string.format('%d:%d:%d', index, c + cost, p), (index + 2) * a - now, c > 0
end

algorithms[5] = sliding_counter
