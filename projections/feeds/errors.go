package feeds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
)

// ErrRedisTooOld is a Redis without Lua functions (FUNCTION, FCALL): before
// 7.0.
var ErrRedisTooOld = errors.New("the feeds need Redis 7.0 or later")

// Fail wraps err with what was being done, marking failures to reach Redis
// as domain.ErrUnavailable so that readers fall back to Postgres.
func Fail(what string, err error) error {
	if unreachable(err) {
		return fmt.Errorf("%s: %w: %w", what, domain.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// unreachable tells a failure to reach Redis (no connection, a connection
// lost, a deadline, a server loading or without a master) from a failure of the
// command itself.
func unreachable(err error) bool {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		redis.IsLoadingError(err), redis.IsClusterDownError(err), redis.IsTryAgainError(err),
		redis.IsMasterDownError(err), redis.IsMaxClientsError(err):
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "i/o timeout") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe")
}
