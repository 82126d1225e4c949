package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

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
	assert.Equal(t, []string{"api", "readmodel", "planner", "appliers"}, cfg.Roles)
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

// TestServiceSetsItsGCTargetUnlessGOGCIs: the service runs its collector at
// gcPercent, but an operator's GOGC wins.
func TestServiceSetsItsGCTargetUnlessGOGCIs(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	pct, set := setGCPercent(func(string) (string, bool) { return "", false })
	assert.False(t, set)
	assert.Equal(t, gcPercent, pct)
	assert.Equal(t, gcPercent, debug.SetGCPercent(150), "the target in force")

	pct, set = setGCPercent(func(k string) (string, bool) { return "150", k == "GOGC" })
	assert.True(t, set)
	assert.Equal(t, 150, pct, "what GOGC set is left alone")
	assert.Equal(t, 150, debug.SetGCPercent(prev))
}

// TestServiceRunsTwicePsAsCPUsUnlessGOMAXPROCSIs: the service runs
// procsPerCPU Ps a CPU, however many times serve starts in one process, but
// an operator's GOMAXPROCS wins.
func TestServiceRunsTwicePsAsCPUsUnlessGOMAXPROCSIs(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	unset := func(string) (string, bool) { return "", false }

	for range 2 {
		procs, set := setProcs(unset)
		assert.False(t, set)
		assert.Equal(t, procsPerCPU*defaultProcs, procs)
		assert.Equal(t, procsPerCPU*defaultProcs, runtime.GOMAXPROCS(0), "the Ps in force, not compounded")
	}

	runtime.GOMAXPROCS(3)
	procs, set := setProcs(func(k string) (string, bool) { return "3", k == "GOMAXPROCS" })
	assert.True(t, set)
	assert.Equal(t, 3, procs, "what GOMAXPROCS set is left alone")
	assert.Equal(t, 3, runtime.GOMAXPROCS(0))
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
	opts := readerOptions(&redis.Options{Addr: addr})
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
