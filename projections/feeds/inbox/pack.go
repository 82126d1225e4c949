package inbox

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
)

// applyCall is one run of the apply script: the items of its recipients,
// one inbox key each, as lists of items that recipients with the same items
// share (see apply.lua).
type applyCall struct {
	recipients []domain.UserID
	keys       []string
	// lists holds the call's script arguments as they are known: four slots
	// for the cap, the TTL, the segment size and the number of lists (filled
	// in by args), then the item lists. Kept as one slice so that a call's arguments are not
	// copied again before the client's own copy.
	lists  []any
	nlists int
	refs   []any // each key's list, from 1
	// shared finds the lists of single items (see shareable).
	shared map[shareKey]int
}

func newApplyCall() *applyCall {
	return &applyCall{lists: make([]any, 4, 64), shared: map[shareKey]int{}}
}

// shareKey is a work item with at most one post, as a map key.
type shareKey struct {
	op    Op
	seq   uint64
	floor int64
	post  domain.PostID // 0: none
}

// shareable reports whether a recipient's items can share a list with
// other recipients': a single item with at most one post, such as the push of
// a post to its author's followers or the removal of a deleted one.
func shareable(items []Item) (shareKey, bool) {
	if len(items) != 1 || len(items[0].Posts) > 1 || items[0].Op == OpMaterialise || items[0].Op == OpReconcile {
		return shareKey{}, false
	}
	it := items[0]
	k := shareKey{op: it.Op, seq: it.Seq, floor: it.Floor}
	if len(it.Posts) == 1 {
		k.post = it.Posts[0]
	}
	return k, true
}

// size bounds the number of the call's script arguments.
func (c *applyCall) size() int { return len(c.lists) + len(c.refs) }

// args are the call's script arguments.
func (c *applyCall) args(cfg feeds.Config) []any {
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
func (c *applyCall) String() string {
	if len(c.recipients) == 1 {
		return fmt.Sprintf("user %d", c.recipients[0])
	}
	return fmt.Sprintf("user %d and %d others", c.recipients[0], len(c.recipients)-1)
}

// pack packs the items into script runs: each recipient's items, in the
// order given, as one list, in one run.
func (s inboxes) pack(items []Item) []*applyCall {
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
		calls []*applyCall
		mine  []Item // one recipient's items
		list  []any  // their list's arguments
	)
	for lo := 0; lo < len(order); {
		r := items[order[lo]].Recipient
		mine = mine[:0]
		for ; lo < len(order) && items[order[lo]].Recipient == r; lo++ {
			mine = append(mine, items[order[lo]])
		}
		if len(calls) == 0 || !s.SingleRedis() {
			calls = append(calls, newApplyCall())
		}
		c := calls[len(calls)-1]
		key, shareable := shareable(mine)
		ref, ok := c.shared[key]
		if !shareable || !ok || c.size()+1 > callArgs {
			list = s.appendList(list[:0], mine)
			if len(c.recipients) > 0 && c.size()+len(list)+1 > callArgs {
				c = newApplyCall()
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
		c.keys = append(c.keys, s.Keys().Inbox(r))
		c.refs = append(c.refs, strconv.Itoa(ref))
	}
	return calls
}

// opPushes is the script's op for a run of k pushes of one post each, sent
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
const opPushes = 7

// seqScore is an inbox's "s" score for log sequence seq, 2seq - 2^54.
func seqScore(seq uint64) string { return strconv.FormatInt(int64(2*seq)-1<<54, 10) }

// appendList appends the script arguments of a recipient's list: the
// number of items, then each item, runs of two or more pushes of one post
// as one opPushes item.
func (s inboxes) appendList(args []any, items []Item) []any {
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
			args = s.appendItem(args, items[j])
			j++
			continue
		}
		run := items[j:e]
		low := run[0].Posts[0]
		for _, it := range run[1:] {
			low = min(low, it.Posts[0])
		}
		args = append(args, strconv.Itoa(opPushes), seqScore(run[0].Seq), "("+strconv.FormatInt(-int64(low)-1, 10), strconv.Itoa(3*len(run)))
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

// appendItem appends the script arguments of one item: op, seq, floor, n,
// posts.
func (s inboxes) appendItem(args []any, it Item) []any {
	posts, floor := it.Posts, it.Floor
	if it.Op == OpMaterialise || it.Op == OpReconcile {
		posts, floor = newest(posts, floor, s.Config().InboxCap)
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

// newest returns the at most limit newest posts at or above floor, and the
// floor from which they are complete: the lowest kept when some were cut. This
// is exactly what trimming the new inbox would keep, without sending the posts
// a cold user's many followees have that trimming would drop.
func newest(posts []domain.PostID, floor int64, limit int) ([]domain.PostID, int64) {
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
