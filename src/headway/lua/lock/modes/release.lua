-- Release a lease in a mode and grant every waiter that now fits.
-- Includes clock.lua, lock/handoff.lua (wake, next_fence) and lock/modes/queue.lua,
-- loaded before it. KEYS[1..7] as in lock/modes/queue.lua; or, for a lease taken by
-- lock/modes/try.lua (a concurrency slot), a short call of KEYS[1] holders and KEYS[2]
-- queue (queue.lua's KEYS[1] and KEYS[3]): all such a release touches while nobody waits.
-- ARGV[1] token    the lease's token
-- ARGV[2] call     random id of this release call, or "" from a client that never
--                  retries (a short call sends no more than ARGV[1]: "")
-- ARGV[3] channel  pub/sub channel on which the waiters listen       } the whole call's
-- ARGV[4] node     the releasing client's id: its own waiters are    } only
--                  told by it, not on the channel                    }
-- ARGV[5] capacity the releaser's capacity, used only if no acquire left one ('#cap')
-- Returns 1 when released, or {1, waiter, fence, ...} when waiters of `node` were granted
-- here too (each other waiter granted is told on the channel); 0 (or {0, waiter, fence,
-- ...}) when the token no longer holds a lease (nothing of its is touched; waiters that
-- fit now are still granted); -1 for a short call while somebody waits (nothing done:
-- send the whole call).
-- Idempotent per call: a retried release (redis-py retries a command whose reply was
-- lost) finds its own call in KEYS[7] and returns 1 again.
local now_us = server_now_us()
local token, call = ARGV[1], ARGV[2] or ''
local k = mode_keys(KEYS)

local left, mine = false, nil
if redis.call('EXISTS', k.queue) == 0 then
  -- Nobody waits (the common case, and always for concurrency slots): the lease goes;
  -- after a fenced one, the holders' keys live as long as the last lease left (a run-out
  -- lease is dropped by the next call that counts the holders).
  local ends = redis.call('ZSCORE', k.holders, token)
  if ends then
    left = tonumber(ends) > now_us
    if not k.held then
      redis.call('ZREM', k.holders, token)
    elseif select(2, unhold(k, token, 0)) then
      local last = last_score(k.holders)
      expire_with({k.holders, k.held}, last and math.ceil((last - now_us) / 1000) or 0)
    end
  end
elseif not k.held then
  return -1
else
  local cap = tonumber(redis.call('HGET', k.wants, '#cap') or ARGV[5])
  local used = prune(k, now_us)
  local now_used = unhold(k, token, used)
  left = now_used ~= nil
  used, mine = grant_waiting(k, now_used or used, cap, now_us, ARGV[3], ARGV[4], '')
  settle(k, now_us)
end
local ok = left
if call ~= '' then
  local done = token .. ' ' .. call
  if left then
    redis.call('SET', k.released, done, 'PX', 60000)
  else
    -- Granted to waiters of ours all the same: they are told by the caller.
    ok = redis.call('GET', k.released) == done
  end
end
if mine and #mine > 0 then
  return {ok and 1 or 0, unpack(mine)}
end
return ok and 1 or 0
