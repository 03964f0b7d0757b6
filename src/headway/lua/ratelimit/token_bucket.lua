-- Token bucket as GCRA: a fragment of ratelimit/decide.lua and decide_one.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: idiv, fmt, algorithms
-- REGISTERS   algorithms[1] (kind 1 in ratelimit/algorithms.py)
-- STATE  the theoretical arrival time (TAT, server us) of the next unit; the bucket
--        is full once the TAT is in the past, so the state matters until then.
-- a    interval_us: microseconds per unit of refill
-- b    capacity: units admitted at once
-- check(state, key, now, cost, a, b), with state the STATE the main read from the
-- string key (false if none), returns what common.lua says (reset: until full), and
-- for its commit x = the new TAT, y = the state read (false if none).
-- commit returns the STATE to write, the TTL its key gets: the longest a state can matter
-- (a refill from empty, a * b; a key that outlives its state reads as a full bucket), and
-- the us its state matters, for decide_one.lua to keep a TTL that covers them (when a
-- key was read).
-- Sized for its three fields at once (one allocation, no rehash as functions are added).
local token_bucket = { string_state = true, check = nil, commit = nil }

function token_bucket.check(state, key, now, cost, a, b)
  local tau = a * b
  local tat = state and state + 0 or now
  if tat < now then tat = now end
  local new_tat = tat + cost * a
  -- A TAT past now + tau is debt (a settled reservation, settle.lua): nothing remains.
  local room = tau - (tat - now)
  if room < 0 then room = 0 end
  local remaining = idiv(room, a)
  if new_tat - now > tau then
    return false, remaining, tat - now, new_tat - tau - now, remaining, tat - now
  end
  return true, remaining, tat - now, 0, idiv(tau - (new_tat - now), a), new_tat - now, new_tat,
    state
end

function token_bucket.commit(_, now, _, a, b, new_tat, stored)
  return fmt(new_tat), a * b, stored and new_tat - now
end

algorithms[1] = token_bucket
