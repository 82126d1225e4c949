package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// TestRedisLogsThroughTheServiceLog: go-redis's own lines (here, dials to a
// Redis that is down) are records of the service's structured log, warnings
// of component redis, not lines on stderr.
func TestRedisLogsThroughTheServiceLog(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now

	var out localstacktest.SyncBuffer
	logRedisThrough(slog.New(slog.NewJSONHandler(&out, nil)))
	t.Cleanup(logging.Enable)
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { assert.Error(t, rdb.Ping(context.Background()).Err()) })
	}
	wg.Wait()

	records := redisRecords(t, out.String())
	require.NotEmpty(t, records, "go-redis logged nothing through the service's log")
	for _, r := range records {
		assert.Equal(t, "WARN", r.Level)
		assert.Equal(t, "redis", r.Component)
		assert.Contains(t, r.Msg, "failed to dial")
		assert.False(t, strings.HasPrefix(r.Msg, "redis: "), "the component says it")
	}
}

// TestRedisLogIsSampled: of a burst of one kind of go-redis line one is
// written, and the next, a second later, says how many were left out; a
// line of another kind is not held back by them, and a recovered panic is an
// error.
func TestRedisLogIsSampled(t *testing.T) {
	var out localstacktest.SyncBuffer
	l := &redisLog{log: slog.New(slog.NewJSONHandler(&out, nil)).With("component", "redis")}
	ctx := context.Background()
	for i := range 100 {
		l.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 5, i)
	}
	l.Printf(ctx, "autopipeline: recovered dispatch panic: %v\n%s", "boom", "stack")
	time.Sleep(1100 * time.Millisecond)
	l.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 5, 100)

	records := redisRecords(t, out.String())
	require.Len(t, records, 3, out.String())
	assert.Equal(t, redisRecord{Level: "WARN", Msg: "connection pool: failed to dial after 5 attempts: 0", Component: "redis"}, records[0])
	assert.Equal(t, "ERROR", records[1].Level)
	assert.Equal(t, redisRecord{Level: "WARN", Msg: "connection pool: failed to dial after 5 attempts: 100", Component: "redis", LeftOut: 99}, records[2])
}

type redisRecord struct {
	Level, Msg, Component string
	LeftOut               int `json:"left_out"`
}

func redisRecords(t *testing.T, out string) []redisRecord {
	t.Helper()
	var records []redisRecord
	for line := range strings.Lines(out) {
		var r redisRecord
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		records = append(records, r)
	}
	return records
}
