-- Redlock's fence write-back: raise a node's fence counter to the lease's token.
-- Includes nothing.
-- KEYS[1] fence  integer: the last fencing token handed out for this resource
-- KEYS[2] owner  string: token of the current holder
-- ARGV[1] fence  the lease's fencing token (the highest its granting nodes returned)
-- ARGV[2] token  the lease's random token
-- The counter becomes max(counter, ARGV[1]) on every node, holder or not, so
-- any later INCR there yields more than the lease's fence.
-- Returns 1 when this node still holds the lease (owner is ARGV[2]), else 0.
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], 2592000000)
if redis.call('GET', KEYS[2]) == ARGV[2] then
  return 1
end
return 0
