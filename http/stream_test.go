package http

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
)

// streamRig is the app with its streams on a real JetStream, served on a
// loopback port, without projections: posts are written from their events.
type streamRig struct {
	srv     *Server
	streams *Streams
	log     *events.Log
	auth    *Authenticator
	addr    string
	logs    *syncBuffer
	n       int
	ids     *domain.IDGenerator
	// natsURL is the NATS server's.
	natsURL string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func newStreamRig(t *testing.T, cfg StreamConfig) *streamRig {
	t.Helper()
	url := localstacktest.NATSForTest(t).ClientURL()
	log := openTestLog(t, url)
	r := &streamRig{log: log, logs: &syncBuffer{}, natsURL: url}
	logger := slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var err error
	r.auth, err = NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	r.ids, err = domain.NewIDGenerator(3)
	require.NoError(t, err)
	pack, err := media.NewPack(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pack.Close() })
	reg := prometheus.NewRegistry()
	r.streams = NewStreams(StreamDeps{Log: log, Registerer: reg, Logger: logger}, cfg)
	r.srv = NewServer(Deps{Logger: logger, Registerer: reg, Gatherer: reg, Log: log, Media: pack, Auth: r.auth, IDs: r.ids, Streams: r.streams}, Config{})
	r.addr = runStreams(t, r.srv, r.streams)
	return r
}

// openTestLog opens the log on its own connection to the NATS server at url.
func openTestLog(t *testing.T, url string) *events.Log {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	log, err := events.OpenLog(context.Background(), js, events.Config{}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)
	return log
}

// runStreams runs streams and serves srv on a loopback port until the test
// ends.
func runStreams(t *testing.T, srv *Server, streams *Streams) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = streams.Run(ctx)
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Shutdown(context.Background())
		cancel()
		<-done
	})
	return ln.Addr().String()
}

func (r *streamRig) token(t *testing.T, user domain.UserID) string {
	t.Helper()
	tok, err := r.auth.Mint(user, false, time.Now(), time.Hour)
	require.NoError(t, err)
	return tok
}

// append stores ev with the given time and returns its position.
func (r *streamRig) append(t *testing.T, at time.Time, ev events.Event) uint64 {
	t.Helper()
	r.n++
	res, err := r.log.AppendEvent(context.Background(), fmt.Sprintf("s%d-%d", r.n, time.Now().UnixNano()), at, ev)
	require.NoError(t, err)
	return res.Seq
}

func (r *streamRig) newPost(t *testing.T, author domain.UserID, caption string) (domain.PostID, uint64) {
	t.Helper()
	id, at := r.ids.Next(time.Now())
	seq := r.append(t, time.Now(), events.PostCreated{PostID: domain.PostID(id), UserID: author, Caption: caption, CreatedAt: at,
		Media: []events.Media{{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 1, Height: 1, Size: 1}}})
	return domain.PostID(id), seq
}

// sseMsg is one block of a stream: an event, or a comment (a ping) with or
// without an id.
type sseMsg struct {
	id      string
	event   string
	data    string
	comment bool
}

// sseClient reads one stream.
type sseClient struct {
	resp   *http.Response
	msgs   chan sseMsg
	cancel context.CancelFunc
	// ended is closed when the body ends; err says how.
	ended chan struct{}
	err   error
}

// openStream opens GET /stream on addr with token in the header (or, if
// query, in the query) and Last-Event-ID lastID (if not empty).
func openStream(t *testing.T, addr, token, lastID string, query bool) *sseClient {
	t.Helper()
	c, err := dialStream(addr, token, lastID, query, nil)
	require.NoError(t, err)
	t.Cleanup(c.close)
	return c
}

func dialStream(addr, token, lastID string, query bool, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*sseClient, error) {
	ctx, cancel := context.WithCancel(context.Background())
	url := "http://" + addr + "/stream"
	if query {
		url += "?access_token=" + token
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	if !query {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	tr := &http.Transport{DisableKeepAlives: true}
	if dial != nil {
		tr.DialContext = dial
	}
	resp, err := (&http.Client{Transport: tr}).Do(req) //nolint:bodyclose // closed by close

	if err != nil {
		cancel()
		return nil, err
	}
	c := &sseClient{resp: resp, msgs: make(chan sseMsg, 100_000), cancel: cancel, ended: make(chan struct{})}
	if resp.StatusCode != http.StatusOK {
		close(c.ended)
		return c, nil
	}
	go c.read()
	return c, nil
}

func (c *sseClient) read() {
	defer close(c.ended)
	sc := bufio.NewScanner(c.resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var m sseMsg
	var data []string
	any := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if any {
				m.data = strings.Join(data, "\n")
				c.msgs <- m
			}
			m, data, any = sseMsg{}, nil, false
			continue
		}
		any = true
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "":
			m.comment = true
		case "id":
			m.id = value
		case "event":
			m.event = value
		case "data":
			data = append(data, value)
		}
	}
	c.err = sc.Err()
}

