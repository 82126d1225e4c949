package feeds

import "time"

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
	// sends that merge to every follower at every unfollow (decision 36).
	BigMargin int
}

// IsBig reports whether an author with n followers is big, given whether it
// was (see BigMargin).
func (c Config) IsBig(n int64, was bool) bool {
	if was {
		return n > int64(c.BigThreshold-c.BigMargin)
	}
	return n > int64(c.BigThreshold)
}

// defaults are the values of Config's zero fields (BigMargin's is
// BigThreshold/10).
var defaults = Config{
	InboxCap:     500,
	SegmentSize:  100,
	OutboxCap:    500,
	TTL:          7 * 24 * time.Hour,
	BigThreshold: 10000,
}

// withDefaults fills in c's zero fields.
func (c Config) withDefaults() Config {
	if c.InboxCap <= 0 {
		c.InboxCap = defaults.InboxCap
	}
	if c.SegmentSize <= 0 {
		c.SegmentSize = defaults.SegmentSize
	}
	if c.OutboxCap <= 0 {
		c.OutboxCap = defaults.OutboxCap
	}
	if c.TTL <= 0 {
		c.TTL = defaults.TTL
	}
	if c.BigThreshold <= 0 {
		c.BigThreshold = defaults.BigThreshold
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
