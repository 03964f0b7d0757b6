-- Settling a token bucket: a fragment of ratelimit/settle.lua (not run alone); its model
-- is settle_model.token_bucket.
-- NEEDS       from ratelimit/common.lua: fmt; from ratelimit/settling.lua: settling, adjusted
-- REGISTERS   settling[1] (kind 1 in ratelimit/algorithms.py)
-- RULE        tokens go back as an earlier TAT, never before now (capped at capacity: a
--             full bucket's TAT is in the past); the rest is charged as a later TAT, which
--             may pass now + a * b: debt, refused until the bucket refills past it. Its
--             key then lives until the TAT.
settling[1] = {
  string_state = true,
  settle = function(state, _, now, _, charged, actual, a, b)
    local tat = state and state + 0 or now
    if tat < now then tat = now end
    tat = now + adjusted(tat - now, charged, actual, a)
    local ttl = a * b
    if tat - now > ttl then ttl = tat - now end
    return fmt(tat), ttl
  end,
}
