-- Acquire several locks at once, all or nothing, one attempt (MultiLock's one script).
-- Includes clock.lua (server_now_us) and lock/handoff.lua (first_waiter, next_fence,
-- hand_off), loaded before it. Every key is in one hash slot (or on one server).
-- For lock i (1..n), in the caller's (canonical) order, four keys:
-- KEYS[4i-3] owner  string: token of the current holder, expiring with the lease (PX)
-- KEYS[4i-2] fence  integer: the last fencing token handed out for this resource
-- KEYS[4i-1] queue  zset: waiter id -> arrival time (us); the lowest score goes next
-- KEYS[4i]   places zset: waiter id -> server time (ms) after which its place is void
-- ARGV[1]     ttl_ms  every lease's TTL in milliseconds
-- ARGV[2i]    token   random token of lock i's new lease
-- ARGV[2i+1]  channel pub/sub channel of lock i's waiters
-- A lock is taken only as lock/acquire.lua would take it for a single attempt: free, and
-- no waiter with a valid place ahead (a free lock with waiters goes to the first of them,
-- as there). Nothing queues: a caller refused takes the locks one by one, in order.
-- Idempotent: run again with the same tokens while they hold the locks (a retried
-- call), it returns the same grants with their TTLs renewed from now.
-- Returns {1, fence_1, ..., fence_n} when every lock was granted (each fence from its
-- own counter); {0, i, pttl_ms} when lock i is held (pttl_ms: the holder's remaining
-- lease) or an earlier waiter goes first (0): then nothing was granted.
local n = #KEYS / 4
if redis.call('GET', KEYS[1]) == ARGV[2] then
  local fences = {1}
  for i = 1, n do
    redis.call('PEXPIRE', KEYS[4 * i - 3], ARGV[1])
    fences[i + 1] = tonumber(redis.call('GET', KEYS[4 * i - 2]))
  end
  return fences
end

local now_us = server_now_us()
local now_ms = math.floor(now_us / 1000)
for i = 1, n do
  local owner, fence, queue, places = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local pttl = redis.call('PTTL', owner)
  if pttl ~= -2 then
    return {0, i, pttl}
  end
  if first_waiter(queue, places, now_ms) then
    -- Free (its holder's lease ran out), but others wait: the first of them gets it now.
    if hand_off(owner, fence, queue, places, ARGV[2 * i + 1], now_us, '') then
      return {0, i, redis.call('PTTL', owner)}
    end
    return {0, i, 0}
  end
end

local fences = {1}
for i = 1, n do
  redis.call('SET', KEYS[4 * i - 3], ARGV[2 * i], 'PX', ARGV[1])
  fences[i + 1] = next_fence(KEYS[4 * i - 2], now_us, 0)
end
return fences
