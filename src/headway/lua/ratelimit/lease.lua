-- Lease a key's quota: charge up to `want` units to every policy at once,
-- all-or-nothing, after giving back a previous lease's unspent units.
-- INCLUDES  clock.lua (server_now_us), ratelimit/common.lua, the fragments of the
--           call's algorithms, then ratelimit/leasing.lua and the lease fragment each
--           of those algorithms declares (ratelimit/leasing/<name>.lua).
-- NEEDS     from common: call_clock, idiv, ttl_ms, `algorithms`; from
--           leasing: `leasing`, filled by the lease fragments.
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
-- Cut as the decide scripts were (docs/decisions/ratelimit.md): numbers by arithmetic (`s + 0`),
-- no tables but one per policy's check, the key's TTL kept while it covers the states.
local now, grace_ms = call_clock(ARGV[1])
local key = KEYS[1]
local cost, back = ARGV[2] + 0, ARGV[6] + 0
local n = (#ARGV - 6) / 4

-- The policies' states, split with string.find (one policy: the value itself).
local states = {}
local value = redis.call('GET', key)
if value then
  if n == 1 then
    states[1] = value
  else
    local from = 1
    for i = 1, n do
      if from > #value then break end
      local bar = string.find(value, '|', from, true) or #value + 1
      states[i] = string.sub(value, from, bar - 1)
      from = bar + 1
    end
  end
end

local returned = false
if back > 0 and value then
  for i = 1, n do
    local at = 4 * i + 3 -- ARGV index of policy i's kind
    local state = states[i]
    if state then
      state = leasing[ARGV[at] + 0].give_back(state, ARGV[at + 3] + 0, back, ARGV[at + 1] + 0)
      if state then
        states[i] = state
        returned = true
      end
    end
  end
end
-- Only give back (or refused): the states with the units returned, under the key's TTL
-- (it covers them: giving back only shortens what a state holds).
if cost == 0 then
  if returned then redis.call('SET', key, table.concat(states, '|', 1, n), 'KEEPTTL') end
  return {0}
end

-- Each policy's check at `cost` (common.lua: its values, in one table made at once). One
-- policy admitting reports only the values after the charge: its reset may be left out.
local found, allowed, least = {}, true, nil
for i = 1, n do
  local at = 4 * i + 3
  local f = {
    algorithms[ARGV[at] + 0].check(
      states[i] or false, key, now, cost, ARGV[at + 1] + 0, ARGV[at + 2] + 0, n == 1
    ),
  }
  found[i] = f
  allowed = allowed and f[1]
  if least == nil or f[2] < least then least = f[2] end
end
if not allowed then
  if returned then redis.call('SET', key, table.concat(states, '|', 1, n), 'KEEPTTL') end
  local out = {0}
  for i = 1, n do
    local f, at = found[i], 7 * i - 5
    out[at], out[at + 1], out[at + 2], out[at + 3] = f[1] and 1 or 0, f[2], f[3], f[4]
    out[at + 4], out[at + 5], out[at + 6] = 0, 0, 0
  end
  return out
end

local permille, want = ARGV[4] + 0, ARGV[3] + 0
local granted = math.min(least, math.max(cost, math.min(want, idiv(least * permille, 1000))))
local hold = ARGV[5] + 0
-- A key just made has no TTL to keep.
local out, longest, needed, keep = {granted}, 0, 0, value and true or false
for i = 1, n do
  local at, to = 4 * i + 3, 7 * i - 5
  local kind, a, b = ARGV[at] + 0, ARGV[at + 1] + 0, ARGV[at + 2] + 0
  local f, lease = found[i], leasing[kind]
  local state, ttl_us
  if lease.charge then
    local gap = math.min(hold, (f[2] - granted) * a)
    local matters, remaining, reset, off, mark
    state, matters, remaining, reset, off, mark =
      lease.charge(states[i] or false, now, granted, a, b, gap)
    out[to], out[to + 1], out[to + 2], out[to + 3] = 1, remaining, reset, 0
    out[to + 4], out[to + 5], out[to + 6] = off, a, mark
    -- As decide_one.lua's: the key lasts as long as a bucket's state could ever matter
    -- (a refill from empty), kept while its PTTL covers what this state needs.
    ttl_us = a * b
    if matters > needed then needed = matters end
  else
    -- A window's check did not depend on the cost but for the units left: what `granted`
    -- leaves is what `cost` left, less the difference (ratelimit/leasing.lua).
    local covered
    state, ttl_us, covered =
      algorithms[kind].commit(key, now, granted, a, b, f[7], f[8], f[9], grace_ms)
    local off, step, mark = lease.terms(now, a)
    out[to], out[to + 1], out[to + 2], out[to + 3] = 1, f[5] - (granted - cost), f[6], 0
    out[to + 4], out[to + 5], out[to + 6] = off, step, mark
    keep = keep and covered
  end
  states[i] = state
  if ttl_us > longest then longest = ttl_us end
end
-- The key's TTL covers every state it holds (each writer sets it to the longest): a
-- window charged again in its window keeps it (its commit says so), and a bucket's state
-- while the PTTL reaches past what it needs (1 ms to spare for the rounding of both). A
-- SET that keeps the TTL costs the server about half of one that sets it; a PTTL less.
local joined = n == 1 and states[1] or table.concat(states, '|', 1, n)
if keep and (needed == 0 or redis.call('PTTL', key) > ttl_ms(needed, grace_ms)) then
  redis.call('SET', key, joined, 'KEEPTTL')
else
  redis.call('SET', key, joined, 'PX', ttl_ms(longest, grace_ms))
end
return out
