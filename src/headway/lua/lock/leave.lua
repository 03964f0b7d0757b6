-- A waiter gives up its place (timeout or cancellation).
-- Includes clock.lua and lock/handoff.lua (hand_off), loaded before it.
-- KEYS[1] owner   string: token of the current holder
-- KEYS[2] queue   zset: waiter id -> arrival time (us)
-- KEYS[3] places  zset: waiter id -> server time (ms) after which its place is void
-- KEYS[4] fence   integer: the last fencing token handed out for this resource
-- ARGV[1] waiter  the waiter id leaving ("<token>:<ttl_ms>:<node>")
-- ARGV[2] channel pub/sub channel of the waiters
-- A lock handed to the leaving waiter meanwhile is released, and a free lock goes
-- to the next waiter (hand_off): neither is lost with the one leaving.
-- Returns 1.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local token = string.match(ARGV[1], '^(.+):%d+:.*$')
if token and redis.call('GET', KEYS[1]) == token then
  redis.call('DEL', KEYS[1])
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  hand_off(KEYS[1], KEYS[4], KEYS[2], KEYS[3], ARGV[2], nil, '')
end
return 1
