-- Take one permit of a lock with ARGV[2] permits (a concurrency slot); never waits.
-- Includes clock.lua (server_now_us), loaded before it.
-- KEYS[1] permits zset: lease token -> end of its lease (server time, us). Leases that
--                 ended are pruned on every call; the key lives as long as its longest lease.
-- ARGV[1] token   random token of the new lease (the caller's; no fencing counter is kept)
-- ARGV[2] limit   most permits held at once
-- ARGV[3] ttl_ms  lease length in milliseconds
-- Returns {1, held, 0} when granted (held counts the new permit), or {0, held, wait_us}
-- when every permit is held, where wait_us is the time until the first lease ends if its
-- holder neither releases nor renews it.
-- Not idempotent: every call brings a fresh token, and no client sends a call twice.
local now = server_now_us()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count = redis.call('ZCARD', KEYS[1])
if count >= tonumber(ARGV[2]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, count, tonumber(first[2]) - now}
end
local ttl_ms = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl_ms * 1000), ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl_ms then
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
end
return {1, count + 1, 0}
