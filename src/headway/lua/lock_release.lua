-- Release a lease and wake the next waiter.
-- KEYS[1] owner   string: token of the current holder
-- KEYS[2] queue   zset: waiter id -> arrival time (us)
-- KEYS[3] places  zset: waiter id -> server time (ms) after which its place is void
-- ARGV[1] token   the lease's token
-- ARGV[2] channel pub/sub channel on which the next waiter listens
-- Returns 1 when released, 0 when the token no longer holds the lock (nothing touched).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Skip waiters whose place lapsed, so the wake-up reaches a live one.
while true do
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not head then
    return 1
  end
  local until_ms = tonumber(redis.call('ZSCORE', KEYS[3], head) or '0')
  if until_ms > now_ms then
    redis.call('PUBLISH', ARGV[2], head)
    return 1
  end
  redis.call('ZREM', KEYS[2], head)
  redis.call('ZREM', KEYS[3], head)
end
