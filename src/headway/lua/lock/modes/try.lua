-- Take one of a semaphore's permits at once or not at all: no place in the queue, no
-- fence (the lease's fence is 0). A concurrency limit's slot (ratelimit/permits.py) is
-- this call; its release and renewal are lock/modes/release.lua and extend.lua.
-- Includes clock.lua, lock/handoff.lua and lock/modes/queue.lua, loaded before it.
-- KEYS[1..3] the first three of lock/modes/queue.lua (holders, held, queue): all it reads.
-- ARGV[1] token    random token of the new lease (a fresh one per call)
-- ARGV[2] ttl_ms   lease TTL in milliseconds
-- ARGV[3] capacity the semaphore's permits (every permit weighs 1)
-- A request never overtakes one still waiting: with anybody queued it is refused (the
-- waiters are granted by their own next attempt, or by any other script's).
-- Returns {1, held, 0} when granted (held counts the new permit), or {0, held, wait_us}
-- when not, where wait_us is the time until the first lease ends if its holder neither
-- releases nor renews it (0 when nobody holds but somebody waits).
-- Not idempotent: every call brings a fresh token, and no client sends a call twice.
local now_us = server_now_us()
local k = {holders = KEYS[1], held = KEYS[2], queue = KEYS[3]}
local ttl_ms = tonumber(ARGV[2])

drop_gone(k, now_us)
local held = redis.call('ZCARD', k.holders)
if held >= tonumber(ARGV[3]) or redis.call('EXISTS', k.queue) == 1 then
  return {0, held, soonest_us(k, now_us)}
end
redis.call('ZADD', k.holders, us(now_us + ttl_ms * 1000), ARGV[1])
keep_holders(k, ttl_ms, false)
return {1, held + 1, 0}
