package http

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// sampledLog writes at most one line a second of what a request logs on a
// path every request may take at once: a dependency that fails fails every
// request, and a line for each, thousands a second, costs the process CPU
// and its log's reader patience just when there is least of either. Each
// line says how many like it were left out since the last (left_out); the
// requests themselves are counted in the metrics.
type sampledLog struct {
	every rate.Sometimes
	calls atomic.Int64
}

func newSampledLog() *sampledLog {
	return &sampledLog{every: rate.Sometimes{Interval: time.Second}}
}

// log is logger.Log, unless a line was written less than a second ago.
func (s *sampledLog) log(ctx context.Context, logger *slog.Logger, level slog.Level, msg string, args ...any) {
	s.calls.Add(1)
	s.every.Do(func() {
		left := s.calls.Swap(0) - 1
		logger.Log(ctx, level, msg, append(args, "left_out", left)...)
	})
}
