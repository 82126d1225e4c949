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
	"github.com/feedproject/feed/projections"
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

// AdvanceCheckpoint moves projector $1's checkpoint to $2 under the lease
// epoch $3 (advance_checkpoint, of each schema's migrations), refusing the
// write, and the batch's transaction with it, if a newer epoch wrote the
// checkpoint (see projections.Fenced).
const AdvanceCheckpoint = `SELECT advance_checkpoint($1, $2, $3)`

// checkpointFenced is the error advance_checkpoint raises.
const checkpointFenced = "FE002"

// Fenced is projections.ErrFenced, with Postgres's message, if err is
// advance_checkpoint's refusal; else nil.
func Fenced(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == checkpointFenced {
		return fmt.Errorf("%w: %s", projections.ErrFenced, pgErr.Message)
	}
	return nil
}
