-- Release a lease and wake the next waiter.
-- KEYS[1] owner   string: token of the current holder
-- KEYS[2] queue   zset: waiter id -> arrival time (us)
-- KEYS[3] places  zset: waiter id -> server time (ms) after which its place is void
-- KEYS[4] released string: "<token> <call>" of the last release done here (for a minute)
-- ARGV[1] token   the lease's token
-- ARGV[2] channel pub/sub channel on which the next waiter listens
-- ARGV[3] call    random id of this release call
-- Returns 1 when released, 0 when the token no longer holds the lock (nothing touched).
-- Idempotent per call: a retried release (redis-py retries a command whose reply was
-- lost) finds its own call in KEYS[4] and returns 1 again, instead of a false "not
-- held"; a second release call for the same lease still returns 0.
local done = ARGV[1] .. ' ' .. ARGV[3]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if redis.call('GET', KEYS[4]) == done then
    return 1
  end
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[4], done, 'PX', 60000)
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
