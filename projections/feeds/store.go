package feeds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
)

// Config tunes a Store. Its zero value works: every zero field takes its
// default.
type Config struct {
	// InboxCap is how many posts an inbox keeps (default 500): once it has
	// that many it holds its InboxCap newest at least, and at most one
	// segment more (SegmentSize, or InboxCap if that is smaller); an inbox
	// that would hold more is trimmed back to its InboxCap newest. Redis's
	// zset-max-listpack-entries must be at least InboxCap+5 for every inbox
	// to stay in the compact encoding (see CheckListpack).
	InboxCap int
	// SegmentSize is how many posts one of an inbox's zsets takes from pushes
	// (default 100; see apply.lua). Smaller is cheaper to push into and costs
	// more keys; tests make it small to exercise the segments' edges.
	SegmentSize int
	// OutboxCap is how many posts an outbox keeps (default 500).
	OutboxCap int
	// TTL is how long an inbox lives after it was materialised or last read
	// (default 7 days). Expired users stop receiving pushes.
	TTL time.Duration
	// BigThreshold is the follower count above which an author becomes big:
	// not pushed to followers, their posts merged in at read time (default
	// 10000).
	BigThreshold int
	// BigMargin is how far below BigThreshold a big author's followers must
	// fall for it to be pushed again: it stays big while it has more than
	// BigThreshold − BigMargin (default BigThreshold/10; negative: none).
	// Each time an author stops being big its outbox is merged into every
	// follower's inbox, since its posts of the big period were never pushed:
	// without a margin, an author followed and unfollowed at the threshold
	// sent that merge to hundreds of inboxes at every unfollow (a bench graph
	// with 33 authors at exactly the threshold gave its appliers a storm of
	// some 500 merges every four seconds, 40 % of their time).
	BigMargin int
}

// isBig reports whether an author with n followers is big, given whether it
// was (see BigMargin).
func (c Config) isBig(n int64, was bool) bool {
	if was {
		return n > int64(c.BigThreshold-c.BigMargin)
	}
	return n > int64(c.BigThreshold)
}

const (
	stDefaultInboxCap     = 500
	stDefaultSegmentSize  = 100
	stDefaultOutboxCap    = 500
	stDefaultTTL          = 7 * 24 * time.Hour
	stDefaultBigThreshold = 10000

	// stWarmingTTL is how long a materialisation request suppresses repeats.
	stWarmingTTL = 30 * time.Second
)

// Key names below a keyspace version's prefix (feed:v<N>:). Persisted names:
// never rename them (see the package doc).
const (
	stBigKey         = "big"
	stWarmKey        = "warm"
	stPlannerPosKey  = "planner:pos"
	stInboxSuffix    = "iy"
	stOutboxSuffix   = "out"
	stFollowerSuffix = "fol"
	stFollowsSuffix  = "fng"
	stWarmingSuffix  = "warming"
)

// VersionKey holds the keyspace version readers and the live planner use
// (absent: 1). A rebuild builds the next version beside it and then moves it.
const VersionKey = "feed:version"

// KeyPrefix is the prefix of every key of keyspace version v.
func KeyPrefix(v int64) string { return "feed:v" + strconv.FormatInt(v, 10) + ":" }

// key names a global key of the store's keyspace.
func (s *Store) key(name string) string { return s.prefix + name }

// userKey names one of a user's keys; the user id is the hash tag, so all of a
// user's keys live in one Redis Cluster slot.
func (s *Store) userKey(u domain.UserID, suffix string) string {
	return s.prefix + "{" + strconv.FormatInt(int64(u), 10) + "}:" + suffix
}

func stWithDefaults(c Config) Config {
	if c.InboxCap <= 0 {
		c.InboxCap = stDefaultInboxCap
	}
	if c.SegmentSize <= 0 {
		c.SegmentSize = stDefaultSegmentSize
	}
	if c.OutboxCap <= 0 {
		c.OutboxCap = stDefaultOutboxCap
	}
	if c.TTL <= 0 {
		c.TTL = stDefaultTTL
	}
	if c.BigThreshold <= 0 {
		c.BigThreshold = stDefaultBigThreshold
	}
	switch {
	case c.BigMargin == 0:
		c.BigMargin = c.BigThreshold / 10
	case c.BigMargin < 0:
		c.BigMargin = 0
	}
	c.BigMargin = min(c.BigMargin, c.BigThreshold)
	return c
}

// Store reads and writes the feeds of one keyspace version in Redis. It is
// safe for concurrent use.
type Store struct {
	rdb       redis.UniversalClient
	cfg       Config
	apply     *stFunction
	page      *stFunction
	outboxAdd *stFunction
	version   int64
	prefix    string
	// batch is whether one apply script call may carry many recipients: only
	// on a single Redis, where keys of different slots can go together.
	batch bool
	// repairs counts the inbox entries reconciliation had to fix: in a correct
	// system it stays at zero. Shared by the stores of every version.
	repairs *atomic.Int64
}

// Repairs is the number of inbox entries reconciliation had to fix so far.
func (s *Store) Repairs() int64 { return s.repairs.Load() }

// NewStore returns a store of keyspace version 1 over rdb (a client, a
// cluster client or a ring); At gives the other versions.
func NewStore(rdb redis.UniversalClient, cfg Config) *Store {
	s := &Store{
		rdb:       rdb,
		cfg:       stWithDefaults(cfg),
		apply:     stApply,
		page:      stPage,
		outboxAdd: stOutboxAdd,
		repairs:   new(atomic.Int64),
	}
	// A failover (Sentinel) client is a *redis.Client too: one master.
	_, s.batch = rdb.(*redis.Client)
	return s.At(1)
}

// At returns the store of keyspace version v, sharing s's client and
// configuration.
func (s *Store) At(v int64) *Store {
	if v == s.version {
		return s
	}
	c := *s
	c.version, c.prefix = v, KeyPrefix(v)
	return &c
}

// Version is the store's keyspace version.
func (s *Store) Version() int64 { return s.version }

// ActiveVersion reads the keyspace version in use.
func (s *Store) ActiveVersion(ctx context.Context) (int64, error) {
	v, err := s.rdb.Get(ctx, VersionKey).Int64()
	if errors.Is(err, redis.Nil) {
		return 1, nil
	}
	if err != nil {
		return 0, stFail("read the feeds' keyspace version", err)
	}
	return v, nil
}

