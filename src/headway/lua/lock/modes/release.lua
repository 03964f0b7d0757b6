-- Release a lease in a mode and grant every waiter that now fits.
-- Includes clock.lua, lock/handoff.lua (wake, next_fence) and lock/modes/queue.lua,
-- loaded before it. KEYS[1..7] as in lock/modes/queue.lua, or only KEYS[1..3] (holders,
-- held, queue: a short call, all a release touches while nobody waits).
-- ARGV[1] token    the lease's token
-- ARGV[2] call     random id of this release call, or "" from a client that never
--                  retries (a short call's is always "")
-- ARGV[3] channel  pub/sub channel on which the waiters listen       } the whole call's
-- ARGV[4] node     the releasing client's id: its own waiters are    } only
--                  told by it, not on the channel                    }
-- ARGV[5] capacity the releaser's capacity, used only if no acquire left one ('#cap')
-- Returns {1, waiter, fence, ...} when released: the waiters of `node` granted here (each
-- other waiter granted is told on the channel); {0} when the token no longer holds a
-- lease (nothing of its is touched; waiters that fit now are still granted); {-1} for a
-- short call while somebody waits (nothing done: send the whole call).
-- Idempotent per call: a retried release (redis-py retries a command whose reply was
-- lost) finds its own call in KEYS[7] and returns {1} again.
local now_us = server_now_us()
local k = mode_keys(KEYS)
local token, call = ARGV[1], ARGV[2]

local left, mine = nil, {}
if redis.call('EXISTS', k.queue) == 0 then
  -- Nobody waits (the common case, and always for concurrency slots): the lease goes;
  -- after a fenced one, the holders' keys live as long as the last lease left (a run-out
  -- lease is dropped by the next call that counts the holders).
  local ends = redis.call('ZSCORE', k.holders, token)
  if ends then
    local _, fenced = unhold(k, token, 0)
    left = tonumber(ends) > now_us
    if fenced then
      local last = last_score(k.holders)
      expire_with({k.holders, k.held}, last and math.ceil((last - now_us) / 1000) or 0)
    end
  end
elseif #KEYS < 7 then
  return {-1}
else
  local cap = tonumber(redis.call('HGET', k.wants, '#cap') or ARGV[5])
  local used = prune(k, now_us)
  left = unhold(k, token, used)
  used, mine = grant_waiting(k, left or used, cap, now_us, ARGV[3], ARGV[4], '')
  settle(k, now_us)
end
local done = token .. ' ' .. call
if not left then
  local ok = call ~= '' and redis.call('GET', k.released) == done
  -- Granted to waiters of ours all the same: they are told by the caller.
  return {ok and 1 or 0, unpack(mine)}
end
if call ~= '' then
  redis.call('SET', k.released, done, 'PX', 60000)
end
return {1, unpack(mine)}
