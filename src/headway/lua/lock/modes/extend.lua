-- Extend a lease in a mode that is still held.
-- Includes clock.lua, lock/handoff.lua (wake, next_fence) and lock/modes/queue.lua,
-- loaded before it. KEYS[1..7] as in lock/modes/queue.lua; or, for a lease taken by
-- lock/modes/try.lua (a concurrency slot), a short call of KEYS[1] holders and KEYS[2]
-- queue (queue.lua's KEYS[1] and KEYS[3]): all such a renewal touches while nobody waits.
-- ARGV[1] token    the lease's token
-- ARGV[2] ttl_ms   the new TTL, counted from now
-- ARGV[3] channel  pub/sub channel of the waiters                       } the whole
-- ARGV[4] capacity the extender's capacity, used only if no acquire     } call's only
--                  left one ('#cap')
-- Returns 1 when extended; 0 when the token no longer holds a lease (a lease that ran
-- out is not brought back; the waiters that fit without it are granted and told); -1
-- for a short call while somebody waits (nothing done: send the whole call).
local now_us = server_now_us()
local k = mode_keys(KEYS)
local token, ttl_ms = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', k.queue) == 0 then
  -- Nobody waits (the common case, and always for concurrency slots): renew, and keep
  -- the holders' keys at least as long.
  local ends = redis.call('ZSCORE', k.holders, token)
  if not ends or tonumber(ends) <= now_us then
    return 0
  end
  redis.call('ZADD', k.holders, us(now_us + ttl_ms * 1000), token)
  keep_holders(k, ttl_ms, k.held and redis.call('HEXISTS', k.held, token) == 1)
  return 1
elseif not k.held then
  return -1
end
local used = prune(k, now_us)
if redis.call('ZSCORE', k.holders, token) then
  redis.call('ZADD', k.holders, us(now_us + ttl_ms * 1000), token)
  settle(k, now_us)
  return 1
end
local cap = tonumber(redis.call('HGET', k.wants, '#cap') or ARGV[4])
grant_waiting(k, used, cap, now_us, ARGV[3], '', '')
settle(k, now_us)
return 0
