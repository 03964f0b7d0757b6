-- Give a concurrency slot back.
-- KEYS[1] slots  zset: lease token -> end of its lease (server time, us)
-- ARGV[1] token  the slot's lease token
-- Returns 1 when the slot was still held (now released), 0 when its lease had ended.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZREM', KEYS[1], ARGV[1])
