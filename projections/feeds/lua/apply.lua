-- Applies one recipient's work items, in order, to their inbox, atomically.
--
-- KEYS[1]  the inbox, feed:v<N>:{<uid>}:in
-- ARGV[1]  the inbox cap (posts kept)
-- ARGV[2]  the inbox TTL in milliseconds (set when materialising)
-- ARGV[3..] the items, each: op, seq, floor, n, post_1 .. post_n
--           op: 1 push, 2 remove, 3 merge, 4 unmerge, 5 materialise,
--           6 reconcile, which is followed by m, allowed_1 .. allowed_m
--
-- The inbox holds post ids as members scored by themselves (>= 1) and two
-- specials with negative scores, so they sort below every post (ranks 0 and 1):
-- "f" = -(floor+1), the inbox is exactly the feed's posts with id >= floor; and
-- "s" = -(seq+1), the log sequence of the last item applied. An item whose seq
-- is not above it was applied before and is skipped. Only materialise creates
-- an inbox; every other op on a missing inbox is skipped.
--
-- Numbers go back to Redis through num(): Lua's own number-to-string
-- conversion keeps 14 digits, and ids have up to 16.
--
-- Returns {items applied, entries reconcile had to repair}.

local key = KEYS[1]
local cap = tonumber(ARGV[1])
local ttl = ARGV[2]

local function num(x)
  return string.format('%d', x)
end

local exists, floor, seq = false, 0, 0
do
  local sc = redis.call('ZMSCORE', key, 'f', 's')
  if sc[1] then
    exists = true
    floor = -tonumber(sc[1]) - 1
    if sc[2] then seq = -tonumber(sc[2]) - 1 end
  end
end

-- put adds the posts ARGV[first .. last] that are >= min, keeping the cap
-- newest posts; if any had to go, the floor becomes the oldest kept. It makes
-- room before it adds, so the zset never holds more than the cap and the two
-- specials: one that outgrew zset-max-listpack-entries even for a moment would
-- keep the large encoding for good.
local function put(first, last, min)
  local cand, seen = {}, {}
  for j = first, last do
    local p = ARGV[j]
    if not seen[p] and tonumber(p) >= min then
      seen[p] = true
      cand[#cand + 1] = p
    end
  end
  local new = {} -- the posts the inbox does not have yet
  for c = 1, #cand, 500 do
    local chunk = {}
    for j = c, math.min(c + 499, #cand) do chunk[#chunk + 1] = cand[j] end
    local sc = redis.call('ZMSCORE', key, unpack(chunk))
    for j = 1, #chunk do
      if not sc[j] then new[#new + 1] = chunk[j] end
    end
  end
  table.sort(new, function(a, b) return tonumber(a) < tonumber(b) end)

  local n = redis.call('ZCARD', key) - 2
  local drop = n + #new - cap
  local skip = 0 -- the oldest new posts, which are not added
  if drop > 0 then
    -- The drop oldest of the inbox and the new posts go.
    local old = redis.call('ZRANGE', key, 2, 1 + math.min(drop, n))
    local cut = 0
    for _ = 1, drop do
      if cut < #old and (skip >= #new or tonumber(old[cut + 1]) < tonumber(new[skip + 1])) then
        cut = cut + 1
      else
        skip = skip + 1
      end
    end
    if cut > 0 then redis.call('ZREMRANGEBYRANK', key, 2, 1 + cut) end
  end
  local args = {}
  for j = skip + 1, #new do
    args[#args + 1] = new[j]
    args[#args + 1] = new[j]
    if #args >= 1000 then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('ZADD', key, unpack(args)) end
  if drop > 0 then
    floor = tonumber(redis.call('ZRANGE', key, 2, 2)[1])
  end
end

-- remove takes ARGV[first .. last] out of the inbox.
local function remove(first, last)
  local args = {}
  for j = first, last do
    args[#args + 1] = ARGV[j]
    if #args >= 1000 then
      redis.call('ZREM', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('ZREM', key, unpack(args)) end
end

-- raise lifts the floor to f, dropping the posts below it (never the specials).
local function raise(f)
  if f > floor then
    redis.call('ZREMRANGEBYSCORE', key, '0', '(' .. num(f))
    floor = f
  end
end

local function save()
  redis.call('ZADD', key, num(-(floor + 1)), 'f', num(-(seq + 1)), 's')
end

-- reconcile makes the inbox exactly the posts ARGV[first .. last] above the
-- higher of its floor and f, and counts what it had to change: entries above
-- that floor that should not be there (unless allowed: a big account's older
-- posts, which reads merge anyway), entries missing, and the entries beyond the
-- cap of those that remain. Entries below the floor are dropped uncounted when
-- the inbox is within its cap: the planner cannot vouch for them, but they are
-- not wrong.
local function reconcile(first, last, f, afirst, alast)
  f = math.max(floor, f)
  local want, allowed, repairs = {}, {}, 0
  for j = first, last do
    if tonumber(ARGV[j]) >= f then want[ARGV[j]] = true end
  end
  for j = afirst, alast do allowed[ARGV[j]] = true end
  local have = redis.call('ZRANGE', key, 2, -1)
  local present, remaining = {}, 0
  for _, p in ipairs(have) do
    present[p] = true
    if tonumber(p) >= f and not want[p] and not allowed[p] then
      redis.call('ZREM', key, p)
      repairs = repairs + 1
    else
      remaining = remaining + 1
    end
  end
  if remaining > cap then repairs = repairs + remaining - cap end
  for p in pairs(want) do
    if not present[p] then repairs = repairs + 1 end
  end
  raise(f)
  put(first, last, floor)
  return repairs
end

local applied, repaired, dirty = 0, 0, false
local i = 3
while i <= #ARGV do
  local op = tonumber(ARGV[i])
  local iseq = tonumber(ARGV[i + 1])
  local ifloor = tonumber(ARGV[i + 2])
  local first, last = i + 4, i + 3 + tonumber(ARGV[i + 3])
  i = last + 1
  local afirst, alast = 0, -1
  if op == 6 then
    afirst, alast = i + 1, i + tonumber(ARGV[i])
    i = alast + 1
  end
  if op == 6 then
    -- At the planner's position, which the inbox may already have reached.
    if exists and iseq >= seq then
      repaired = repaired + reconcile(first, last, ifloor, afirst, alast)
      seq = iseq
      applied, dirty = applied + 1, true
    end
  elseif op == 5 then
    if not exists then
      exists, floor, seq = true, ifloor, iseq
      save()
      put(first, last, floor)
      redis.call('PEXPIRE', key, ttl)
      applied, dirty = applied + 1, true
    end
  elseif op < 1 or op > 6 then
    if dirty then save() end
    return redis.error_reply('ERR feed apply: unknown op ' .. num(op))
  elseif exists and iseq > seq then
    if op == 1 then
      put(first, last, floor)
    elseif op == 2 then
      remove(first, last)
    elseif op == 3 then
      raise(math.max(floor, ifloor))
      put(first, last, floor)
    else
      remove(first, last)
      raise(math.max(floor, ifloor))
    end
    seq = iseq
    applied, dirty = applied + 1, true
  end
end
if dirty then save() end
return {applied, repaired}
