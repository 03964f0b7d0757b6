-- Sliding log: a fragment of ratelimit/decide.lua and decide_one.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: fmt, ttl_ms, algorithms
-- REGISTERS   algorithms[4] (kind 4 in ratelimit/algorithms.py)
-- KEY  zset: one member per unit charged, scored by the server us it was charged at;
--      members are "<us>:<n>" (n counts up within one us); it lives at least one window
--      after the newest entry, at most two. Entries at or before now - window are pruned.
-- a    window_us
-- b    limit: units in any window
-- state    unused: the zset is read here
-- check(_, key, now, cost, a, b, charging) returns what common.lua says (reset: until
-- the log is empty; left out when charging and admitted, as it costs a ZRANGE), and for
-- its commit x = the entries in the window.
-- Entries are read by rank without scores, their time taken from the member: a score
-- costs the server a double formatted per entry (~0.5 us, as much as the parse here).
-- Sized for its two functions at once (one allocation, no rehash as they are added).
local sliding_log = { check = nil, commit = nil }

local function charged_at(member)
  return string.sub(member, 1, string.find(member, ':', 1, true) - 1) + 0
end

function sliding_log.check(_, key, now, cost, a, b, charging)
  local count = redis.call('ZCARD', key)
  -- The time of the entry a refusal waits for: the oldest, once read (if in the window).
  local first = nil
  if count + cost <= b then
    -- Admitted whatever pruning takes away: prune, counting what it took.
    count = count - redis.call('ZREMRANGEBYSCORE', key, '-inf', now - a)
    if charging then return true, b - count, 0, 0, b - count - cost, a, count end
  else
    -- Refused unless pruning frees room. The oldest entry says whether anything is to be
    -- pruned (one command, as the prune, which then need not run: the refusal of a full
    -- log is read-only); it is also the one that leaves first, often the retry's (read
    -- and parsed once for both).
    local oldest = redis.call('ZRANGE', key, 0, 0)[1]
    if oldest then first = charged_at(oldest) end
    if first and first <= now - a then
      count = count - redis.call('ZREMRANGEBYSCORE', key, '-inf', now - a)
      first = nil
    end
  end
  local ok = count + cost <= b
  local reset = 0
  if count > 0 then
    reset = charged_at(redis.call('ZRANGE', key, -1, -1)[1]) + a - now
  end
  if ok then return true, b - count, reset, 0, b - count - cost, a, count end
  -- The (count + cost - limit)-th oldest entry has to leave the window first.
  local k = count + cost - b
  if k > 1 or not first then first = charged_at(redis.call('ZRANGE', key, k - 1, k - 1)[1]) end
  -- More entries than the limit is debt (a settled reservation, settle.lua).
  local left = b - count
  if left < 0 then left = 0 end
  return false, left, reset, first + a - now, left, reset
end

function sliding_log.commit(key, now, cost, a, _, count, _, _, grace_ms)
  local stamp = fmt(now)
  if cost == 1 then
    redis.call('ZADD', key, stamp, stamp .. ':' .. fmt(count + 1))
  else
    local args = {}
    for i = 1, cost do
      args[#args + 1] = stamp
      args[#args + 1] = stamp .. ':' .. fmt(count + i)
      -- unpack() is bounded by the Lua stack: add in batches.
      if #args >= 1000 or i == cost then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
  end
  -- It must last a window past its newest entry (now): its TTL is set to two windows and
  -- kept while it still covers one (1 ms to spare for the rounding), as a PTTL costs the
  -- server a quarter of a PEXPIRE (a write, propagated).
  if redis.call('PTTL', key) <= ttl_ms(a, grace_ms) then
    redis.call('PEXPIRE', key, ttl_ms(2 * a, grace_ms))
  end
end

algorithms[4] = sliding_log