func (c *sseClient) close() {
	c.cancel()
	_ = c.resp.Body.Close()
	<-c.ended
}

// next is the next block within d, failing the test if none comes.
func (c *sseClient) next(t *testing.T, d time.Duration) sseMsg {
	t.Helper()
	select {
	case m := <-c.msgs:
		return m
	case <-time.After(d):
		t.Fatalf("no stream message within %s", d)
		return sseMsg{}
	}
}

// nextEvent is the next block that is an event, skipping pings.
func (c *sseClient) nextEvent(t *testing.T, d time.Duration) sseMsg {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		m := c.next(t, time.Until(deadline))
		if m.event != "" {
			return m
		}
	}
}

func errorCodeOf(t *testing.T, resp *http.Response) string {
	t.Helper()
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return body.Error.Code
}

func TestStreamAuthByHeaderAndByQuery(t *testing.T) {
	r := newStreamRig(t, StreamConfig{})
	viewer, author := domain.UserID(11), domain.UserID(12)
	r.append(t, time.Now(), events.UserFollowed{FollowerID: viewer, FolloweeID: author})

	t.Run("no token", func(t *testing.T) {
		c, err := dialStream(r.addr, "", "", false, nil)
		require.NoError(t, err)
		defer c.close()
		assert.Equal(t, http.StatusUnauthorized, c.resp.StatusCode)
		assert.Equal(t, "unauthenticated", errorCodeOf(t, c.resp))
		bad, err := dialStream(r.addr, "not-a-token", "", true, nil)
		require.NoError(t, err)
		defer bad.close()
		assert.Equal(t, http.StatusUnauthorized, bad.resp.StatusCode)
	})
	for _, query := range []bool{false, true} {
		t.Run(fmt.Sprintf("query=%t", query), func(t *testing.T) {
			tok := r.token(t, viewer)
			c := openStream(t, r.addr, tok, "", query)
			require.Equal(t, http.StatusOK, c.resp.StatusCode)
			assert.Equal(t, "text/event-stream", c.resp.Header.Get("Content-Type"))
			assert.Equal(t, "no-cache", c.resp.Header.Get("Cache-Control"))
			assert.True(t, c.resp.Close, "the stream's body ends with its connection")
			assert.Equal(t, int64(-1), c.resp.ContentLength, "no length: the body runs until the connection closes")
			assert.Empty(t, c.resp.TransferEncoding)
			first := c.next(t, 5*time.Second)
			assert.True(t, first.comment, "the response starts with a ping, before any event")
			id, seq := r.newPost(t, author, "hello")
			ev := c.nextEvent(t, 5*time.Second)
			assert.Equal(t, "post", ev.event)
			assert.Equal(t, strconv.FormatUint(seq, 10), ev.id)
			var post map[string]any
			require.NoError(t, json.Unmarshal([]byte(ev.data), &post))
			assert.Equal(t, id.String(), post["id"])
			assert.Equal(t, author.String(), post["user_id"])
			assert.Equal(t, "hello", post["caption"])
			assert.Equal(t, false, post["has_liked"])
			// A bad request with the token in the query.
			bad, err := dialStream(r.addr, tok, "not-a-position", query, nil)
			require.NoError(t, err)
			defer bad.close()
			assert.Equal(t, http.StatusBadRequest, bad.resp.StatusCode)
			assert.NotContains(t, r.logs.String(), tok, "a token is never logged")
		})
	}
}

func TestStreamSixthOfAUserIs429(t *testing.T) {
	r := newStreamRig(t, StreamConfig{Ping: 50 * time.Millisecond})
	tok := r.token(t, 21)
	var open []*sseClient
	for range 5 {
		c := openStream(t, r.addr, tok, "", false)
		require.Equal(t, http.StatusOK, c.resp.StatusCode)
		open = append(open, c)
	}
	sixth, err := dialStream(r.addr, tok, "", false, nil)
	require.NoError(t, err)
	defer sixth.close()
	require.Equal(t, http.StatusTooManyRequests, sixth.resp.StatusCode)
	assert.NotEmpty(t, sixth.resp.Header.Get("Retry-After"))
	assert.Equal(t, "too_many_requests", errorCodeOf(t, sixth.resp))
	other := openStream(t, r.addr, r.token(t, 22), "", false)
	assert.Equal(t, http.StatusOK, other.resp.StatusCode, "another user's streams are not counted")

	// A stream closed by its client is given back once a ping finds it gone.
	open[0].close()
	require.Eventually(t, func() bool {
		c, err := dialStream(r.addr, tok, "", false, nil)
		if err != nil {
			return false
		}
		defer c.close()
		return c.resp.StatusCode == http.StatusOK
	}, 5*time.Second, 50*time.Millisecond)
}

