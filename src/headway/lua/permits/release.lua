-- Give a permit back.
-- Includes clock.lua (server_now_us), loaded before it.
-- KEYS[1] permits zset: lease token -> end of its lease (server time, us)
-- ARGV[1] token   the lease's token
-- Returns 1 when the permit was still held (now released), 0 when its lease had ended.
-- Idempotent in effect: a retry finds nothing to remove and returns 0.
local now = server_now_us()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZREM', KEYS[1], ARGV[1])
