-- Sliding log: a fragment of ratelimit/decide.lua and decide_one.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: fmt, ttl_ms, algorithms
-- REGISTERS   algorithms[4] (kind 4 in ratelimit/algorithms.py)
-- KEY  zset: one member per unit charged, scored by the server us it was charged at;
--      members are "<us>:<n>" (n counts up within one us); it expires one window
--      after the newest entry. Entries at or before now - window are out of the window:
--      counted out by ZCOUNT, pruned when a charge writes.
-- a    window_us
-- b    limit: units in any window
-- state    unused: the zset is read here
-- check(_, key, now, cost, a, b, charging) returns the fields the main reports:
--   ok, remaining, remaining_after, reset (until the log is empty), reset_after, retry;
--   with charging, an admitting check leaves out reset (its ZRANGE): only the state
--   after the charge is reported.
local sliding_log = {}

function sliding_log.check(_, key, now, cost, a, b, charging)
  local horizon = fmt(now - a)
  local since = '(' .. horizon
  local count = redis.call('ZCOUNT', key, since, '+inf')
  local r = {
    ok = count + cost <= b, remaining = b - count, reset = 0, retry = 0, count = count, horizon = horizon,
  }
  if r.ok then
    r.remaining_after = b - count - cost
    r.reset_after = a
    if charging then return r end
  end
  if count > 0 then
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    r.reset = tonumber(newest[2]) + a - now
  end
  if not r.ok then
    r.remaining_after = r.remaining
    r.reset_after = r.reset
    -- The (count + cost - limit)-th oldest entry in the window has to leave it first.
    local k = count + cost - b
    local entry = redis.call('ZRANGE', key, since, '+inf', 'BYSCORE', 'LIMIT', k - 1, 1, 'WITHSCORES')
    r.retry = tonumber(entry[2]) + a - now
  end
  return r
end

function sliding_log.commit(key, now, r, grace_ms)
  local cost = r.remaining - r.remaining_after
  local stamp = fmt(now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', r.horizon)
  if cost == 1 then
    redis.call('ZADD', key, stamp, stamp .. ':' .. fmt(r.count + 1))
  else
    local args = {}
    for i = 1, cost do
      args[#args + 1] = stamp
      args[#args + 1] = stamp .. ':' .. fmt(r.count + i)
      -- unpack() is bounded by the Lua stack: add in batches.
      if #args >= 1000 or i == cost then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
  end
  redis.call('PEXPIRE', key, ttl_ms(r.reset_after, grace_ms))
end

algorithms[4] = sliding_log
