package http

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/feeds/presence"
	"github.com/feedproject/feed/projections/readmodel"
)

// StreamConfig holds GET /stream's optional knobs; the zero value works.
type StreamConfig struct {
	// Window is how far back a stream resumes: a Last-Event-ID whose next
	// event is older gets a reset. Default 10m.
	Window time.Duration
	// PerUser is the most streams one user holds open, on every replica
	// sharing the presence record (on this process alone without one, or
	// while it is unreachable); the next is answered 429. Default 5.
	PerUser int
	// Buffer is how many events a stream may have waiting to be written; a
	// client that lets more pile up is disconnected. Default 256.
	Buffer int
	// Ping is how long a stream stays silent before a ping; default 15s.
	Ping time.Duration
	// WriteTimeout bounds each write to a client; default 10s.
	WriteTimeout time.Duration
	// Recent is how many of the last events dispatched a process keeps, for
	// new streams and those resumed a moment after they dropped to catch up
	// from memory; one further behind reads the log. Default 4096.
	Recent int
	// CatchUps is how many resumed streams of this process read the log at
	// once to catch up from beyond the recent events, each with a consumer
	// of its own on the server, whose streams hold a bounded number (1 000
	// by default); the others wait their turn. Default 32.
	CatchUps int
	// Openings is how many streams of this process read their followees
	// from the log at once as they open, each with a consumer of its own
	// for the moment it takes: a replica's clients all reconnect at once
	// when another goes down. Default 256.
	Openings int
}

