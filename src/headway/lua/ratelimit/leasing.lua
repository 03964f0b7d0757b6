-- Leased quota, per algorithm: a library of ratelimit/lease.lua (not run alone). The
-- reference model is ratelimit/lease_model.py, function for function.
-- NEEDS       from ratelimit/common.lua: idiv, fmt, and `algorithms` as the call's
--             fragments filled it (leasing[kind] is defined for those kinds only)
-- DEFINES     leasing[kind] (kinds as in ratelimit/algorithms.py; sliding logs are not
--             leased), a table with
--   give_back(state, mark, units, a) -> the state with units given back, or nil when
--       the state moved on (another window; another charge of a bucket since)
--   and, for windows (charged by their fragment's check and commit; k units leave what
--       the check at the cost found, less k - cost, until the same reset):
--   terms(now, a) -> off, step, mark: unit i (0-based) may be spent until
--       now + off + i * step (the window's last us); mark is the window index
--   or, for buckets:
--   charge(state, now, k, a, b, gap) -> state, matters_us, remaining, reset, off, mark:
--       matters_us is how long the new state matters (lease.lua gives the key a * b,
--       the longest a bucket's state can matter, kept while its PTTL covers these);
--       the bucket's end (TAT) moves to max(end, now + gap) + k * a; unit i holds the
--       refill slot starting at now + off + i * a and may be spent until it starts
-- Reads and writes only the STATE strings each fragment's header describes.
-- Only the kinds whose fragment the script includes are defined (`algorithms` holds just
-- those): every closure and table made is server time, once per library load (on every
-- call where the script runs as EVAL).
local leasing = {}
local bucket_charge, window_terms

if algorithms[1] or algorithms[2] then
  bucket_charge = function(state_end, now, k, a, b, gap)
    local start = math.max(state_end, now + gap)
    local new_end = start + k * a
    return new_end, idiv(a * b - (new_end - now), a), start - now
  end
end

-- Token bucket, STATE the TAT.
if algorithms[1] then leasing[1] = {
  charge = function(state, now, k, a, b, gap)
    local tat = state and state + 0 or now
    if tat < now then tat = now end
    local new_end, remaining, off = bucket_charge(tat, now, k, a, b, gap)
    return fmt(new_end), new_end - now, remaining, new_end - now, off, new_end
  end,
  give_back = function(state, mark, units, a)
    local tat = state + 0
    if tat ~= mark then return nil end
    return fmt(tat - units * a)
  end,
} end

-- Leaky bucket, STATE "<level>:<stamp>": its end is stamp + level.
if algorithms[2] then leasing[2] = {
  charge = function(state, now, k, a, b, gap)
    local level = 0
    if state then
      local l, t = string.match(state, '^(%d+):(%d+)$')
      level = l - math.max(0, now - t)
      if level < 0 then level = 0 end
    end
    local new_end, remaining, off = bucket_charge(now + level, now, k, a, b, gap)
    local written = string.format('%d:%d', new_end - now, now)
    return written, new_end - now, remaining, new_end - now, off, new_end
  end,
  give_back = function(state, mark, units, a)
    local l, t = string.match(state, '^(%d+):(%d+)$')
    local level, stamp = l + 0, t + 0
    if level + stamp ~= mark then return nil end
    return string.format('%d:%d', level - units * a, stamp)
  end,
} end

-- Windows: units may be spent until the window they were charged to ends.
if algorithms[3] or algorithms[5] then
  window_terms = function(now, a)
    local index = idiv(now, a)
    return (index + 1) * a - now - 1, 0, index
  end
end

-- Fixed window, STATE "<w>:<c>".
if algorithms[3] then leasing[3] = {
  terms = window_terms,
  give_back = function(state, mark, units)
    local w, c = string.match(state, '^(%d+):(%d+)$')
    if w + 0 ~= mark then return nil end
    return string.format('%s:%d', w, math.max(0, c - units))
  end,
} end

-- Sliding counter, STATE "<w>:<c>:<p>": units go back to the window they were charged
-- to, current or (while it still weighs) previous.
if algorithms[5] then leasing[5] = {
  terms = window_terms,
  give_back = function(state, mark, units)
    local sw, sc, sp = string.match(state, '^(%d+):(%d+):(%d+)$')
    local w, c, p = sw + 0, sc + 0, sp + 0
    if w == mark + 1 then  -- the previous window still weighs: lighten it
      return string.format('%d:%d:%d', w, c, math.max(0, p - units))
    end
    if w ~= mark then return nil end
    return string.format('%d:%d:%d', w, math.max(0, c - units), p)
  end,
} end
