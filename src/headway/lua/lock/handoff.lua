-- Shared functions of the lock scripts, included (prepended) by lock/acquire.lua,
-- lock/release.lua, lock/leave.lua, lock/acquire_many.lua and lock/release_many.lua;
-- never run alone. No KEYS or ARGV of its own:
-- each function takes the keys and values it needs. Needs clock.lua (server_now_us),
-- included before it.
-- A waiter id is "<token>:<ttl_ms>:<node>": the lease token it will hold, the TTL it
-- asked for, and the client (backend instance) it waits in, which may be empty.

-- Tell the waiters on `channel`. A name ending in ':swake' is a sharded channel (Redis
-- Cluster: SPUBLISH stays on the shard that owns the lock's slot, where its waiters
-- SSUBSCRIBE); any other is a classic one (PUBLISH, which a Cluster copies to every node).
local function wake(channel, message)
  if string.sub(channel, -6) == ':swake' then
    redis.call('SPUBLISH', channel, message)
  else
    redis.call('PUBLISH', channel, message)
  end
end

-- The fencing token of a new grant: one more than the last, and above `floor` and the
-- server's clock in microseconds (so a lost counter never makes it go backwards). The clock
-- is nearly always ahead of the counter, so one SET ... GET writes the floored value and
-- reads the last (an INCR, then the SET, cost a call more); the TTL is renewed with it,
-- so a resource in use keeps its counter.
local function next_fence(fence_key, now_us, floor)
  local fence = math.max(now_us, floor) + 1
  local last = tonumber(
    redis.call('SET', fence_key, string.format('%.0f', fence), 'PX', 2592000000, 'GET')
  )
  if last and last >= fence then
    fence = last + 1
    redis.call('SET', fence_key, string.format('%.0f', fence), 'PX', 2592000000)
  end
  return fence
end

-- Queue `waiter` (arrival `score`, us; kept if it is queued already) with a place until
-- now_ms + place_ms.
local function enqueue(queue, places, waiter, score, now_ms, place_ms)
  redis.call('ZADD', queue, 'NX', score, waiter)
  redis.call('ZADD', places, now_ms + place_ms, waiter)
end

-- The first waiter in `queue` whose place is still valid at `now_ms`, or nil; waiters
-- that stopped renewing their place (dead, cancelled, gave up) lose it on the way.
local function first_waiter(queue, places, now_ms)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head then
    local void = redis.call('ZRANGEBYSCORE', places, '-inf', now_ms)
    if #void > 0 then
      for i = 1, #void do
        redis.call('ZREM', queue, void[i])
      end
      redis.call('ZREMRANGEBYSCORE', places, '-inf', now_ms)
      head = redis.call('ZRANGE', queue, 0, 0)[1]
    end
  end
  return head
end

-- Keep `key` (a queue's zset) at least `place_ms` longer: GT only ever lengthens a TTL,
-- in one call where a PTTL and a PEXPIRE took two. A key GT leaves alone either lives
-- longer already or has no TTL at all (just made): only the latter gets one.
local function keep_key(key, place_ms)
  if redis.call('PEXPIRE', key, place_ms, 'GT') == 0 and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, place_ms)
  end
end

-- Keep the queue's keys at least as long as the places just given.
local function keep_queue(queue, places, place_ms)
  keep_key(queue, place_ms)
  keep_key(places, place_ms)
end