func (c StreamConfig) withDefaults() StreamConfig {
	if c.CatchUps <= 0 {
		c.CatchUps = 32
	}
	if c.Openings <= 0 {
		c.Openings = 256
	}
	if c.Recent <= 0 {
		c.Recent = 1 << 12
	}
	if c.Window <= 0 {
		c.Window = 10 * time.Minute
	}
	if c.PerUser <= 0 {
		c.PerUser = 5
	}
	if c.Buffer <= 0 {
		c.Buffer = 256
	}
	if c.Ping <= 0 {
		c.Ping = 15 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	return c
}

// StreamActivity is where the activity events of GET /stream come from: the
// activity projection's items as the log makes them.
type StreamActivity interface {
	// ActivityItems returns, in order, the items of activity that rec makes
	// for the users wants accepts. It must depend on the log up to rec alone:
	// a resumed stream reads the same records again and must get the same
	// items.
	ActivityItems(ctx context.Context, rec events.Record, wants func(domain.UserID) bool) ([]ActivityItem, error)
}

// ActivityItem is one item of a user's activity, as GET /activity shows it.
type ActivityItem struct {
	User domain.UserID
	// JSON is the item's body (nil in the dispatcher's own, whose item the
	// stream finds as it writes it).
	JSON []byte
}

// StreamPresence records open streams where every replica sees them (a
// *presence.Registry): the per-user limit holds across replicas, and the
// fan-out serves the users holding one first.
type StreamPresence interface {
	// Admit records a new stream of user unless user holds limit already.
	Admit(ctx context.Context, user domain.UserID, limit int) (s presence.Stream, held int, ok bool, err error)
	// Renew keeps the entries of open streams from expiring.
	Renew(ctx context.Context, streams []presence.Stream) error
	// Release removes a closed stream's entry.
	Release(ctx context.Context, s presence.Stream) error
	// Renewal is how often the open streams are renewed.
	Renewal() time.Duration
}

// StreamDeps are what the streams need; Log is required.
type StreamDeps struct {
	Log *events.Log
	// Posts, if set, tells the author of a post liked or commented on that
	// the streams have not seen created.
	Posts FeedPosts
	// Activity, if set, adds activity events.
	Activity StreamActivity
	// Presence, if set, records the open streams for every replica.
	Presence   StreamPresence
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Streams serves GET /stream. One reader of the log (Run) finds, for each
// event, the connected viewers it concerns, through an index of their
// followees: its work grows with the connected viewers, not with followers.
// A stream that starts behind that reader (a resumption) reads the log itself
// until it reaches it, then joins it.
type Streams struct {
	log          *events.Log
	cfg          StreamConfig
	posts        FeedPosts
	activity     StreamActivity
	logger       *slog.Logger
	now          func() time.Time
	metrics      *streamMetrics
	presence     StreamPresence
	presenceLost *sampledLog
	// renewing is held by a renewal of the open streams' entries, and by a
	// release, so that a renewal under way cannot add an entry back after
	// its release.
	renewing sync.Mutex

	// authors remembers recent posts' authors, for the reader and replays.
	authors postAuthors

	catchUps chan struct{}  // a slot per resumed stream reading the log
	openings chan struct{}  // a slot per stream reading its followees
	streams  sync.WaitGroup // the streams being written
	ready    chan struct{}  // closed once Run knows where it starts
	done     chan struct{}  // closed by Close

	mu sync.Mutex
	// begun is the event being dispatched (last while none is): a stream
	// joins only at or past it, so none misses or repeats it.
	begun, last uint64
	// turn is closed, and replaced, when the dispatcher ends an event.
	turn chan struct{}
	// recent are the last events dispatched, from which a stream catches up
	// in memory.
	recent    recentRing
	closed    bool
	readyOnce sync.Once
	byAuthor  map[domain.UserID]map[*viewer]struct{}
	byUser    map[domain.UserID]map[*viewer]struct{}
	open      map[domain.UserID]int
	// held are the entries of this process's streams in the presence record.
	held map[presence.Stream]struct{}
}

// NewStreams returns the streams of deps' log; Run feeds them.
func NewStreams(deps StreamDeps, cfg StreamConfig) *Streams {
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Streams{
		log: deps.Log, cfg: cfg.withDefaults(), posts: deps.Posts, activity: deps.Activity,
		logger: deps.Logger, now: deps.Now, metrics: newStreamMetrics(deps.Registerer),
		presence: deps.Presence, presenceLost: newSampledLog(),
		ready: make(chan struct{}), done: make(chan struct{}), turn: make(chan struct{}),
		byAuthor: map[domain.UserID]map[*viewer]struct{}{}, byUser: map[domain.UserID]map[*viewer]struct{}{},
		open: map[domain.UserID]int{}, held: map[presence.Stream]struct{}{},
	}
	s.catchUps = make(chan struct{}, s.cfg.CatchUps)
	s.openings = make(chan struct{}, s.cfg.Openings)
	s.recent.ring = make([]recent, s.cfg.Recent)
	return s
}

// errCaughtUp ends a read of the log that reached where it was going.
var errCaughtUp = errors.New("caught up")

// Run reads the log from its head and dispatches each event to the streams
// it concerns, until ctx ends. A failed read is retried from the event after
// the last dispatched. It also renews the open streams' presence entries.
func (s *Streams) Run(ctx context.Context) error {
	if s.presence != nil {
		renewCtx, stop := context.WithCancel(ctx)
		var renewals sync.WaitGroup
		renewals.Go(func() { s.renew(renewCtx) })
		defer renewals.Wait()
		defer stop()
	}
	return s.read(ctx)
}

// read is Run's reading of the log.
func (s *Streams) read(ctx context.Context) error {
	err := events.RetryUnavailable(ctx, s.logger, "streams: read the log's head", func() error {
		head, err := s.log.Head(ctx)
		if err == nil {
			s.mu.Lock()
			s.begun, s.last = head, head
			s.mu.Unlock()
		}
		return err
	})
	if err != nil {
		return err
	}
	s.readyOnce.Do(func() { close(s.ready) })
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		s.mu.Lock()
		from := s.last + 1
		s.mu.Unlock()
		err := s.log.Read(ctx, events.ReadOptions{FromSeq: from, IncludeUnknown: true}, func(rec events.Record) error {
			backoff = 100 * time.Millisecond
			return s.dispatch(ctx, rec)
		})
		if ctx.Err() != nil {
			return nil //nolint:nilerr // stopped: the read's error is the stop
		}
		s.logger.Warn("streams: reading the log failed; reading again", "from", from, "err", err, "after", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}

// Close ends every stream, each at a point a client resumes from, and
// refuses new ones: before the server's shutdown, which waits for them.
func (s *Streams) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
}

// dispatch hands rec's events to the joined streams it concerns.
func (s *Streams) dispatch(ctx context.Context, rec events.Record) error {
	s.mu.Lock()
	if rec.Seq <= s.last {
		s.mu.Unlock()
		return nil
	}
	if rec.Seq != s.last+1 {
		s.mu.Unlock()
		return fmt.Errorf("streams: event %d came after %d", rec.Seq, s.last)
	}
	s.begun = rec.Seq
	s.mu.Unlock()
	var items []ActivityItem
	kept := recent{rec: rec}
	if s.activity != nil && rec.Event != nil {
		owner, known, maybe := s.activityOwner(ctx, rec)
		kept.owner, kept.known, kept.maybe = owner, known, maybe
		var err error
		switch {
		case !maybe:
		case known && s.joined(owner):
			// Found by the owner's streams as they write it (see
			// writeActivity), so that no stream waits for another's.
			items = []ActivityItem{{User: owner}}
		case !known:
			items, err = s.activity.ActivityItems(ctx, rec, s.joined)
		}
		if err != nil {
			s.mu.Lock()
			s.begun = s.last
			s.endTurn()
			s.mu.Unlock()
			return fmt.Errorf("streams: activity of event %d: %w", rec.Seq, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.endTurn()
	var body []byte
	visit := func(set map[*viewer]struct{}) {
		for v := range set {
			s.deliver(v, rec, items, body)
		}
	}
	switch e := rec.Event.(type) {
	case events.PostCreated:
		if set := s.byAuthor[e.UserID]; len(set) > 0 {
			// At its position a post is as its event made it, for every
			// viewer: encoded once, and announced without waiting for the
			// read model.
			body = appendPost(nil, readmodel.CreatedPost(e))
			visit(set)
		}
	case events.PostDeleted:
		visit(s.byAuthor[e.UserID])
	case events.UserFollowed:
		visit(s.byUser[e.FollowerID])
	case events.UserUnfollowed:
		visit(s.byUser[e.FollowerID])
	}
	for _, it := range items {
		visit(s.byUser[it.User])
	}
	kept.body = body
	s.recent.add(kept)
	s.last = rec.Seq
	return nil
}

// activityOwner is whose activity item rec may make (maybe), if known: a
// follow makes the followee's, a like or a comment its post's author's.
// Finding the item means waiting for the activity projection to apply rec,
// and a query: the one reader of the log must not do that, for every like,
// for all the streams. An author not known (a post the read model does not
// have yet) is not.
func (s *Streams) activityOwner(ctx context.Context, rec events.Record) (owner domain.UserID, known, maybe bool) {
	var post domain.PostID
	switch e := rec.Event.(type) {
	case events.PostCreated:
		s.authors.add(e.PostID, e.UserID)
		return 0, false, false
	case events.UserFollowed:
		return e.FolloweeID, true, true
	case events.PostLiked:
		post = e.PostID
	case events.CommentAdded:
		post = e.PostID
	default:
		return 0, false, false
	}
	author, ok := s.authors.get(post)
	if !ok && s.posts != nil {
		if posts, err := s.posts.Posts(ctx, []domain.PostID{post}, 0, 0); err == nil && len(posts) == 1 {
			author, ok = posts[0].UserID, true
			s.authors.add(post, author)
		}
	}
	return author, ok, true
}

// postAuthors remembers the authors of the last posts created, a ring of
// them, for the likes and comments that mostly follow soon after.
type postAuthors struct {
	mu   sync.Mutex
	by   map[domain.PostID]domain.UserID
	ring []domain.PostID
	next int
}

const rememberedAuthors = 1 << 16

func (a *postAuthors) add(post domain.PostID, author domain.UserID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.by == nil {
		a.by, a.ring = make(map[domain.PostID]domain.UserID, rememberedAuthors), make([]domain.PostID, rememberedAuthors)
	}
	if _, ok := a.by[post]; ok {
		return
	}
	delete(a.by, a.ring[a.next])
	a.ring[a.next] = post
	a.next = (a.next + 1) % len(a.ring)
	a.by[post] = author
}

func (a *postAuthors) get(post domain.PostID) (domain.UserID, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	u, ok := a.by[post]
	return u, ok
}

// joined reports whether user has a joined stream.
func (s *Streams) joined(user domain.UserID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byUser[user]) > 0
}

// deliver queues v's events of rec, a post's with body, keeping the followee
// index current; a stream whose queue is full is dropped. The caller holds mu.
func (s *Streams) deliver(v *viewer, rec events.Record, items []ActivityItem, body []byte) {
	if !v.attached || rec.Seq <= v.pos {
		return
	}
	v.pos = rec.Seq // visited once, whatever index it is found by
	for _, ev := range v.events(rec, items) {
		if ev.kind == kindPost {
			ev.body = body
		}
		switch ev.kind {
		case kindFollow:
			addViewer(s.byAuthor, ev.user, v)
		case kindUnfollow:
			removeViewer(s.byAuthor, ev.user, v)
		}
		ev.live = true
		select {
		case v.queue <- ev:
		default:
			// Its writer may be blocked on the connection for as long as a
			// write may take: closing the connection frees it now.
			s.detach(v)
			close(v.slow)
			s.metrics.slow.Inc()
			if v.hangUp != nil {
				v.hangUp()
			}
			return
		}
	}
}

func addViewer(index map[domain.UserID]map[*viewer]struct{}, key domain.UserID, v *viewer) {
	set := index[key]
	if set == nil {
		set = map[*viewer]struct{}{}
		index[key] = set
	}
	set[v] = struct{}{}
}

func removeViewer(index map[domain.UserID]map[*viewer]struct{}, key domain.UserID, v *viewer) {
	delete(index[key], v)
	if len(index[key]) == 0 {
		delete(index, key)
	}
}

// attach joins v to the dispatch. The caller holds mu.
func (s *Streams) attach(v *viewer) {
	v.attached = true
	addViewer(s.byUser, v.user, v)
	for f := range v.follows {
		addViewer(s.byAuthor, f, v)
	}
}

// detach takes v out of the dispatch. The caller holds mu.
func (s *Streams) detach(v *viewer) {
	if !v.attached {
		return
	}
	v.attached = false
	removeViewer(s.byUser, v.user, v)
	for f := range v.follows {
		removeViewer(s.byAuthor, f, v)
	}
}

// slot is an admitted stream: its user and, if the presence record took it,
// its entry there.
type slot struct {
	user  domain.UserID
	entry *presence.Stream
}

// reserve admits a stream of user, refusing one over the limit: the limit
// across replicas, as the presence record counts, or this process's alone
// without one or while it is unreachable.
func (s *Streams) reserve(ctx context.Context, user domain.UserID) (slot, error) {
	if s.isClosed() {
		return slot{}, errShuttingDown
	}
	sl := slot{user: user}
	if s.presence != nil {
		entry, held, ok, err := s.presence.Admit(ctx, user, s.cfg.PerUser)
		switch {
		case err != nil:
			s.presenceLost.log(ctx, s.logger, slog.LevelWarn, "stream: presence record unreachable; the stream limit is this process's", "err", err)
		case !ok:
			s.metrics.refused.Inc()
			return slot{}, fmt.Errorf("user %d has %d streams open, the most one user may: %w", user, held, domain.ErrTooMany)
		default:
			sl.entry = &entry
		}
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		if sl.entry != nil {
			s.forget(*sl.entry)
		}
		return slot{}, errShuttingDown
	case sl.entry == nil && s.open[user] >= s.cfg.PerUser:
		n := s.open[user]
		s.mu.Unlock()
		s.metrics.refused.Inc()
		return slot{}, fmt.Errorf("user %d has %d streams open here, the most one user may: %w", user, n, domain.ErrTooMany)
	}
	defer s.mu.Unlock()
	s.open[user]++
	if sl.entry != nil {
		s.held[*sl.entry] = struct{}{}
	}
	s.metrics.open.Inc()
	return sl, nil
}

var errShuttingDown = fmt.Errorf("the service is shutting down: %w", domain.ErrUnavailable)

func (s *Streams) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// release ends sl's stream, here and in the presence record.
func (s *Streams) release(sl slot) {
	s.mu.Lock()
	if s.open[sl.user]--; s.open[sl.user] <= 0 {
		delete(s.open, sl.user)
	}
	if sl.entry != nil {
		delete(s.held, *sl.entry)
	}
	s.metrics.open.Dec()
	s.mu.Unlock()
	if sl.entry != nil {
		s.forget(*sl.entry)
	}
}

// presenceTimeout bounds a renewal or release in the presence record: an
// entry not released expires anyway.
const presenceTimeout = 2 * time.Second

// forget removes entry from the presence record, after any renewal under
// way (which may have read it among the held).
func (s *Streams) forget(entry presence.Stream) {
	s.renewing.Lock()
	defer s.renewing.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), presenceTimeout)
	defer cancel()
	if err := s.presence.Release(ctx, entry); err != nil {
		s.presenceLost.log(ctx, s.logger, slog.LevelWarn, "stream: release in the presence record failed; the entry expires", "err", err)
	}
}

// renew keeps this process's entries in the presence record from expiring,
// until ctx ends.
func (s *Streams) renew(ctx context.Context) {
	tick := time.NewTicker(s.presence.Renewal())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.renewing.Lock()
		s.mu.Lock()
		held := make([]presence.Stream, 0, len(s.held))
		for e := range s.held {
			held = append(held, e)
		}
		s.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, presenceTimeout)
		if err := s.presence.Renew(rctx, held); err != nil {
			s.presenceLost.log(rctx, s.logger, slog.LevelWarn, "stream: renewal in the presence record failed", "streams", len(held), "err", err)
		}
		cancel()
		s.renewing.Unlock()
	}
}

