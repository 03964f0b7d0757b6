-- Leased quota, per algorithm: a library of ratelimit/lease.lua (not run alone). The
-- reference model is ratelimit/lease_model.py, function for function.
-- NEEDS       from ratelimit/common.lua: idiv, fmt
-- DEFINES     leasing[kind] (kinds as in ratelimit/algorithms.py; sliding logs are not
--             leased) with
--   terms(before, state, now, a) -> off, step, mark   for a lease charged at now:
--       unit i (0-based) may be spent until now + off + i * step; before is the
--       fragment's check at the request's cost, state what its commit wrote;
--       mark is what the state must still say for units to be given back
--   give_back(state, mark, units, a) -> the state with units given back, or nil
--       when the state moved on (another window; another charge of a bucket since)
-- Reads only the STATE strings each fragment's header describes, and check's
-- documented field reset.
local leasing = {}

-- Token bucket, STATE the TAT: unit i holds the refill slot starting at the old TAT
-- (now if the bucket was full) + i * a, and may be spent until that slot starts.
leasing[1] = {
  terms = function(before, state, _, a) return before.reset, a, tonumber(state) end,
  give_back = function(state, mark, units, a)
    local tat = tonumber(state)
    if tat ~= mark then return nil end
    return fmt(tat - units * a)
  end,
}

-- Leaky bucket, STATE "<level>:<stamp>": the same as the token bucket, with
-- stamp + level as the TAT.
leasing[2] = {
  terms = function(before, state, _, a)
    local l, t = string.match(state, '^(%d+):(%d+)$')
    return before.reset, a, tonumber(l) + tonumber(t)
  end,
  give_back = function(state, mark, units, a)
    local l, t = string.match(state, '^(%d+):(%d+)$')
    local level, stamp = tonumber(l), tonumber(t)
    if level + stamp ~= mark then return nil end
    return string.format('%d:%d', level - units * a, stamp)
  end,
}

-- Windows: units may be spent until the window they were charged to ends.
local function window_terms(_, _, now, a)
  local index = idiv(now, a)
  return (index + 1) * a - now - 1, 0, index
end

-- Fixed window, STATE "<w>:<c>".
leasing[3] = {
  terms = window_terms,
  give_back = function(state, mark, units)
    local w, c = string.match(state, '^(%d+):(%d+)$')
    if tonumber(w) ~= mark then return nil end
    return string.format('%d:%d', tonumber(w), math.max(0, tonumber(c) - units))
  end,
}

-- Sliding counter, STATE "<w>:<c>:<p>".
leasing[5] = {
  terms = window_terms,
  give_back = function(state, mark, units)
    local w, c, p = string.match(state, '^(%d+):(%d+):(%d+)$')
    if tonumber(w) ~= mark then return nil end
    return string.format('%d:%d:%d', tonumber(w), math.max(0, tonumber(c) - units), tonumber(p))
  end,
}
