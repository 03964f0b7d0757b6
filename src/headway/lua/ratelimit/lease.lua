-- Lease a key's quota: charge up to `want` units to every policy at once,
-- all-or-nothing, after giving back a previous lease's unspent units.
-- INCLUDES  clock.lua (server_now_us), ratelimit/common.lua, the fragments of the
--           call's algorithms, then ratelimit/leasing.lua.
-- NEEDS     from clock: server_now_us; from common: idiv, ttl_ms, `algorithms`; from
--           leasing: `leasing`.
-- KEYS[1]   the string states of all the policies, joined by '|' in policy order
--           (the key and format of ratelimit/decide.lua; no sliding logs here)
-- ARGV[1]   now: "" reads the server's TIME; an integer (us) only from the tests,
--           and then every TTL gets a 60 s grace (as in decide.lua)
-- ARGV[2]   cost of the request that asks (0: only give back)
-- ARGV[3]   want: most units to take (>= cost)
-- ARGV[4]   permille: most of the least remaining quota to take, in thousandths
-- ARGV[5]   hold: us a bucket's lease should stay valid (its slots start no sooner,
--           while the bucket has room for that gap besides the lease)
-- ARGV[6]   units to give back first (0: none)
-- ARGV[7 + 4(i-1) .. 10 + 4(i-1)]  kind, a, b, mark of policy i (mark: from the lease
--           given back)
-- Returns {granted, then per policy: ok, remaining, reset_us, retry_us, off, step, mark}.
-- granted 0: refused (fields as decide.lua's peek at cost; off, step, mark 0); else
-- the fields are after charging `granted` (>= cost) units, and unit i of the lease may be
-- spent until the server's now + off + i * step (ratelimit/leasing.lua). {0} alone
-- when cost is 0.
local now, grace_ms
if ARGV[1] == '' then
  now = server_now_us()
  grace_ms = 0
else
  now = tonumber(ARGV[1])
  grace_ms = 60000
end
local cost, want = tonumber(ARGV[2]), tonumber(ARGV[3])
local permille, hold, back = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local n = (#ARGV - 6) / 4

local values = {}
local value = redis.call('GET', KEYS[1])
if value then
  for part in string.gmatch(value, '[^|]+') do values[#values + 1] = part end
end

local function arg(i, field) return tonumber(ARGV[6 + 4 * (i - 1) + field]) end

local returned = false
if back > 0 and value then
  for i = 1, n do
    local state = leasing[arg(i, 1)].give_back(values[i], arg(i, 4), back, arg(i, 2))
    if state then
      values[i] = state
      returned = true
    end
  end
end
local function keep_returned()
  if returned then
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl > 0 then redis.call('SET', KEYS[1], table.concat(values, '|'), 'PX', pttl) end
  end
end
if cost == 0 then
  keep_returned()
  return {0}
end

-- Each policy's answer at `cost` (the fragments' check: see common.lua), as the refusal's
-- fields: ok, remaining, reset, retry, then off, step, mark (0: nothing leased).
local before, allowed, least = {}, true, nil
for i = 1, n do
  local ok, remaining, reset, retry =
    algorithms[arg(i, 1)].check(values[i] or false, KEYS[1], now, cost, arg(i, 2), arg(i, 3))
  before[i] = {ok and 1 or 0, remaining, reset, retry, 0, 0, 0}
  allowed = allowed and ok
  if least == nil or remaining < least then least = remaining end
end
if not allowed then
  keep_returned()
  local out = {0}
  for i = 1, n do
    for _, v in ipairs(before[i]) do out[#out + 1] = v end
  end
  return out
end

local granted = math.min(least, math.max(cost, math.min(want, idiv(least * permille, 1000))))
local out, written, longest = {granted}, {}, 0
for i = 1, n do
  local kind, a, b = arg(i, 1), arg(i, 2), arg(i, 3)
  local state, ttl_us, fields
  if leasing[kind].charge then
    local gap = math.min(hold, (before[i][2] - granted) * a)
    local remaining, reset, off, mark
    state, ttl_us, remaining, reset, off, mark =
      leasing[kind].charge(values[i] or false, now, granted, a, b, gap)
    fields = {1, remaining, reset, 0, off, a, mark}
  else
    local _, _, _, _, remaining_after, reset_after, x, y, z =
      algorithms[kind].check(values[i] or false, KEYS[1], now, granted, a, b)
    state, ttl_us = algorithms[kind].commit(KEYS[1], now, granted, a, b, x, y, z, grace_ms)
    local off, step, mark = leasing[kind].terms(now, a)
    fields = {1, remaining_after, reset_after, 0, off, step, mark}
  end
  written[i] = state
  if ttl_us > longest then longest = ttl_us end
  for _, v in ipairs(fields) do out[#out + 1] = v end
end
redis.call('SET', KEYS[1], table.concat(written, '|'), 'PX', ttl_ms(longest, grace_ms))
return out
