-- Renew a permit's lease that is still held.
-- Includes clock.lua (server_now_us), loaded before it.
-- KEYS[1] permits zset: lease token -> end of its lease (server time, us)
-- ARGV[1] token   the lease's token
-- ARGV[2] ttl_ms  the new lease length, counted from now
-- Returns 1 when renewed, 0 when the lease had already ended (nothing renewed).
-- Idempotent: a retry renews from its own "now" again.
local now = server_now_us()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
local ttl_ms = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', string.format('%.0f', now + ttl_ms * 1000), ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl_ms then
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
end
return 1
