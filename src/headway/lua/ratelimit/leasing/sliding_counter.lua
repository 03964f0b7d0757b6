-- Leasing a sliding counter: a fragment of ratelimit/lease.lua (not run alone); its model
-- is lease_model.sliding_counter (a WindowLease).
-- NEEDS       from ratelimit/leasing.lua: leasing, window_terms
-- REGISTERS   leasing[5] (kind 5 in ratelimit/algorithms.py): terms, give_back
-- STATE       "<w>:<c>:<p>" (ratelimit/sliding_counter.lua); the mark is the window index
--             w: units go back to the window they were charged to, current or (while it
--             still weighs) previous
leasing[5] = {
  terms = window_terms,
  give_back = function(state, mark, units)
    local sw, sc, sp = string.match(state, '^(%d+):(%d+):(%d+)$')
    local w, c, p = sw + 0, sc + 0, sp + 0
    if w == mark + 1 then  -- the previous window still weighs: lighten it
      return string.format('%d:%d:%d', w, c, math.max(0, p - units))
    end
    if w ~= mark then return nil end
    return string.format('%d:%d:%d', w, math.max(0, c - units), p)
  end,
}
