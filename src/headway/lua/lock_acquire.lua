-- Acquire a lock lease, first come first served.
-- KEYS[1] owner  string: token of the current holder, expiring with the lease (PX)
-- KEYS[2] fence  integer: the last fencing token handed out for this resource
-- KEYS[3] queue  zset: waiter id -> arrival time (us); the lowest score goes next
-- KEYS[4] places zset: waiter id -> server time (ms) after which its place is void
-- ARGV[1] token    random token of the new lease
-- ARGV[2] ttl_ms   lease TTL in milliseconds
-- ARGV[3] waiter   waiter id, or "" for a single attempt that does not queue
-- ARGV[4] place_ms how long a queued waiter keeps its place without trying again
-- ARGV[5] floor    the new fencing token must exceed this (Redlock's majority read); else 0
-- Idempotent: run again with the same token while it holds the lock, it returns the same grant.
-- Returns {1, fence} when granted; {0, pttl_ms} when not, where pttl_ms is the
-- holder's remaining lease, or 0 when the lock is free but an earlier waiter goes first.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local waiter = ARGV[3]

-- Waiters that stopped renewing their place (dead, cancelled, gave up) lose it.
local void = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms)
for i = 1, #void do
  redis.call('ZREM', KEYS[3], void[i])
end
if #void > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_ms)
end

-- A retried attempt (redis-py retries a command whose reply was lost) finds its
-- own grant: report it again rather than make it wait out its own lease.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end

local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if (not head) or head == waiter then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    -- The fence never goes backwards: it is floored by the server's clock in
    -- microseconds, so a lost counter (restart without persistence, expiry
    -- after long idleness) still yields a token above every earlier one.
    local fence = redis.call('INCR', KEYS[2])
    local floor = math.max(now_us, tonumber(ARGV[5]))
    if fence <= floor then
      fence = floor + 1
      redis.call('SET', KEYS[2], string.format('%.0f', fence))
    end
    redis.call('PEXPIRE', KEYS[2], 2592000000)
    if head then
      redis.call('ZREM', KEYS[3], waiter)
      redis.call('ZREM', KEYS[4], waiter)
    end
    return {1, fence}
  end
  pttl = 0
end

if waiter ~= '' then
  local place_ms = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[3], 'NX', now_us, waiter)
  redis.call('ZADD', KEYS[4], now_ms + place_ms, waiter)
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < place_ms then
      redis.call('PEXPIRE', KEYS[i], place_ms)
    end
  end
end
return {0, pttl}
