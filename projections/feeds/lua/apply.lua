-- Applies work items to the inboxes of one or more recipients: each
-- recipient's items in order, the whole call atomically.
--
-- KEYS[1..k] the recipients' inboxes, feed:v<N>:{<uid>}:ix
-- ARGV[1]    the inbox cap (posts kept)
-- ARGV[2]    the inbox TTL in milliseconds (set when materialising)
-- ARGV[3]    l, the number of item lists that follow
-- then       the l lists, each: m, then m items, each: op, seq, floor, n,
--            post_1 .. post_n
--            op: 1 push, 2 remove, 3 merge, 4 unmerge, 5 materialise,
--            6 reconcile, which is followed by a, allowed_1 .. allowed_a
-- then       if l > 1, for each key in turn the number (1..l) of its list
--
-- One call carries many recipients, and recipients with the same items (the
-- followers a post is pushed to) share one list, so that a fan-out pays for
-- the script's entry and for reading the items once per call, not per push.
-- Redis Cluster refuses keys of different slots in one call, and every user's
-- keys are in their own slot: there the caller sends one recipient per call.
--
-- The inbox holds post ids as members scored by 2^53 minus themselves, so
-- newest first (>= 1), and two specials with negative scores, so they sort
-- before every post (ranks 0 and 1):
-- "f" = -(floor+1), the inbox is exactly the feed's posts with id >= floor; and
-- "s" = -(seq+1), the log sequence of the last item applied. An item whose seq
-- is not above it was applied before and is skipped. Only materialise creates
-- an inbox (with both specials); every other op on a missing inbox is skipped.
--
-- A push costs four commands when the inbox has room (move "s" to the item's
-- seq if it is newer, check the floor, count the posts, add the post) and
-- seven when it is full (read its two oldest posts, remove the oldest, add,
-- raise the floor); the zset never holds more than the cap and the two
-- specials, not even for a moment. Newest first is what makes a push into a
-- full inbox cheap: a listpack finds where a new entry goes by walking from
-- its head, so the newest post lands after two entries rather than after all
-- of them (a ZADD into 500 posts took 16 us in the other order, 3-5 us in this
-- one), and the oldest, which trimming takes, are at the tail.
--
-- Numbers go back to Redis through num(): Lua's own number-to-string
-- conversion keeps 14 digits, and ids have up to 16. Constant ranks are
-- written as strings: Redis formats every number argument with snprintf.
--
-- Returns {items applied, entries reconcile had to repair}.

-- Globals, as locals: the hot loop reads them for every push.
local rcall, tonumber, format, unpack = redis.call, tonumber, string.format, unpack
local KEYS, ARGV = KEYS, ARGV

local cap = tonumber(ARGV[1])
local ttl = ARGV[2]

local function num(x)
  return format('%d', x)
end

-- score is the score of post p (a number): newest first; member is its
-- member. Both are kept for the call: a fan-out puts the same posts into
-- many inboxes, and a lookup is cheaper than formatting them again.
local M = 9007199254740992 -- 2^53; every post id is below it
local scores, members = {}, {}
local function score(p)
  local s = scores[p]
  if not s then
    s = num(M - p)
    scores[p] = s
  end
  return s
end
local function member(p)
  local s = members[p]
  if not s then
    s = num(p)
    members[p] = s
  end
  return s
end