// Active returns the store of the keyspace version in use.
func (s *Store) Active(ctx context.Context) (*Store, error) {
	v, err := s.ActiveVersion(ctx)
	if err != nil {
		return nil, err
	}
	return s.At(v), nil
}

// Config returns the store's configuration with the defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Op is what a work item does to an inbox. Its values are sent to the apply
// script: never reorder them.
type Op uint8

// The work item operations.
const (
	// OpPush adds a new post (if it is not below the inbox floor).
	OpPush Op = iota + 1
	// OpRemove removes a deleted post.
	OpRemove
	// OpMerge merges a newly followed author's outbox: raises the floor to the
	// item's and adds the posts at or above it.
	OpMerge
	// OpUnmerge removes an unfollowed author's posts and raises the floor to the
	// item's.
	OpUnmerge
	// OpMaterialise creates a missing inbox from the given posts and floor.
	OpMaterialise
	// OpReconcile makes an existing inbox exactly the given posts above the
	// higher of its floor and the item's, tolerating Allowed posts, and counts
	// the entries it had to repair (see Store.Repairs).
	OpReconcile
)

func (o Op) String() string {
	switch o {
	case OpPush:
		return "push"
	case OpRemove:
		return "remove"
	case OpMerge:
		return "merge"
	case OpUnmerge:
		return "unmerge"
	case OpMaterialise:
		return "materialise"
	case OpReconcile:
		return "reconcile"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Item is one change to one recipient's inbox.
type Item struct {
	Recipient domain.UserID
	// Seq is the log sequence the item comes from (for materialise, the
	// planner's position when it read the outboxes). An inbox skips items at or
	// below the last sequence it applied, which makes redelivery harmless.
	Seq uint64
	Op  Op
	// Posts: exactly one for push and remove; the author's outbox posts for
	// merge and unmerge; the followees' posts for materialise.
	Posts []domain.PostID
	// Floor is, for merge and unmerge, the author's outbox floor and, for
	// materialise and reconcile, the lowest id from which Posts are complete.
	Floor int64
	// Allowed, for reconcile, are posts the inbox may hold or not (big accounts'
	// posts pushed before they grew big: reads merge them anyway).
	Allowed []domain.PostID `json:",omitempty"`
}

func stCheckItem(it Item) error {
	switch {
	case it.Recipient <= 0:
		return fmt.Errorf("recipient %d is not a user id: %w", it.Recipient, domain.ErrInvalid)
	case it.Op < OpPush || it.Op > OpReconcile:
		return fmt.Errorf("unknown op %d: %w", it.Op, domain.ErrInvalid)
	case (it.Op == OpPush || it.Op == OpRemove) && len(it.Posts) != 1:
		return fmt.Errorf("%s carries %d posts, not one: %w", it.Op, len(it.Posts), domain.ErrInvalid)
	case it.Seq > stMaxSeq:
		return fmt.Errorf("seq %d is above 2^52-2: %w", it.Seq, domain.ErrInvalid)
	case it.Floor < 0 || it.Floor >= domain.MaxID:
		return fmt.Errorf("floor %d outside [0, 2^53): %w", it.Floor, domain.ErrInvalid)
	}
	for _, p := range it.Posts {
		if p <= 0 || p >= domain.MaxID {
			return fmt.Errorf("post %d outside [1, 2^53): %w", p, domain.ErrInvalid)
		}
	}
	return nil
}

// stCallArgs bounds the arguments of an apply call that carries several
// recipients, and of a round trip of calls. A post's pushes to hundreds of
// followers share a call, which is what makes them cheap; a call carries at
// most about one whole-outbox merge or materialisation (some 500 posts each),
// and a round trip one call on a single Redis, so that an applier keeps Redis
// from its other clients (the planner, readers, the other appliers) for about
// a millisecond at a time. Redis runs every command a client's read brought
// (16 KiB) before it turns to the next client: pipelining all of a message's
// calls put some 10 ms of an applier's work ahead of each of the planner's
// round trips under the bench's load, and the planner makes four a batch.
const stCallArgs = 512

// stCatchUpItems and stCatchUpArgs: a message of stCatchUpItems items or more
// is sent in round trips of up to stCatchUpArgs arguments, four calls each,
// not one. Only a batch of hundreds of events makes a message that large, and
// the planner's batches grow that large only while the feeds are behind
// (PendingWork). Then each recipient's run is long, a call carries about one
// recipient, and a round trip of one call waited some 10 ms for about 1 ms of
// Redis's work under the bench's load (README, session 26): the appliers were
// bound by their round trips at about the input's rate, so lag that built up
// never drained. Four calls a trip spread that wait over four times the work;
// while the feeds keep up, messages are smaller and the planner's round trips
// wait behind no more than one call (decision 40).
const (
	stCatchUpItems = 4000
	stCatchUpArgs  = 4 * stCallArgs
)

// stApplyCall is one run of the apply script: the items of its recipients,
// one inbox key each, as lists of items that recipients with the same items
// share (see apply.lua).
type stApplyCall struct {
	recipients []domain.UserID
	keys       []string
	// lists holds the call's script arguments as they are known: four slots
	// for the cap, the TTL, the segment size and the number of lists (filled
	// in by args), then the item lists. Kept as one slice so that a call's arguments are not
	// copied again before the client's own copy.
	lists  []any
	nlists int
	refs   []any // each key's list, from 1
	// shared finds the lists of single items (see stShareable).
	shared map[stItem]int
}

func stNewApplyCall() *stApplyCall {
	return &stApplyCall{lists: make([]any, 4, 64), shared: map[stItem]int{}}
}

// stItem is a work item with at most one post, as a map key.
type stItem struct {
	op    Op
	seq   uint64
	floor int64
	post  domain.PostID // 0: none
}

// stShareable reports whether a recipient's items can share a list with
// other recipients': a single item with at most one post, such as the push of
// a post to its author's followers or the removal of a deleted one.
func stShareable(items []Item) (stItem, bool) {
	if len(items) != 1 || len(items[0].Posts) > 1 || items[0].Op == OpMaterialise || items[0].Op == OpReconcile {
		return stItem{}, false
	}
	it := items[0]
	k := stItem{op: it.Op, seq: it.Seq, floor: it.Floor}
	if len(it.Posts) == 1 {
		k.post = it.Posts[0]
	}
	return k, true
}

// size bounds the number of the call's script arguments.
func (c *stApplyCall) size() int { return len(c.lists) + len(c.refs) }

// args are the call's script arguments.
func (c *stApplyCall) args(cfg Config) []any {
	ttl := max(cfg.TTL.Milliseconds(), 1)
	c.lists[0], c.lists[1] = strconv.Itoa(cfg.InboxCap), strconv.FormatInt(ttl, 10)
	c.lists[2], c.lists[3] = strconv.Itoa(cfg.SegmentSize), strconv.Itoa(c.nlists)
	if c.nlists == 1 {
		return c.lists // every key has the one list
	}
	// A copy: args is called again when the script must be loaded first.
	return append(c.lists[:len(c.lists):len(c.lists)], c.refs...)
}

// String names the call's recipients in errors.
func (c *stApplyCall) String() string {
	if len(c.recipients) == 1 {
		return fmt.Sprintf("user %d", c.recipients[0])
	}
	return fmt.Sprintf("user %d and %d others", c.recipients[0], len(c.recipients)-1)
}

// ApplyItems applies items to their recipients' inboxes and returns how many
// were applied (the rest were skipped: applied before, or the inbox is not
// materialised). Items of the same recipient are applied in the order given, all
// in one script run, so that no item can take effect after a later one of the
// same recipient failed. On a single Redis one script run carries many
// recipients (see stCallArgs); on a Cluster, which refuses keys of different
// slots in one run, or a Ring, it carries one. The runs are sent in rounds of
// about stCallArgs arguments, one round trip each (see stCallArgs), or of
// stCatchUpArgs when the items are stCatchUpItems or more. Invalid
// items fail the whole call before anything is written. On an error some
// recipients may have been updated; applying the same items again is safe.
func (s *Store) ApplyItems(ctx context.Context, items []Item) (applied int, err error) {
	return s.applyItems(ctx, items, nil)
}

// applyItems is ApplyItems, telling round, if not nil, how long each round
// trip took.
func (s *Store) applyItems(ctx context.Context, items []Item, round func(time.Duration)) (applied int, err error) {
	if len(items) == 0 {
		return 0, nil
	}
	for i, it := range items {
		if err := stCheckItem(it); err != nil {
			return 0, fmt.Errorf("apply feed items: item %d: %w", i, err)
		}
	}
	calls := s.stPack(items)
	trip := stCallArgs
	if len(items) >= stCatchUpItems {
		trip = stCatchUpArgs
	}
	for len(calls) > 0 {
		k, size := 1, calls[0].size()
		for k < len(calls) && size+calls[k].size() <= trip {
			size += calls[k].size()
			k++
		}
		start := time.Now()
		n, err := s.stRunRound(ctx, calls[:k])
		if round != nil {
			round(time.Since(start))
		}
		applied += n
		if err != nil {
			return applied, err
		}
		calls = calls[k:]
	}
	return applied, nil
}

// stRunRound runs calls in one round trip, and again those Redis refused for
// want of the function, once it is loaded.
func (s *Store) stRunRound(ctx context.Context, calls []*stApplyCall) (applied int, err error) {
	n, retry, err := s.stRunApply(ctx, calls)
	applied += n
	if err == nil && len(retry) > 0 {
		// Redis lacked the function (a new Redis, a restart without
		// persistence, FUNCTION FLUSH). The calls that failed wrote nothing, so
		// loading it and running them again keeps every recipient's order.
		if err := s.apply.Load(ctx, s.rdb); err != nil {
			return applied, stFail("apply feed items", err)
		}
		n, retry, err = s.stRunApply(ctx, retry)
		applied += n
		if err == nil && len(retry) > 0 {
			err = fmt.Errorf("apply feed items for %s: Lua functions flushed twice: %w", retry[0], domain.ErrUnavailable)
		}
	}
	return applied, err
}

// stPack packs the items into script runs: each recipient's items, in the
// order given, as one list, in one run.
func (s *Store) stPack(items []Item) []*stApplyCall {
	// order lists the items by recipient, the recipients in the order they
	// first appear, each one's items in the order given.
	group := make(map[domain.UserID]int)
	groups := make([]int, len(items))
	order := make([]int, len(items))
	for i, it := range items {
		g, ok := group[it.Recipient]
		if !ok {
			g = len(group)
			group[it.Recipient] = g
		}
		groups[i], order[i] = g, i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(groups[a], groups[b]) })

	var (
		calls []*stApplyCall
		mine  []Item // one recipient's items
		list  []any  // their list's arguments
	)
	for lo := 0; lo < len(order); {
		r := items[order[lo]].Recipient
		mine = mine[:0]
		for ; lo < len(order) && items[order[lo]].Recipient == r; lo++ {
			mine = append(mine, items[order[lo]])
		}
		if len(calls) == 0 || !s.batch {
			calls = append(calls, stNewApplyCall())
		}
		c := calls[len(calls)-1]
		key, shareable := stShareable(mine)
		ref, ok := c.shared[key]
		if !shareable || !ok || c.size()+1 > stCallArgs {
			list = s.stAppendList(list[:0], mine)
			if len(c.recipients) > 0 && c.size()+len(list)+1 > stCallArgs {
				c = stNewApplyCall()
				calls = append(calls, c)
			}
			c.lists = append(c.lists, list...)
			c.nlists++
			ref = c.nlists
			if shareable {
				c.shared[key] = ref
			}
		}
		c.recipients = append(c.recipients, r)
		c.keys = append(c.keys, s.userKey(r, stInboxSuffix))
		c.refs = append(c.refs, strconv.Itoa(ref))
	}
	return calls
}

// stOpPushes is the script's op for a run of k pushes of one post each, sent
// as one item: 7, the first push's "s" score, the lowest post p's -(p+1)
// after "(" (the bounds of the count by which the script tells where the run
// goes, as its ZCOUNT takes them), 3k, then each push's seq, rising, then each
// push's score and post, as ZADD takes them (see apply.lua). A run is what a
// recipient gets from a batch of posts under load; as one item it costs the
// script no table and two arguments fewer a push, and the script neither
// parses nor formats its posts to add them, nor the bounds of its count.
// (Sent as three more arguments, the bounds and the last push's "s" score
// cost Redis fewer instructions a run but made a call carry a fifth fewer
// runs: the appliers' round trips, not Redis's work, set the bench's pace.)
const stOpPushes = 7

// stSeqScore is an inbox's "s" score for log sequence seq, 2seq - 2^54.
func stSeqScore(seq uint64) string { return strconv.FormatInt(int64(2*seq)-1<<54, 10) }

// stAppendList appends the script arguments of a recipient's list: the
// number of items, then each item, runs of two or more pushes of one post
// as one stOpPushes item.
func (s *Store) stAppendList(args []any, items []Item) []any {
	at := len(args)
	args = append(args, nil) // the count, known at the end
	n := 0
	for j := 0; j < len(items); n++ {
		e := j
		// A run's sequences rise, which apply.lua relies on: the planner's
		// items of a recipient always do.
		for e < len(items) && items[e].Op == OpPush && len(items[e].Posts) == 1 && (e == j || items[e].Seq > items[e-1].Seq) {
			e++
		}
		if e-j < 2 {
			args = s.stAppendItem(args, items[j])
			j++
			continue
		}
		run := items[j:e]
		low := run[0].Posts[0]
		for _, it := range run[1:] {
			low = min(low, it.Posts[0])
		}
		args = append(args, strconv.Itoa(stOpPushes), stSeqScore(run[0].Seq), "("+strconv.FormatInt(-int64(low)-1, 10), strconv.Itoa(3*len(run)))
		for _, it := range run {
			args = append(args, strconv.FormatUint(it.Seq, 10))
		}
		for _, it := range run {
			args = append(args, strconv.FormatInt(inboxScore(it.Posts[0]), 10), strconv.FormatInt(int64(it.Posts[0]), 10))
		}
		j = e
	}
	args[at] = strconv.Itoa(n)
	return args
}

// stAppendItem appends the script arguments of one item: op, seq, floor, n,
// posts.
func (s *Store) stAppendItem(args []any, it Item) []any {
	posts, floor := it.Posts, it.Floor
	if it.Op == OpMaterialise || it.Op == OpReconcile {
		posts, floor = stNewest(posts, floor, s.cfg.InboxCap)
	}
	args = append(args,
		strconv.Itoa(int(it.Op)),
		strconv.FormatUint(it.Seq, 10),
		strconv.FormatInt(floor, 10),
		strconv.Itoa(len(posts)))
	for _, p := range posts {
		args = append(args, strconv.FormatInt(int64(p), 10))
	}
	if it.Op == OpReconcile {
		args = append(args, strconv.Itoa(len(it.Allowed)))
		for _, p := range it.Allowed {
			args = append(args, strconv.FormatInt(int64(p), 10))
		}
	}
	return args
}

// stNewest returns the at most limit newest posts at or above floor, and the
// floor from which they are complete: the lowest kept when some were cut. This
// is exactly what trimming the new inbox would keep, without sending the posts
// a cold user's many followees have that trimming would drop.
func stNewest(posts []domain.PostID, floor int64, limit int) ([]domain.PostID, int64) {
	kept := make([]domain.PostID, 0, len(posts))
	for _, p := range posts {
		if int64(p) >= floor {
			kept = append(kept, p)
		}
	}
	if len(kept) <= limit {
		return kept, floor
	}
	slices.SortFunc(kept, func(a, b domain.PostID) int { return cmp.Compare(b, a) })
	kept = slices.Compact(kept)
	if len(kept) <= limit {
		return kept, floor
	}
	kept = kept[:limit]
	return kept, int64(kept[limit-1])
}

// stRunApply pipelines the calls and returns how many items they applied and
// the calls refused because Redis lacked the function.
func (s *Store) stRunApply(ctx context.Context, calls []*stApplyCall) (applied int, missing []*stApplyCall, err error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = s.apply.FCall(ctx, pipe, c.keys, c.args(s.cfg)...)
	}
	_, _ = pipe.Exec(ctx) // each command's error is looked at below
	for i, cmd := range cmds {
		res, cerr := cmd.Int64Slice()
		switch {
		case cerr == nil && len(res) == 2:
			applied += int(res[0])
			s.repairs.Add(res[1])
		case cerr == nil:
			err = fmt.Errorf("apply feed items for %s: unexpected answer %v", calls[i], res)
		case stMissingFunction(cerr):
			missing = append(missing, calls[i])
		case err == nil:
			err = stFail(fmt.Sprintf("apply feed items for %s", calls[i]), cerr)
		}
	}
	return applied, missing, err
}

