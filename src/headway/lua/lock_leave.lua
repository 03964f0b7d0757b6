-- A waiter gives up its place (timeout or cancellation).
-- KEYS[1] owner   string: token of the current holder
-- KEYS[2] queue   zset: waiter id -> arrival time (us)
-- KEYS[3] places  zset: waiter id -> server time (ms) after which its place is void
-- ARGV[1] waiter  the waiter id leaving
-- ARGV[2] channel pub/sub channel of the waiters
-- If the lock is free, the new first waiter is woken: a wake-up addressed to
-- the leaving waiter must not be lost with it. Returns 1.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    redis.call('PUBLISH', ARGV[2], head)
  end
end
return 1