func TestStreamPingsWhenIdleWithItsPosition(t *testing.T) {
	r := newStreamRig(t, StreamConfig{Ping: 100 * time.Millisecond})
	head := r.append(t, time.Now(), events.UserFollowed{FollowerID: 31, FolloweeID: 32})
	c := openStream(t, r.addr, r.token(t, 33), "", false)
	assert.Equal(t, strconv.FormatUint(head, 10), c.resp.Header.Get("X-Position"))
	start := time.Now()
	pings := 0
	for pings < 3 {
		m := c.next(t, 2*time.Second)
		require.True(t, m.comment, "an idle stream sends nothing but pings: %+v", m)
		require.Empty(t, m.event)
		pings++
	}
	assert.Less(t, time.Since(start), 2*time.Second)
	// Others' events move the position a ping tells.
	later := r.append(t, time.Now(), events.UserFollowed{FollowerID: 34, FolloweeID: 32})
	require.Eventually(t, func() bool {
		select {
		case m := <-c.msgs:
			return m.id == strconv.FormatUint(later, 10)
		default:
			return false
		}
	}, 5*time.Second, 10*time.Millisecond, "a ping carries the position reached")
}

func TestStreamSlowReaderIsDisconnectedWithoutDelayingOthers(t *testing.T) {
	// A write would wait for a minute: the slow viewer's connection is
	// closed as its queue overflows.
	r := newStreamRig(t, StreamConfig{Buffer: 16, WriteTimeout: time.Minute, Ping: time.Minute})
	author, slow, quick := domain.UserID(41), domain.UserID(42), domain.UserID(43)
	r.append(t, time.Now(), events.UserFollowed{FollowerID: slow, FolloweeID: author})
	r.append(t, time.Now(), events.UserFollowed{FollowerID: quick, FolloweeID: author})
	// The slow client never reads, with a small receive buffer: the server's
	// writes soon block.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) })
		return errors.Join(err, serr)
	}}
	stalled, err := d.Dial("tcp", r.addr)
	require.NoError(t, err)
	defer stalled.Close()
	_, err = fmt.Fprintf(stalled, "GET /stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", r.token(t, slow))
	require.NoError(t, err)
	head := make([]byte, 10)
	_, err = io.ReadFull(stalled, head)
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 2", string(head), "the stalled stream is open")
	q := openStream(t, r.addr, r.token(t, quick), "", false)
	q.next(t, 5*time.Second)

	// Posts far larger than a caption may be: a few fill the socket buffers.
	caption := strings.Repeat("x", 100_000)
	const posts = 100
	var last uint64
	for range posts {
		_, last = r.newPost(t, author, caption)
	}
	appended := time.Now()
	got := 0
	for got < posts {
		m := q.nextEvent(t, 10*time.Second)
		require.Equal(t, "post", m.event)
		got++
		if m.id == strconv.FormatUint(last, 10) {
			break
		}
	}
	assert.Equal(t, posts, got)
	assert.Less(t, time.Since(appended), 5*time.Second, "the quick viewer is not held back by the slow one")
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.streams.metrics.slow) == 1 }, 10*time.Second, 10*time.Millisecond,
		"the slow viewer is disconnected and counted")
	require.NoError(t, stalled.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.Copy(io.Discard, stalled)
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the slow viewer's connection is closed: %v", err)
}

func TestStreamShutdownEndsStreamsCleanly(t *testing.T) {
	r := newStreamRig(t, StreamConfig{})
	c := openStream(t, r.addr, r.token(t, 51), "", false)
	c.next(t, 5*time.Second)
	start := time.Now()
	require.NoError(t, r.srv.Shutdown(context.Background()))
	assert.Less(t, time.Since(start), 3*time.Second)
	select {
	case <-c.ended:
		assert.NoError(t, c.err, "the body ends cleanly (its last chunk), not cut")
	case <-time.After(3 * time.Second):
		t.Fatal("the stream did not end at shutdown")
	}
}

