package feeds

import (
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// SetBeforeFill makes fn run between a page's read from Redis and its entry
// into the cache.
func (c *PageCache) SetBeforeFill(fn func()) { c.beforeFill = fn }

// Invalidations is how many invalidation messages the cache has handled.
func (c *PageCache) Invalidations() uint64 { return c.invalidations.Load() }

// Following reports whether the cache follows Redis's invalidations (and so
// may serve from memory).
func (c *PageCache) Following() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tracked != nil
}

// Lookups is the count of lookups with result.
func (c *PageCache) Lookups(result string) int {
	return int(testutil.ToFloat64(c.lookups.WithLabelValues(result)))
}

// EncodeWork encodes work items as a fan-out message's body.
func EncodeWork(items []Item) ([]byte, error) { return encodeWork(items) }

// SetBeforeApply makes fn run before each message's work is applied; its
// error fails the message.
func (a *Applier) SetBeforeApply(fn func([]Item) error) { a.beforeApply = fn }

// DecodeWork decodes a fan-out message's work items.
func DecodeWork(data []byte) ([]Item, error) { return decodeWork(data) }

// SetBeforePlan makes fn run between a batch's first round trip to Redis and
// its plan's.
func (p *Planner) SetBeforePlan(fn func()) { p.beforePlan = fn }

// SetAppliersStall sets how long p waits for appliers that apply nothing.
func (p *Planner) SetAppliersStall(d time.Duration) { p.stall = d }

// ErrStateLost is the planner's error for a Redis that lost its state.
var ErrStateLost = errStateLost

// Pages is how many pages c holds, expired or not.
func (c *PageCache) Pages() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pages.Len()
}

// Layout decodes an inbox's layout member.
func Layout(m string) (gen string, head, tail, below int64, ok bool) { return stLayout(m) }
