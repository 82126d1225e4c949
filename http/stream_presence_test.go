package http

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/http/media"
	"github.com/feedproject/feed/projections/feeds/presence"
)

// presenceReplica is an API server with its streams, recording them in a
// shared Redis through a client of its own.
type presenceReplica struct {
	addr string
	rdb  *redis.Client
	srv  *Server
	// stop shuts the server down and stops its streams.
	stop func()
}

func newPresenceReplica(t *testing.T, natsURL, redisAddr string, expiry time.Duration) *presenceReplica {
	t.Helper()
	log := openTestLog(t, natsURL)
	auth, err := NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	ids, err := domain.NewIDGenerator(3)
	require.NoError(t, err)
	pack, err := media.NewPack(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pack.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	reg := prometheus.NewRegistry()
	quiet := slog.New(slog.DiscardHandler)
	streams := NewStreams(StreamDeps{Log: log, Registerer: reg, Logger: quiet,
		Presence: presence.New(rdb, presence.Config{Expiry: expiry})}, StreamConfig{Ping: 50 * time.Millisecond})
	srv := NewServer(Deps{Logger: quiet, Registerer: reg, Gatherer: reg, Log: log, Media: pack, Auth: auth, IDs: ids, Streams: streams}, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = streams.Run(ctx)
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	r := &presenceReplica{addr: ln.Addr().String(), rdb: rdb, srv: srv}
	stopped := false
	r.stop = func() {
		if !stopped {
			stopped = true
			_ = srv.Shutdown(context.Background())
			cancel()
			<-done
		}
	}
	t.Cleanup(r.stop)
	return r
}

// TestStreamLimitAcrossReplicas: one user's five streams are counted across
// two API replicas sharing Redis. The sixth is 429 on either; a stream closed
// on one frees a place on the other; the places of a replica that dies (its
// streams neither renewed nor released) free within the entries' expiry.
func TestStreamLimitAcrossReplicas(t *testing.T) {
	natsURL := localstacktest.NATSForTest(t).ClientURL()
	redisAddr := localstacktest.RedisForTest(t).Addr()
	const expiry = 1500 * time.Millisecond
	a := newPresenceReplica(t, natsURL, redisAddr, expiry)
	b := newPresenceReplica(t, natsURL, redisAddr, expiry)
	auth, err := NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	tok, err := auth.Mint(41, false, time.Now(), time.Hour)
	require.NoError(t, err)
	dial := func(r *presenceReplica) *sseClient {
		c, err := dialStream(r.addr, tok, "", false, nil)
		require.NoError(t, err)
		t.Cleanup(c.close)
		return c
	}

	var onA []*sseClient
	for range 3 {
		c := dial(a)
		require.Equal(t, http.StatusOK, c.resp.StatusCode)
		onA = append(onA, c)
	}
	for range 2 {
		require.Equal(t, http.StatusOK, dial(b).resp.StatusCode)
	}
	for _, r := range []*presenceReplica{a, b} {
		sixth := dial(r)
		require.Equal(t, http.StatusTooManyRequests, sixth.resp.StatusCode, "the sixth across the replicas")
		assert.NotEmpty(t, sixth.resp.Header.Get("Retry-After"))
		assert.Equal(t, "too_many_requests", errorCodeOf(t, sixth.resp))
	}

	// A stream closed on A frees a place, taken on B.
	onA[0].close()
	require.Eventually(t, func() bool {
		c, err := dialStream(b.addr, tok, "", false, nil)
		if err != nil {
			return false
		}
		if c.resp.StatusCode == http.StatusOK {
			t.Cleanup(c.close)
			return true
		}
		c.close()
		return false
	}, 5*time.Second, 20*time.Millisecond, "a closed stream frees its place")
	require.Equal(t, http.StatusTooManyRequests, dial(a).resp.StatusCode)

	// B dies: it reaches Redis no more, and its three streams end without a
	// word there. They still count, until their entries expire.
	_ = b.rdb.Close()
	killed := time.Now()
	b.stop()
	require.Equal(t, http.StatusTooManyRequests, dial(a).resp.StatusCode, "a dead replica's entries outlive it")
	// Each entry expires at most the expiry after B last wrote it.
	var freed time.Duration
	for range 3 {
		require.Eventually(t, func() bool {
			c, err := dialStream(a.addr, tok, "", false, nil)
			if err != nil {
				return false
			}
			if c.resp.StatusCode == http.StatusOK {
				freed = time.Since(killed)
				t.Cleanup(c.close)
				return true
			}
			c.close()
			return false
		}, 2*expiry+2*time.Second, 20*time.Millisecond, "a dead replica's places free within the expiry")
	}
	assert.LessOrEqual(t, freed, expiry+time.Second, "all three of B's places free within the expiry")
	require.Equal(t, http.StatusTooManyRequests, dial(a).resp.StatusCode)
}

// TestStreamLimitWithoutRedis: while the presence record is unreachable, the
// limit is the process's own.
func TestStreamLimitWithoutRedis(t *testing.T) {
	natsURL := localstacktest.NATSForTest(t).ClientURL()
	r := newPresenceReplica(t, natsURL, "127.0.0.1:1", time.Second)
	auth, err := NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	tok, err := auth.Mint(42, false, time.Now(), time.Hour)
	require.NoError(t, err)
	for range 5 {
		c := openStream(t, r.addr, tok, "", false)
		require.Equal(t, http.StatusOK, c.resp.StatusCode)
	}
	sixth := openStream(t, r.addr, tok, "", false)
	require.Equal(t, http.StatusTooManyRequests, sixth.resp.StatusCode)
}
