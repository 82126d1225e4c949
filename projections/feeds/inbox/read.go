package inbox

import (
	"cmp"
	"context"
	_ "embed" // the page script
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
)

// pageLua reads a page of an inbox.
//
//go:embed lua/page.lua
var pageLua string

// pageFn is pageLua as Redis runs it, made once: its name is a hash of its
// code.
var pageFn = feeds.NewFunction("feed_page", pageLua)

// LoadFunctions loads every Lua library the feeds call into Redis (see
// feeds.Store.LoadFunctions).
func LoadFunctions(ctx context.Context, store *feeds.Store) error {
	return store.LoadFunctions(ctx, applyFn, pageFn, feeds.OutboxFunction())
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

// ReadPage reads at most n posts of user's home feed strictly below before (0: from
// the newest), merging in the outboxes of bigFollowees (the big accounts user
// follows), and refreshes the inbox's TTL. Each key is read atomically with
// its floor, so a concurrent trim cannot leave a gap above the floor reported.
func ReadPage(ctx context.Context, store *feeds.Store, user domain.UserID, bigFollowees []domain.UserID, before int64, n int) (Page, error) {
	s := inboxes{store}
	what := fmt.Sprintf("read feed page of user %d", user)
	by, err := pageRange(what, before, n)
	if err != nil {
		return Page{}, err
	}
	var (
		in   *redis.Cmd
		outs []feeds.OutboxRead
	)
	err = s.withPageScript(ctx, what, func() error {
		pipe := s.Client().TxPipeline()
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

// ReadPageWithBig is ReadPage finding the big accounts user follows itself, in the
// round trip that reads the inbox (the intersection of the big set and the
// user's followees), so that most pages take one round trip: only a user who
// follows big accounts needs a second, for their outboxes. A single Redis
// only, since the intersection spans two hash slots; ok is false elsewhere,
// and ReadPage must be used.
func ReadPageWithBig(ctx context.Context, store *feeds.Store, user domain.UserID, before int64, n int) (page Page, ok bool, err error) {
	if !store.SingleRedis() {
		return Page{}, false, nil
	}
	page, _, err = inboxes{store}.pageWithBig(ctx, user, before, n, true, "")
	return page, true, err
}

// PageDeps names what a page's read depended on besides the keys every page
// reads (the inbox's meta, the user's followees, the big set): the inbox's
// head, which a push into it changes alone (see apply.lua), and the big
// accounts whose outboxes it merged.
type PageDeps struct {
	Head     string
	Followed []domain.UserID
}

// ReadPageTracked is ReadPageWithBig on a single Redis, also returning what
// the read depended on; refresh is whether it refreshes the inbox's TTL, and
// head, if not empty, the key the caller expects the inbox's head to have,
// which the read declares (see page.lua).
func ReadPageTracked(ctx context.Context, store *feeds.Store, user domain.UserID, before int64, n int, refresh bool, head string) (Page, PageDeps, error) {
	return inboxes{store}.pageWithBig(ctx, user, before, n, refresh, head)
}

// pageWithBig is ReadPageTracked.
func (s inboxes) pageWithBig(ctx context.Context, user domain.UserID, before int64, n int, refresh bool, head string) (Page, PageDeps, error) {
	what := fmt.Sprintf("read feed page of user %d", user)
	by, err := pageRange(what, before, n)
	if err != nil {
		return Page{}, PageDeps{}, err
	}
	var (
		bigs *redis.StringSliceCmd
		in   *redis.Cmd
	)
	err = s.withPageScript(ctx, what, func() error {
		pipe := s.Client().TxPipeline()
		bigs = pipe.SInter(ctx, s.Keys().Big(), s.Keys().Following(user))
		in = s.queueInbox(ctx, pipe, user, before, n, refresh, head)
		_, err := pipe.Exec(ctx)
		return err
	}, func() *redis.Cmd { return in })
	if err != nil {
		return Page{}, PageDeps{}, err
	}
	followed, err := feeds.ParseUsers(bigs.Val(), what, bigs.Err())
	if err != nil || len(followed) == 0 || errors.Is(in.Err(), redis.Nil) {
		page, head, err := mergePage(what, in, nil, n)
		return page, PageDeps{Head: head}, err
	}
	// The outboxes a moment after the inbox: each is still read atomically
	// with its floor, which is what the page's floor needs; a big account's
	// post in between is a newer post of the feed, not a gap.
	pipe := s.Client().TxPipeline()
	outs := s.queueOutboxes(ctx, pipe, followed, by)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Page{}, PageDeps{}, feeds.Fail(what, err)
	}
	page, head, err := mergePage(what, in, outs, n)
	return page, PageDeps{Head: head, Followed: followed}, err
}

// withPageScript runs read, a transaction that reads an inbox with the page
// function, whose command inbox returns; if Redis did not have the function
// (a new Redis, a restart without persistence, FUNCTION FLUSH), it loads it
// and runs read again. The function wrote nothing when it was refused.
func (s inboxes) withPageScript(ctx context.Context, what string, read func() error, inbox func() *redis.Cmd) error {
	for range 2 {
		err := read()
		if feeds.MissingFunction(inbox().Err()) {
			if err := pageFn.Load(ctx, s.Client()); err != nil {
				return feeds.Fail(what, err)
			}
			continue
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			return feeds.Fail(what, err)
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

// queueInbox queues the read of user's inbox by the page script (see
// page.lua): at most n posts strictly below before (0: from the newest), which
// it scores newest first (inboxScore), with its floor. With refresh it first
// refreshes the TTL of the inbox's keys: the user is active. head, if not
// empty, is declared as the inbox's head (see pageWithBig).
func (s inboxes) queueInbox(ctx context.Context, pipe redis.Pipeliner, user domain.UserID, before int64, n int, refresh bool, head string) *redis.Cmd {
	from, ttl := "0", "0"
	if before > 0 {
		from = "(" + strconv.FormatInt(inboxScore(domain.PostID(before)), 10)
	}
	if refresh {
		ttl = strconv.FormatInt(max(s.Config().TTL.Milliseconds(), 1), 10)
	}
	keys := []string{s.Keys().Inbox(user)}
	if head != "" && head != keys[0] {
		keys = append(keys, head)
	}
	return pageFn.FCall(ctx, pipe, keys, from, n, ttl)
}

// inboxScore is the score of post p in an inbox: 2^53 - p, newest first (see
// apply.lua).
func inboxScore(p domain.PostID) int64 { return domain.MaxID - int64(p) }

// queueOutboxes queues the reads of authors' outboxes.
func (s inboxes) queueOutboxes(ctx context.Context, pipe redis.Pipeliner, authors []domain.UserID, by *redis.ZRangeBy) []feeds.OutboxRead {
	outs := make([]feeds.OutboxRead, 0, len(authors))
	for _, a := range authors {
		outs = append(outs, s.QueueOutbox(ctx, pipe, a, by))
	}
	return outs
}

// inboxPage is what the page script read of an inbox.
type inboxPage struct {
	floor   int64
	seq     uint64
	head    string // the head segment's key (a small inbox's: its meta)
	members []string
}

// decodeInboxPage decodes the page script's answer; ok is false when the inbox
// does not exist.
func decodeInboxPage(what string, cmd *redis.Cmd) (page inboxPage, ok bool, err error) {
	vals, err := cmd.Slice()
	if errors.Is(err, redis.Nil) {
		return inboxPage{}, false, nil
	}
	if err != nil {
		return inboxPage{}, false, feeds.Fail(what, err)
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
	page.floor, page.seq = feeds.Special(specials[0]), seqOf(specials[1])
	return page, true, nil
}

// mergePage makes the page from the inbox's and the outboxes' reads: not
// materialised without an inbox, else their posts at or above the highest of
// their floors, newest first, without duplicates, at most n; and the key of
// the inbox's head.
func mergePage(what string, in *redis.Cmd, outs []feeds.OutboxRead, n int) (Page, string, error) {
	inbox, ok, err := decodeInboxPage(what, in)
	if err != nil || !ok {
		return Page{}, "", err
	}
	floor := inbox.floor
	all := make([]string, 0, n)
	all = append(all, inbox.members...)
	var fromOutboxes []domain.PostID
	for _, o := range outs {
		posts, f, ok, err := o.Read(what)
		if err != nil {
			return Page{}, "", err
		}
		if ok {
			floor = max(floor, f)
			fromOutboxes = append(fromOutboxes, posts...)
		}
	}
	posts := make([]domain.PostID, 0, len(all)+len(fromOutboxes))
	for _, m := range all {
		p, err := feeds.ParsePost(m)
		if err != nil {
			return Page{}, "", fmt.Errorf("%s: %w", what, err)
		}
		if int64(p) >= floor {
			posts = append(posts, p)
		}
	}
	for _, p := range fromOutboxes {
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

// ReadAll returns user's whole inbox: its posts newest first, its floor, its
// sequence (at least that of the last item that took anything out of it, at
// most that of the last applied; see apply.lua), and whether it exists. It
// does not refresh the TTL.
func ReadAll(ctx context.Context, store *feeds.Store, user domain.UserID) (posts []domain.PostID, floor int64, seq uint64, ok bool, err error) {
	s := inboxes{store}
	what := fmt.Sprintf("read inbox of user %d", user)
	cmd := pageFn.Run(ctx, s.Client(), []string{s.Keys().Inbox(user)}, "0", math.MaxInt32, "0")
	page, ok, err := decodeInboxPage(what, cmd)
	if err != nil || !ok {
		return nil, 0, 0, false, err
	}
	posts = make([]domain.PostID, 0, len(page.members))
	for _, m := range page.members {
		p, err := feeds.ParsePost(m)
		if err != nil {
			return nil, 0, 0, false, fmt.Errorf("%s: %w", what, err)
		}
		posts = append(posts, p)
	}
	return posts, page.floor, page.seq, true, nil
}

// Keys returns the keys user's inbox is made of: its meta first, then
// its segments from the newest. Nil if it does not exist.
func Keys(ctx context.Context, store *feeds.Store, user domain.UserID) ([]string, error) {
	s := inboxes{store}
	what := fmt.Sprintf("list the keys of the inbox of user %d", user)
	meta := s.Keys().Inbox(user)
	lay, err := s.Client().ZRangeArgs(ctx, redis.ZRangeArgs{Key: meta, Start: "0", Stop: "0", ByScore: true}).Result()
	if err != nil {
		return nil, feeds.Fail(what, err)
	}
	if len(lay) == 0 {
		return nil, nil // none, or the unsegmented layout: not an inbox
	}
	gen, head, tail, _, ok := layout(lay[0])
	if !ok {
		return nil, nil
	}
	keys := []string{meta}
	// Segment 0 is the meta itself (a small inbox).
	for k := head; k >= max(tail, 1); k-- {
		seg := meta + ":" + gen + ":" + strconv.FormatInt(k, 10)
		n, err := s.Client().Exists(ctx, seg).Result()
		if err != nil {
			return nil, feeds.Fail(what, err)
		}
		if n == 1 {
			keys = append(keys, seg)
		}
	}
	return keys, nil
}

// layout decodes an inbox's layout member, "<g>:<h>/<r>/<t>" (see
// apply.lua).
func layout(m string) (gen string, head, tail, below int64, ok bool) {
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

// maxSeq is the highest log sequence an inbox takes: its "s" is scored
// 2seq - 2^54, below its "m" at -(2^53+2) (see apply.lua).
const maxSeq = 1<<52 - 2

// seqOf is the log sequence of an inbox's "s" score.
func seqOf(score float64) uint64 { return uint64((int64(score) + 1<<54) / 2) }
