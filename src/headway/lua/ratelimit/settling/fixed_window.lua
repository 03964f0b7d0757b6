-- Settling a fixed window: a fragment of ratelimit/settle.lua (not run alone); its model
-- is settle_model.fixed_window.
-- NEEDS       from ratelimit/common.lua: idiv; from ratelimit/settling.lua: settling, adjusted
-- REGISTERS   settling[3] (kind 3 in ratelimit/algorithms.py)
-- RULE        only while the reservation's window is the current one: its count falls by
--             the refund (floor 0) or rises by the rest, past the limit if need be (debt
--             until the window ends). Once the window has ended the reservation's units
--             are in a count no decision reads: nothing changes.
settling[3] = {
  string_state = true,
  settle = function(state, _, now, at, charged, actual, a)
    local index = idiv(now, a)
    local count = 0
    if state then
      local w, c = string.match(state, '^(%d+):(%d+)$')
      if w + 0 == index then count = c + 0 end
    end
    if idiv(at, a) == index then count = adjusted(count, charged, actual, 1) end
    return string.format('%d:%d', index, count), (index + 1) * a - now
  end,
}
