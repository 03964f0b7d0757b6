-- Sliding counter: a fragment of ratelimit/decide.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: idiv, algorithms
-- REGISTERS   algorithms[5] (kind 5 in ratelimit/algorithms.py)
-- STATE  "<w>:<c>:<p>": w = current window index, c = units charged in it, p = units
--        in the window before; it matters until the current window's count stops
--        weighing (the end of the next window).
-- a    window_us
-- b    limit
-- A request is admitted when p * (W - e) + (c + cost) * W <= limit * W, with e the
-- time elapsed in the current window (integers: the weighted estimate, times W).
-- check(state, key, now, cost, a, b), with state the STATE decide.lua read from the
-- string key (false if none), returns the fields decide.lua reports:
--   ok, remaining, remaining_after, reset (until the estimate is 0), reset_after, retry.
-- commit returns the STATE to write and how long it matters (us).
local sliding_counter = { string_state = true }

local function counter_reset(index, a, now, c, p)
  if c > 0 then return (index + 2) * a - now end
  if p > 0 then return (index + 1) * a - now end
  return 0
end

local function counter_room(weighted, c, a, b)
  local free = b * a - weighted - c * a
  if free < 0 then return 0 end
  return idiv(free, a)
end

function sliding_counter.check(state, key, now, cost, a, b)
  local index = idiv(now, a)
  local e = now - index * a
  local c, p = 0, 0
  if state then
    local sw, sc, sp = string.match(state, '^(%d+):(%d+):(%d+)$')
    local w = tonumber(sw)
    if w == index then
      c, p = tonumber(sc), tonumber(sp)
    elseif w == index - 1 then
      p = tonumber(sc)
    end
  end
  local weighted = p * (a - e)
  local r = {
    ok = weighted + (c + cost) * a <= b * a,
    remaining = counter_room(weighted, c, a, b),
    reset = counter_reset(index, a, now, c, p),
    retry = 0,
    index = index,
    c = c + cost,
    p = p,
  }
  if r.ok then
    r.remaining_after = counter_room(weighted, c + cost, a, b)
    r.reset_after = counter_reset(index, a, now, c + cost, p)
  else
    r.remaining_after = r.remaining
    r.reset_after = r.reset
    if c + cost <= b then
      r.retry = a - idiv((b - c - cost) * a, p) - e
    else
      local wait = a - idiv((b - cost) * a, c)
      if wait < 0 then wait = 0 end
      r.retry = a - e + wait
    end
  end
  return r
end

function sliding_counter.commit(_, _, r)
  return string.format('%d:%d:%d', r.index, r.c, r.p), r.reset_after
end

algorithms[5] = sliding_counter
