-- Read a mode family's holders and how many wait, changing nothing (``inspect``).
-- Includes clock.lua (server_now_us), loaded before it.
-- KEYS[1] holders  zset: holder token -> server time (us) its lease runs out
-- KEYS[2] held     hash: holder token -> "<weight>:<fence>" (absent for unfenced holders)
-- KEYS[3] places   zset: waiter id -> server time (ms) after which its place is void
-- (lock/modes/queue.lua's KEYS[1], KEYS[2] and KEYS[4].) No ARGV.
-- Read-only: holders whose lease ran out and lapsed places are not dropped here, only
-- left out.
-- Returns {waiting, token, left_us, held, token, left_us, held, ...}: the waiters whose
-- place is live, then each live holder (oldest lease end first) with its remaining
-- microseconds and its holders' hash entry ("" for an unfenced holder: weight 1, fence 0).
local now_us = server_now_us()
local now = string.format('%.0f', now_us)
local now_ms = string.format('%.0f', math.floor(now_us / 1000))
local reply = {redis.call('ZCOUNT', KEYS[3], '(' .. now_ms, '+inf')}
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  reply[#reply + 1] = live[i]
  reply[#reply + 1] = string.format('%.0f', live[i + 1] - now_us)
  reply[#reply + 1] = redis.call('HGET', KEYS[2], live[i]) or ''
end
return reply
