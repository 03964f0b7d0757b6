-- Release a lease in a mode and grant every waiter that now fits.
-- Includes clock.lua, lock/handoff.lua (wake, next_fence) and lock/modes/queue.lua,
-- loaded before it. KEYS[1..7] as in lock/modes/queue.lua.
-- ARGV[1] token    the lease's token
-- ARGV[2] channel  pub/sub channel on which the waiters listen
-- ARGV[3] call     random id of this release call, or "" from a client that never retries
-- ARGV[4] node     the releasing client's id: its own waiters are told by it, not on the channel
-- ARGV[5] capacity the releaser's capacity, used only if no acquire left one ('#cap')
-- Returns {1, waiter, fence, ...} when released: the waiters of `node` granted here (each
-- other waiter granted is told on the channel); {0} when the token no longer holds a
-- lease (nothing of its is touched; waiters that fit now are still granted).
-- Idempotent per call: a retried release (redis-py retries a command whose reply was
-- lost) finds its own call in KEYS[7] and returns {1} again.
local now_us = server_now_us()
local now_ms = math.floor(now_us / 1000)
local k = mode_keys(KEYS)
local cap = tonumber(redis.call('HGET', k.wants, '#cap') or ARGV[5])
local done = ARGV[1] .. ' ' .. ARGV[3]

local used = prune(k, now_ms)
local left = unhold(k, ARGV[1], used)
local mine
used, mine = grant_waiting(k, left or used, cap, now_us, ARGV[2], ARGV[4], '')
settle(k, now_ms)
if not left then
  local ok = ARGV[3] ~= '' and redis.call('GET', k.released) == done
  -- Granted to waiters of ours all the same: they are told by the caller.
  return {ok and 1 or 0, unpack(mine)}
end
if ARGV[3] ~= '' then
  redis.call('SET', k.released, done, 'PX', 60000)
end
return {1, unpack(mine)}
