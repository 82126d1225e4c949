package domain

import "errors"

// The categories of failure. Code wraps them with context
// (fmt.Errorf("delete post %d: %w", id, ErrNotFound)); the HTTP layer maps each to
// one status and error code, in one table.
var (
	// ErrInvalid means the input breaks a rule of the contract.
	ErrInvalid = errors.New("invalid input")
	// ErrUnauthenticated means no valid credentials came with a protected request.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrForbidden means the caller may not do this to this resource.
	ErrForbidden = errors.New("forbidden")
	// ErrNotFound means the resource does not exist or was deleted.
	ErrNotFound = errors.New("not found")
	// ErrConflict means the resource changed concurrently; the caller may retry.
	ErrConflict = errors.New("conflict")
	// ErrTooLarge means a request or one of its parts is over its size limit.
	ErrTooLarge = errors.New("too large")
	// ErrUnsupportedMedia means an upload is not one of the accepted image types.
	ErrUnsupportedMedia = errors.New("unsupported media type")
	// ErrTooMany means the caller holds as many of something as it may (open
	// streams); it may retry once one is given back.
	ErrTooMany = errors.New("too many")
	// ErrUnavailable means a dependency (the event log, a store) cannot be reached;
	// nothing was written and the caller may retry later.
	ErrUnavailable = errors.New("dependency unavailable")
	// ErrOutcomeUnknown means a write was sent but whether it was stored could
	// not be learnt in time; a retry under the same idempotency key is safe.
	ErrOutcomeUnknown = errors.New("outcome unknown")
)
