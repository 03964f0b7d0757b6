-- Settling a leaky bucket: a fragment of ratelimit/settle.lua (not run alone); its model
-- is settle_model.leaky_bucket.
-- NEEDS       from ratelimit/settling.lua: settling, adjusted
-- REGISTERS   settling[2] (kind 2 in ratelimit/algorithms.py)
-- RULE        the level, leaked to now, falls by the refund (never below empty) or rises
--             by the rest, past full if need be: debt, refused until it leaks below full
--             again. Its key then lives until the level has leaked away.
settling[2] = {
  string_state = true,
  settle = function(state, _, now, _, charged, actual, a, b)
    local level = 0
    if state then
      local l, t = string.match(state, '^(%d+):(%d+)$')
      local elapsed = now - t
      if elapsed < 0 then elapsed = 0 end
      level = l - elapsed
      if level < 0 then level = 0 end
    end
    level = adjusted(level, charged, actual, a)
    local ttl = a * b
    if level > ttl then ttl = level end
    return string.format('%d:%d', level, now), ttl
  end,
}
