-- Shared functions of the lock-mode scripts (read-write locks and semaphores), included
-- (prepended) by lock/modes/acquire.lua, release.lua, extend.lua and leave.lua; never
-- run alone. Needs clock.lua and lock/handoff.lua (wake, next_fence), included before it.
-- The rule is lock/modes.py's: a FIFO queue of weighted requests, granted while the
-- weights of the live holders, of the requests ahead and its own fit in the capacity.
-- KEYS, the same in every mode script, all under one hash tag ({lock-<family>:<resource>}):
-- KEYS[1] held     hash: holder token -> "<weight>:<fence>"; '#used' -> their weights' sum
-- KEYS[2] expiries zset: holder token -> server time (ms) its lease runs out
-- KEYS[3] queue    zset: waiter id -> arrival time (us); the lowest score goes next
-- KEYS[4] places   zset: waiter id -> server time (ms) after which its place is void
-- KEYS[5] wants    hash: waiter id -> weight; '#cap' -> the capacity (the newest acquire's)
-- KEYS[6] fence    integer: the last fencing token of the family on the resource
-- KEYS[7] released string: "<token> <call>" of the last release done here (for a minute)
-- Every key but the fence lives exactly as long as its last lease or place (settle);
-- the fence is kept as the exclusive lock's is (next_fence).
-- DEFINES
--   mode_keys(KEYS)  the keys above by name
--   prune(k, now_ms) drop holders whose lease ran out; returns the weight in use, how many
--   unhold(k, token, used)  drop `token`'s hold; returns the weight in use, or nil if not held
--   grant_waiting(k, used, cap, now_us, channel, node, own)  grant every waiter that fits
--   settle(k, now_ms) expire each key with its last lease or place, delete empty ones
--   keep_holders(k, ttl_ms)  the holders' keys live at least `ttl_ms` (after a grant alone)
--   soonest_ms(k, now_ms)  the shortest remaining lease (ms), 0 if nobody holds

local function mode_keys(keys)
  return {held = keys[1], expiries = keys[2], queue = keys[3], places = keys[4],
          wants = keys[5], fence = keys[6], released = keys[7]}
end

local function prune(k, now_ms)
  local used = tonumber(redis.call('HGET', k.held, '#used') or '0')
  local gone = redis.call('ZRANGEBYSCORE', k.expiries, '-inf', now_ms)
  if #gone > 0 then
    for i = 1, #gone do
      local held = redis.call('HGET', k.held, gone[i])
      if held then
        used = used - tonumber(string.match(held, '^(%d+):'))
        redis.call('HDEL', k.held, gone[i])
      end
    end
    redis.call('ZREMRANGEBYSCORE', k.expiries, '-inf', now_ms)
    redis.call('HSET', k.held, '#used', used)
  end
  return used, #gone
end

-- Grant `token` a lease of `weight` for `ttl_ms`: returns its fence.
local function hold(k, token, weight, ttl_ms, now_us, used)
  local fence = next_fence(k.fence, now_us, 0)
  redis.call('HSET', k.held, token, weight .. ':' .. string.format('%.0f', fence),
             '#used', used + weight)
  redis.call('ZADD', k.expiries, math.floor(now_us / 1000) + ttl_ms, token)
  return fence
end

local function unhold(k, token, used)
  local held = redis.call('HGET', k.held, token)
  if not held then
    return nil
  end
  used = used - tonumber(string.match(held, '^(%d+):'))
  redis.call('HDEL', k.held, token)
  redis.call('HSET', k.held, '#used', used)
  redis.call('ZREM', k.expiries, token)
  return used
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
        local fence = hold(k, token, weight, tonumber(ttl_ms), now_us, used)
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

local function expire_with(keys, until_ms, now_ms)
  for _, key in ipairs(keys) do
    if until_ms and until_ms > now_ms then
      redis.call('PEXPIRE', key, until_ms - now_ms)
    else
      redis.call('DEL', key)
    end
  end
end

local function settle(k, now_ms)
  expire_with({k.held, k.expiries}, last_score(k.expiries), now_ms)
  if redis.call('EXISTS', k.queue, k.places, k.wants) > 0 then
    expire_with({k.queue, k.places, k.wants}, last_score(k.places), now_ms)
  end
end

-- After a grant or a renewal of `ttl_ms`, when nothing else changed: the holders' keys
-- live at least that long (no shorter lease can have become the last).
local function keep_holders(k, ttl_ms)
  if redis.call('PTTL', k.held) < ttl_ms then
    redis.call('PEXPIRE', k.held, ttl_ms)
    redis.call('PEXPIRE', k.expiries, ttl_ms)
  end
end

local function soonest_ms(k, now_ms)
  local first = redis.call('ZRANGE', k.expiries, 0, 0, 'WITHSCORES')
  if first[2] then
    return math.max(1, tonumber(first[2]) - now_ms)
  end
  return 0
end