// AddToOutbox adds post to author's outbox, trimming it to OutboxCap and
// raising its floor. A post below the floor is ignored, so a replay is harmless.
func (s *Store) AddToOutbox(ctx context.Context, author domain.UserID, post domain.PostID) error {
	key := s.userKey(author, stOutboxSuffix)
	err := s.outboxAdd.Run(ctx, s.rdb, []string{key}, strconv.FormatInt(int64(post), 10), strconv.Itoa(s.cfg.OutboxCap)).Err()
	if err != nil {
		return stFail(fmt.Sprintf("add post %d to outbox of user %d", post, author), err)
	}
	return nil
}

// OutboxChange adds a new post to its author's outbox or removes a deleted one.
type OutboxChange struct {
	Author domain.UserID
	Post   domain.PostID
	Remove bool
}

// RemoveFromOutbox removes post from author's outbox (its floor stays).
func (s *Store) RemoveFromOutbox(ctx context.Context, author domain.UserID, post domain.PostID) error {
	if err := s.rdb.ZRem(ctx, s.userKey(author, stOutboxSuffix), strconv.FormatInt(int64(post), 10)).Err(); err != nil {
		return stFail(fmt.Sprintf("remove post %d from outbox of user %d", post, author), err)
	}
	return nil
}

// Outbox is an author's recent posts.
type Outbox struct {
	// Posts are newest first.
	Posts []domain.PostID
	// Floor: Posts are exactly the author's live posts with id >= Floor.
	Floor int64
}

