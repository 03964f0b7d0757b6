-- Settle a reservation (reserve.lua) with its actual cost: every policy's state changes
-- by actual - charged units where its algorithm's rule says so (the fragments under
-- ratelimit/settling/, each with its RULE), possibly past the limit (debt).
-- INCLUDES  clock.lua (server_now_us), ratelimit/common.lua, ratelimit/settling.lua,
--           then the settle fragments of the algorithms the call's policies use.
-- NEEDS     from common: call_clock, ttl_ms; from settling: `settling`, as filled.
-- KEYS     as reserve.lua (and decide.lua): the string states' key, then the zsets.
-- ARGV[1]  now: "" reads the server's TIME; an integer (us) only from the tests (TTLs
--          then get a 60 s grace, as in decide.lua)
-- ARGV[2]  at: the server us of the reservation (reserve.lua's reply)
-- ARGV[3 + 5(i-1) .. 7 + 5(i-1)]  kind, a, b, charged, actual of policy i (charged =
--          actual for a policy the reservation does not meter)
-- Every string state is rewritten, normalised to now (the same reads at every later
-- time), with the TTL covering the longest: one GET and one SET, as decide.lua.
-- Returns now (server us).
local now, grace_ms = call_clock(ARGV[1])
local at = ARGV[2] + 0
local n = (#ARGV - 2) / 5

local strings = 0
for i = 1, n do
  if settling[ARGV[5 * i - 2] + 0].string_state then strings = strings + 1 end
end
local value = strings > 0 and redis.call('GET', KEYS[1])
local from, next_key = 1, strings > 0 and 2 or 1
local written, longest = {}, 0
for i = 1, n do
  local rule = settling[ARGV[5 * i - 2] + 0]
  local a, b = ARGV[5 * i - 1] + 0, ARGV[5 * i] + 0
  local charged, actual = ARGV[5 * i + 1] + 0, ARGV[5 * i + 2] + 0
  if rule.string_state then
    local state = false
    if value and from <= #value then
      local bar = string.find(value, '|', from, true) or #value + 1
      state = string.sub(value, from, bar - 1)
      from = bar + 1
    end
    local s, ttl_us = rule.settle(state, KEYS[1], now, at, charged, actual, a, b, grace_ms)
    written[#written + 1] = s
    if ttl_us > longest then longest = ttl_us end
  else
    rule.settle(false, KEYS[next_key], now, at, charged, actual, a, b, grace_ms)
    next_key = next_key + 1
  end
end
if #written > 0 then
  redis.call('SET', KEYS[1], table.concat(written, '|'), 'PX', ttl_ms(longest, grace_ms))
end
return now
