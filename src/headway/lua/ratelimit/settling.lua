-- Settling reservations, the library of ratelimit/settle.lua (not run alone). The
-- reference model is ratelimit/settle_model.py, function for function.
-- NEEDS       from ratelimit/common.lua: nothing but what the fragments take themselves
-- DEFINES     for the settle fragments that follow it (lua/ratelimit/settling/<name>.lua,
--             one per algorithm in ratelimit/algorithms.py):
--   settling            the registry: each fragment sets settling[kind] to a table with
--     string_state      as its algorithm's (ratelimit/common.lua)
--     settle(state, key, now, at, charged, actual, a, b, grace_ms) -> for a string
--         state, the state to write (normalised to now: it reads the same at every later
--         time), changed by actual - charged units where the algorithm's rule says so,
--         and the TTL (us) that covers it; a state of its own key is written by the
--         fragment itself (nothing returned). at is the server us of the reservation.
--   adjusted(value, charged, actual, unit) -> value (units times unit) less the refund,
--         floor 0, or plus the rest, capped at DEBT_CAP
--   DEBT_CAP            2^51: the most a bucket may owe (us) or a window may count, so
--                       that every value stays exact in a double
local settling = {}
local DEBT_CAP = 2251799813685248

local function adjusted(value, charged, actual, unit)
  if actual < charged then
    local v = value - (charged - actual) * unit
    if v < 0 then v = 0 end
    return v
  end
  local v = value + (actual - charged) * unit
  if v > DEBT_CAP then v = DEBT_CAP end
  return v
end