-- The item lists, read once: each item is {op, seq, floor, first, last,
-- afirst, alast, p}, where first .. last and afirst .. alast are the ARGV
-- indices of its posts and allowed posts and p is its only post as a number
-- (if it has one). A list that is a lone push has it as its field push, with
-- its post as a string in post, its score and "s"'s score after it.
--
-- Reading them converts only what is used: tonumber() of a string parses it
-- twice (Lua checks that it is a number, then converts it), and for the
-- runs of pushes into full inboxes these conversions were 8 % of the server's work.
-- An op and a post count of one are looked up as strings; a floor is read
-- only by the ops that use it.
local opOf = {['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5, ['6'] = 6}
local lists = {}
local i = 4
for l = 1, tonumber(ARGV[3]) do
  local list = {}
  for k = 1, tonumber(ARGV[i]) do
    local op = opOf[ARGV[i + 1]] or tonumber(ARGV[i + 1])
    local it = {op = op, seq = tonumber(ARGV[i + 2])}
    if op > 2 then it.floor = tonumber(ARGV[i + 3]) end
    local n = ARGV[i + 4]
    if n == '1' then n = 1 else n = tonumber(n) end
    it.first, it.last = i + 5, i + 4 + n
    i = it.last
    it.afirst, it.alast = 0, -1
    if op == 6 then
      it.afirst, it.alast = i + 2, i + 1 + tonumber(ARGV[i + 1])
      i = it.alast
    end
    if it.first == it.last then it.p = tonumber(ARGV[it.first]) end
    list[k] = it
  end
  -- A lone push: what a post's fan-out gives each follower.
  if #list == 1 and list[1].op == 1 and list[1].p then
    list.push = list[1]
    local it = list[1]
    it.post, it.score, it.s = ARGV[it.first], score(it.p), num(-(it.seq + 1))
    -- The specials scored below the post's -(p+1), once "s" is the item's:
    -- "f" if the floor is above the post, and "s" if the item's seq is.
    it.under = '(' .. num(-(it.p + 1))
    it.sUnder = 0
    if it.seq > it.p then it.sUnder = 1 end
  end
  lists[l] = list
  i = i + 1
end
-- With more than one list, ARGV[i + r - 1] is the list of KEYS[r].
local shared = #lists == 1 and lists[1]

-- The inbox being changed and what is known of it.
local key            -- KEYS[r]
local exists         -- whether it is materialised
local floor, seq     -- its specials, as they will be saved
local moved          -- whether seq changed since "s" was saved
local saved          -- the floor as stored (nil: none stored yet)
local count          -- its posts, or nil when not known
local dirty          -- whether an item was applied since the last save
local pend, npend = {}, 0 -- ZADD arguments (score, member, ...) not yet sent

-- flush sends the queued ZADD. Adds are queued so that a push's post and the
-- new "s" go in one command.
local function flush()
  if npend > 0 then
    rcall('ZADD', key, unpack(pend, 1, npend))
    npend = 0
  end
end

-- call runs a command on the inbox after the queued adds, so it sees them.
local function call(cmd, ...)
  flush()
  return rcall(cmd, key, ...)
end

-- queue adds member (a post id or a special) with score sc to the next ZADD.
local function queue(sc, member)
  pend[npend + 1], pend[npend + 2] = sc, member
  npend = npend + 2
  if npend >= 1000 then flush() end
end

-- posts is the number of posts in the inbox: its entries but the specials,
-- which an inbox always has both of.
local function posts()
  if not count then count = call('ZCARD') - 2 end
  return count
end

-- putOne adds post p (pn its number) if it is >= min, as put does, in as few
-- commands as it takes: the case of a push. It returns false, having done
-- nothing, if the inbox holds more than the cap (which was lowered): put trims.
local function putOne(p, pn, min)
  if pn < min then return true end
  local n = posts()
  if n < cap then
    -- Whether the inbox has it already does not matter: adding it again
    -- changes nothing. How many posts it has is then not known.
    queue(score(pn), p)
    count = nil
    return true
  end
  if n > cap then return false end
  -- Full: its oldest goes to make room, unless p is older or it has p.
  local old = call('ZRANGE', -math.min(n, 2), -1)
  local o1, o2 = tonumber(old[#old]), tonumber(old[#old - 1])
  if pn <= o1 then
    if pn < o1 then floor = o1 end -- p goes at once; o1 is the oldest kept
    return true
  end
  -- Newer than its newest, p is not in it; else it is looked up (a scan).
  if pn <= tonumber(call('ZRANGE', '2', '2')[1]) and call('ZSCORE', p) then return true end
  call('ZREMRANGEBYRANK', '-1', '-1')
  if o2 and o2 < pn then floor = o2 else floor = pn end
  queue(score(pn), p)
  return true
end

-- put adds the item's posts (it.posts, as numbers, if it has them, else its
-- arguments) that are >= min, keeping the cap newest posts; if any had to go,
-- the floor becomes the oldest kept. It makes room before it adds, so the zset
-- never holds more than the cap and the two specials: one that outgrew
-- zset-max-listpack-entries even for a moment would keep the large encoding for
-- good. It works on numbers, converted once: Lua sorts and compares them
-- natively, where strings each took a conversion per comparison.
local function put(it, min)
  if it.p and putOne(ARGV[it.first], it.p, min) then return end
  local cand, seen = {}, {}
  local src, lo, hi = it.posts, 1, 0
  if src then hi = #src else lo, hi = it.first, it.last end
  for j = lo, hi do
    local p
    if src then p = src[j] else p = tonumber(ARGV[j]) end
    if p >= min and not seen[p] then
      seen[p] = true
      cand[#cand + 1] = p
    end
  end
  if #cand == 0 then return end
  local n = posts()
  if n + #cand <= cap then
    -- Room for all of them (see putOne).
    for j = 1, #cand do queue(score(cand[j]), member(cand[j])) end
    count = nil
    return
  end

  -- The posts the inbox does not have yet. Those newer than its newest (a
  -- push's post, as a rule) are new without a lookup, which would scan it.
  local new, ask = {}, {}
  local newest = 0
  if n > 0 then newest = tonumber(call('ZRANGE', '2', '2')[1]) end
  for j = 1, #cand do
    if cand[j] > newest then new[#new + 1] = cand[j] else ask[#ask + 1] = cand[j] end
  end
  for c = 1, #ask, 500 do
    local chunk = {}
    for j = c, math.min(c + 499, #ask) do chunk[#chunk + 1] = member(ask[j]) end
    local sc = call('ZMSCORE', unpack(chunk))
    for j = 1, #chunk do
      if not sc[j] then new[#new + 1] = ask[c + j - 1] end
    end
  end
  table.sort(new)

  local drop = n + #new - cap
  local skip = 0 -- the oldest new posts, which are not added
  if drop > 0 then
    -- The drop oldest of the inbox and the new posts go. One more of the
    -- inbox's is read: if it stays, it may be the oldest kept. They are read
    -- from the tail, newest first, and turned oldest first.
    local cut, a, b = 0, nil, nil
    local pair = drop < n and call('ZRANGE', -(drop + 1), -drop)
    if pair and new[1] and new[1] > tonumber(pair[2]) then
      -- The new posts are all newer than the drop-th oldest of the inbox (as
      -- a run of pushes is): the drop oldest go, and only the two entries
      -- at the edge of the cut need reading.
      cut, a, b = drop, tonumber(pair[1]), new[1]
    else
      local k, tail = math.min(drop + 1, n), {}
      if k > 0 then tail = call('ZRANGE', -k, -1) end
      local old = {}
      for j = #tail, 1, -1 do old[#old + 1] = tonumber(tail[j]) end
      for _ = 1, drop do
        if cut < #old and (skip >= #new or old[cut + 1] < new[skip + 1]) then
          cut = cut + 1
        else
          skip = skip + 1
        end
      end
      a, b = old[cut + 1], new[skip + 1]
    end
    if cut > 0 then call('ZREMRANGEBYRANK', -cut, -1) end
    -- The floor becomes the oldest kept, the inbox's or a new one.
    if a and (not b or a < b) then floor = a else floor = b end
    count = cap
  else
    count = n + #new
  end
  for j = skip + 1, #new do queue(score(new[j]), member(new[j])) end
end

-- remove takes the item's posts out of the inbox.
local function remove(it)
  local args, gone = {}, 0
  for j = it.first, it.last do
    args[#args + 1] = ARGV[j]
    if #args >= 1000 or j == it.last then
      gone = gone + call('ZREM', unpack(args))
      args = {}
    end
  end
  if count then count = count - gone end
end

-- raise lifts the floor to f, dropping the posts below it (never the specials).
local function raise(f)
  if f > floor then
    local gone = call('ZREMRANGEBYSCORE', '(' .. score(f), '+inf')
    if count then count = count - gone end
    floor = f
  end
end

-- save stores the specials that changed, with the queued adds.
local function save()
  if floor ~= saved then
    queue(num(-(floor + 1)), 'f')
    saved = floor
  end
  if moved then
    queue(num(-(seq + 1)), 's')
    moved = false
  end
  flush()
  dirty = false
end

-- reconcile makes the inbox exactly the item's posts above the higher of its
-- floor and the item's, and counts what it had to change: entries above that
-- floor that should not be there (unless allowed: a big account's older posts,
-- which reads merge anyway), entries missing, and the entries beyond the cap of
-- those that remain. Entries below the floor are dropped uncounted when the
-- inbox is within its cap: the planner cannot vouch for them, but they are not
-- wrong.
local function reconcile(it)
  local f = math.max(floor, it.floor)
  local want, allowed, repairs = {}, {}, 0
  for j = it.first, it.last do
    if tonumber(ARGV[j]) >= f then want[ARGV[j]] = true end
  end
  for j = it.afirst, it.alast do allowed[ARGV[j]] = true end
  local have = call('ZRANGE', 2, -1)
  local present, remaining = {}, 0
  for _, p in ipairs(have) do
    present[p] = true
    if tonumber(p) >= f and not want[p] and not allowed[p] then
      call('ZREM', p)
      repairs = repairs + 1
    else
      remaining = remaining + 1
    end
  end
  count = remaining
  if remaining > cap then repairs = repairs + remaining - cap end
  for p in pairs(want) do
    if not present[p] then repairs = repairs + 1 end
  end
  raise(f)
  put(it, floor)
  return repairs
end

-- load reads the specials of the inbox.
local function load()
  exists, floor, seq, moved, saved, count, dirty = false, 0, 0, false, nil, nil, false
  local sc = rcall('ZMSCORE', key, 'f', 's')
  if sc[1] then
    exists = true
    floor = -tonumber(sc[1]) - 1
    saved = floor
    if sc[2] then seq = -tonumber(sc[2]) - 1 end
  end
end

local applied, repaired = 0, 0

for r = 1, #KEYS do
  key = KEYS[r]
  local list = shared or lists[tonumber(ARGV[i + r - 1])]
  local lone = list.push
  if lone then
    -- A lone push, the bulk of a fan-out, reads nothing it can do without:
    -- reading the specials' scores costs more than the add (Redis formats
    -- each as a double, Lua parses it back). "s" takes the item's seq at once
    -- if the inbox exists and the seq is above its own (LT: scores are
    -- -(seq+1)); else the push was applied before, or there is no inbox, and
    -- nothing is done. Then whether the post is below the floor is a count of
    -- the specials scored under the post's -(p+1) (whether "s" is among them
    -- is known), and whether the inbox has room is a count of its entries.
    if rcall('ZADD', key, 'XX', 'LT', 'CH', lone.s, 's') == 1 then
      applied = applied + 1
      if rcall('ZCOUNT', key, '-inf', lone.under) == lone.sUnder then
        local n = rcall('ZCARD', key) - 2
        if n < cap then
          rcall('ZADD', key, lone.score, lone.post)
        elseif n == cap and cap > 1 then
          -- Full: its oldest post o goes for the post, and the floor rises
          -- to the oldest kept, o2 or the post, unless the post is o or is
          -- older (then the floor rises to o), or the inbox had it (then o
          -- goes back).
          local tail = rcall('ZRANGE', key, '-2', '-1')
          local o, o2 = tonumber(tail[2]), tonumber(tail[1])
          if lone.p > o then
            rcall('ZREMRANGEBYRANK', key, '-1', '-1')
            if rcall('ZADD', key, lone.score, lone.post) == 1 then
              rcall('ZADD', key, num(-(math.min(o2, lone.p) + 1)), 'f')
            else
              rcall('ZADD', key, score(o), tail[2])
            end
          elseif lone.p < o then
            rcall('ZADD', key, num(-(o + 1)), 'f')
          end
        else
          -- Over the cap (it was lowered), or a cap of one: put trims.
          load()
          count = n
          put(lone, floor)
          save()
        end
      end
    end
  else
    load()
    local k = 1
    while k <= #list do
      local it = list[k]
      local op = it.op
      if op == 6 then
        -- At the planner's position, which the inbox may already have reached.
        if exists and it.seq >= seq then
          repaired = repaired + reconcile(it)
          seq, moved = it.seq, true
          applied, dirty = applied + 1, true
        end
      elseif op == 5 then
        if not exists then
          exists, floor, seq, moved, count = true, it.floor, it.seq, true, 0
          put(it, floor)
          save()
          call('PEXPIRE', ttl)
          applied = applied + 1
        end
      elseif op < 1 or op > 6 then
        if dirty then save() end
        return redis.error_reply('ERR feed apply: unknown op ' .. num(op))
      elseif op == 1 and exists and list[k + 1] and list[k + 1].op == 1 then
        -- A run of pushes (what a recipient gets from a batch of posts under
        -- load) is put at once: the inbox is read, trimmed and added to once,
        -- not once a post. The result is the pushes' one by one: put keeps the
        -- cap newest of the inbox and the posts, whatever their order, and a
        -- post that a push before it would have put below the floor is among
        -- the oldest, so it goes too. Each push is still skipped unless it is
        -- newer than the last item applied.
        local run = {posts = {}}
        while list[k] and list[k].op == 1 do
          local p = list[k]
          if p.seq > seq then
            if p.p then
              run.posts[#run.posts + 1] = p.p
            else
              for j = p.first, p.last do run.posts[#run.posts + 1] = tonumber(ARGV[j]) end
            end
            seq, moved = p.seq, true
            applied, dirty = applied + 1, true
          end
          k = k + 1
        end
        put(run, floor)
        k = k - 1
      elseif exists and it.seq > seq then
        if op == 1 then
          put(it, floor)
        elseif op == 2 then
          remove(it)
        elseif op == 3 then
          raise(math.max(floor, it.floor))
          put(it, floor)
        else
          remove(it)
          raise(math.max(floor, it.floor))
        end
        seq, moved = it.seq, true
        applied, dirty = applied + 1, true
      end
      k = k + 1
    end
    if dirty then save() end
  end
end
return {applied, repaired}