// Outboxes returns the outboxes of authors; an author without one gets an empty
// outbox with floor 0 (no posts at all).
func (s *Store) Outboxes(ctx context.Context, authors []domain.UserID) (map[domain.UserID]Outbox, error) {
	out := make(map[domain.UserID]Outbox, len(authors))
	if len(authors) == 0 {
		return out, nil
	}
	pipe := s.rdb.Pipeline()
	reads := make([]outboxRead, len(authors))
	for i, a := range authors {
		reads[i] = s.queueWholeOutbox(ctx, pipe, a)
	}
	_, _ = pipe.Exec(ctx) // each command's error is looked at below
	for i, r := range reads {
		ob, err := r.outbox()
		if err != nil {
			return nil, err
		}
		out[authors[i]] = ob
	}
	return out, nil
}

// outboxRead is a queued read of an author's whole outbox: its floor, and
// its posts without their scores. With scores (WITHSCORES) Redis formats
// each as a double: 245 µs of Redis an outbox of 500 posts against 20 µs
// without (redis-benchmark, one client's loopback), and 3.6 % of Redis's
// time in the bench's mixed phase, where every reconcile and
// materialisation reads the outboxes of all the user's followees. Two
// commands, not one atomic read: only the planner writes outboxes, and it
// reads them itself, between its writes.
type outboxRead struct {
	author domain.UserID
	pageSource
}

