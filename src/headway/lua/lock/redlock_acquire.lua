-- Redlock's grant on one node: SET NX, and this node's fencing token in the same script.
-- Includes nothing.
-- KEYS[1] owner  string: token of the holder, expiring with the lease (PX)
-- KEYS[2] fence  integer: the last fencing token this node handed out for the resource
-- ARGV[1] token  random token of the new lease (fresh for every round)
-- ARGV[2] ttl_ms lease TTL in milliseconds
-- ARGV[3] fenced "1": count a fencing token; "0": none (RedlockBackend(fencing=False))
-- The token is the counter plus one. A node without a counter (a new resource, a restart
-- without persistence, 30 days unused) starts from its clock in whole seconds, as
-- microseconds: above any counter it lost (one grant per microsecond would be needed to
-- catch up), and the same on nodes whose clocks agree to the second, so their tokens agree.
-- Returns the fence (>= 1) when granted, 0 when granted without fencing, -1 when the
-- resource is held (by anybody: a round never queues and never re-enters).
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -1
end
if ARGV[3] == '0' then
  return 0
end
local fence = redis.call('INCR', KEYS[2])
if fence == 1 then
  fence = tonumber(redis.call('TIME')[1]) * 1000000
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', 2592000000)
end
return fence
