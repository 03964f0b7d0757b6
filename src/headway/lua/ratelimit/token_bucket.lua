-- Token bucket as GCRA: a fragment of ratelimit/decide.lua (not run alone).
-- NEEDS       from ratelimit/common.lua: idiv, fmt, algorithms
-- REGISTERS   algorithms[1] (kind 1 in ratelimit/algorithms.py)
-- STATE  the theoretical arrival time (TAT, server us) of the next unit; the bucket
--        is full once the TAT is in the past, so the state matters until then.
-- a    interval_us: microseconds per unit of refill
-- b    capacity: units admitted at once
-- check(state, key, now, cost, a, b), with state the STATE decide.lua read from the
-- string key (false if none), returns the fields decide.lua reports:
--   ok, remaining, remaining_after, reset (until full), reset_after, retry.
-- commit returns the STATE to write and how long it matters (us).
local token_bucket = { string_state = true }

function token_bucket.check(state, key, now, cost, a, b)
  local tau = a * b
  local tat = tonumber(state) or now
  if tat < now then tat = now end
  local new_tat = tat + cost * a
  local r = {
    ok = new_tat - now <= tau,
    remaining = idiv(tau - (tat - now), a),
    reset = tat - now,
    reset_after = new_tat - now,
    retry = 0,
    new_tat = new_tat,
  }
  if r.ok then
    r.remaining_after = idiv(tau - (new_tat - now), a)
  else
    r.remaining_after = r.remaining
    r.retry = new_tat - tau - now
  end
  return r
end

function token_bucket.commit(_, now, r)
  return fmt(r.new_tat), r.new_tat - now
end

algorithms[1] = token_bucket
