-- Leased quota, the library of ratelimit/lease.lua (not run alone). The reference model
-- is ratelimit/lease_model.py, function for function.
-- NEEDS       from ratelimit/common.lua: idiv
-- DEFINES     for the lease fragments that follow it (lua/ratelimit/leasing/<name>.lua,
--             one per leased algorithm, each named by its entry in ratelimit/algorithms.py):
--   leasing             the registry: each lease fragment sets leasing[kind] (its kind
--                       in ratelimit/algorithms.py) to a table with
--     give_back(state, mark, units, a) -> the state with units given back, or nil when
--         the state moved on (another window; another charge of a bucket since)
--     and, for a window (WindowLease: charged by its fragment's check and commit; k units
--         leave what the check at the cost found, less k - cost, until the same reset):
--     terms(now, a) -> off, step, mark: unit i (0-based) may be spent until
--         now + off + i * step (the window's last us); mark is the window index
--     or, for a bucket (BucketLease):
--     charge(state, now, k, a, b, gap) -> state, matters_us, remaining, reset, off, mark:
--         matters_us is how long the new state matters (lease.lua gives the key a * b,
--         the longest a bucket's state can matter, kept while its PTTL covers these);
--         the bucket's end (TAT, the mark) moves to max(end, now + gap) + k * a; unit i
--         holds the refill slot starting at now + off + i * a and may be spent until it
--         starts
--   bucket_charge(state_end, now, k, a, b, gap) -> new_end, remaining, off: a bucket's
--       charge from its end, for a bucket's `charge`
--   window_terms(now, a) -> off, step, mark: a window's `terms`
-- Knows no algorithm: which kinds can be leased, and how, is the lease fragments' and the
-- table's to say.
local leasing = {}

local function bucket_charge(state_end, now, k, a, b, gap)
  local start = math.max(state_end, now + gap)
  local new_end = start + k * a
  return new_end, idiv(a * b - (new_end - now), a), start - now
end

local function window_terms(now, a)
  local index = idiv(now, a)
  return (index + 1) * a - now - 1, 0, index
end
