-- Leasing a token bucket: a fragment of ratelimit/lease.lua (not run alone); its model is
-- lease_model.token_bucket (a BucketLease).
-- NEEDS       from ratelimit/common.lua: fmt; from ratelimit/leasing.lua: leasing, bucket_charge
-- REGISTERS   leasing[1] (kind 1 in ratelimit/algorithms.py): charge, give_back
-- STATE       the TAT (ratelimit/token_bucket.lua); the mark is the TAT
leasing[1] = {
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
}