// queueWholeOutbox queues the read of author's whole outbox on pipe: the
// read of a page's outbox (queueOutbox) with every post.
func (s *Store) queueWholeOutbox(ctx context.Context, pipe redis.Pipeliner, author domain.UserID) outboxRead {
	return outboxRead{author: author, pageSource: s.queueOutbox(ctx, pipe, author, &redis.ZRangeBy{Min: "(0", Max: "+inf"})}
}

// outbox is what the read found: an author without an outbox has none, at
// floor 0.
func (r outboxRead) outbox() (Outbox, error) {
	what := fmt.Sprintf("read outbox of user %d", r.author)
	f, err := r.floor.Result()
	switch {
	case errors.Is(err, redis.Nil):
		f = -1 // floor 0
	case err != nil:
		return Outbox{}, stFail(what, err)
	}
	ms, err := r.posts.Result()
	if err != nil {
		return Outbox{}, stFail(what, err)
	}
	ob := Outbox{Posts: make([]domain.PostID, 0, len(ms)), Floor: stSpecial(f)}
	for _, m := range ms {
		p, err := stParsePost(m)
		if err != nil {
			return Outbox{}, fmt.Errorf("%s: %w", what, err)
		}
		ob.Posts = append(ob.Posts, p)
	}
	return ob, nil
}

// Follow records that follower follows followee. The two sets live in
// different slots, so the writes are not atomic; both are idempotent and the
// planner replays them after a crash.
func (s *Store) Follow(ctx context.Context, follower, followee domain.UserID) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.SAdd(ctx, s.userKey(followee, stFollowerSuffix), int64(follower))
		p.SAdd(ctx, s.userKey(follower, stFollowsSuffix), int64(followee))
		return nil
	})
	if err != nil {
		return stFail(fmt.Sprintf("record user %d follows %d", follower, followee), err)
	}
	return nil
}

// Unfollow records that follower no longer follows followee.
func (s *Store) Unfollow(ctx context.Context, follower, followee domain.UserID) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.SRem(ctx, s.userKey(followee, stFollowerSuffix), int64(follower))
		p.SRem(ctx, s.userKey(follower, stFollowsSuffix), int64(followee))
		return nil
	})
	if err != nil {
		return stFail(fmt.Sprintf("record user %d unfollows %d", follower, followee), err)
	}
	return nil
}

// Followers returns the users who follow user, in no particular order.
func (s *Store) Followers(ctx context.Context, user domain.UserID) ([]domain.UserID, error) {
	return s.stUsers(ctx, s.userKey(user, stFollowerSuffix), fmt.Sprintf("read followers of user %d", user))
}

// FollowerCount returns how many users follow user.
func (s *Store) FollowerCount(ctx context.Context, user domain.UserID) (int64, error) {
	n, err := s.rdb.SCard(ctx, s.userKey(user, stFollowerSuffix)).Result()
	if err != nil {
		return 0, stFail(fmt.Sprintf("count followers of user %d", user), err)
	}
	return n, nil
}

// Following returns the users user follows, in no particular order.
func (s *Store) Following(ctx context.Context, user domain.UserID) ([]domain.UserID, error) {
	return s.stUsers(ctx, s.userKey(user, stFollowsSuffix), fmt.Sprintf("read followees of user %d", user))
}

// SetBig marks user as a big account (not pushed; merged at read time) or not.
func (s *Store) SetBig(ctx context.Context, user domain.UserID, big bool) error {
	var err error
	if big {
		err = s.rdb.SAdd(ctx, s.key(stBigKey), int64(user)).Err()
	} else {
		err = s.rdb.SRem(ctx, s.key(stBigKey), int64(user)).Err()
	}
	if err != nil {
		return stFail(fmt.Sprintf("mark user %d big=%t", user, big), err)
	}
	return nil
}

// BigAccounts returns the big accounts, in no particular order.
func (s *Store) BigAccounts(ctx context.Context) ([]domain.UserID, error) {
	return s.stUsers(ctx, s.key(stBigKey), "read big accounts")
}

// BigFollowees returns those of the big accounts big that user follows, in
// big's order: the authors whose outboxes Page merges in for user.
func (s *Store) BigFollowees(ctx context.Context, user domain.UserID, big []domain.UserID) ([]domain.UserID, error) {
	if len(big) == 0 {
		return nil, nil
	}
	members := make([]any, len(big))
	for i, b := range big {
		members[i] = int64(b)
	}
	is, err := s.rdb.SMIsMember(ctx, s.userKey(user, stFollowsSuffix), members...).Result()
	if err != nil {
		return nil, stFail(fmt.Sprintf("read big followees of user %d", user), err)
	}
	var followed []domain.UserID
	for i, yes := range is {
		if yes {
			followed = append(followed, big[i])
		}
	}
	return followed, nil
}

func (s *Store) stUsers(ctx context.Context, key, what string) ([]domain.UserID, error) {
	ms, err := s.rdb.SMembers(ctx, key).Result()
	return stParseUsers(ms, what, err)
}

// stParseUsers turns a set's members (read with error err) into user ids.
func stParseUsers(ms []string, what string, err error) ([]domain.UserID, error) {
	if err != nil {
		return nil, stFail(what, err)
	}
	users := make([]domain.UserID, 0, len(ms))
	for _, m := range ms {
		u, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: member %q is not a user id", what, m)
		}
		users = append(users, domain.UserID(u))
	}
	return users, nil
}

// PlannerPosition returns the log sequence the planner has finished (0 if it
// never ran).
func (s *Store) PlannerPosition(ctx context.Context) (uint64, error) {
	seq, _, _, err := s.plannerState(ctx)
	return seq, err
}

