-- Settling a sliding counter: a fragment of ratelimit/settle.lua (not run alone); its
-- model is settle_model.sliding_counter.
-- NEEDS       from ratelimit/common.lua: idiv; from ratelimit/settling.lua: settling, adjusted
-- REGISTERS   settling[5] (kind 5 in ratelimit/algorithms.py)
-- RULE        the count of the reservation's window changes while it weighs: as the
--             current window's (c), or, in the window after, as the previous one's (p);
--             floor 0, and past the limit if need be (debt, weighing less as the window
--             slides). Two windows later it weighs nothing: nothing changes.
settling[5] = {
  string_state = true,
  settle = function(state, _, now, at, charged, actual, a)
    local index = idiv(now, a)
    local c, p = 0, 0
    if state then
      local sw, sc, sp = string.match(state, '^(%d+):(%d+):(%d+)$')
      local w = sw + 0
      if w == index then
        c, p = sc + 0, sp + 0
      elseif w == index - 1 then
        p = sc + 0
      end
    end
    local mine = idiv(at, a)
    if mine == index then
      c = adjusted(c, charged, actual, 1)
    elseif mine == index - 1 then
      p = adjusted(p, charged, actual, 1)
    end
    return string.format('%d:%d:%d', index, c, p), (index + 2) * a - now
  end,
}
