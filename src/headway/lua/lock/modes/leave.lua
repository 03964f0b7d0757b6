-- A waiter in a mode gives up its place (timeout or cancellation).
-- Includes clock.lua, lock/handoff.lua (wake, next_fence) and lock/modes/queue.lua,
-- loaded before it. KEYS[1..7] as in lock/modes/queue.lua.
-- ARGV[1] waiter   the waiter id leaving ("<token>:<ttl_ms>:<node>")
-- ARGV[2] channel  pub/sub channel of the waiters
-- ARGV[3] capacity the leaver's capacity, used only if no acquire left one ('#cap')
-- A lease granted to the leaving waiter meanwhile is released, and every waiter that
-- fits without it (or without its place ahead of them) is granted and told.
-- Returns 1.
local now_us = server_now_us()
local k = mode_keys(KEYS)
local cap = tonumber(redis.call('HGET', k.wants, '#cap') or ARGV[3])
redis.call('ZREM', k.queue, ARGV[1])
redis.call('ZREM', k.places, ARGV[1])
redis.call('HDEL', k.wants, ARGV[1])
local used = prune(k, now_us)
local token = string.match(ARGV[1], '^(.+):%d+:.*$')
if token then
  used = unhold(k, token, used) or used
end
grant_waiting(k, used, cap, now_us, ARGV[2], '', '')
settle(k, now_us)
return 1
