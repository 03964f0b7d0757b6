-- Extend a lease that is still held. Includes nothing.
-- KEYS[1] owner  string: token of the current holder
-- ARGV[1] token  the lease's token
-- ARGV[2] ttl_ms the new TTL, counted from now
-- Returns 1 when extended, 0 when the token no longer holds the lock (nothing touched).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
