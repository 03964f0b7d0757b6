-- Redlock's release on one node: compare-and-delete, and optionally raise the counter.
-- Includes nothing.
-- KEYS[1] owner  string: token of the holder
-- KEYS[2] fence  integer: the last fencing token this node handed out for the resource
-- ARGV[1] token  the lease's (or the failed round's) token
-- ARGV[2] fence  raise the counter to at least this ("0": leave it). A failed round
--                passes the highest fence it was granted, so the nodes that granted and
--                those that refused count on from the same value and agree next time.
-- Returns 1 when released, 0 when the token does not hold the lock here.
if ARGV[2] ~= '0' then
  local current = tonumber(redis.call('GET', KEYS[2]) or '0')
  if current < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', 2592000000)
  end
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
