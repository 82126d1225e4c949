package pgschema

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/feedproject/feed/domain"
)

// Unreachable tells a failure to reach Postgres (no connection, a connection
// lost, a server shutting down or refusing connections, a deadline) from a
// failure of the statement itself.
func Unreachable(err error) bool {
	var (
		connErr *pgconn.ConnectError
		netErr  net.Error
		pgErr   *pgconn.PgError
	)
	switch {
	case errors.As(err, &connErr), errors.As(err, &netErr),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, io.ErrUnexpectedEOF),
		pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	case errors.As(err, &pgErr):
		// 08: connection exception; 57P01-57P03: admin/crash shutdown, cannot
		// connect now; 53300: too many connections.
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P") || pgErr.Code == "53300"
	}
	return false
}

// Failure marks a failure to reach Postgres as domain.ErrUnavailable,
// keeping the original in the chain.
func Failure(err error) error {
	if Unreachable(err) {
		return fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
	}
	return err
}
