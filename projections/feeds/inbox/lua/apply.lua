-- Applies work items to the inboxes of one or more recipients: each
-- recipient's items in order, the whole call atomically.
--
-- A function library (FUNCTION LOAD), not a script (EVAL): Redis runs a
-- library's code once, when it loads it, and a call runs only the function
-- it registers, NAME (feeds.NewFunction gives the library's name and NAME, both
-- named by a hash of this code). Everything this file defines is made once,
-- not per call: as a script, making its constants, tables and some 30
-- closures cost Redis more instructions a call than a lone push's commands.
-- What a call is given and finds lives in this file's locals too, set at
-- the start of each call (Redis runs one call at a time).
--
-- KEYS[1..k] the recipients' inboxes (their meta keys), feed:v<N>:{<uid>}:iy
-- ARGV[1]    the inbox cap (posts kept; see most below)
-- ARGV[2]    the inbox TTL in milliseconds (set when materialising)
-- ARGV[3]    S, the segment size (see below)
-- ARGV[4]    l, the number of item lists that follow
-- then       the l lists, each: m, then m items, each: op, seq, floor, n,
--            post_1 .. post_n
--            op: 1 push, 2 remove, 3 merge, 4 unmerge, 5 materialise,
--            6 reconcile, which is followed by a, allowed_1 .. allowed_a;
--            7 pushes, a run of k pushes of one post each: in place of its
--            seq and floor the bounds of the count that tells where it goes
--            (see run) as ZCOUNT takes them, the first push's "s" score and
--            -(lowest+1) after "(", and its n = 3k "posts" the pushes'
--            seqs, rising, then each push's score and post in turn, as
--            ZADD takes them
-- then       if l > 1, for each key in turn the number (1..l) of its list
--
-- One call carries many recipients, and recipients with the same items (the
-- followers a post is pushed to) share one list, so that a fan-out pays for
-- the script's entry and for reading the items once per call, not per push.
-- Redis Cluster refuses keys of different slots in one call, and every user's
-- keys are in their own slot: there the caller sends one recipient per call.
--
-- An inbox is segmented (docs/segmented-inboxes.md): its posts are spread
-- over zsets of about S posts, the segments <meta>:<g>:<k>, numbered t .. h
-- from the oldest to the newest; every post of segment k is newer than every
-- post of the segments below it. A listpack zset finds a member by walking it
-- from its head, so adding a post to a zset of the whole inbox walked up to
-- the cap's entries; a segment bounds that walk at about S. A post is scored
-- by 2^53 minus its id, newest first.
--
-- A small inbox, of at most S posts, keeps them in its meta, as the one
-- segment 0 (h = t = 0): a lone push into it is three commands on one key,
-- three quarters of what a push through the meta into a segment of its own
-- costs Redis. When a post would make it more than S, its posts move as they
-- are into segment 1, the head from then on; a rewrite with S or fewer puts
-- them back.
--
-- The meta zset holds these four members (five for a small inbox), and the
-- posts of segment 0:
-- "f" = -(floor+1), the inbox is exactly the feed's posts with id >= floor;
-- "s" = 2seq - 2^54, a log sequence: an item whose seq is not above it was
--       applied before, or comes from before what the inbox reflects, and
--       is skipped. Every item that takes anything out of the inbox or
--       makes it anew (a remove, unmerge, reconcile, materialise, trim,
--       rewrite) sets it to its own seq; a push that only adds its post
--       where it belongs need not. A push again, of a post still there,
--       changes nothing; one whose post has gone since went by one of those,
--       which set "s" above it. So "s" is at least the seq of the last item
--       that took anything out, at most that of the last item applied. A
--       push that only adds its posts to the head (see lone and run)
--       leaves it: it pays a count, not the rewrite of "s" (Redis deletes
--       and inserts a member whose score changes), which cost a lone push
--       into a small inbox a fifth of its instructions and a run of two
--       into a segmented one a tenth. Readers' caches hear of such a push
--       from the head, which it changes (a small inbox's head is its meta),
--       and of every other change from the meta, which it changes: page.lua
--       names both;
-- "b" = -(b+1), the head's lower bound: every post >= b belongs in segment h,
--       every post below it in a lower one; b >= floor;
-- "<g>:<h>/<r>/<t>", the layout, scored 0 (ZRANGEBYSCORE 0 0: the specials
--       are below it, the posts above):
--       g, the generation, names the segments: a new inbox takes a new one,
--       so that segments that outlived an old inbox's meta are never read;
--       h and t, the head and tail segment numbers (t <= h; segment t exists
--       unless t = h: Redis deletes an emptied zset, so a segment between them
--       may be missing, and readers skip it);
--       r, how many posts the segments below the head hold.
--       It is a member, not scores, because reading a score costs more than
--       the push it serves: Redis formats each as a double, Lua parses it back.
--       A push into the head reads only "<g>:<h>", the head's name, and r.
-- "m", scored -(2^53+2), only in a small inbox's meta: it marks it as small.
--       (Not -inf: a listpack keeps that as text, and each walk over the
--       meta would parse it.)
-- So the scores lie in three bands: "s" at or below -(2^53+4) (seqs are
-- below 2^52 - 1; even, so exact), "m" above it, and "f" and "b" from
-- -2^53 up. "f" and "b" are scored below every -(p+1) they are above, so a
-- count of the members from item q's "s" score to post p's -(p+1) (not
-- included) counts "m" in a small inbox, "s" if q was applied before, and
-- "f" and "b" if p is below them: 0, p goes into the head of a segmented
-- inbox (or there is no inbox); 1, into a small inbox if it has "m" (else
-- one of the others is counted); more, not simply. (A small inbox's b is
-- its floor.)
-- Only materialise creates an inbox; every other op on a missing inbox is
-- skipped. A meta without a layout is an inbox of the unsegmented layout
-- (its posts in it): it is deleted, and the next read materialises it anew.
--
-- Segments expire a second after the meta: while the meta lives, all of them do.
-- A new post newer than the head's lower bound goes into the head, or into a
-- new head when the head holds S (the posts move nowhere: the old head is
-- below it). Trimming takes the oldest posts from the tail. What does not
-- fit these (a merge of older posts, a post older than the head's bound) is
-- rewritten: the inbox is read whole, changed, and written back in segments
-- of S, the head the newest.
--
-- Numbers go back to Redis through num(): Lua's own number-to-string
-- conversion keeps 14 digits, and ids have up to 16. Constant ranks are
-- written as strings: Redis formats every number argument with snprintf.
--
-- Returns {items applied, entries reconcile had to repair}.

-- redis.call and string.format as locals, set by each call: the hot loop
-- reads them for every push. (A library's code sees no global but redis,
-- and redis without call, when it loads; its functions see them all.)
local rcall, format

-- The call's keys and arguments.
local KEYS, ARGV
-- The call's cap and TTL (ARGV[1], ARGV[2]) and S. No segment is given more
-- than the cap, so that a zset-max-listpack-entries of the cap and a few
-- keeps every one compact, whatever S. A head takes posts older than its
-- newest (log order is not quite id order) up to L, 2S; past that the inbox
-- is rewritten.
--
-- An inbox holds at most most = cap + S posts: one that would hold more is
-- trimmed to its cap newest. Trimming to the cap on every push cost a push
-- into a full inbox half its commands (the tail's oldest read and removed,
-- the floor and layout rewritten); trimmed S at a time, a push into a full
-- inbox is a push into one with room, and the trim is a segment's worth of
-- removals once every S posts.
local cap, ttl, S, L, most
-- How much longer than the meta a segment lives.
local margin = 1000

local function num(x)
  return format('%d', x)
end

-- score is the score of post p (a number): newest first; member is its
-- member. Both are kept for the call (scores and members are made anew by
-- each): a fan-out puts the same posts into many inboxes, and a lookup is
-- cheaper than formatting them again.
local M = 9007199254740992 -- 2^53; every post id is below it
local MARK = '-9007199254740994' -- "m"'s score, -(2^53+2)
-- A small inbox's meta: its posts are the members scored above POSTS (the
-- layout's 0), and it has SMALL members besides ("m", "f", "s", "b" and the
-- layout).
local POSTS, SMALL = '(0', 5
-- "s"'s score for seq q, and the seq of "s"'s score x (a number).
local SB = 18014398509481984 -- 2^54
local function sScore(q)
  return num(2 * q - SB)
end
local function seqOf(x)
  return (x + SB) / 2
end
local scores, members
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
-- its post as a string in post, its score, and the bounds of the count that
-- tells where it goes (see the meta above): lo, its "s" score, and under,
-- -(p+1), excluded.
--
-- Reading them converts only what is used, and a number once: tonumber() of
-- a string parses it twice (Lua checks that it is a number, then converts
-- it), arithmetic once, so the hot paths read a number as s + 0. An op and a
-- post count of one are looked up as strings; a floor is read only by the
-- ops that use it.
local opOf = {['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5, ['6'] = 6, ['7'] = 7}
-- count reads a count: counts of one are the most common, and the rest
-- repeat from list to list (a call's list numbers, its runs' lengths), so
-- each is converted once and kept in counts, which stays small (counts are
-- bounded by a call's size; it is emptied if it ever holds more than 4 096).
local counts, ncounts = {}, 0
local function count(s)
  if s == '1' then return 1 end
  local n = counts[s]
  if not n then
    n = tonumber(s)
    if ncounts >= 4096 then counts, ncounts = {}, 0 end
    counts[s], ncounts = n, ncounts + 1
  end
  return n
end
-- readList reads the item list at ARGV[i] (its number of items); it
-- returns it and the index of the argument after it.
local function readList(i)
  local list = {}
  for k = 1, count(ARGV[i]) do
    local op = opOf[ARGV[i + 1]] or tonumber(ARGV[i + 1])
    -- Made with every field it may take (false: none), so that it is
    -- made once, not grown field by field.
    local it = {
      op = op, seq = false, floor = false, first = 0, last = 0, afirst = 0, alast = -1, p = false,
      post = false, score = false, lo = false, under = false,
    }
    if op > 2 and op < 7 then it.floor = tonumber(ARGV[i + 3]) end
    it.first, it.last = i + 5, i + 4 + count(ARGV[i + 4])
    if op == 7 then
      -- Its last push's.
      it.seq = ARGV[it.first + (it.last - it.first + 1) / 3 - 1] + 0
    else
      it.seq = ARGV[i + 2] + 0
    end
    i = it.last
    if op == 6 then
      it.afirst, it.alast = i + 2, i + 1 + tonumber(ARGV[i + 1])
      i = it.alast
    end
    if it.first == it.last then it.p = ARGV[it.first] + 0 end
    list[k] = it
  end
  -- A lone push: what a post's fan-out gives each follower.
  if #list == 1 and list[1].op == 1 and list[1].p then
    list.push = list[1]
    local it = list[1]
    it.post, it.score = ARGV[it.first], score(it.p)
    it.lo, it.under = sScore(it.seq), '(' .. num(-(it.p + 1))
  end
  return list, i + 1
end
-- readLists reads the call's item lists; it returns them and the index of
-- the first argument after them, and the runs. A list that is a run alone
-- (what a recipient gets from a batch of posts under load) is a run: the
-- index of its number of items, in runs, read by run as it goes (its list
-- false), made a table only if the general way must take it: the tables
-- cost a run of two a fifth of what it cost Redis.
local function readLists()
  local lists, runs = {}, {}
  local i = 5
  for l = 1, count(ARGV[4]) do
    if ARGV[i] == '1' and ARGV[i + 1] == '7' then
      lists[l], runs[l] = false, i
      i = i + 5 + count(ARGV[i + 4])
    else
      lists[l], i = readList(i)
    end
  end
  return lists, runs, i
end

-- The inbox being changed and what is known of it. The fields of its meta
-- are kept as they will be saved, with what was last saved of each.
local key            -- KEYS[r], its meta
local exists         -- whether it is materialised
local floor, seq, b  -- "f", "s", "b"
local gen, h, t, r   -- the layout's (gen as a string of digits)
local was           -- the fields as stored (nil: not stored); the layout as lay
local segp           -- the segments' names without their number
local hc             -- the head's posts, or nil when not known
local life           -- a new segment's TTL in ms (0: none), or nil when not known
local dirty          -- whether an item was applied since the last save

-- Tables the general way fills anew for each inbox, made once: only their
-- first entries, as many as the use at hand fills, are read.
local addArgs, saveArgs, saveGone = {}, {}, {}

-- The general way: declared first, as they call each other.
local seg, postsOf, setGen, parse, layout, layoutOf, headCount, expireKey, expire, tailUp, oldest, add, readAll, writeAll, trim, addPosts, remove, raise, candidates, reconcile, load, save, materialise

function seg(k)
  if k == 0 then return key end
  return segp .. num(k)
end

-- postsOf returns the posts (strings) of segment k, newest first.
function postsOf(k)
  if k == 0 then return rcall('ZRANGEBYSCORE', key, POSTS, '+inf') end
  return rcall('ZRANGE', seg(k), '0', '-1')
end

-- setGen makes g (a string of digits) the inbox's generation.
function setGen(g)
  gen, segp = g, key .. ':' .. g .. ':'
end

-- parse makes the layout member m the inbox's; false if it is not one.
function parse(m)
  local g, hs, rs, ts = string.match(m, '^(%d+):(%d+)/(%d+)/(%d+)$')
  if not g then return false end
  setGen(g)
  h, r, t = tonumber(hs), tonumber(rs), tonumber(ts)
  return true
end

-- layout reads the meta's member scored 0, its layout if it has one.
function layout()
  return rcall('ZRANGEBYSCORE', key, '0', '0')[1] or ''
end

function layoutOf()
  return gen .. ':' .. num(h) .. '/' .. num(r) .. '/' .. num(t)
end

-- headCount is the number of posts in the head.
function headCount()
  if not hc then
    if h == 0 then
      hc = rcall('ZCARD', key) - SMALL
    else
      hc = rcall('ZCARD', seg(h))
    end
  end
  return hc
end

-- expireKey gives the segment named k the meta's life and a margin.
function expireKey(k)
  if not life then
    local ms = rcall('PTTL', key)
    if ms > 0 then life = ms + margin else life = 0 end
  end
  if life > 0 then rcall('PEXPIRE', k, num(life)) end
end

-- expire gives segment k the meta's life and a margin (segment 0, the meta,
-- has its own).
function expire(k)
  if k > 0 then expireKey(seg(k)) end
end

-- tailUp moves t to the lowest segment that exists, or to h.
function tailUp()
  while t < h and rcall('EXISTS', seg(t)) == 0 do t = t + 1 end
end

-- oldest is the oldest post of the inbox, or nil if it has none.
function oldest()
  for k = t, h do
    local o
    if k == 0 then
      o = rcall('ZREVRANGEBYSCORE', key, '+inf', POSTS, 'LIMIT', '0', '1')[1]
    else
      o = rcall('ZRANGE', seg(k), '-1', '-1')[1]
    end
    if o then return tonumber(o) end
  end
  return nil
end

-- add adds the posts ps (numbers, ascending) to segment k and returns how
-- many were not there.
function add(k, ps, from, to)
  if from > to then return 0 end
  local args, n = addArgs, 0
  for j = from, to do
    args[n + 1], args[n + 2] = score(ps[j]), member(ps[j])
    n = n + 2
  end
  return rcall('ZADD', seg(k), unpack(args, 1, n))
end

-- readAll returns every post of the inbox, as numbers, newest first.
function readAll()
  local all = {}
  for k = h, t, -1 do
    local ms = postsOf(k)
    for j = 1, #ms do all[#all + 1] = ms[j] + 0 end
  end
  return all
end

-- writeAll makes the inbox exactly the posts ps (numbers, any order, maybe
-- repeated), cut to the cap newest if more than most; if any had to go, the
-- floor becomes the oldest kept. S posts or fewer go into the meta (segment
-- 0); more are written anew in segments from t (1 if it was 0): the oldest S
-- posts in t, the next S in t+1, and so on; the head h has the newest, S or
-- fewer.
function writeAll(ps)
  table.sort(ps, function(x, y) return x > y end)
  local all, last = {}, nil
  for j = 1, #ps do
    if ps[j] ~= last and ps[j] >= floor then
      all[#all + 1] = ps[j]
      last = ps[j]
    end
  end
  if #all > most then
    for j = #all, cap + 1, -1 do all[j] = nil end
    floor = all[cap]
  end
  local old = {}
  for k = math.max(t, 1), h do old[#old + 1] = seg(k) end
  if #old > 0 then rcall('DEL', unpack(old)) end
  if t == 0 and hc ~= 0 then rcall('ZREMRANGEBYSCORE', key, POSTS, '+inf') end
  -- Oldest first, each segment's posts ascending: a listpack inserts a post
  -- with a lower score than all it holds at its head.
  local m = #all
  local nseg = math.max(1, math.ceil(m / S))
  if nseg == 1 then
    t = 0
  else
    t = math.max(t, 1)
  end
  local asc = {}
  for j = 1, m do asc[j] = all[m - j + 1] end
  for j = 0, nseg - 1 do
    local from, to = j * S + 1, math.min((j + 1) * S, m)
    if j == nseg - 1 then to = m end
    if from <= to then
      add(t + j, asc, from, to)
      expire(t + j)
    end
  end
  h = t + nseg - 1
  hc = m - (nseg - 1) * S
  r = m - hc
  b = floor
  if nseg > 1 then b = math.max(b, asc[(nseg - 1) * S] + 1) end
end

-- trim drops the oldest posts down to the cap if the inbox holds more than
-- most; if any went, the floor becomes the oldest kept.
function trim()
  local n = r + headCount()
  if n <= most then return end
  local d = n - cap
  while d > 0 do
    if t == h then
      rcall('ZREMRANGEBYRANK', seg(h), -d, '-1')
      hc = hc - d
      d = 0
    else
      local n = rcall('ZCARD', seg(t))
      if n <= d then
        if n > 0 then rcall('DEL', seg(t)) end
        r, d = r - n, d - n
        t = t + 1
        tailUp()
      else
        rcall('ZREMRANGEBYRANK', seg(t), -d, '-1')
        r, d = r - d, 0
      end
    end
  end
  floor = oldest() or floor
  b = math.max(b, floor)
end

-- addPosts adds posts (numbers, >= floor, no repeats) to the inbox, then
-- trims it. Posts at or above b go into the head or new heads above it
-- (a push, as a rule); if any is below b, or the head would outgrow L, the
-- inbox is rewritten.
function addPosts(ps)
  if #ps == 0 then return end
  for j = 1, #ps do
    if ps[j] < b then
      local all = readAll()
      for q = 1, #ps do all[#all + 1] = ps[q] end
      writeAll(all)
      return
    end
  end
  local n = headCount()
  if n + #ps <= S then
    table.sort(ps)
    hc = n + add(h, ps, 1, #ps)
    if n == 0 then expire(h) end -- a head emptied by removals is gone
    trim()
    return
  end
  if h == 0 then
    -- A small inbox outgrows its meta: its posts move as they are into
    -- segment 1 (no segment of its generation is left from before: a
    -- rewrite into the meta deletes them), the head from now on.
    rcall('ZRANGESTORE', seg(1), key, POSTS, '+inf', 'BYSCORE')
    rcall('ZREMRANGEBYSCORE', key, POSTS, '+inf')
    h, t = 1, 1
    expire(1)
  end
  -- The posts newer than the head's newest go above it; the others into it.
  local top = b - 1
  if n > 0 then top = tonumber(rcall('ZRANGE', seg(h), '0', '0')[1]) end
  local into, above = {}, {}
  for j = 1, #ps do
    if ps[j] <= top then into[#into + 1] = ps[j] else above[#above + 1] = ps[j] end
  end
  if n + #into > L then
    local all = readAll()
    for q = 1, #ps do all[#all + 1] = ps[q] end
    writeAll(all)
    return
  end
  table.sort(above)
  local room = math.max(0, S - n - #into)
  local first = math.min(room, #above)
  for j = 1, first do into[#into + 1] = above[j] end
  if first > 0 then top = above[first] end
  hc = n + add(h, into, 1, #into)
  if n == 0 and hc > 0 then expire(h) end
  -- The rest in new heads of S each.
  local j = first + 1
  while j <= #above do
    local to = math.min(j + S - 1, #above)
    r = r + hc
    h, b = h + 1, top + 1
    hc = add(h, above, j, to)
    expire(h)
    top = above[to]
    j = to + 1
  end
  trim()
end

-- remove takes the posts (strings) from ARGV[first .. last] out of the inbox.
function remove(first, last)
  for k = t, h do
    local gone = 0
    for c = first, last, 1000 do
      gone = gone + rcall('ZREM', seg(k), unpack(ARGV, c, math.min(c + 999, last)))
    end
    if k == h then
      if hc then hc = hc - gone end
    else
      r = r - gone
    end
  end
  tailUp()
end

-- raise lifts the floor to f, dropping the posts below it.
function raise(f)
  if f <= floor then return end
  for k = t, h do
    local gone = rcall('ZREMRANGEBYSCORE', seg(k), '(' .. score(f), '+inf')
    if k == h then
      if hc then hc = hc - gone end
    else
      r = r - gone
    end
    if rcall('EXISTS', seg(k)) == 1 then break end
  end
  floor = f
  b = math.max(b, f)
  tailUp()
end

-- candidates are the item's posts (numbers) >= min without repeats; given a
-- table of posts, those.
function candidates(it, min, src)
  local out, seen = {}, {}
  local lo, hi = 1, 0
  if src then hi = #src else lo, hi = it.first, it.last end
  for j = lo, hi do
    local p
    if src then p = src[j] else p = ARGV[j] + 0 end
    if p >= min and not seen[p] then
      seen[p] = true
      out[#out + 1] = p
    end
  end
  return out
end

-- reconcile makes the inbox exactly the item's posts above the higher of its
-- floor and the item's, and counts what it had to change: entries above that
-- floor that should not be there (unless allowed: a big account's older posts,
-- which reads merge anyway), entries missing, and the entries beyond most of
-- those that remain. Entries below the floor are dropped uncounted when the
-- inbox is within most: the planner cannot vouch for them, but they are not
-- wrong.
function reconcile(it)
  local f = math.max(floor, it.floor)
  local want, allowed, repairs = {}, {}, 0
  for j = it.first, it.last do
    local p = ARGV[j] + 0
    if p >= f then want[p] = true end
  end
  for j = it.afirst, it.alast do allowed[tonumber(ARGV[j])] = true end
  local have, kept, present = readAll(), {}, {}
  for _, p in ipairs(have) do
    present[p] = true
    if p >= f and not want[p] and not allowed[p] then
      repairs = repairs + 1
    else
      kept[#kept + 1] = p
    end
  end
  if #kept > most then repairs = repairs + #kept - most end
  for p in pairs(want) do
    if not present[p] then repairs = repairs + 1 end
  end
  floor = math.max(floor, f)
  for p in pairs(want) do kept[#kept + 1] = p end
  writeAll(kept)
  return repairs
end

-- load reads the meta of the inbox. An inbox of the unsegmented layout is
-- deleted: it does not exist.
function load()
  exists, floor, seq, b, hc, life, dirty = false, 0, 0, 0, nil, nil, false
  was = {}
  local sc = rcall('ZMSCORE', key, 'f', 's', 'b')
  if not sc[1] then return end
  local lay = layout()
  if not parse(lay) then
    rcall('DEL', key)
    return
  end
  exists = true
  floor = -sc[1] - 1
  seq = seqOf(sc[2] + 0)
  b = -sc[3] - 1
  was = {f = floor, s = seq, b = b, lay = lay, small = h == 0}
end

-- save stores the meta's fields that changed.
function save()
  local args, n, gone, g = saveArgs, 0, saveGone, 0
  if was.f ~= floor then
    args[n + 1], args[n + 2] = num(-(floor + 1)), 'f'
    n = n + 2
    was.f = floor
  end
  if was.s ~= seq then
    args[n + 1], args[n + 2] = sScore(seq), 's'
    n = n + 2
    was.s = seq
  end
  if was.b ~= b then
    args[n + 1], args[n + 2] = num(-(b + 1)), 'b'
    n = n + 2
    was.b = b
  end
  local lay = layoutOf()
  if lay ~= was.lay then
    if was.lay then
      g = g + 1
      gone[g] = was.lay
    end
    args[n + 1], args[n + 2] = '0', lay
    n = n + 2
    was.lay = lay
  end
  local small = h == 0
  if small ~= (was.small or false) then
    if small then
      args[n + 1], args[n + 2] = MARK, 'm'
      n = n + 2
    else
      g = g + 1
      gone[g] = 'm'
    end
    was.small = small
  end
  if g > 0 then rcall('ZREM', key, unpack(gone, 1, g)) end
  if n > 0 then rcall('ZADD', key, unpack(args, 1, n)) end
  dirty = false
end

-- materialise creates the inbox from the item's posts.
function materialise(it)
  local now = rcall('TIME')
  setGen(now[1] .. format('%06d', tonumber(now[2])))
  exists, floor, seq, b, h, t, r, hc = true, it.floor, it.seq, it.floor, 0, 0, 0, 0
  life = 0
  if ttl > 0 then life = ttl + margin end
  writeAll(candidates(it, floor))
  save()
  if ttl > 0 then rcall('PEXPIRE', key, num(ttl)) end
end


-- lone applies a lone push to the inbox key in as few commands as it takes.
-- It returns whether the push was applied.
local function lone(it)
  -- Reading the specials' scores costs more than the add (Redis formats
  -- each as a double, Lua parses it back). Where the post goes is a count
  -- (see the meta above): 1 and a small inbox with room, the post goes in,
  -- three commands, and "s" stays; 0, into the head of a segmented inbox if
  -- it has room.
  --
  -- A lone push is one post's fan-out: the only item of its seq for this
  -- recipient (the planner gives a recipient at most one item a log
  -- sequence, and materialise and reconcile, at the planner's position,
  -- come after the items of that sequence).
  local u = rcall('ZCOUNT', key, it.lo, it.under)
  if u == 1 then
    -- "m" alone, if the meta holds more than the four members of a
    -- segmented inbox's: a small inbox, the post at or above its floor, the
    -- push not applied before.
    local n = rcall('ZCARD', key) - SMALL
    if n >= 0 and n < S then
      -- Not added: there already, from this push before.
      return rcall('ZADD', key, it.score, it.post) == 1
    end
  elseif u == 0 then
    -- A segmented inbox (its meta has no posts, so its layout is last), the
    -- post at or above its head's bound, the push not applied before; or
    -- none.
    local lay = rcall('ZRANGE', key, '-1', '-1')[1]
    if not lay then return false end
    local hs, rs = string.match(lay, '^(%d+:%d+)/(%d+)/')
    if not hs then
      -- The unsegmented layout: gone, as if it had expired.
      rcall('DEL', key)
      return false
    end
    life = nil
    local head = key .. ':' .. hs
    local n = rcall('ZCARD', head)
    if n < S and tonumber(rs) + n < most then
      -- Room in the head and in the inbox: the post goes in, and the meta
      -- stays as it is (see "s" above).
      local added = rcall('ZADD', head, it.score, it.post)
      if n == 0 then expireKey(head) end -- a new head, or one emptied by removals
      return added == 1
    end
  end
  -- Anything else the general way: a small inbox that is full, a segmented
  -- one that needs a new head or a trim, a post below the head or the floor,
  -- a push applied before, the meta of another layout.
  load()
  if not exists or it.seq <= seq then return false end
  seq = it.seq
  addPosts(candidates(nil, floor, {it.p}))
  save()
  return true
end

-- run applies a run of pushes, an op 7 item alone in its list (what a
-- recipient gets from a batch of posts under load), the way lone applies
-- one push: in the case that holds nearly always, a segmented inbox whose
-- head takes every post and that needs no trim, in four commands and no
-- more Lua than they need. The general way costs a run some 200 000 Redis
-- instructions more (loading and saving the meta as fields, the posts'
-- tables), which made runs, not pushes, what Redis's thread spent itself on
-- under load. It returns the number of posts it added (those of a run
-- applied before are there already), or nil, having written nothing the
-- general way would not write again, when that must take it. Its list is
-- at ARGV[at] (see readLists): 1, then the item, 7, the bounds of its
-- count, n, and its n posts from at+5.
local function run(at)
  -- Its posts are ZADD's arguments as sent (ARGV[pa .. last]); its
  -- lowest tells where it goes, and its first seq whether it was applied
  -- before (its seqs rise: appendList), as a lone push's count does (see
  -- there): 0, into the head of a segmented inbox (or there is none);
  -- anything else the general way. The count's bounds are sent as ZCOUNT
  -- takes them, the first push's "s" score and -(lowest+1) after "(".
  local first, last = at + 5, at + 4 + count(ARGV[at + 4])
  local k = (last - first + 1) / 3
  local pa = first + k
  if rcall('ZCOUNT', key, ARGV[at + 2], ARGV[at + 3]) ~= 0 then return nil end
  -- A segmented inbox's meta has no posts: its layout is last. (A small
  -- one's last member is a post, no layout; none, no inbox.)
  local lay = rcall('ZRANGE', key, '-1', '-1')[1] or ''
  -- The usual case first, a head with room for the run and no trim, which
  -- needs only the head's name and r from the layout "<g>:<h>/<r>/<t>":
  -- taken apart with plain finds, it costs Redis a fifth of what parse's
  -- pattern and conversions do (the whole of it, in a run of two).
  local c = string.find(lay, '/', 1, true)
  if not c then return nil end -- a small inbox's post, or none
  local c2 = string.find(lay, '/', c + 1, true)
  if not c2 then return nil end
  local head = key .. ':' .. string.sub(lay, 1, c - 1)
  local n = rcall('ZCARD', head)
  -- A head that is new or emptied needs its TTL: the general way (so does
  -- a small inbox's, whose head is its meta). So does a run longer than L,
  -- the most a head holds.
  if n == 0 or k > L then return nil end
  if n + k <= S and string.sub(lay, c + 1, c2 - 1) + n + k <= most then
    -- The meta stays as it is (see "s" above).
    return rcall('ZADD', head, unpack(ARGV, pa, last))
  end
  if not parse(lay) or h == 0 then return nil end
  hc, life = nil, nil
  -- A head without room for the run: a new head takes it all if every post
  -- is newer than the head's newest (the general way fills the old head
  -- first; an emptier head is no less a segment), its lower bound above
  -- that newest. A run longer than S takes a head of its own this way, up
  -- to L posts (the general way would cut it into heads of S): a planner
  -- behind the log makes batches whose runs are longer than S, and sending
  -- those the general way made each of them dearer just when the appliers
  -- were behind.
  local top
  if n + k > S then
    top = tonumber(rcall('ZRANGE', seg(h), '0', '0')[1])
    -- Its lowest post p, sent as "(" .. -(p+1).
    if -string.sub(ARGV[at + 3], 2) - 1 <= top then return nil end
  end
  -- One that would hold more than most is trimmed to the cap, here only if
  -- the trim stays below the head (it does unless S is the cap), which
  -- leaves its bound as it is.
  local below = r
  if top then below = r + n end
  if r + n + k > most and r + n + k - cap >= below then return nil end
  -- Writes from here: a new head or a trim, which change the meta; "s"
  -- takes the run's seq with them (see "s" above).
  local new, added = false, 0
  if top then
    r, h, b = r + n, h + 1, top + 1
    added = rcall('ZADD', seg(h), unpack(ARGV, pa, last))
    hc = added
    expire(h)
    new = true
  else
    added = rcall('ZADD', seg(h), unpack(ARGV, pa, last))
    hc = n + added
  end
  local s = sScore(ARGV[pa - 1] + 0) -- its last push's
  if r + hc > most then
    -- The floor becomes the oldest kept, the layout changes; the bound
    -- stays (the trim stops below the head).
    if not new then b = 0 end -- not read: trim only raises it, and it is not written
    trim()
    rcall('ZREM', key, lay)
    if new then
      rcall('ZADD', key, s, 's', num(-(floor + 1)), 'f', num(-(b + 1)), 'b', '0', layoutOf())
    else
      rcall('ZADD', key, s, 's', num(-(floor + 1)), 'f', '0', layoutOf())
    end
  elseif new then
    rcall('ZREM', key, lay)
    rcall('ZADD', key, s, 's', num(-(b + 1)), 'b', '0', layoutOf())
  end
  return added
end

-- apply is the function the library registers: keys and args are the
-- call's KEYS and ARGV.
local capArg, ttlArg, sArg
local function apply(keys, args)
  KEYS, ARGV, rcall, format = keys, args, redis.call, string.format
  -- The same as the last call's, as a rule: Lua keeps one copy of each
  -- string, so comparing them costs less than parsing them.
  if ARGV[1] ~= capArg or ARGV[2] ~= ttlArg or ARGV[3] ~= sArg then
    capArg, ttlArg, sArg = ARGV[1], ARGV[2], ARGV[3]
    cap = tonumber(capArg)
    ttl = tonumber(ttlArg)
    S = math.min(tonumber(sArg), cap)
    L = math.min(2 * S, cap)
    most = cap + S
  end
  scores, members = {}, {}
  -- Nothing of the last call's inbox is kept: a call that raised an error
  -- stopped anywhere.
  key, exists, floor, seq, b, gen, h, t, r, was, segp, hc, life, dirty =
    nil, false, 0, 0, 0, nil, 0, 0, 0, {}, nil, nil, nil, false
  local lists, runs, i = readLists()
  -- With more than one list, ARGV[i + r - 1] is the list of KEYS[r].
  local single = #lists == 1
  local applied, repaired = 0, 0

  for q = 1, #KEYS do
    key = KEYS[q]
    local l = 1
    if not single then l = count(ARGV[i + q - 1]) end
    local list, at = lists[l], runs[l]
    local done
    if at then
      done = run(at)
      if done then
        applied = applied + done
      else
        list = readList(at)
      end
    elseif list.push then
      if lone(list.push) then applied = applied + 1 end
      done = true
    end
    if not done then
      load()
      local k = 1
      while k <= #list do
        local it = list[k]
        local op = it.op
        if op == 6 then
          -- At the planner's position, which the inbox may already have reached.
          if exists and it.seq >= seq then
            repaired = repaired + reconcile(it)
            seq = it.seq
            applied, dirty = applied + 1, true
          end
        elseif op == 5 then
          if not exists then
            materialise(it)
            applied = applied + 1
          end
        elseif op < 1 or op > 7 then
          if dirty then save() end
          return redis.error_reply('ERR feed apply: unknown op ' .. num(op))
        elseif (op == 1 or op == 7) and exists then
          -- A run of pushes (what a recipient gets from a batch of posts under
          -- load) is put at once, then trimmed once: if the inbox and the
          -- posts are more than most, the cap newest of them, whatever their
          -- order, are kept. (One by one, a trim might have come before the
          -- last pushes and kept more: both are the feed above the floor.)
          -- Each push is still skipped unless it is newer than the last item
          -- applied.
          local run = {}
          while list[k] and (list[k].op == 1 or list[k].op == 7) do
            local p = list[k]
            if p.op == 7 then
              -- Its scores and posts as sent: no need to format them again.
              -- If all of it is new (its sequences rise), no push's sequence
              -- but the first need be read.
              local c = (p.last - p.first + 1) / 3
              local pa = p.first + c
              local all = ARGV[p.first] + 0 > seq
              local took = 0
              for j = 0, c - 1 do
                if all or ARGV[p.first + j] + 0 > seq then
                  local post = ARGV[pa + 2 * j + 1]
                  local n = post + 0
                  members[n], scores[n] = post, ARGV[pa + 2 * j]
                  run[#run + 1] = n
                  took = took + 1
                end
              end
              -- The last push is among those taken if any is.
              if took > 0 then
                seq = p.seq
                applied, dirty = applied + took, true
              end
            elseif p.seq > seq then
              if p.p then
                run[#run + 1] = p.p
              else
                for j = p.first, p.last do run[#run + 1] = ARGV[j] + 0 end
              end
              seq = p.seq
              applied, dirty = applied + 1, true
            end
            k = k + 1
          end
          addPosts(candidates(nil, floor, run))
          k = k - 1
        elseif exists and it.seq > seq then
          if op == 2 then
            remove(it.first, it.last)
          elseif op == 3 then
            raise(math.max(floor, it.floor))
            addPosts(candidates(it, floor))
          elseif op == 4 then
            remove(it.first, it.last)
            raise(math.max(floor, it.floor))
          end
          seq = it.seq
          applied, dirty = applied + 1, true
        end
        k = k + 1
      end
      if dirty then save() end
    end
  end
  -- Nothing of this call is kept until the next.
  KEYS, ARGV, scores, members, was = nil, nil, nil, nil, nil
  return {applied, repaired}
end

redis.register_function(NAME, apply)
