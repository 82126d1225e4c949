-- Removes a live stream's entry.
--
-- KEYS[1]  the user's streams, stream:{<uid>} (see admit.lua)
-- ARGV[1]  the stream's id
--
-- Returns the streams the user still holds (expired entries dropped).
--
-- A function of a library of its own (see inbox/lua/apply.lua), NAME.

local function release(KEYS, ARGV)
  local key = KEYS[1]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREM', key, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  return redis.call('ZCARD', key)
end

redis.register_function(NAME, release)
