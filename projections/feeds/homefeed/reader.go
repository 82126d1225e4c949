package homefeed

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// Reader is the read side of the home feed in Redis.
type Reader struct {
	base *feeds.Store
	js   jetstream.JetStream
	// cur is the store of the keyspace version in use as of checked (unix
	// nanoseconds).
	cur     atomic.Pointer[feeds.Store]
	checked atomic.Int64

	// stream is the fan-out stream's handle, looked up once: every read asks
	// for the feeds' position, and a lookup is itself a request to JetStream.
	mu     sync.Mutex
	stream jetstream.Stream
}

// NewReader returns a reader of store; js finds the feeds' position.
func NewReader(store *feeds.Store, js jetstream.JetStream) *Reader {
	r := &Reader{base: store, js: js}
	r.cur.Store(store)
	return r
}

// store is the store of the keyspace version in use.
func (r *Reader) store(ctx context.Context) *feeds.Store {
	now, last := time.Now().UnixNano(), r.checked.Load()
	if now-last >= int64(feeds.VersionCheck) && r.checked.CompareAndSwap(last, now) {
		if s, err := r.base.Active(ctx); err == nil {
			r.cur.Store(s)
		}
	}
	return r.cur.Load()
}

// Page is the cached part of a home feed page for user (see inbox.ReadPage), with
// the posts of the big accounts the user follows merged in. minPos is the log
// position the page must reflect (see PageCache.Page); read from Redis, every
// page reflects what Redis holds.
func (r *Reader) Page(ctx context.Context, user domain.UserID, before int64, n int, _ uint64) (inbox.Page, error) {
	s := r.store(ctx)
	if page, ok, err := inbox.ReadPageWithBig(ctx, s, user, before, n); ok {
		return page, err
	}
	big, err := s.BigAccounts(ctx)
	if err != nil {
		return inbox.Page{}, err
	}
	followed, err := s.BigFollowees(ctx, user, big)
	if err != nil {
		return inbox.Page{}, err
	}
	return inbox.ReadPage(ctx, s, user, followed, before, n)
}

// RequestMaterialise asks the planner to build the user's inbox.
func (r *Reader) RequestMaterialise(ctx context.Context, user domain.UserID) error {
	return r.store(ctx).RequestMaterialise(ctx, user)
}

// Position is how far the feeds reflect the log (see fanout.Position).
func (r *Reader) Position(ctx context.Context) (uint64, error) {
	planned, err := fanout.PlannerPosition(ctx, r.store(ctx))
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	stream := r.stream
	r.mu.Unlock()
	if stream == nil {
		if stream, err = r.js.Stream(ctx, fanout.FanoutStream); err != nil {
			return 0, fmt.Errorf("feeds position: %w: %w", domain.ErrUnavailable, err)
		}
		r.mu.Lock()
		r.stream = stream
		r.mu.Unlock()
	}
	return fanout.PositionAfter(ctx, planned, stream)
}
