-- Extend a lease in a mode that is still held.
-- Includes clock.lua, lock/handoff.lua (wake, next_fence) and lock/modes/queue.lua,
-- loaded before it. KEYS[1..7] as in lock/modes/queue.lua.
-- ARGV[1] token    the lease's token
-- ARGV[2] ttl_ms   the new TTL, counted from now
-- ARGV[3] channel  pub/sub channel of the waiters
-- ARGV[4] capacity the extender's capacity, used only if no acquire left one ('#cap')
-- Returns 1 when extended; 0 when the token no longer holds a lease (a lease that ran
-- out is not brought back; the waiters that fit without it are granted and told).
local now_us = server_now_us()
local now_ms = math.floor(now_us / 1000)
local k = mode_keys(KEYS)
local used = prune(k, now_ms)
if redis.call('HEXISTS', k.held, ARGV[1]) == 1 then
  redis.call('ZADD', k.expiries, now_ms + tonumber(ARGV[2]), ARGV[1])
  settle(k, now_ms)
  return 1
end
local cap = tonumber(redis.call('HGET', k.wants, '#cap') or ARGV[4])
grant_waiting(k, used, cap, now_us, ARGV[3], '', '')
settle(k, now_ms)
return 0