// SetPlannerPosition records the log sequence the planner has finished.
func (s *Store) SetPlannerPosition(ctx context.Context, seq uint64) error {
	if err := s.rdb.Set(ctx, s.key(stPlannerPosKey), strconv.FormatUint(seq, 10), 0).Err(); err != nil {
		return stFail(fmt.Sprintf("set planner position %d", seq), err)
	}
	return nil
}

// Page is a page of a home feed as far as Redis knows it.
type Page struct {
	// Materialised is whether the user has an inbox; if not, the feed must come
	// from Postgres (and a materialisation should be requested).
	Materialised bool
	// Posts are newest first, below the page's `before`, at or above Floor,
	// merged from the inbox and the big authors' outboxes without duplicates.
	Posts []domain.PostID
	// Floor is the effective floor: the highest of the inbox's and the big
	// authors' floors. The feed's posts at or above it are all known here; those
	// below it must come from Postgres.
	Floor int64
}

// Page reads at most n posts of user's home feed strictly below before (0: from
// the newest), merging in the outboxes of bigFollowees (the big accounts user
// follows), and refreshes the inbox's TTL. Each key is read atomically with
// its floor, so a concurrent trim cannot leave a gap above the floor reported.
func (s *Store) Page(ctx context.Context, user domain.UserID, bigFollowees []domain.UserID, before int64, n int) (Page, error) {
	what := fmt.Sprintf("read feed page of user %d", user)
	by, err := pageRange(what, before, n)
	if err != nil {
		return Page{}, err
	}
	var (
		in   *redis.Cmd
		outs []pageSource
	)
	err = s.withPageScript(ctx, what, func() error {
		pipe := s.rdb.TxPipeline()
		in = s.queueInbox(ctx, pipe, user, before, n, true, "")
		outs = s.queueOutboxes(ctx, pipe, bigFollowees, by)
		_, err := pipe.Exec(ctx)
		return err
	}, func() *redis.Cmd { return in })
	if err != nil {
		return Page{}, err
	}
	page, _, err := mergePage(what, in, outs, n)
	return page, err
}

// PageWithBig is Page finding the big accounts user follows itself, in the
// round trip that reads the inbox (the intersection of the big set and the
// user's followees), so that most pages take one round trip: only a user who
// follows big accounts needs a second, for their outboxes. A single Redis
// only, since the intersection spans two hash slots; ok is false elsewhere,
// and Page must be used.
func (s *Store) PageWithBig(ctx context.Context, user domain.UserID, before int64, n int) (page Page, ok bool, err error) {
	if !s.batch {
		return Page{}, false, nil
	}
	page, _, err = s.pageWithBig(ctx, user, before, n, true, "")
	return page, true, err
}

// pageRead names what a page's read depended on besides the keys every page
// reads (the inbox's meta, the user's followees, the big set): the inbox's
// head, which a push into it changes alone (see apply.lua), and the big
// accounts whose outboxes it merged.
type pageRead struct {
	head     string
	followed []domain.UserID
}

// pageWithBig is PageWithBig on a single Redis, also returning what the read
// depended on; refresh is whether it refreshes the inbox's TTL, and head, if
// not empty, the key the caller expects the inbox's head to have, which the
// read declares (see page.lua).
func (s *Store) pageWithBig(ctx context.Context, user domain.UserID, before int64, n int, refresh bool, head string) (Page, pageRead, error) {
	what := fmt.Sprintf("read feed page of user %d", user)
	by, err := pageRange(what, before, n)
	if err != nil {
		return Page{}, pageRead{}, err
	}
	var (
		bigs *redis.StringSliceCmd
		in   *redis.Cmd
	)
	err = s.withPageScript(ctx, what, func() error {
		pipe := s.rdb.TxPipeline()
		bigs = pipe.SInter(ctx, s.key(stBigKey), s.userKey(user, stFollowsSuffix))
		in = s.queueInbox(ctx, pipe, user, before, n, refresh, head)
		_, err := pipe.Exec(ctx)
		return err
	}, func() *redis.Cmd { return in })
	if err != nil {
		return Page{}, pageRead{}, err
	}
	followed, err := stParseUsers(bigs.Val(), what, bigs.Err())
	if err != nil || len(followed) == 0 || errors.Is(in.Err(), redis.Nil) {
		page, head, err := mergePage(what, in, nil, n)
		return page, pageRead{head: head}, err
	}
	// The outboxes a moment after the inbox: each is still read atomically
	// with its floor, which is what the page's floor needs; a big account's
	// post in between is a newer post of the feed, not a gap.
	pipe := s.rdb.TxPipeline()
	outs := s.queueOutboxes(ctx, pipe, followed, by)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Page{}, pageRead{}, stFail(what, err)
	}
	page, head, err := mergePage(what, in, outs, n)
	return page, pageRead{head: head, followed: followed}, err
}

// withPageScript runs read, a transaction that reads an inbox with the page
// function, whose command inbox returns; if Redis did not have the function
// (a new Redis, a restart without persistence, FUNCTION FLUSH), it loads it
// and runs read again. The function wrote nothing when it was refused.
func (s *Store) withPageScript(ctx context.Context, what string, read func() error, inbox func() *redis.Cmd) error {
	for range 2 {
		err := read()
		if stMissingFunction(inbox().Err()) {
			if err := s.page.Load(ctx, s.rdb); err != nil {
				return stFail(what, err)
			}
			continue
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			return stFail(what, err)
		}
		return nil
	}
	return fmt.Errorf("%s: Lua functions flushed twice: %w", what, domain.ErrUnavailable)
}

// pageRange is the score range of a page of n posts below before.
func pageRange(what string, before int64, n int) (*redis.ZRangeBy, error) {
	if n < 1 || before < 0 {
		return nil, fmt.Errorf("%s: n=%d, before=%d: %w", what, n, before, domain.ErrInvalid)
	}
	by := &redis.ZRangeBy{Min: "1", Max: "+inf", Count: int64(n)}
	if before > 0 {
		by.Max = "(" + strconv.FormatInt(before, 10)
	}
	return by, nil
}

// pageSource is one outbox a page reads: its floor and its posts in the
// page's range, queued in the same transaction.
type pageSource struct {
	floor *redis.FloatCmd
	posts *redis.StringSliceCmd
}

