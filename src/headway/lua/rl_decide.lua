-- Decide (and charge) several rate-limit policies on one key, all-or-nothing.
-- The algorithms come from rl_<algorithm>.lua, prepended to this file: only those the
-- call's policies use (one script per combination), so a call defines no more than it runs.
-- KEYS[i]  the state key of policy i; every key shares one hash tag
-- ARGV[1]  now: "" reads the server's TIME (always, in production); an integer
--          number of microseconds is accepted only from the differential tests,
--          and then every TTL gets a 60 s grace, as the test clock is not Redis's
-- ARGV[2]  cost: units to charge (>= 1; the client rejects costs no policy can admit)
-- ARGV[3]  peek: 1 = decide without charging, 0 = charge when every policy admits
-- ARGV[4 + 3(i-1) .. 6 + 3(i-1)]  kind, a, b of policy i
--          (kind 1 token bucket, 2 leaky bucket, 3 fixed window, 4 sliding log,
--          5 sliding counter; a and b as each algorithm file describes)
-- Returns {allowed, then per policy: ok, remaining, reset_us, retry_us}, where
-- allowed is 1 when every policy admits; remaining and reset_us are after the
-- charge when one was made; retry_us is 0 for a policy that admits.
local now, grace_ms
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  grace_ms = 0
else
  now = tonumber(ARGV[1])
  grace_ms = 60000
end
local cost = tonumber(ARGV[2])
local peek = ARGV[3] == '1'

local checks = {}
local allowed = true
for i = 1, #KEYS do
  local base = 4 + 3 * (i - 1)
  local algorithm = algorithms[tonumber(ARGV[base])]
  local r = algorithm.check(KEYS[i], now, cost, tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]))
  checks[i] = r
  allowed = allowed and r.ok
end

local charge = allowed and not peek
local out = {allowed and 1 or 0}
for i = 1, #KEYS do
  local r = checks[i]
  if charge then
    algorithms[tonumber(ARGV[4 + 3 * (i - 1)])].commit(KEYS[i], now, r, grace_ms)
    out[#out + 1] = 1
    out[#out + 1] = r.remaining_after
    out[#out + 1] = r.reset_after
  else
    out[#out + 1] = r.ok and 1 or 0
    out[#out + 1] = r.remaining
    out[#out + 1] = r.reset
  end
  out[#out + 1] = r.retry
end
return out
