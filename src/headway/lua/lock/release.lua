-- Release a lease and hand the lock to the next waiter.
-- Includes clock.lua (server_now_us) and lock/handoff.lua (release_lease), loaded
-- before it.
-- KEYS[1] owner    string: token of the current holder
-- KEYS[2] queue    zset: waiter id -> arrival time (us)
-- KEYS[3] places   zset: waiter id -> server time (ms) after which its place is void
-- KEYS[4] released string: "<token> <call>" of the last release done here (for a minute)
-- KEYS[5] fence    integer: the last fencing token handed out for this resource
-- ARGV[1] token    the lease's token
-- ARGV[2] channel  pub/sub channel on which the waiters listen
-- ARGV[3] call     random id of this release call, or "" from a client that never retries
-- ARGV[4] node     the releasing client's id: its own waiters are told by it, not on the channel
-- ARGV[5] place_ms how long a waiter queued here keeps its place (only with riders)
-- ARGV[6..] riders waiter ids of the releasing client's tasks that asked for the lock while
--          it held it: they are queued here, in this order, behind those already waiting,
--          instead of by an acquire of their own (only when the release succeeds); or,
--          when the lock goes to a waiter of this client too, left to the client, to ride
--          on that waiter's release (see handoff.lua's queue_riders)
-- Returns 1 when released, {1, waiter, fence, left} when released and handed to
-- `waiter` (left: 1 when the riders were left to the client, else 0), 0 when the token
-- no longer holds the lock (nothing touched).
-- Idempotent per call: a retried release (redis-py retries a command whose reply was
-- lost) finds its own call in KEYS[4] and returns 1 again, instead of a false "not
-- held"; a second release call for the same lease still returns 0.
local riders = {}
for i = 6, #ARGV do
  riders[#riders + 1] = ARGV[i]
end
return release_lease(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3],
                     ARGV[4], tonumber(ARGV[5]), riders)
