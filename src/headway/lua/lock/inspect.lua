-- Read who holds a lock and how many wait, changing nothing (``inspect``).
-- Includes clock.lua (server_now_us), loaded before it.
-- KEYS[1] owner  string: token of the current holder, expiring with the lease (PX)
-- KEYS[2] fence  integer: the last fencing token handed out for this resource
-- KEYS[3] places zset: waiter id -> server time (ms) after which its place is void
-- No ARGV. Read-only: a lapsed place is not dropped here, only left out of the count.
-- Returns {token, fence, pttl_ms, waiting}: the holder's token, the fence counter (the
-- holder's fence: nothing else moves it while the lock is held), the lease's remaining
-- milliseconds, and the waiters whose place is live; token is "" when nobody holds.
local now_ms = string.format('%.0f', math.floor(server_now_us() / 1000))
local waiting = redis.call('ZCOUNT', KEYS[3], '(' .. now_ms, '+inf')
local token = redis.call('GET', KEYS[1])
if not token then
  return {'', 0, 0, waiting}
end
local fence = redis.call('GET', KEYS[2]) or '0'
return {token, fence, redis.call('PTTL', KEYS[1]), waiting}
