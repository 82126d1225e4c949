package http

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/feedproject/feed/domain"
)

// Request bodies are bounded before they are read. fasthttp runs with
// StreamRequestBody, so it reads a request's headers and at most 8 KiB of its
// body; the rest is read only by a handler, through limitedBody, which stops
// at the route's bound whatever the transfer encoding. Nothing may call the
// request's Body(): fasthttp then copies the whole stream into memory.

const (
	// defaultReadTimeout bounds the wait for a request's headers, from their
	// first byte, and each wait for more of its body.
	defaultReadTimeout = 10 * time.Second
	// minBodyRate is the slowest a body may arrive on average, in bytes a
	// second, after its first read timeout: a body trickled in to hold a
	// connection (a slow POST) is cut, a slow mobile upload is not.
	minBodyRate = 4 << 10
)

// bodyKey is where a request's limitedBody is kept among its locals.
type bodyKey struct{}

// hasBody reports whether a request declares a body: a Content-Length above
// zero or a chunked one (-1); -2 is neither.
func hasBody(h *fasthttp.RequestHeader) bool {
	n := h.ContentLength()
	return n > 0 || n == -1
}

// takesBody reports whether requests of method may carry a body on some route
// of this API; the others' routes take none.
func takesBody(method string) bool {
	return method == fiber.MethodPost || method == fiber.MethodPatch || method == fiber.MethodPut
}

// guardBodies runs before every route. A body sent with a method whose routes
// take none is refused from the headers alone. Otherwise the connection is
// kept for the next request only if the handler read the body to its end:
// unread bytes must never be taken for a request, and reading them would
// cost what the route's bound spared.
func guardBodies(c *fiber.Ctx) error {
	if !hasBody(&c.Request().Header) {
		return c.Next()
	}
	c.Context().SetConnectionClose()
	if !takesBody(c.Method()) {
		linger(c, nil)
		return refuseBody(c)
	}
	err := c.Next()
	b, _ := c.Locals(bodyKey{}).(*limitedBody)
	if (b != nil && b.eof) || linger(c, b) {
		c.Context().Response.Header.ResetConnectionClose()
	}
	return err
}

// A body a handler left unread is read on and dropped, up to lingerMax
// bytes for at most lingerTime, before the answer goes: a browser that is
// still sending when the connection closes with bytes unread gets a reset,
// which it shows as a network error instead of the answer (a 413 for an
// image a little too large).
const (
	lingerMax  = 1 << 20
	lingerTime = time.Second
)

// linger drops the rest of the request's body within those bounds and
// reports whether it reached the body's end.
func linger(c *fiber.Ctx, b *limitedBody) bool {
	var r io.Reader
	switch {
	case b != nil && errors.Is(b.err, errBodyStalled):
		return false
	case b != nil:
		r = b.r
	default:
		r = c.Context().RequestBodyStream()
	}
	if r == nil {
		return false
	}
	if conn := c.Context().Conn(); conn != nil {
		if err := conn.SetReadDeadline(time.Now().Add(lingerTime)); err != nil {
			return false
		}
	}
	n, err := io.Copy(io.Discard, io.LimitReader(r, lingerMax+1))
	return err == nil && n <= lingerMax
}

// maxIgnoredBody is the most a POST that takes no body may carry anyway:
// clients that send every POST with a body (an empty JSON object) keep
// working; more is refused.
const maxIgnoredBody = 1 << 10

// noBody is the first handler of a POST route that takes no body: what comes
// with it anyway is read, up to maxIgnoredBody, and ignored.
func noBody(c *fiber.Ctx) error {
	if !hasBody(&c.Request().Header) {
		return c.Next()
	}
	body, err := requestBody(c, maxIgnoredBody)
	if err == nil {
		_, err = io.Copy(io.Discard, body)
		err = bodyError(body, err)
	}
	if errors.Is(err, domain.ErrTooLarge) {
		return fmt.Errorf("%s %s takes no request body (at most %d bytes are ignored): %w", c.Method(), c.Path(), maxIgnoredBody, domain.ErrTooLarge)
	}
	if err != nil {
		return err
	}
	return c.Next()
}

func refuseBody(c *fiber.Ctx) error {
	return fmt.Errorf("%s %s takes no request body: %w", c.Method(), c.Path(), domain.ErrTooLarge)
}

// limitedBody reads a request body, counting, up to a limit, and cuts it when
// it stalls: each read must return within the read timeout, and the body must
// keep up minBodyRate on average.
type limitedBody struct {
	r     io.Reader
	limit int64
	n     int64
	eof   bool
	err   error // the first failure, returned from then on

	conn    net.Conn // nil: no deadlines
	timeout time.Duration
	start   time.Time
}

var (
	errBodyTooLarge = fmt.Errorf("request body too large: %w", domain.ErrTooLarge)
	errBodyStalled  = fmt.Errorf("the request body stalled: %w", fiber.ErrRequestTimeout)
)

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.eof {
		return 0, io.EOF
	}
	if rest := b.limit + 1 - b.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	var deadline time.Time
	if b.conn != nil {
		deadline = b.deadline(time.Now())
		if err := b.conn.SetReadDeadline(deadline); err != nil {
			b.err = fmt.Errorf("read request body: %w", err)
			return 0, b.err
		}
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	switch {
	case b.n > b.limit:
		b.err = errBodyTooLarge
		return n, b.err
	case errors.Is(err, io.EOF):
		b.eof = true
	case err != nil && b.stalled(err, deadline):
		b.err = errBodyStalled
		return n, b.err
	case err != nil:
		b.err = err
	}
	return n, err
}

// deadline is when the next read must have returned: within the read timeout,
// and no later than minBodyRate allows for what has arrived.
func (b *limitedBody) deadline(now time.Time) time.Time {
	d := now.Add(b.timeout)
	if byRate := b.start.Add(b.timeout + time.Duration(b.n)*time.Second/minBodyRate); byRate.Before(d) {
		d = byRate
	}
	return d
}

// stalled reports whether err is the connection's read deadline passing
// (fasthttp's chunk parser does not always wrap the error it read).
func (b *limitedBody) stalled(err error, deadline time.Time) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) ||
		(!deadline.IsZero() && !time.Now().Before(deadline))
}

// bodyError reports a body over its limit or stalled as such, whatever the
// parser made of the truncated stream.
func bodyError(body *limitedBody, err error) error {
	switch {
	case body.n > body.limit:
		return fmt.Errorf("request body is over %d bytes: %w", body.limit, domain.ErrTooLarge)
	case errors.Is(body.err, errBodyStalled):
		return body.err
	}
	return err
}

// requestBody returns the body as a stream of at most limit bytes, refusing at
// once a body whose declared length is over it.
func requestBody(c *fiber.Ctx, limit int64) (*limitedBody, error) {
	if n := c.Request().Header.ContentLength(); n > 0 && int64(n) > limit {
		return nil, fmt.Errorf("request body of %d bytes is over the %d byte limit: %w", n, limit, domain.ErrTooLarge)
	}
	b := &limitedBody{limit: limit, start: time.Now()}
	if b.timeout = c.App().Server().ReadTimeout; b.timeout > 0 {
		b.conn = c.Context().Conn()
	}
	if stream := c.Context().RequestBodyStream(); stream != nil {
		b.r = stream
	} else {
		// No stream: no body, or one already in memory.
		b.r = bytes.NewReader(c.Request().Body())
	}
	c.Locals(bodyKey{}, b)
	return b, nil
}
