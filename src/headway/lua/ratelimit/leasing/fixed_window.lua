-- Leasing a fixed window: a fragment of ratelimit/lease.lua (not run alone); its model is
-- lease_model.fixed_window (a WindowLease).
-- NEEDS       from ratelimit/leasing.lua: leasing, window_terms
-- REGISTERS   leasing[3] (kind 3 in ratelimit/algorithms.py): terms, give_back
-- STATE       "<w>:<c>" (ratelimit/fixed_window.lua); the mark is the window index w
leasing[3] = {
  terms = window_terms,
  give_back = function(state, mark, units)
    local w, c = string.match(state, '^(%d+):(%d+)$')
    if w + 0 ~= mark then return nil end
    return string.format('%s:%d', w, math.max(0, c - units))
  end,
}
