package homefeed

import "github.com/prometheus/client_golang/prometheus/testutil"

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

// Pages is how many pages c holds, expired or not.
func (c *PageCache) Pages() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pages.Len()
}
