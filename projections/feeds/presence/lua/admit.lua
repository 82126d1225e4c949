-- Admits a live stream of a user unless the user holds the most one may.
--
-- KEYS[1]  the user's streams, stream:{<uid>}: stream ids scored by when they
--          expire (Unix milliseconds, of Redis's clock)
-- ARGV[1]  the stream's id
-- ARGV[2]  how long an entry lives unless renewed (milliseconds)
-- ARGV[3]  the most streams one user may hold
--
-- Expired entries (of a process that died) are dropped first. Redis's own
-- clock judges expiry, so replicas whose clocks differ agree on it. The key
-- expires with its newest entry.
--
-- Returns {held, expiry}: the streams the user holds with this one (or
-- without it, negated, when refused), and when the entry expires.
--
-- A function of a library of its own (see inbox/lua/apply.lua), NAME.

local function admit(KEYS, ARGV)
  local key = KEYS[1]
  local ttl = tonumber(ARGV[2])
  local limit = tonumber(ARGV[3])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local expiry = now + ttl

  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local held = redis.call('ZCARD', key)
  if held >= limit and not redis.call('ZSCORE', key, ARGV[1]) then
    return {-held, expiry}
  end
  redis.call('ZADD', key, expiry, ARGV[1])
  redis.call('PEXPIREAT', key, expiry)
  return {redis.call('ZCARD', key), expiry}
end

redis.register_function(NAME, admit)
