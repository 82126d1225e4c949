-- Reads a page of an inbox (see apply.lua for its layout): its floor, its
-- sequence ("s"), its head's key, and at most n posts below a cursor,
-- newest first, atomically.
--
-- KEYS[1] the inbox's meta, feed:v<N>:{<uid>}:iy
-- KEYS[2] optional, the key the caller expects the inbox's head to have (not
--         read as such): a reader that keeps pages by Redis's client-side
--         caching must declare the head, since Redis 7.0 tracks the keys a
--         call declares, not those its function reads, and a push into the
--         head changes the head alone (see apply.lua). A page whose head is
--         not the one declared is not tracked by it (see homefeed.PageCache).
-- ARGV[1] the lowest score (exclusive with "(") of the posts read: the
--         cursor's, or "0" from the newest
-- ARGV[2] n, the most posts read
-- ARGV[3] a TTL in milliseconds to give the inbox first (the user is
--         active), or "0"
--
-- Returns nil if the inbox does not exist (or has the unsegmented layout),
-- else {"f"'s score, "s"'s score, the head's key, post_1 .. post_m}; a
-- small inbox's head is its meta.
--
-- The refresh goes before the reads: Redis stops tracking a key for its
-- readers' caches when the key is changed, so a read before it would be left
-- untracked (see homefeed.PageCache). Every change apply.lua makes to an inbox changes
-- its meta or, a push into the head, the head alone: a reader tracking both
-- hears of them all.

-- A function of a library of its own, as apply.lua is (see there), NAME.

local function page(KEYS, ARGV)
  local rcall = redis.call
  local key = KEYS[1]
  local ttl = ARGV[3]

  if ttl ~= '0' and rcall('PEXPIRE', key, ttl) == 0 then return false end
  local sc = rcall('ZMSCORE', key, 'f', 's')
  if not sc[1] then return false end
  local lay = rcall('ZRANGEBYSCORE', key, '0', '0')[1]
  if not lay then return false end
  local g, hs, ts = string.match(lay, '^(%d+):(%d+)/%d+/(%d+)$')
  if not g then return false end
  local segp = key .. ':' .. g .. ':'
  local h, t = tonumber(hs), tonumber(ts)

  if ttl ~= '0' then
    -- Segments live a second longer than the meta (apply.lua).
    local life = string.format('%d', tonumber(ttl) + 1000)
    for k = math.max(t, 1), h do rcall('PEXPIRE', segp .. k, life) end
  end

  local head = key
  if h > 0 then head = segp .. hs end
  local out, n = {sc[1], sc[2], head}, tonumber(ARGV[2])
  for k = h, t, -1 do
    if n <= 0 then break end
    local ms
    if k == 0 then
      -- A small inbox's posts are in the meta, scored above its layout's 0.
      local from = ARGV[1]
      if from == '0' then from = '(0' end
      ms = rcall('ZRANGEBYSCORE', key, from, '+inf', 'LIMIT', '0', n)
    else
      ms = rcall('ZRANGEBYSCORE', segp .. k, ARGV[1], '+inf', 'LIMIT', '0', n)
    end
    for j = 1, #ms do out[#out + 1] = ms[j] end
    n = n - #ms
  end
  return out
end

redis.register_function(NAME, page)
