-- Reserve: charge every policy on one key its own cost, all-or-nothing (decide.lua with
-- a cost per policy), and say when: the server time a settle (settle.lua) refers to.
-- INCLUDES  clock.lua (server_now_us), ratelimit/common.lua, then the fragments
--           (ratelimit/<algorithm>.lua) of the algorithms the call's policies use.
-- NEEDS     from common: call_clock, ttl_ms, and `algorithms` as the fragments fill it.
-- KEYS     as decide.lua: KEYS[1] the string states of all the policies that keep one,
--          joined by '|' in policy order (absent when every policy is a sliding log),
--          then one zset per sliding log, in policy order.
-- ARGV[1]  now: "" reads the server's TIME; an integer (us) only from the tests, and
--          then every TTL gets a 60 s grace (as in decide.lua)
-- ARGV[2 + 4(i-1) .. 5 + 4(i-1)]  kind, a, b, cost of policy i: a metered policy's cost
--          is the reservation's estimate (>= 0), a request policy's 1
-- Returns {allowed, then per policy: ok, remaining, reset_us, retry_us, then now}: the
-- reply of decide.lua (remaining and reset_us after the charge when one was made), and
-- the server us of the charge.
local now, grace_ms = call_clock(ARGV[1])
local n = (#ARGV - 1) / 4

local kinds, keys = {}, {}
local strings = 0
for i = 1, n do
  kinds[i] = algorithms[ARGV[4 * i - 2] + 0]
  if kinds[i].string_state then strings = strings + 1 end
end
local next_key = strings > 0 and 2 or 1
for i = 1, n do
  if kinds[i].string_state then
    keys[i] = KEYS[1]
  else
    keys[i] = KEYS[next_key]
    next_key = next_key + 1
  end
end
local value = strings > 0 and redis.call('GET', KEYS[1])
local from = 1

local found = {}
local allowed = true
for i = 1, n do
  local state = false
  if value and kinds[i].string_state and from <= #value then
    local bar = string.find(value, '|', from, true) or #value + 1
    state = string.sub(value, from, bar - 1)
    from = bar + 1
  end
  found[i] = {
    kinds[i].check(state, keys[i], now, ARGV[4 * i + 1] + 0, ARGV[4 * i - 1] + 0, ARGV[4 * i] + 0),
  }
  allowed = allowed and found[i][1]
end

local out = {allowed and 1 or 0}
local written, longest = {}, 0
for i = 1, n do
  local f, at = found[i], 4 * i - 2
  if allowed then
    local state, ttl_us = kinds[i].commit(
      keys[i], now, ARGV[4 * i + 1] + 0, ARGV[4 * i - 1] + 0, ARGV[4 * i] + 0,
      f[7], f[8], f[9], grace_ms
    )
    if state then
      written[#written + 1] = state
      if ttl_us > longest then longest = ttl_us end
    end
    out[at], out[at + 1], out[at + 2], out[at + 3] = 1, f[5], f[6], 0
  else
    out[at], out[at + 1], out[at + 2], out[at + 3] = f[1] and 1 or 0, f[2], f[3], f[4]
  end
end
if #written > 0 then
  redis.call('SET', KEYS[1], table.concat(written, '|'), 'PX', ttl_ms(longest, grace_ms))
end
out[#out + 1] = now
return out
