-- Release several leases at once (MultiLock's one script), each as lock/release.lua does.
-- Includes clock.lua (server_now_us) and lock/handoff.lua (release_lease), loaded
-- before it. Every key is in one hash slot (or on one server).
-- For lease i (1..n), five keys:
-- KEYS[5i-4] owner    string: token of the current holder
-- KEYS[5i-3] queue    zset: waiter id -> arrival time (us)
-- KEYS[5i-2] places   zset: waiter id -> server time (ms) after which its place is void
-- KEYS[5i-1] released string: "<token> <call>" of the last release done here (a minute)
-- KEYS[5i]   fence    integer: the last fencing token handed out for this resource
-- ARGV[1] node      the releasing client's id (see lock/release.lua)
-- ARGV[2] place_ms  how long a rider queued here keeps its place
-- then per lease, in order: token, channel, call ("" from a client that never retries),
-- the number of its riders r, and r waiter ids (see lock/release.lua's riders).
-- Returns one reply per lease, in order, each what lock/release.lua returns: 1
-- released, {1, waiter, fence, left} released and handed on, 0 not held (nothing touched).
-- Idempotent per call, as lock/release.lua.
local replies = {}
local at = 3
for i = 1, #KEYS / 5 do
  local token, channel, call = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local riders = {}
  for j = 1, tonumber(ARGV[at + 3]) do
    riders[j] = ARGV[at + 3 + j]
  end
  at = at + 4 + #riders
  replies[i] = release_lease(KEYS[5 * i - 4], KEYS[5 * i - 3], KEYS[5 * i - 2], KEYS[5 * i - 1],
                             KEYS[5 * i], token, channel, call, ARGV[1], tonumber(ARGV[2]),
                             riders)
end
return replies
