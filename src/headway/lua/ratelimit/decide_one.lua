-- Decide (and charge) ONE rate-limit policy on one key: decide.lua specialised for the
-- common call, with the same KEYS and state (so a key can be decided by either), fewer
-- arguments (each one the server reads costs it) and, where it can, a one-integer answer
-- (ratelimit/decision.py's decision_from_decide reads both forms). It skips what only
-- several policies need: the tables of kinds, keys and results, splitting and joining
-- the string key, the loop over policies.
-- INCLUDES  clock.lua (server_now_us), ratelimit/common.lua, then the fragment
--           (ratelimit/<algorithm>.lua) of the policy's algorithm (one script per kind:
--           the kind is implied, never sent).
-- NEEDS     from common: call_clock, ttl_ms, and `algorithms` as the fragment
--           fills it.
-- KEYS[1]  the policy's state: its string (algorithms with string_state), else its own key
-- ARGV[1..2]  a, b of the policy (as its fragment describes them)
-- ARGV[3]  cost: units to charge (>= 1) when the policy admits; negated (-cost), decide
--          the same cost without charging (a peek)
-- ARGV[4]  absent (always, in production): now is the server's TIME. An integer number
--          of microseconds is accepted only from the differential tests, and then every
--          TTL gets a 60 s grace, as the test clock is not Redis's
-- Returns the answer: remaining and reset_us (after the charge when one was made), and
-- retry_us (0 when it admits). As one integer when it fits in one (an array costs the
-- server a table and an array reply: ~0.5 us), with n = reset_us * (b + 1) + remaining
-- (0 <= remaining <= b, and n below 2^53, exact in a double):
--   n          admitted (retry_us 0)
--   -1 - n     refused, with retry_us = reset_us (a full fixed window's refusal)
-- (b bounds remaining for every algorithm: it is the policy's limit or capacity).
-- Else decide.lua's reply for one policy, {allowed, ok, remaining, reset_us, retry_us}.
local now, grace_ms = call_clock(ARGV[4] or '')
-- The only algorithm registered, as one fragment is included.
local _, algorithm = next(algorithms)
local key = KEYS[1]
local a, b, cost = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
local charging = cost > 0
if not charging then cost = -cost end
local state = false
if algorithm.string_state then state = redis.call('GET', key) end
local ok, remaining, reset, retry, remaining_after, reset_after, x, y, z =
  algorithm.check(state, key, now, cost, a, b, charging)
if ok and charging then
  local value, ttl_us, keep = algorithm.commit(key, now, cost, a, b, x, y, z, grace_ms)
  -- A bucket's key lasts as long as its state could ever matter, so it is kept while its
  -- PTTL covers the new state (1 ms to spare for the rounding of both): a PTTL costs the
  -- server about a quarter of what setting the TTL again does.
  if keep and (keep == true or redis.call('PTTL', key) > ttl_ms(keep, grace_ms)) then
    -- Its TTL reaches where this state stops mattering already: SET with PX costs the
    -- server about twice a SET that keeps it.
    redis.call('SET', key, value, 'KEEPTTL')
  elseif value then
    redis.call('SET', key, value, 'PX', ttl_ms(ttl_us, grace_ms))
  end
  remaining, reset = remaining_after, reset_after
end
if remaining >= 0 and remaining <= b and (ok or retry == reset) then
  local n = reset * (b + 1) + remaining
  if n >= 0 and n < 9007199254740992 then
    if ok then return n end
    return -1 - n
  end
end
if ok then return {1, 1, remaining, reset, 0} end
return {0, 0, remaining, reset, retry}
