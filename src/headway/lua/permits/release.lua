-- Give a permit back.
-- KEYS[1] permits zset: lease token -> end of its lease (server time, us)
-- ARGV[1] token   the lease's token
-- Returns 1 when the permit was still held (now released), 0 when its lease had ended.
-- Idempotent in effect: a retry finds nothing to remove and returns 0.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZREM', KEYS[1], ARGV[1])
