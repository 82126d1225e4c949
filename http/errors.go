package http

import (
	"errors"
	"log/slog"
	"strconv"

	"github.com/gofiber/fiber/v2"

	"github.com/feedproject/feed/domain"
)

// errorKinds is the one table from error categories to the contract's statuses
// and error codes. Order matters only for errors that wrap several categories.
var errorKinds = []struct {
	err    error
	status int
	code   string
}{
	{domain.ErrInvalid, fiber.StatusBadRequest, "invalid_input"},
	{domain.ErrUnauthenticated, fiber.StatusUnauthorized, "unauthenticated"},
	{domain.ErrForbidden, fiber.StatusForbidden, "forbidden"},
	{domain.ErrNotFound, fiber.StatusNotFound, "not_found"},
	{domain.ErrConflict, fiber.StatusConflict, "conflict"},
	{domain.ErrTooLarge, fiber.StatusRequestEntityTooLarge, "too_large"},
	{domain.ErrUnsupportedMedia, fiber.StatusUnsupportedMediaType, "unsupported_media_type"},
	{domain.ErrTooMany, fiber.StatusTooManyRequests, "too_many_requests"},
	{domain.ErrOutcomeUnknown, fiber.StatusGatewayTimeout, "outcome_unknown"},
	{domain.ErrUnavailable, fiber.StatusServiceUnavailable, "unavailable"},
}

// retryAfterSeconds is what 503 answers tell clients to wait.
const retryAfterSeconds = 2

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// errorHandler writes every failure in the contract's error body. Category errors
// show their message; anything else is logged once with its chain and shown as
// "internal error". A dependency unavailable is logged a line a second at
// most: while one is down, every request that needs it fails.
func errorHandler(log *slog.Logger) fiber.ErrorHandler {
	unavailable := newSampledLog()
	return func(c *fiber.Ctx, err error) error {
		status, code, message := classify(err)
		if status == fiber.StatusRequestTimeout {
			// The request did not arrive whole: nothing more on this
			// connection can be read as a request.
			c.Context().SetConnectionClose()
		}
		if status == fiber.StatusInternalServerError {
			log.Error("request failed", "method", c.Method(), "path", c.Path(), "err", err)
		}
		if status == fiber.StatusServiceUnavailable || status == fiber.StatusGatewayTimeout {
			unavailable.log(c.UserContext(), log, slog.LevelWarn, "dependency unavailable", "method", c.Method(), "path", c.Path(), "err", err)
			c.Set(fiber.HeaderRetryAfter, strconv.Itoa(retryAfterSeconds))
		}
		if status == fiber.StatusTooManyRequests {
			c.Set(fiber.HeaderRetryAfter, strconv.Itoa(retryAfterSeconds))
		}
		return c.Status(status).JSON(errorBody{Error: errorDetail{Code: code, Message: message}})
	}
}

func classify(err error) (status int, code, message string) {
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			switch k.status {
			case fiber.StatusServiceUnavailable:
				// The chain names internal hosts and servers; clients need only this.
				return k.status, k.code, "a dependency is unavailable; retry later"
			case fiber.StatusGatewayTimeout:
				return k.status, k.code, "the event log did not confirm in time whether the command was stored; " +
					"retrying it with the same Idempotency-Key is safe: it is stored once at most"
			}
			return k.status, k.code, err.Error()
		}
	}
	// Fiber's own errors: unknown routes, wrong methods, bodies over the limit.
	var fe *fiber.Error
	if errors.As(err, &fe) {
		switch fe.Code {
		case fiber.StatusNotFound:
			return fe.Code, "not_found", "no such route"
		case fiber.StatusMethodNotAllowed:
			return fe.Code, "method_not_allowed", "method not allowed on this route"
		case fiber.StatusRequestEntityTooLarge:
			return fe.Code, "too_large", "request body too large"
		case fiber.StatusUnsupportedMediaType:
			return fe.Code, "unsupported_media_type", fe.Message
		case fiber.StatusRequestTimeout:
			// Often no request at all: an idle keep-alive connection past its
			// deadline, which fasthttp then closes. Clients such as Go's
			// net/http know a 408 there for the close; any other status they
			// would take for a stray answer.
			return fe.Code, "request_timeout", "the request did not arrive in time"
		}
		if fe.Code >= 400 && fe.Code < 500 {
			return fiber.StatusBadRequest, "invalid_input", fe.Message
		}
	}
	return fiber.StatusInternalServerError, "internal", "internal error"
}
