-- Acquire a lease in a mode (read, write, or one of a semaphore's permits), first come
-- first served by weight.
-- Includes clock.lua, lock/handoff.lua (wake, next_fence) and lock/modes/queue.lua,
-- loaded before it. KEYS[1..7] as in lock/modes/queue.lua.
-- ARGV[1] token    random token of the new lease
-- ARGV[2] ttl_ms   lease TTL in milliseconds
-- ARGV[3] waiter   waiter id ("<token>:<ttl_ms>:<node>"), or "" for a single attempt that does not queue
-- ARGV[4] place_ms how long a queued waiter keeps its place without trying again
-- ARGV[5] weight   what the lease takes of the capacity (lock/modes.py: LockMode.weight)
-- ARGV[6] capacity the capacity (a semaphore's permits; the newest acquire's counts)
-- ARGV[7] channel  pub/sub channel of the waiters
-- Waiters ahead that fit now (a lease ran out) are granted first, and told.
-- Idempotent: run again with the same token while it holds the lease (a retried call, or
-- a waiter that was handed the lease but missed the message), it returns the same grant
-- with its TTL renewed from now.
-- Returns {1, fence} when granted; {0, pttl_ms} when not, where pttl_ms is the shortest
-- remaining lease, or 0 when nobody holds but an earlier waiter goes first.
local now_us = server_now_us()
local k = mode_keys(KEYS)
local token, ttl_ms, waiter = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local weight, cap = tonumber(ARGV[5]), tonumber(ARGV[6])

local used, pruned = prune(k, now_us)
if redis.call('ZSCORE', k.holders, token) then
  redis.call('ZADD', k.holders, us(now_us + ttl_ms * 1000), token)
  local held = redis.call('HGET', k.held, token)
  keep_holders(k, ttl_ms, held ~= false)
  return {1, held and tonumber(string.match(held, ':(%d+)$')) or 0}
end

local queued = redis.call('EXISTS', k.queue) == 1
local touched = queued
if queued then
  redis.call('HSET', k.wants, '#cap', cap)
  local now_used, _, own = grant_waiting(k, used, cap, now_us, ARGV[7], '', waiter)
  used = now_used
  if own then
    settle(k, now_us)
    return {1, own}
  end
  queued = redis.call('EXISTS', k.queue) == 1
end
if not queued and used + weight <= cap then
  local fence = hold(k, token, weight, ttl_ms, now_us, true)
  if pruned == 0 and not touched then
    keep_holders(k, ttl_ms, true)  -- the common case: a grant, nothing else changed
  else
    settle(k, now_us)
  end
  return {1, fence}
end

if waiter ~= '' then
  local now_ms = math.floor(now_us / 1000)
  redis.call('ZADD', k.queue, 'NX', now_us, waiter)
  redis.call('ZADD', k.places, now_ms + tonumber(ARGV[4]), waiter)
  redis.call('HSET', k.wants, waiter, weight, '#cap', cap)
end
settle(k, now_us)
local soonest = soonest_us(k, now_us)
return {0, soonest > 0 and math.ceil(soonest / 1000) or 0}
