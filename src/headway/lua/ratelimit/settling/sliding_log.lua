-- Settling a sliding log: a fragment of ratelimit/settle.lua (not run alone); its model
-- is settle_model.sliding_log.
-- NEEDS       from ratelimit/common.lua: fmt, ttl_ms; from ratelimit/settling.lua: settling
-- REGISTERS   settling[4] (kind 4 in ratelimit/algorithms.py)
-- KEY         the log's zset (ratelimit/sliding_log.lua)
-- RULE        while the reservation's time `at` is in the window, entries stamped `at` are
--             removed (the refund) or added (the rest: more than the limit is debt, until
--             they leave the window). A reservation counts at most b entries: they share
--             one time and leave together, so more would decide nothing more. Once `at`
--             has left the window its entries have too: nothing changes.
-- Added members are "<at>:s<now>:<n>", unique by ZADD NX (a member taken is skipped): a
-- test clock may settle twice in one us. Entries are taken by score alone.
settling[4] = {
  string_state = false,
  settle = function(_, key, now, at, charged, actual, a, b, grace_ms)
    if charged > b then charged = b end
    if actual > b then actual = b end
    if at <= now - a or actual == charged then return end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - a))
    local stamp = fmt(at)
    if actual < charged then
      local gone = redis.call('ZRANGEBYSCORE', key, stamp, stamp, 'LIMIT', 0, charged - actual)
      -- unpack() is bounded by the Lua stack: remove in batches.
      for i = 1, #gone, 1000 do
        redis.call('ZREM', key, unpack(gone, i, math.min(i + 999, #gone)))
      end
      return
    end
    local want, probe = actual - charged, redis.call('ZCARD', key)
    local prefix = stamp .. ':s' .. fmt(now) .. ':'
    while want > 0 do
      local args, batch = {}, math.min(want, 500)
      for i = 1, batch do
        probe = probe + 1
        args[2 * i - 1] = stamp
        args[2 * i] = prefix .. fmt(probe)
      end
      want = want - redis.call('ZADD', key, 'NX', unpack(args))
    end
    -- As sliding_log.lua's commit: a window past its newest entry (at <= now).
    if redis.call('PTTL', key) <= ttl_ms(a, grace_ms) then
      redis.call('PEXPIRE', key, ttl_ms(2 * a, grace_ms))
    end
  end,
}