// queueInbox queues the read of user's inbox by the page script (see
// page.lua): at most n posts strictly below before (0: from the newest), which
// it scores newest first (inboxScore), with its floor. With refresh it first
// refreshes the TTL of the inbox's keys: the user is active. head, if not
// empty, is declared as the inbox's head (see pageWithBig).
func (s *Store) queueInbox(ctx context.Context, pipe redis.Pipeliner, user domain.UserID, before int64, n int, refresh bool, head string) *redis.Cmd {
	from, ttl := "0", "0"
	if before > 0 {
		from = "(" + strconv.FormatInt(inboxScore(domain.PostID(before)), 10)
	}
	if refresh {
		ttl = strconv.FormatInt(max(s.cfg.TTL.Milliseconds(), 1), 10)
	}
	keys := []string{s.userKey(user, stInboxSuffix)}
	if head != "" && head != keys[0] {
		keys = append(keys, head)
	}
	return s.page.FCall(ctx, pipe, keys, from, n, ttl)
}

// inboxScore is the score of post p in an inbox: 2^53 - p, newest first (see
// apply.lua).
func inboxScore(p domain.PostID) int64 { return domain.MaxID - int64(p) }

// queueOutboxes queues the reads of authors' outboxes.
func (s *Store) queueOutboxes(ctx context.Context, pipe redis.Pipeliner, authors []domain.UserID, by *redis.ZRangeBy) []pageSource {
	outs := make([]pageSource, 0, len(authors))
	for _, a := range authors {
		outs = append(outs, s.queueOutbox(ctx, pipe, a, by))
	}
	return outs
}

// queueOutbox queues the read of author's outbox floor and of its posts in
// by, newest first.
func (s *Store) queueOutbox(ctx context.Context, pipe redis.Pipeliner, author domain.UserID, by *redis.ZRangeBy) pageSource {
	k := s.userKey(author, stOutboxSuffix)
	return pageSource{floor: pipe.ZScore(ctx, k, "f"), posts: pipe.ZRevRangeByScore(ctx, k, by)}
}

// inboxPage is what the page script read of an inbox.
type inboxPage struct {
	floor   int64
	seq     uint64
	head    string // the head segment's key (a small inbox's: its meta)
	members []string
}

// stInboxPage decodes the page script's answer; ok is false when the inbox
// does not exist.
func stInboxPage(what string, cmd *redis.Cmd) (page inboxPage, ok bool, err error) {
	vals, err := cmd.Slice()
	if errors.Is(err, redis.Nil) {
		return inboxPage{}, false, nil
	}
	if err != nil {
		return inboxPage{}, false, stFail(what, err)
	}
	if len(vals) < 3 {
		return inboxPage{}, false, fmt.Errorf("%s: unexpected answer %v", what, vals)
	}
	page.members = make([]string, len(vals)-3)
	specials := [2]float64{}
	for i, v := range vals {
		m, isString := v.(string)
		if !isString {
			return inboxPage{}, false, fmt.Errorf("%s: unexpected answer %v", what, vals)
		}
		switch {
		case i == 2:
			page.head = m
			continue
		case i > 2:
			page.members[i-3] = m
			continue
		}
		sc, err := strconv.ParseFloat(m, 64)
		if err != nil {
			return inboxPage{}, false, fmt.Errorf("%s: special score %q: %w", what, m, err)
		}
		specials[i] = sc
	}
	page.floor, page.seq = stSpecial(specials[0]), stSeqOf(specials[1])
	return page, true, nil
}

// mergePage makes the page from the inbox's and the outboxes' reads: not
// materialised without an inbox, else their posts at or above the highest of
// their floors, newest first, without duplicates, at most n; and the key of
// the inbox's head.
func mergePage(what string, in *redis.Cmd, outs []pageSource, n int) (Page, string, error) {
	inbox, ok, err := stInboxPage(what, in)
	if err != nil || !ok {
		return Page{}, "", err
	}
	floor := inbox.floor
	all := make([]string, 0, n*(1+len(outs)))
	all = append(all, inbox.members...)
	for _, o := range outs {
		f, err := o.floor.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return Page{}, "", stFail(what, err)
		}
		ms, err := o.posts.Result()
		if err != nil {
			return Page{}, "", stFail(what, err)
		}
		floor = max(floor, stSpecial(f))
		all = append(all, ms...)
	}
	posts := make([]domain.PostID, 0, len(all))
	for _, m := range all {
		p, err := stParsePost(m)
		if err != nil {
			return Page{}, "", fmt.Errorf("%s: %w", what, err)
		}
		if int64(p) >= floor {
			posts = append(posts, p)
		}
	}
	// Each source gave its n newest, so the n newest distinct posts overall are
	// among them.
	slices.SortFunc(posts, func(a, b domain.PostID) int { return cmp.Compare(b, a) })
	posts = slices.Compact(posts)
	if len(posts) > n {
		posts = posts[:n]
	}
	return Page{Materialised: true, Posts: posts, Floor: floor}, inbox.head, nil
}

// RequestMaterialise asks for user's inbox to be built, at most once per 30
// seconds per user.
func (s *Store) RequestMaterialise(ctx context.Context, user domain.UserID) error {
	what := fmt.Sprintf("request materialisation of user %d", user)
	marker := s.userKey(user, stWarmingSuffix)
	set, err := s.rdb.SetNX(ctx, marker, "1", stWarmingTTL).Result()
	if err != nil {
		return stFail(what, err)
	}
	if !set {
		return nil
	}
	if err := s.rdb.LPush(ctx, s.key(stWarmKey), int64(user)).Err(); err != nil {
		// Let the next read ask again rather than wait for the marker to expire;
		// if this fails too, the marker expires on its own.
		_ = s.rdb.Del(context.WithoutCancel(ctx), marker).Err()
		return stFail(what, err)
	}
	return nil
}

// PopMaterialiseRequests takes up to n materialisation requests, oldest first.
func (s *Store) PopMaterialiseRequests(ctx context.Context, n int) ([]domain.UserID, error) {
	if n < 1 {
		return nil, fmt.Errorf("pop materialisation requests: n=%d: %w", n, domain.ErrInvalid)
	}
	ms, err := s.rdb.RPopCount(ctx, s.key(stWarmKey), n).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, stFail("pop materialisation requests", err)
	}
	users := make([]domain.UserID, 0, len(ms))
	for _, m := range ms {
		u, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("pop materialisation requests: %q is not a user id", m)
		}
		users = append(users, domain.UserID(u))
	}
	return users, nil
}

