package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/domain"
	feedhttp "github.com/feedproject/feed/http"
)

// TestREADMEDocumentsEveryVariable keeps the README's configuration table true.
func TestREADMEDocumentsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, v := range stack.Variables {
		def := " |"
		if v.Default != "" {
			def = fmt.Sprintf(" `%s` |", v.Default)
		}
		row := fmt.Sprintf("| `%s` |%s", v.Name, def)
		assert.Contains(t, string(readme), row, "README lacks the row %q", row)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := stack.Parse(func(string) string { return "" })
	require.NoError(t, err)
	assert.Equal(t, ":8080", cfg.HTTPAddr)
	assert.Equal(t, ".data", cfg.DataDir)
	assert.Equal(t, "always", cfg.NATSSync)
	assert.Equal(t, []string{"api", "readmodel", "planner", "appliers", "activity"}, cfg.Roles)
	assert.Equal(t, 4222, cfg.NATSPort)
}

func TestTokenMintsAVerifiableToken(t *testing.T) {
	var out, errOut strings.Builder
	env := map[string]string{"FEED_JWT_SECRET": "a-secret-of-sixteen-bytes-or-more"}
	getenv := func(k string) string { return env[k] }
	require.NoError(t, run(context.Background(), []string{"token", "--user", "501", "--admin", "--ttl", "1h"}, getenv, &out, &errOut))
	auth, err := feedhttp.NewAuthenticator(env["FEED_JWT_SECRET"], nil)
	require.NoError(t, err)
	p, err := auth.Authenticate(strings.TrimSpace(out.String()))
	require.NoError(t, err)
	assert.Equal(t, domain.UserID(501), p.UserID)
	assert.True(t, p.Admin)
	assert.Empty(t, errOut.String())

	// Without a secret it signs with the one dev mode accepts, and says so.
	out.Reset()
	require.NoError(t, run(context.Background(), []string{"token", "--user", "7"}, func(string) string { return "" }, &out, &errOut))
	auth, err = feedhttp.NewAuthenticator(stack.DevJWTSecret, nil)
	require.NoError(t, err)
	_, err = auth.Authenticate(strings.TrimSpace(out.String()))
	require.NoError(t, err)
	assert.Contains(t, errOut.String(), "development secret")

	for _, args := range [][]string{{"token"}, {"token", "--user", "0"}, {"token", "--user", "x"}, {"token", "--user", "1", "--ttl", "-1h"}} {
		err := run(context.Background(), args, getenv, io.Discard, io.Discard)
		assert.ErrorIs(t, err, errUsage, "%v", args)
	}
}

func TestServeRefusesWithoutASecret(t *testing.T) {
	cfg, err := stack.Parse(func(string) string { return "" })
	require.NoError(t, err)
	_, err = cfg.TokenSecret(false)
	require.Error(t, err)
	secret, err := cfg.TokenSecret(true)
	require.NoError(t, err)
	assert.Equal(t, stack.DevJWTSecret, secret)
}

// TestServiceLeavesTheRuntimeAlone: serve changes neither the collector's
// target nor the scheduler's Ps; GOGC and GOMAXPROCS, which the runtime reads
// itself, are the operator's (decision 56).
func TestServiceLeavesTheRuntimeAlone(t *testing.T) {
	prevGC, prevProcs := debug.SetGCPercent(137), runtime.GOMAXPROCS(3)
	t.Cleanup(func() {
		debug.SetGCPercent(prevGC)
		runtime.GOMAXPROCS(prevProcs)
	})
	cfg, err := stack.Parse(envMap(map[string]string{
		"FEED_JWT_SECRET": "a-secret-of-sixteen-bytes-or-more",
		"NATS_URL":        "nats://127.0.0.1:1", "REDIS_URL": "redis://127.0.0.1:1", "DATABASE_URL": "postgres://127.0.0.1:1/feed",
	}))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Nothing listens on port 1: serve fails as it connects, after its start.
	require.Error(t, serve(ctx, cfg, false, slog.New(slog.DiscardHandler), io.Discard))
	assert.Equal(t, 137, debug.SetGCPercent(137), "the GC target")
	assert.Equal(t, 3, runtime.GOMAXPROCS(0), "the Ps")
}

// TestDevRedisRealtimeIsOptIn: dev's Redis runs under SCHED_FIFO only when
// FEED_DEV_REDIS_REALTIME names a priority.
func TestDevRedisRealtimeIsOptIn(t *testing.T) {
	cfg, err := stack.Parse(envMap(nil))
	require.NoError(t, err)
	assert.Zero(t, devRedisConfig(cfg).Realtime, "by default")
	assert.Equal(t, devRedisNice, devRedisConfig(cfg).Nice)

	cfg, err = stack.Parse(envMap(map[string]string{"FEED_DEV_REDIS_REALTIME": "1"}))
	require.NoError(t, err)
	assert.Equal(t, 1, devRedisConfig(cfg).Realtime)

	for _, bad := range []string{"100", "-1", "yes"} {
		_, err = stack.Parse(envMap(map[string]string{"FEED_DEV_REDIS_REALTIME": bad}))
		assert.ErrorContains(t, err, "FEED_DEV_REDIS_REALTIME", bad)
	}
}

// TestReadersGiveUpOnRedisAtOnce: a read against a Redis that refuses
// connections dials twice (the reader's one retry), once each, and fails;
// go-redis's defaults dial ten times, 100 ms apart, before the read can fall
// back to Postgres.
func TestReadersGiveUpOnRedisAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	var dials atomic.Int32
	opts := stack.RedisTarget{Node: &redis.Options{Addr: addr}}.NodeOptions(readerTuning)
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	err = rdb.Get(context.Background(), "k").Err()
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	assert.EqualValues(t, 2, dials.Load(), "dials for one read")
}
