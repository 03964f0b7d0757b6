-- Sliding log: a fragment of ratelimit/decide.lua and decide_one.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: fmt, ttl_ms, algorithms
-- REGISTERS   algorithms[4] (kind 4 in ratelimit/algorithms.py)
-- KEY  zset: one member per unit charged, scored by the server us it was charged at;
--      members are "<us>:<n>" (n counts up within one us); it expires one window
--      after the newest entry. Entries at or before now - window are pruned.
-- a    window_us
-- b    limit: units in any window
-- state    unused: the zset is read here
-- check(_, key, now, cost, a, b, charging) returns the fields the main reports:
--   ok, remaining, remaining_after, reset (until the log is empty), reset_after, retry;
--   with charging, an admitting check leaves out reset (its ZRANGE): only the state
--   after the charge is reported.
-- Entries are read by rank without scores, their time taken from the member: a score
-- costs the server a double formatted per entry (~0.5 us, as much as the parse here).
local sliding_log = {}

local function charged_at(members)
  local member = members[1]
  return tonumber(string.sub(member, 1, string.find(member, ':', 1, true) - 1))
end

function sliding_log.check(_, key, now, cost, a, b, charging)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - a))
  local count = redis.call('ZCARD', key)
  local r = { ok = count + cost <= b, remaining = b - count, reset = 0, retry = 0, count = count }
  if r.ok then
    r.remaining_after = b - count - cost
    r.reset_after = a
    if charging then return r end
  end
  if count > 0 then
    r.reset = charged_at(redis.call('ZRANGE', key, -1, -1)) + a - now
  end
  if not r.ok then
    r.remaining_after = r.remaining
    r.reset_after = r.reset
    -- The (count + cost - limit)-th oldest entry has to leave the window first.
    local k = count + cost - b
    r.retry = charged_at(redis.call('ZRANGE', key, k - 1, k - 1)) + a - now
  end
  return r
end

function sliding_log.commit(key, now, r, grace_ms)
  local cost = r.remaining - r.remaining_after
  local stamp = fmt(now)
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