// Inbox returns user's whole inbox: its posts newest first, its floor, its
// sequence (at least that of the last item that took anything out of it, at
// most that of the last applied; see apply.lua), and whether it exists. It
// does not refresh the TTL.
func (s *Store) Inbox(ctx context.Context, user domain.UserID) (posts []domain.PostID, floor int64, seq uint64, ok bool, err error) {
	what := fmt.Sprintf("read inbox of user %d", user)
	cmd := s.page.Run(ctx, s.rdb, []string{s.userKey(user, stInboxSuffix)}, "0", math.MaxInt32, "0")
	page, ok, err := stInboxPage(what, cmd)
	if err != nil || !ok {
		return nil, 0, 0, false, err
	}
	posts = make([]domain.PostID, 0, len(page.members))
	for _, m := range page.members {
		p, err := stParsePost(m)
		if err != nil {
			return nil, 0, 0, false, fmt.Errorf("%s: %w", what, err)
		}
		posts = append(posts, p)
	}
	return posts, page.floor, page.seq, true, nil
}

// InboxKeys returns the keys user's inbox is made of: its meta first, then
// its segments from the newest. Nil if it does not exist.
func (s *Store) InboxKeys(ctx context.Context, user domain.UserID) ([]string, error) {
	what := fmt.Sprintf("list the keys of the inbox of user %d", user)
	meta := s.userKey(user, stInboxSuffix)
	lay, err := s.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: meta, Start: "0", Stop: "0", ByScore: true}).Result()
	if err != nil {
		return nil, stFail(what, err)
	}
	if len(lay) == 0 {
		return nil, nil // none, or the unsegmented layout: not an inbox
	}
	gen, head, tail, _, ok := stLayout(lay[0])
	if !ok {
		return nil, nil
	}
	keys := []string{meta}
	// Segment 0 is the meta itself (a small inbox).
	for k := head; k >= max(tail, 1); k-- {
		seg := meta + ":" + gen + ":" + strconv.FormatInt(k, 10)
		n, err := s.rdb.Exists(ctx, seg).Result()
		if err != nil {
			return nil, stFail(what, err)
		}
		if n == 1 {
			keys = append(keys, seg)
		}
	}
	return keys, nil
}

// stLayout decodes an inbox's layout member, "<g>:<h>/<r>/<t>" (see
// apply.lua).
func stLayout(m string) (gen string, head, tail, below int64, ok bool) {
	gen, rest, ok := strings.Cut(m, ":")
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 {
		return "", 0, 0, 0, false
	}
	var nums [3]int64
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return "", 0, 0, 0, false
		}
		nums[i] = n
	}
	if _, err := strconv.ParseUint(gen, 10, 64); err != nil {
		return "", 0, 0, 0, false
	}
	return gen, nums[0], nums[2], nums[1], true
}

// LoadFunctions loads the Lua functions the store calls into Redis, as a
// call that finds one missing does. It fails with ErrRedisTooOld if Redis
// has no functions (before 7.0).
func (s *Store) LoadFunctions(ctx context.Context) error {
	for _, f := range []*stFunction{s.apply, s.page, s.outboxAdd} {
		if err := f.Load(ctx, s.rdb); err != nil {
			if redis.HasErrorPrefix(err, "unknown command") {
				return fmt.Errorf("%w: %w", ErrRedisTooOld, err)
			}
			return stFail("load the feeds' Lua functions", err)
		}
	}
	return nil
}

// ErrRedisTooOld is a Redis without Lua functions (FUNCTION, FCALL): before
// 7.0.
var ErrRedisTooOld = errors.New("the feeds need Redis 7.0 or later")

// CheckListpack returns Redis's zset-max-listpack-entries (zset-max-ziplist-
// entries before Redis 7). Every inbox stays compact if it is at least
// InboxCap+5 (no zset of an inbox holds more than the cap, and a small
// inbox's meta its posts and five members more); the caller warns if not.
func (s *Store) CheckListpack(ctx context.Context) (entries int64, err error) {
	for _, name := range []string{"zset-max-listpack-entries", "zset-max-ziplist-entries"} {
		kv, err := s.rdb.ConfigGet(ctx, name).Result()
		if err != nil {
			return 0, stFail("read "+name, err)
		}
		if v, ok := kv[name]; ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read %s: %q is not a number", name, v)
			}
			return n, nil
		}
	}
	return 0, errors.New("read zset-max-listpack-entries: the server reports neither it nor zset-max-ziplist-entries")
}

// CheckEviction reports whether Redis may evict keys: it has a maxmemory
// and a maxmemory-policy other than noeviction. An inbox is several keys
// (see apply.lua), and one of its segments evicted would leave a gap in a
// home feed that nothing notices; the caller warns.
func (s *Store) CheckEviction(ctx context.Context) (evicts bool, policy string, err error) {
	kv, err := s.rdb.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return false, "", stFail("read maxmemory", err)
	}
	policy = kv["maxmemory-policy"]
	return kv["maxmemory"] != "0" && policy != "noeviction", policy, nil
}

// stSpecial decodes a special member's score -(v+1).
func stSpecial(score float64) int64 { return -int64(score) - 1 }

// stMaxSeq is the highest log sequence an inbox takes: its "s" is scored
// 2seq - 2^54, below its "m" at -(2^53+2) (see apply.lua).
const stMaxSeq = 1<<52 - 2

// stSeqOf is the log sequence of an inbox's "s" score.
func stSeqOf(score float64) uint64 { return uint64((int64(score) + 1<<54) / 2) }

func stParsePost(m string) (domain.PostID, error) {
	p, err := strconv.ParseInt(m, 10, 64)
	if err != nil || p <= 0 {
		return 0, fmt.Errorf("member %q is not a post id", m)
	}
	return domain.PostID(p), nil
}

// stFail wraps err with what was being done, marking failures to reach Redis
// as domain.ErrUnavailable so that readers fall back to Postgres.
func stFail(what string, err error) error {
	if stUnreachable(err) {
		return fmt.Errorf("%s: %w: %w", what, domain.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// stUnreachable tells a failure to reach Redis (no connection, a connection
// lost, a deadline, a server loading or without a master) from a failure of the
// command itself.
func stUnreachable(err error) bool {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		redis.IsLoadingError(err), redis.IsClusterDownError(err), redis.IsTryAgainError(err),
		redis.IsMasterDownError(err), redis.IsMaxClientsError(err):
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "i/o timeout") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe")
}
