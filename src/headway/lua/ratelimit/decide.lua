-- Decide (and charge) several rate-limit policies on one key, all-or-nothing.
-- INCLUDES  clock.lua (server_now_us), ratelimit/common.lua, then the fragments (ratelimit/<algorithm>.lua) of just
--           the algorithms the call's policies use (one script per combination), so a
--           library (or, as EVAL, a call) defines no more than it runs.
-- NEEDS     from common: call_clock, ttl_ms, and `algorithms` as the fragments fill it.
-- KEYS     every key shares one hash tag. KEYS[1] holds the string states of all the
--          policies that keep one (all but sliding logs), in policy order, joined by
--          '|': one GET and one SET per decision however many policies, as every
--          command costs the server about as much as a whole `return 1`. Then one
--          zset per sliding log, in policy order (a call of sliding logs only has no
--          string key).
-- ARGV[1]  now: "" reads the server's TIME (always, in production); an integer
--          number of microseconds is accepted only from the differential tests,
--          and then every TTL gets a 60 s grace, as the test clock is not Redis's
-- ARGV[2]  cost: units to charge (>= 1; the client rejects costs no policy can admit)
-- ARGV[3]  peek: 1 = decide without charging, 0 = charge when every policy admits
-- ARGV[4 + 3(i-1) .. 6 + 3(i-1)]  kind, a, b of policy i
--          (kinds as in ratelimit/algorithms.py's table; a and b as each fragment describes)
-- Returns {allowed, then per policy: ok, remaining, reset_us, retry_us}, where
-- allowed is 1 when every policy admits; remaining and reset_us are after the
-- charge when one was made; retry_us is 0 for a policy that admits.
local now, grace_ms = call_clock(ARGV[1])
local cost = ARGV[2] + 0
local peek = ARGV[3] == '1'
local n = (#ARGV - 3) / 3

-- Each policy's algorithm, and the key its state is in: KEYS[1] for a string state,
-- else the next key of its own.
local kinds, keys = {}, {}
local strings = 0
for i = 1, n do
  kinds[i] = algorithms[ARGV[1 + 3 * i] + 0]
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
local from = 1 -- where the next policy's part of value starts

-- What each policy's check found (common.lua: its values, in a table made at once).
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
    kinds[i].check(state, keys[i], now, cost, ARGV[2 + 3 * i] + 0, ARGV[3 + 3 * i] + 0),
  }
  allowed = allowed and found[i][1]
end

local charge = allowed and not peek
local out = {allowed and 1 or 0}
local written, longest = {}, 0
for i = 1, n do
  local f, at = found[i], 4 * i - 2
  if charge then
    local state, ttl_us = kinds[i].commit(
      keys[i], now, cost, ARGV[2 + 3 * i] + 0, ARGV[3 + 3 * i] + 0, f[7], f[8], f[9], grace_ms
    )
    if state then
      written[#written + 1] = state
      if ttl_us > longest then longest = ttl_us end
    end
    out[at], out[at + 1], out[at + 2] = 1, f[5], f[6]
  else
    out[at], out[at + 1], out[at + 2] = f[1] and 1 or 0, f[2], f[3]
  end
  out[at + 3] = f[4]
end
if #written > 0 then
  -- The key lasts as long as its longest-lived state; a state that stopped mattering
  -- before reads the same as a missing one (each carries its own time or window).
  redis.call('SET', KEYS[1], table.concat(written, '|'), 'PX', ttl_ms(longest, grace_ms))
end
return out