-- Grant the lock to `waiter` (its id parsed: the lease `token`, `ttl_ms`, and `home`, the
-- client it waits in) and tell it on `channel` with "<waiter> <fence>", unless it waits
-- in `node` (the caller's own client, which tells it without a message). Returns the
-- waiter, its fence, and whether it waits in `node`.
local function grant(owner, fence_key, channel, waiter, token, ttl_ms, home, now_us, node)
  redis.call('SET', owner, token, 'PX', ttl_ms)
  local fence = next_fence(fence_key, now_us, 0)
  local ours = node ~= '' and home == node
  if not ours then
    wake(channel, waiter .. ' ' .. string.format('%.0f', fence))
  end
  return {waiter, fence, ours}
end

-- Grant the free lock to the first waiter whose place is still valid (dropping lapsed
-- ones), as `grant` does. `now_us` may be nil: the clock is read only if somebody
-- waits. `head` is the queue's first member if the caller has just read it (false: the
-- queue is empty), or nil to read it here. Returns the waiter and fence, or nil when
-- nobody waits.
local function hand_off(owner, fence_key, queue, places, channel, now_us, node, head)
  if head == nil then
    head = redis.call('ZRANGE', queue, 0, 0)[1]
  end
  if not head then
    return nil  -- the common case, nobody waits: no clock needed
  end
  now_us = now_us or server_now_us()
  local now_ms = math.floor(now_us / 1000)
  while true do
    if not head then
      return nil
    end
    local until_ms = tonumber(redis.call('ZSCORE', places, head) or '0')
    local token, ttl_ms, home = string.match(head, '^(.+):(%d+):(.*)$')
    if until_ms > now_ms and not token then
      -- Not a waiter id this version writes: wake it, to try again in its place.
      wake(channel, head)
      return nil
    end
    redis.call('ZREM', queue, head)
    redis.call('ZREM', places, head)
    if until_ms <= now_ms then
      head = redis.call('ZRANGE', queue, 0, 0)[1]
    else
      return grant(owner, fence_key, channel, head, token, ttl_ms, home, now_us, node)
    end
  end
end

-- Queue `riders` (waiter ids of the releasing client `node`, in the order they asked)
-- behind those already waiting, unless the lock was just `granted` (as `grant` returns)
-- to a waiter of `node` too: then the riders are left to that client, which has them ride
-- on its waiter's release (queued only to be taken out again, they would cost the
-- server five calls each). With nobody granted, the first rider is next: it is granted
-- at once and the others are left likewise. Returns the grant, its fourth value true if
-- the riders were left to the client.
local function queue_riders(owner, fence_key, queue, places, channel, node, riders, granted,
                            now_us, place_ms)
  if not granted then
    local token, ttl_ms, home = string.match(riders[1], '^(.+):(%d+):(.*)$')
    if token then
      granted = grant(owner, fence_key, channel, riders[1], token, ttl_ms, home, now_us, node)
    end
  end
  if granted and granted[3] then
    granted[4] = true
    return granted
  end
  local now_ms = math.floor(now_us / 1000)
  for i = 1, #riders do
    -- Arrival times just before now, in the riders' order (a zset orders equal scores
    -- by member, not by arrival).
    enqueue(queue, places, riders[i], now_us - (#riders - i), now_ms, place_ms)
  end
  keep_queue(queue, places, place_ms)
  return granted or hand_off(owner, fence_key, queue, places, channel, now_us, node, nil)
end

-- Release `token`'s lease on the lock whose keys are given, hand the lock to the next
-- waiter and queue `riders` (a list of waiter ids, with a place of `place_ms`) as
-- `queue_riders` says. `call` ("" for none) marks the release for a minute in
-- `released`, so a retried call is recognised. Returns what lock/release.lua returns:
-- 1 released, {1, waiter, fence, left} released and handed on (left: 1 if the riders
-- were left to the client), 0 not held (nothing touched).
local function release_lease(owner, queue, places, released, fence_key, token, channel, call,
                             node, place_ms, riders)
  local done = token .. ' ' .. call
  if redis.call('GET', owner) ~= token then
    if redis.call('GET', released) == done then
      return 1
    end
    return 0
  end
  if call ~= '' then
    redis.call('SET', released, done, 'PX', 60000)
  end
  -- The owner key stays until the end: a grant overwrites it, else it is deleted.
  local head = redis.call('ZRANGE', queue, 0, 0)[1] or false
  local now_us = nil
  if #riders > 0 then
    now_us = server_now_us()
  end
  local granted = hand_off(owner, fence_key, queue, places, channel, now_us, node, head)
  if #riders > 0 then
    granted = queue_riders(owner, fence_key, queue, places, channel, node, riders, granted,
                           now_us, place_ms)
  end
  if granted then
    return {1, granted[1], granted[2], granted[4] and 1 or 0}
  end
  redis.call('DEL', owner)
  return 1
end
