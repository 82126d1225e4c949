-- Adds a post to an author's outbox, keeping the cap newest, atomically.
--
-- KEYS[1]  the outbox, feed:v<N>:{<uid>}:out
-- ARGV[1]  the post id
-- ARGV[2]  the outbox cap (posts kept)
--
-- The outbox holds post ids scored by themselves and the special "f" with
-- score -(floor+1): it lists exactly the author's live posts with id >= floor.
-- When posts must go, the oldest go and the floor rises to the oldest kept. A
-- post below the floor was accounted for before, so adding it again is a no-op,
-- which keeps the planner's replays idempotent. Room is made before adding, so
-- the zset never holds more than the cap and "f" (see apply.lua).
--
-- Returns 1 if the post was added, 0 if not.
--
-- A function of a library of its own, as apply.lua is (see there), NAME.

local function num(x)
  return string.format('%d', x)
end

local function add(KEYS, ARGV)
  local key = KEYS[1]
  local post = ARGV[1]
  local cap = tonumber(ARGV[2])

  local floor = 0
  local f = redis.call('ZSCORE', key, 'f')
  if f then
    floor = -tonumber(f) - 1
  else
    redis.call('ZADD', key, '-1', 'f')
  end
  if tonumber(post) < floor or redis.call('ZSCORE', key, post) then return 0 end

  local n = redis.call('ZCARD', key) - 1 -- posts, without "f"
  local drop = n + 1 - cap
  local added = 1
  if drop > 0 then
    local old = redis.call('ZRANGE', key, 1, drop)
    if tonumber(post) < tonumber(old[drop]) then
      -- The post is among the oldest: it goes with the others but the newest.
      drop, added = drop - 1, 0
    end
    if drop > 0 then redis.call('ZREMRANGEBYRANK', key, 1, drop) end
  end
  if added == 1 then redis.call('ZADD', key, post, post) end
  if drop > 0 or added == 0 then
    local low = tonumber(redis.call('ZRANGE', key, 1, 1)[1])
    redis.call('ZADD', key, num(-(low + 1)), 'f')
  end
  return added
end

redis.register_function(NAME, add)
