-- Leasing a leaky bucket: a fragment of ratelimit/lease.lua (not run alone); its model is
-- lease_model.leaky_bucket (a BucketLease).
-- NEEDS       from ratelimit/leasing.lua: leasing, bucket_charge
-- REGISTERS   leasing[2] (kind 2 in ratelimit/algorithms.py): charge, give_back
-- STATE       "<level>:<stamp>" (ratelimit/leaky_bucket.lua): its end, the mark, is
--             stamp + level
leasing[2] = {
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
}
