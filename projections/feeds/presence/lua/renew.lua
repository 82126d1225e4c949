-- Renews a live stream's entry, adding it again if Redis lost it.
--
-- KEYS[1]  the user's streams, stream:{<uid>} (see admit.lua)
-- ARGV[1]  the stream's id
-- ARGV[2]  how long an entry lives unless renewed (milliseconds)
--
-- Returns when the entry expires (Unix milliseconds, of Redis's clock).
--
-- A function of a library of its own (see inbox/lua/apply.lua), NAME.

local function renew(KEYS, ARGV)
  local key = KEYS[1]
  local t = redis.call('TIME')
  local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
  redis.call('ZADD', key, expiry, ARGV[1])
  redis.call('PEXPIREAT', key, expiry)
  return expiry
end

redis.register_function(NAME, renew)