// start decides where a stream begins: after the log's head for a new one;
// after resume for one resumed within the window; else after the head, with
// a reset first.
func (s *Streams) start(ctx context.Context, resume *uint64) (from uint64, reset bool, err error) {
	head, err := s.log.Head(ctx)
	if err != nil {
		return 0, false, err
	}
	if resume == nil {
		return head, false, nil
	}
	r := *resume
	switch {
	case r > head:
		return head, true, nil
	case r == head:
		return r, false, nil
	}
	next, err := s.log.Get(ctx, r+1)
	if err != nil {
		return 0, false, err
	}
	if s.now().Sub(next.OccurredAt) > s.cfg.Window {
		return head, true, nil
	}
	return r, false, nil
}

// followsAt is user's followees just after the event at pos, from the log:
// exact at any position, for the cost of reading user's follow events, on
// one of the Openings.
func (s *Streams) followsAt(ctx context.Context, user domain.UserID, pos uint64) (map[domain.UserID]struct{}, error) {
	follows := map[domain.UserID]struct{}{}
	if pos == 0 {
		return follows, nil
	}
	select {
	case s.openings <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.openings }()
	filter := fmt.Sprintf("%s.%d.%s.>", events.SubjectPrefix, user, events.KindFollow)
	err := s.log.Read(ctx, events.ReadOptions{Filters: []string{filter}, StopAtEnd: true}, func(rec events.Record) error {
		if rec.Seq > pos {
			return errCaughtUp
		}
		switch e := rec.Event.(type) {
		case events.UserFollowed:
			follows[e.FolloweeID] = struct{}{}
		case events.UserUnfollowed:
			delete(follows, e.FolloweeID)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errCaughtUp) {
		return nil, fmt.Errorf("followees of %d: %w", user, err)
	}
	return follows, nil
}

var errStreamsClosed = errors.New("streams closed")

// position is how far v's stream has gone with nothing left to write: the
// position a ping tells the client, 0 while events are waiting.
func (s *Streams) position(v *viewer) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !v.attached || len(v.queue) > 0 {
		return 0
	}
	return max(s.last, v.pos)
}

// Headers of GET /stream.
const (
	headerLastEventID = "Last-Event-ID"
	queryAccessToken  = "access_token"
)

// registerStream adds GET /stream; without streams it answers 503.
func registerStream(app *fiber.App, deps Deps) {
	app.Get("/stream", deps.Auth.streamAuth, func(c *fiber.Ctx) error {
		if deps.Streams == nil {
			return fmt.Errorf("no streams are configured: %w", domain.ErrUnavailable)
		}
		return deps.Streams.handle(c)
	})
}

// streamAuth admits a request with a valid token in its Authorization
// header or, for a browser's EventSource, which cannot set headers, in the
// access_token query parameter.
func (a *Authenticator) streamAuth(c *fiber.Ctx) error {
	if _, ok, err := bearer(c); ok || err != nil {
		return a.requireAuth(c)
	}
	token := c.Query(queryAccessToken)
	if token == "" {
		return fmt.Errorf("a bearer token or the access_token parameter is required: %w", domain.ErrUnauthenticated)
	}
	p, err := a.Authenticate(token)
	if err != nil {
		return err
	}
	c.Locals(principalKey, p)
	return c.Next()
}

// handle answers GET /stream: it checks the request, then streams.
func (s *Streams) handle(c *fiber.Ctx) error {
	p, _ := principal(c)
	var resume *uint64
	if h := c.Get(headerLastEventID); h != "" {
		r, err := events.ParsePosition(strings.TrimSpace(h))
		if err != nil {
			return fmt.Errorf("header %s: %w", headerLastEventID, err)
		}
		resume = &r
	}
	ctx, cancel := queryContext(c)
	defer cancel()
	sl, err := s.reserve(ctx, p.UserID)
	if err != nil {
		return err
	}
	from, reset, err := s.start(ctx, resume)
	if err != nil {
		s.release(sl)
		return err
	}
	switch {
	case reset:
		s.metrics.resets.Inc()
	case resume != nil:
		s.metrics.resumptions.Inc()
	}
	c.Set(fiber.HeaderContentType, "text/event-stream")
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set("X-Accel-Buffering", "no")
	c.Set(headerPosition, events.Position(from))
	// The connection ends with the stream, so the body needs no framing:
	// the stream writes to the connection itself, taken over once the
	// handlers have set the headers, rather than through the server's
	// chunked body writer, which copied each event through a pipe and a
	// goroutine of its own. It is watched for the client leaving, which no
	// request after it could share.
	fc := c.Context()
	fc.Response.Header.SetConnectionClose()
	fc.HijackSetNoResponse(true)
	user := p.UserID
	fc.Hijack(func(conn net.Conn) {
		defer s.release(sl)
		if !s.serving() {
			return
		}
		defer s.streams.Done()
		// The connection itself: the server's wrapper neither closes it
		// (the server does, once the stream returns) nor reads it but
		// through a buffer the server reuses then.
		if raw, ok := conn.(interface{ UnsafeConn() net.Conn }); ok {
			conn = raw.UnsafeConn()
		}
		out := &sseWriter{w: bufio.NewWriterSize(conn, sseBuffer), conn: conn, timeout: s.cfg.WriteTimeout}
		_, _ = out.w.Write(fc.Response.Header.Header())
		s.serve(user, from, reset, out)
	})
	return nil
}

// sseBuffer is a stream's write buffer: room for the events held for one
// write.
const sseBuffer = holdBytes + 4<<10

// serving counts a stream in streams unless they are closed.
func (s *Streams) serving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.streams.Add(1)
	return true
}

