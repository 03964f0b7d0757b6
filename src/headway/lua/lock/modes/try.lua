-- Take one of a semaphore's permits at once or not at all: no place in the queue, no
-- fence (the lease's fence is 0), no entry in the holders' hash. A concurrency limit's
-- slot (ratelimit/permits.py) is this call; its release and renewal are the short calls
-- of lock/modes/release.lua and extend.lua.
-- Includes clock.lua, lock/handoff.lua and lock/modes/queue.lua, loaded before it.
-- KEYS[1] holders  the family's holders (lock/modes/queue.lua's KEYS[1])
-- KEYS[2] queue    the family's queue (lock/modes/queue.lua's KEYS[3]): only its existence
-- ARGV[1] token    random token of the new lease (a fresh one per call)
-- ARGV[2] ttl_ms   lease TTL in milliseconds
-- ARGV[3] capacity the semaphore's permits (every permit weighs 1)
-- Run-out leases are dropped from the holders (a fenced one's entry in the holders' hash
-- stays until the hash goes: see lock/modes/queue.lua). A request never overtakes one
-- still waiting: with anybody queued it is refused (the waiters are granted by their own
-- next attempt, or by any other script's).
-- Returns held when granted (an integer: the permits held, the new one included), or
-- {held, wait_us} when not, where wait_us is the time until the first lease ends if its
-- holder neither releases nor renews it (0 when nobody holds but somebody waits).
-- Not idempotent: every call brings a fresh token, and no client sends a call twice.
local now_us = server_now_us()
local ttl_ms = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', us(now_us))
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[3]) or redis.call('EXISTS', KEYS[2]) == 1 then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {held, first[2] and math.max(1, first[2] - now_us) or 0}
end
redis.call('ZADD', KEYS[1], us(now_us + ttl_ms * 1000), ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl_ms then
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
end
return held + 1