func TestStreamResumesWithinTheWindowAndResetsBeyond(t *testing.T) {
	r := newStreamRig(t, StreamConfig{Window: 10 * time.Minute})
	viewer, author := domain.UserID(61), domain.UserID(62)
	old := time.Now().Add(-time.Hour)
	r.append(t, old, events.UserFollowed{FollowerID: viewer, FolloweeID: author})
	r.append(t, old, events.UserFollowed{FollowerID: 69, FolloweeID: author})
	before := r.append(t, time.Now(), events.UserFollowed{FollowerID: 68, FolloweeID: author})
	p1, s1 := r.newPost(t, author, "one")
	s2 := r.append(t, time.Now(), events.PostDeleted{PostID: p1, UserID: author, DeletedAt: time.Now()})

	// Within the window: every event after the position, in order.
	c := openStream(t, r.addr, r.token(t, viewer), strconv.FormatUint(before, 10), false)
	m := c.nextEvent(t, 5*time.Second)
	assert.Equal(t, [2]string{"post", strconv.FormatUint(s1, 10)}, [2]string{m.event, m.id})
	m = c.nextEvent(t, 5*time.Second)
	assert.Equal(t, [2]string{"delete", strconv.FormatUint(s2, 10)}, [2]string{m.event, m.id})
	assert.JSONEq(t, fmt.Sprintf(`{"id":%q}`, p1), m.data)
	c.close()

	// Older than the window: a reset at the head, then the events after it.
	c = openStream(t, r.addr, r.token(t, viewer), "1", false)
	m = c.nextEvent(t, 5*time.Second)
	assert.Equal(t, [2]string{"reset", strconv.FormatUint(s2, 10)}, [2]string{m.event, m.id})
	_, s3 := r.newPost(t, author, "three")
	m = c.nextEvent(t, 5*time.Second)
	assert.Equal(t, [2]string{"post", strconv.FormatUint(s3, 10)}, [2]string{m.event, m.id})
	assert.InDelta(t, 1, testutil.ToFloat64(r.streams.metrics.resets), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(r.streams.metrics.resumptions), 0)
}

func TestStreamWithoutStreamsIs503(t *testing.T) {
	a := newTestApp(t)
	req, err := http.NewRequest(http.MethodGet, "/stream", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+a.token(t, 1))
	resp := a.do(t, req)
	assert.Equal(t, http.StatusServiceUnavailable, resp.status)
	_, _ = io.Discard.Write(resp.raw)
}

func TestSSEEventWritesEachLineOfItsData(t *testing.T) {
	var buf bytes.Buffer
	out := &sseWriter{w: bufio.NewWriter(&buf)}
	require.NoError(t, out.event(5, "post", []byte(`{"a":1}`)))
	require.NoError(t, out.event(6, "activity", []byte("one\ntwo\n")))
	assert.Equal(t, "id: 5\nevent: post\ndata: {\"a\":1}\n\nid: 6\nevent: activity\ndata: one\ndata: two\ndata: \n\n", buf.String())
	assert.Equal(t, uint64(6), out.lastID)
}

// TestStreamsOpeningAtOnceHoldFewConsumers opens many streams at once, as a
// replica's clients do when another goes down: each reads its user's
// followees on a consumer of its own, and no more than Openings of those
// are on the server at a time, whose streams hold a bounded number.
func TestStreamsOpeningAtOnceHoldFewConsumers(t *testing.T) {
	const openings, opening = 2, 40
	r := newStreamRig(t, StreamConfig{Openings: openings})
	streams := r.streams
	for u := range opening {
		r.append(t, time.Now(), events.UserFollowed{FollowerID: domain.UserID(u + 1), FolloweeID: 999})
	}
	ctx := context.Background()
	stream := eventStream(t, r.natsURL)
	consumers := func() int {
		info, err := stream.Info(ctx)
		require.NoError(t, err)
		return info.State.Consumers
	}
	require.Eventually(t, func() bool { return consumers() == 1 }, 5*time.Second, 10*time.Millisecond, "the streams' own reader")

	most := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			most = max(most, consumers())
			select {
			case <-time.After(time.Millisecond):
			case <-streams.done:
				return
			}
			if streams.isClosed() {
				return
			}
		}
	}()
	var opened sync.WaitGroup
	var clients sync.Map
	for u := range opening {
		opened.Go(func() {
			c, err := dialStream(r.addr, r.token(t, domain.UserID(u+1)), "", false, nil)
			if assert.NoError(t, err) {
				clients.Store(u, c)
			}
		})
	}
	opened.Wait()
	clients.Range(func(_, c any) bool {
		t.Cleanup(c.(*sseClient).close)
		assert.Equal(t, http.StatusOK, c.(*sseClient).resp.StatusCode)
		return true
	})
	require.Eventually(t, func() bool { return testutil.ToFloat64(streams.metrics.caughtUp.WithLabelValues("memory")) == opening },
		10*time.Second, 10*time.Millisecond, "every stream joined")
	streams.Close()
	<-done
	assert.LessOrEqual(t, most, 1+openings, "consumers at once: the reader's and the openings'")
	assert.Greater(t, most, 1, "the sampling saw the catch-ups")
}

// eventStream is the log's stream on the NATS server at url, as the server
// reports it.
func eventStream(t *testing.T, url string) jetstream.Stream {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream, err := js.Stream(context.Background(), "FEED_EVENTS")
	require.NoError(t, err)
	return stream
}