// Wait waits, after Close, until every stream has ended or ctx ends.
func (s *Streams) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.streams.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("streams still open: %w", ctx.Err())
	}
}

// serve writes one stream until the client goes, falls behind, or the
// streams close.
func (s *Streams) serve(user domain.UserID, from uint64, reset bool, out *sseWriter) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer out.watch(cancel)()
	// The response starts at once, before any event.
	if out.comment("ping") != nil {
		return
	}
	if reset {
		if out.event(from, "reset", []byte("{}")) != nil {
			return
		}
	}
	follows, err := s.followsAt(ctx, user, from)
	if err != nil {
		s.logger.Warn("stream: followees unknown; the client resumes", "user", user, "err", err)
		return
	}
	v := &viewer{user: user, pos: from, follows: follows,
		queue: make(chan streamEvent, s.cfg.Buffer), slow: make(chan struct{}), hangUp: out.hangUp}
	write := func(ev streamEvent) error { return s.write(ctx, out, user, ev) }
	// The replay queues its events as the reader will, while they are
	// written: it reads the log as fast as the log goes, where one that
	// wrote each (a post waits for the read model) stayed behind the reader
	// under load, never to join it.
	enqueue := func(ev streamEvent) error {
		select {
		case v.queue <- ev:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	joined := make(chan error, 1)
	var joining sync.WaitGroup
	joining.Go(func() { joined <- s.join(ctx, v, enqueue) })
	defer func() {
		cancel()
		joining.Wait()
		s.mu.Lock()
		s.detach(v)
		s.mu.Unlock()
	}()
	idle := time.NewTicker(s.cfg.Ping)
	defer idle.Stop()
	wrote := false
	for {
		select {
		case err := <-joined:
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, errStreamsClosed) {
					s.logger.Warn("stream: replay failed; the client resumes", "user", user, "err", err)
				}
				return
			}
			joined = nil
		case ev := <-v.queue:
			// The events waiting behind it go out with it, in one write.
			out.hold = len(v.queue) > 0
			if err := write(ev); err != nil {
				s.countSlow(err)
				return
			}
			wrote = true
		case <-v.slow:
			return
		case <-idle.C:
			if wrote {
				wrote = false
				continue
			}
			if pos := s.position(v); pos > out.lastID {
				err = out.ping(pos)
			} else {
				err = out.comment("ping")
			}
			if err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// countSlow counts a stream ended by a write that timed out: a client that
// takes no write for WriteTimeout has fallen behind as surely as one whose
// queue is full.
func (s *Streams) countSlow(err error) {
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		s.metrics.slow.Inc()
	}
}

// write sends one event.
func (s *Streams) write(ctx context.Context, out *sseWriter, viewer domain.UserID, ev streamEvent) error {
	var data []byte
	switch ev.kind {
	case kindPost:
		data = ev.body
		if data == nil {
			data = appendPost(nil, readmodel.CreatedPost(ev.created))
		}
	case kindDelete:
		data = append(appendString([]byte(`{"id":`), ev.post.String()), '}')
	case kindFollow, kindUnfollow:
		data = append(appendString([]byte(`{"user_id":`), ev.user.String()), '}')
	case kindActivity:
		if ev.pending != nil {
			return s.writeActivity(ctx, out, viewer, ev)
		}
		data = ev.activity
	}
	if err := out.event(ev.seq, ev.kind, data); err != nil {
		return err
	}
	s.metrics.sent.WithLabelValues(ev.kind).Inc()
	if ev.kind == kindPost && ev.live {
		s.metrics.delay.Observe(s.now().Sub(ev.occurred).Seconds())
	}
	return nil
}

// writeActivity writes the viewer's activity item of the event the
// dispatcher found may make one, if it does.
func (s *Streams) writeActivity(ctx context.Context, out *sseWriter, viewer domain.UserID, ev streamEvent) error {
	items, err := s.activity.ActivityItems(ctx, *ev.pending, func(u domain.UserID) bool { return u == viewer })
	if err != nil {
		return err
	}
	for _, it := range items {
		if it.User != viewer {
			continue
		}
		if err := out.event(ev.seq, kindActivity, it.JSON); err != nil {
			return err
		}
		s.metrics.sent.WithLabelValues(kindActivity).Inc()
	}
	return nil
}

// awaitApplied waits until the projection whose position p looks up has
// applied seq; false if ctx ends first.
func awaitApplied(ctx context.Context, p *sharedPosition, seq uint64) bool {
	for backoff := firstPoll; ; backoff = min(2*backoff, maxPoll) {
		if pos, err := p.get(ctx, seq); err == nil && pos >= seq {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
	}
}

// sseWriter writes Server-Sent Events, each write bounded in time.
type sseWriter struct {
	w       *bufio.Writer
	conn    net.Conn
	timeout time.Duration
	// lastID is the last id written.
	lastID uint64
	// hold keeps an event in the buffer (up to holdBytes), for the next
	// one's write: it is not the last of those waiting.
	hold bool
}

// holdBytes bounds the events held for one write.
const holdBytes = 16 << 10

// watch calls gone when the client closes the connection (or sends
// anything: a stream's connection carries no other request), so that a
// stream whose client left ends at once, not at its next write. The
// returned stop closes the connection and waits for the watch to end.
func (o *sseWriter) watch(gone func()) (stop func()) {
	if o.conn == nil {
		return func() {}
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		// The server's read deadline, set for the request, no longer applies.
		_ = o.conn.SetReadDeadline(time.Time{})
		var b [1]byte
		_, _ = o.conn.Read(b[:])
		gone()
	}()
	return func() {
		o.hangUp()
		<-ended
	}
}

// hangUp closes the connection, failing a write that waits on it.
func (o *sseWriter) hangUp() {
	if o.conn != nil {
		_ = o.conn.Close()
	}
}

func (o *sseWriter) flush() error {
	if o.conn != nil {
		// The server's deadline was set once for the whole response.
		_ = o.conn.SetWriteDeadline(time.Now().Add(o.timeout))
	}
	return o.w.Flush()
}

func (o *sseWriter) comment(text string) error {
	_, _ = o.w.WriteString(": " + text + "\n\n")
	return o.flush()
}

// ping is a comment with the position the stream has reached, so that a
// client resumes from there: an id without data dispatches no event.
func (o *sseWriter) ping(pos uint64) error {
	_, _ = fmt.Fprintf(o.w, ": ping\nid: %d\n\n", pos)
	o.lastID = pos
	return o.flush()
}

var newline = []byte{'\n'}

func (o *sseWriter) event(id uint64, kind string, data []byte) error {
	b := append(o.w.AvailableBuffer(), "id: "...)
	b = strconv.AppendUint(b, id, 10)
	b = append(append(append(b, "\nevent: "...), kind...), '\n')
	_, _ = o.w.Write(b)
	for {
		line, rest, more := bytes.Cut(data, newline)
		_, _ = o.w.WriteString("data: ")
		_, _ = o.w.Write(line)
		_ = o.w.WriteByte('\n')
		if !more {
			break
		}
		data = rest
	}
	_ = o.w.WriteByte('\n')
	o.lastID = id
	if o.hold && o.w.Buffered() < holdBytes {
		return nil
	}
	return o.flush()
}

type streamMetrics struct {
	open                      prometheus.Gauge
	sent                      *prometheus.CounterVec
	resumptions, resets, slow prometheus.Counter
	refused                   prometheus.Counter
	delay                     prometheus.Histogram
	// caughtUp counts streams brought to the dispatcher, from memory or
	// from the log.
	caughtUp *prometheus.CounterVec
}

func newStreamMetrics(reg prometheus.Registerer) *streamMetrics {
	m := &streamMetrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{Name: "feed_streams_open", Help: "Open GET /stream connections."}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_stream_events_total", Help: "Events written to streams, by type.",
		}, []string{"type"}),
		resumptions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "feed_stream_resumptions_total", Help: "Streams resumed with Last-Event-ID within the window.",
		}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "feed_stream_resets_total", Help: "Streams resumed from a position older than the window, answered with a reset.",
		}),
		slow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "feed_stream_slow_disconnects_total", Help: "Streams disconnected for falling behind: more events waiting than the buffer holds, or a write not taken within the write timeout.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "feed_stream_refused_total", Help: "Streams refused with 429: the user had as many open as one may.",
		}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "feed_stream_announce_seconds",
			Help:    "Time from a post accepted to its announcement written to a connected viewer's stream.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		caughtUp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_stream_catch_ups_total", Help: "Streams that caught up with the live events, by where from: memory (the recent events) or the log (a resumption from further back).",
		}, []string{"from"}),
	}
	if reg != nil {
		reg.MustRegister(m.open, m.sent, m.resumptions, m.resets, m.slow, m.refused, m.delay, m.caughtUp)
	}
	return m
}
