package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// logRedisThrough makes go-redis, which logs through a global of its own
// (stderr by default), log through logger instead.
func logRedisThrough(logger *slog.Logger) {
	redis.SetLogger(&redisLog{log: logger.With("component", "redis")})
}

// redisLog is go-redis's logger on the service's structured log. Its lines
// carry no level: they are warnings (a dial that failed, a connection
// dropped), errors when they report a panic. They are sampled as the
// requests' are: while Redis is down every command's dial fails, so a line
// of each kind is written at most once a second, with how many like it were
// left out since the last.
type redisLog struct {
	log   *slog.Logger
	kinds sync.Map // format string → *redisLines
}

// redisLines is the sampling of one kind of line.
type redisLines struct {
	every rate.Sometimes
	calls atomic.Int64
}

func (l *redisLog) Printf(ctx context.Context, format string, v ...any) {
	k, ok := l.kinds.Load(format)
	if !ok {
		// The formats are go-redis's constants: a few dozen at most.
		k, _ = l.kinds.LoadOrStore(format, &redisLines{every: rate.Sometimes{Interval: time.Second}})
	}
	lines := k.(*redisLines)
	lines.calls.Add(1)
	lines.every.Do(func() {
		level := slog.LevelWarn
		if strings.Contains(format, "panic") {
			level = slog.LevelError
		}
		msg := strings.TrimSpace(strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
		l.log.Log(ctx, level, msg, "left_out", lines.calls.Swap(0)-1)
	})
}
