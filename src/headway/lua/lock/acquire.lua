-- Acquire a lock lease, first come first served.
-- Includes clock.lua (server_now_us) and lock/handoff.lua (first_waiter, next_fence,
-- enqueue, keep_queue, hand_off), loaded before it.
-- KEYS[1] owner  string: token of the current holder, expiring with the lease (PX)
-- KEYS[2] fence  integer: the last fencing token handed out for this resource
-- KEYS[3] queue  zset: waiter id -> arrival time (us); the lowest score goes next
-- KEYS[4] places zset: waiter id -> server time (ms) after which its place is void
-- ARGV[1] token    random token of the new lease
-- ARGV[2] ttl_ms   lease TTL in milliseconds
-- ARGV[3] waiter   waiter id ("<token>:<ttl_ms>:<node>"), or "" for a single attempt that does not queue
-- ARGV[4] place_ms how long a queued waiter keeps its place without trying again
-- ARGV[5] floor    the new fencing token must exceed this (Redlock's majority read); else 0
-- ARGV[6] channel  pub/sub channel of the waiters
-- Idempotent: run again with the same token while it holds the lock (a retried call, or
-- a waiter that was handed the lock but missed the message), it returns the same grant
-- with its TTL renewed from now.
-- Returns {1, fence} when granted; {0, pttl_ms} when not, where pttl_ms is the
-- holder's remaining lease, or 0 when the lock is free but an earlier waiter goes first.
local now_us = server_now_us()
local now_ms = math.floor(now_us / 1000)
local waiter = ARGV[3]

local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end

local head = first_waiter(KEYS[3], KEYS[4], now_ms)

local pttl = -2
if holder then
  pttl = redis.call('PTTL', KEYS[1])
end
if pttl == -2 then
  if (not head) or head == waiter then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    local fence = next_fence(KEYS[2], now_us, tonumber(ARGV[5]))
    if head then
      redis.call('ZREM', KEYS[3], waiter)
      redis.call('ZREM', KEYS[4], waiter)
    end
    return {1, fence}
  end
  -- Free (its holder's lease ran out), but others wait: the first of them gets it now.
  if hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[6], now_us, '', head) then
    pttl = redis.call('PTTL', KEYS[1])
  else
    pttl = 0
  end
end

if waiter ~= '' then
  local place_ms = tonumber(ARGV[4])
  enqueue(KEYS[3], KEYS[4], waiter, now_us, now_ms, place_ms)
  keep_queue(KEYS[3], KEYS[4], place_ms)
end
return {0, pttl}
