// Package presence records, in the Redis every API replica shares, the live
// streams open: each user's, which bounds how many one user holds across the
// replicas, and the users holding one (online), whose inboxes the fan-out
// serves first.
package presence

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
)

var (
	//go:embed lua/admit.lua
	admitLua string
	//go:embed lua/renew.lua
	renewLua string
	//go:embed lua/release.lua
	releaseLua string

	admitFn   = feeds.NewFunction("stream_admit", admitLua)
	renewFn   = feeds.NewFunction("stream_renew", renewLua)
	releaseFn = feeds.NewFunction("stream_release", releaseLua)
)

// Config holds the registry's optional knobs; the zero value works.
type Config struct {
	// Expiry is how long an entry lives unless renewed: the streams of a
	// process that dies stop counting within it. Default 45s.
	Expiry time.Duration
}

// Registry is the record of open streams in Redis.
type Registry struct {
	rdb    redis.UniversalClient
	expiry time.Duration
}

// New returns the registry kept in rdb.
func New(rdb redis.UniversalClient, cfg Config) *Registry {
	if cfg.Expiry <= 0 {
		cfg.Expiry = 45 * time.Second
	}
	return &Registry{rdb: rdb, expiry: cfg.Expiry}
}

// Renewal is how often a holder of streams renews them (Renew): a third of
// the expiry, so that a renewal that fails once or twice loses nothing.
func (r *Registry) Renewal() time.Duration { return r.expiry / 3 }

// Stream is one open stream's entry.
type Stream struct {
	User domain.UserID
	ID   string
}

// Admit records a new stream of user unless user already holds limit streams
// that have not expired, atomically; it returns the stream, how many the user
// holds (with it if admitted) and whether it was.
func (r *Registry) Admit(ctx context.Context, user domain.UserID, limit int) (Stream, int, bool, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	s := Stream{User: user, ID: hex.EncodeToString(b[:])}
	res, err := admitFn.Run(ctx, r.rdb, []string{feeds.StreamsKey(user)}, s.ID, r.expiry.Milliseconds(), limit).Int64Slice()
	if err != nil {
		return s, 0, false, feeds.Fail("admit a stream", err)
	}
	if len(res) != 2 {
		return s, 0, false, fmt.Errorf("admit a stream: answer %v", res)
	}
	if res[0] < 0 {
		return s, int(-res[0]), false, nil
	}
	// The online set is another slot's: a second command, after the admission.
	if err := r.rdb.ZAddGT(ctx, feeds.OnlineKey, redis.Z{Score: float64(res[1]), Member: user.String()}).Err(); err != nil {
		return s, int(res[0]), true, feeds.Fail("mark a user online", err)
	}
	return s, int(res[0]), true, nil
}

// Renew extends the entries of streams by the expiry, adding any that Redis
// lost, in two round trips however many there are.
func (r *Registry) Renew(ctx context.Context, streams []Stream) error {
	if len(streams) == 0 {
		return nil
	}
	run := func() ([]*redis.Cmd, error) {
		pipe := r.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(streams))
		for i, s := range streams {
			cmds[i] = renewFn.FCall(ctx, pipe, []string{feeds.StreamsKey(s.User)}, s.ID, r.expiry.Milliseconds())
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	cmds, err := run()
	if feeds.MissingFunction(err) {
		if err = renewFn.Load(ctx, r.rdb); err == nil {
			cmds, err = run()
		}
	}
	if err != nil {
		return feeds.Fail("renew streams", err)
	}
	online := make([]redis.Z, 0, len(streams))
	for i, s := range streams {
		e, err := cmds[i].Int64()
		if err != nil {
			return feeds.Fail("renew streams", err)
		}
		online = append(online, redis.Z{Score: float64(e), Member: s.User.String()})
	}
	if err := r.rdb.ZAddGT(ctx, feeds.OnlineKey, online...).Err(); err != nil {
		return feeds.Fail("mark users online", err)
	}
	return nil
}

// Release removes s's entry; a user whose last stream it was goes offline.
func (r *Registry) Release(ctx context.Context, s Stream) error {
	left, err := releaseFn.Run(ctx, r.rdb, []string{feeds.StreamsKey(s.User)}, s.ID).Int64()
	if err != nil {
		return feeds.Fail("release a stream", err)
	}
	if left == 0 {
		// A stream admitted meanwhile on another replica marks the user
		// online again at its next renewal.
		if err := r.rdb.ZRem(ctx, feeds.OnlineKey, s.User.String()).Err(); err != nil {
			return feeds.Fail("mark a user offline", err)
		}
	}
	return nil
}

// Online returns the users holding an open stream as of now, by the local
// clock (a skew of seconds against the expiry's tens is harmless: it only
// serves a user first for a little more or less long). It also drops the
// entries expired for longer than the expiry.
func (r *Registry) Online(ctx context.Context, now time.Time) (map[domain.UserID]struct{}, error) {
	ms := now.UnixMilli()
	pipe := r.rdb.Pipeline()
	pipe.ZRemRangeByScore(ctx, feeds.OnlineKey, "-inf", "("+strconv.FormatInt(ms-r.expiry.Milliseconds(), 10))
	users := pipe.ZRangeByScore(ctx, feeds.OnlineKey, &redis.ZRangeBy{Min: "(" + strconv.FormatInt(ms, 10), Max: "+inf"})
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, feeds.Fail("read the online users", err)
	}
	set := make(map[domain.UserID]struct{}, len(users.Val()))
	for _, u := range users.Val() {
		id, err := domain.ParseUserID(u)
		if err != nil {
			continue
		}
		set[id] = struct{}{}
	}
	return set, nil
}

// Watcher keeps a copy of the online users, read again every interval: the
// fan-out's look-up is then a map's, with no round trip in its path.
type Watcher struct {
	reg   *Registry
	every time.Duration
	set   atomic.Pointer[map[domain.UserID]struct{}]
}

// Watch returns a watcher of r's online users, reading them every interval
// (default 1s) once Run runs.
func (r *Registry) Watch(interval time.Duration) *Watcher {
	if interval <= 0 {
		interval = time.Second
	}
	return &Watcher{reg: r, every: interval}
}

// Run reads the online users until ctx ends. A failed read keeps the last
// copy: a stale copy only orders work, it loses none.
func (w *Watcher) Run(ctx context.Context) error {
	tick := time.NewTicker(w.every)
	defer tick.Stop()
	for {
		if set, err := w.reg.Online(ctx, time.Now()); err == nil {
			w.set.Store(&set)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Online returns the online users as last read (nil before the first read);
// the caller must not change it.
func (w *Watcher) Online() map[domain.UserID]struct{} {
	if p := w.set.Load(); p != nil {
		return *p
	}
	return nil
}
