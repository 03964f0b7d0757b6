-- Shared functions of the lock-mode scripts (read-write locks and semaphores), included
-- (prepended) by lock/modes/acquire.lua, try.lua, release.lua, extend.lua and leave.lua; never
-- run alone. Needs clock.lua and lock/handoff.lua (wake, next_fence), included before it.
-- The rule is lock/modes.py's: a FIFO queue of weighted requests, granted while the
-- weights of the live holders, of the requests ahead and its own fit in the capacity.
-- KEYS, the same in every mode script, all under one hash tag: a family's holders key H
-- and the names H:held, H:queue, ... (lock/backends/redis/mode_keys.py: family_keys).
-- KEYS[1] holders  zset: holder token -> server time (us) its lease runs out. Every holder
--                  is here; a holder of weight 1 without a fence (an answer-at-once grant,
--                  lock/modes/try.lua: a concurrency slot) is only here.
-- KEYS[2] held     hash: holder token -> "<weight>:<fence>" for the other holders;
--                  '#extra' -> the sum of (weight - 1) over them, absent when 0. So the
--                  weight in use is ZCARD(holders) + '#extra'. Entries of holders that
--                  lock/modes/try.lua pruned stay until the hash goes (it does not take
--                  this key): harmless, as every lookup goes through the holders first,
--                  and a semaphore's permits all weigh 1.
-- KEYS[3] queue    zset: waiter id -> arrival time (us); the lowest score goes next
-- KEYS[4] places   zset: waiter id -> server time (ms) after which its place is void
-- KEYS[5] wants    hash: waiter id -> weight; '#cap' -> the capacity (the newest acquire's)
-- KEYS[6] fence    integer: the last fencing token of the family on the resource
-- KEYS[7] released string: "<token> <call>" of the last release done here (for a minute)
-- Every key but the fence lives at least as long as its last lease or place, and no
-- longer once a script has settled it (settle: after a fenced holder leaves, a waiter
-- leaves or is granted); empty keys are deleted. The fence is kept as the exclusive
-- lock's is (next_fence).
-- DEFINES
--   mode_keys(KEYS)  the keys above by name (a short call's two: holders and queue)
--   us(n)            n (an integer) as Redis's argument, exact (no exponent)
--   drop_gone(k, now_us)  drop holders whose lease ran out; returns how many
--   prune(k, now_us) drop_gone, then returns the weight in use, and how many were dropped
--   hold(k, token, weight, ttl_ms, now_us, fenced)  grant a lease; returns its fence (0 unfenced)
--   unhold(k, token, used)  drop `token`'s hold; returns the weight in use (nil if not
--                           held) and whether it had an entry in the holders' hash
--   grant_waiting(k, used, cap, now_us, channel, node, own)  grant every waiter that fits
--   settle(k, now_us) expire each key with its last lease or place, delete empty ones
--   keep_holders(k, ttl_ms, fenced)  the holders' keys live at least `ttl_ms` (after a grant alone)
--   soonest_us(k, now_us)  the shortest remaining lease (us), 0 if nobody holds

local function mode_keys(keys)
  if #keys == 2 then  -- a short call (lock/modes/release.lua, extend.lua): holders, queue
    return {holders = keys[1], queue = keys[2]}
  end
  return {holders = keys[1], held = keys[2], queue = keys[3], places = keys[4],
          wants = keys[5], fence = keys[6], released = keys[7]}
end

-- Microsecond times have 16 digits: Redis turns a Lua number into "%.17g" text, which
-- may carry an exponent; "%.0f" is exact.
local function us(n)
  return string.format('%.0f', n)
end

local function weight_of(held)
  return tonumber(string.match(held, '^(%d+):'))
end

local function add_extra(k, delta)
  if delta ~= 0 then
    local extra = redis.call('HINCRBY', k.held, '#extra', delta)
    if extra == 0 then
      redis.call('HDEL', k.held, '#extra')
    end
  end
end

-- Drop the holders whose lease ran out (their hash entries too); returns how many.
local function drop_gone(k, now_us)
  local now = us(now_us)
  local gone = redis.call('ZRANGEBYSCORE', k.holders, '-inf', now)
  if #gone > 0 then
    if redis.call('EXISTS', k.held) == 1 then
      local delta = 0
      for i = 1, #gone do
        local held = redis.call('HGET', k.held, gone[i])
        if held then
          delta = delta - (weight_of(held) - 1)
          redis.call('HDEL', k.held, gone[i])
        end
      end
      add_extra(k, delta)
    end
    redis.call('ZREMRANGEBYSCORE', k.holders, '-inf', now)
  end
  return #gone
end

local function prune(k, now_us)
  local gone = drop_gone(k, now_us)
  local extra = tonumber(redis.call('HGET', k.held, '#extra') or '0')
  return redis.call('ZCARD', k.holders) + extra, gone
end

-- Grant `token` a lease of `weight` for `ttl_ms`: returns its fence (0 when not `fenced`).
local function hold(k, token, weight, ttl_ms, now_us, fenced)
  local fence = 0
  if fenced then
    fence = next_fence(k.fence, now_us, 0)
  end
  if fenced or weight ~= 1 then
    redis.call('HSET', k.held, token, weight .. ':' .. us(fence))
    add_extra(k, weight - 1)
  end
  redis.call('ZADD', k.holders, us(now_us + ttl_ms * 1000), token)
  return fence
end

-- Drop `token`'s hold: returns the weight in use then (nil if it held nothing), and
-- whether it was in the holders' hash.
local function unhold(k, token, used)
  if redis.call('ZREM', k.holders, token) == 0 then
    return nil, false
  end
  local held = redis.call('HGET', k.held, token)
  if not held then
    return used - 1, false
  end
  local weight = weight_of(held)
  redis.call('HDEL', k.held, token)
  add_extra(k, 1 - weight)
  return used - weight, true
end

-- Grant the queue's head while it fits, dropping lapsed places, and tell each waiter
-- granted on `channel` ("<waiter> <fence>"), except `own` (the caller: it gets the reply)
-- and those waiting in `node` (the caller's client, which tells them: they are returned
-- as a flat list waiter, fence, ...). Returns the weight in use, that list, own's fence.
local function grant_waiting(k, used, cap, now_us, channel, node, own)
  local now_ms = math.floor(now_us / 1000)
  local mine, own_fence = {}, nil
  while true do
    local batch = redis.call('ZRANGE', k.queue, 0, 15)
    if #batch == 0 then
      return used, mine, own_fence
    end
    for i = 1, #batch do
      local waiter = batch[i]
      local until_ms = tonumber(redis.call('ZSCORE', k.places, waiter) or '0')
      local weight = tonumber(redis.call('HGET', k.wants, waiter) or cap)
      if until_ms > now_ms and used + weight > cap then
        return used, mine, own_fence
      end
      redis.call('ZREM', k.queue, waiter)
      redis.call('ZREM', k.places, waiter)
      redis.call('HDEL', k.wants, waiter)
      local token, ttl_ms, home = string.match(waiter, '^(.+):(%d+):(.*)$')
      if until_ms > now_ms and token then
        local fence = hold(k, token, weight, tonumber(ttl_ms), now_us, true)
        used = used + weight
        if waiter == own then
          own_fence = fence
        elseif node ~= '' and home == node then
          mine[#mine + 1] = waiter
          mine[#mine + 1] = fence
        else
          wake(channel, waiter .. ' ' .. string.format('%.0f', fence))
        end
      end
    end
  end
end

-- The latest score of `zset`, or nil if it is empty.
local function last_score(zset)
  local last = redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')
  return tonumber(last[2])
end

local function expire_with(keys, left_ms)
  for _, key in ipairs(keys) do
    if left_ms > 0 then
      redis.call('PEXPIRE', key, left_ms)
    else
      redis.call('DEL', key)
    end
  end
end

local function settle(k, now_us)
  local last = last_score(k.holders)
  expire_with({k.holders, k.held}, last and math.ceil((last - now_us) / 1000) or 0)
  if redis.call('EXISTS', k.queue, k.places, k.wants) > 0 then
    local now_ms = math.floor(now_us / 1000)
    local until_ms = last_score(k.places)
    expire_with({k.queue, k.places, k.wants}, until_ms and until_ms - now_ms or 0)
  end
end

-- After a grant or a renewal of `ttl_ms`, when nothing else changed: the holders' keys
-- live at least that long (no shorter lease can have become the last). `fenced`: the
-- grant wrote the holders' hash too (a new hash has no TTL yet: PTTL -1).
local function keep_holders(k, ttl_ms, fenced)
  if redis.call('PTTL', fenced and k.held or k.holders) < ttl_ms then
    redis.call('PEXPIRE', k.holders, ttl_ms)
    if fenced then
      redis.call('PEXPIRE', k.held, ttl_ms)
    end
  end
end

local function soonest_us(k, now_us)
  local first = redis.call('ZRANGE', k.holders, 0, 0, 'WITHSCORES')
  if first[2] then
    return math.max(1, tonumber(first[2]) - now_us)
  end
  return 0
end
