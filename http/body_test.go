package http

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
)

// wireRequest is a request written to the server's socket by hand, so its
// body can be chunked, endless, cut short or stalled.
type wireRequest struct {
	method, path string
	header       []string // "Name: value"
	// declared is the Content-Length sent; -1 sends the body chunked.
	declared int64
	// prefix is the body's first bytes; filler follows up to send bytes.
	prefix []byte
	send   int64
	// hold keeps the connection open, sending nothing more, once send bytes
	// are written (a stalled body); otherwise the writer stops there.
	hold bool
}

// wireAnswer is the server's answer and what the client had sent of the
// body when it came.
type wireAnswer struct {
	status int
	close  bool // the server closes the connection
	body   []byte
	sent   int64
	after  time.Duration
}

func (a wireAnswer) errorCode() string {
	var body errorBody
	_ = json.Unmarshal(a.body, &body)
	return body.Error.Code
}

// filler is the body after a request's prefix: 32 KiB of one letter, valid
// inside a JSON string and inside an image part.
var filler = bytes.Repeat([]byte("a"), 32<<10)

// sendWire sends req to addr and reads the answer, while the body is still
// being written: a server that bounds what it reads answers long before an
// endless body ends.
func sendWire(t *testing.T, addr string, req wireRequest) wireAnswer {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))

	var head strings.Builder
	fmt.Fprintf(&head, "%s %s HTTP/1.1\r\nHost: feed\r\n", req.method, req.path)
	for _, h := range req.header {
		head.WriteString(h + "\r\n")
	}
	if req.declared < 0 {
		head.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	} else {
		fmt.Fprintf(&head, "Content-Length: %d\r\n\r\n", req.declared)
	}
	start := time.Now()
	_, err = io.WriteString(conn, head.String())
	require.NoError(t, err)

	var sent atomic.Int64
	answered := make(chan struct{})
	writer := make(chan struct{})
	go func() {
		defer close(writer)
		var chunk []byte // reused: the clients' garbage would count as the server's memory
		write := func(p []byte) bool {
			if req.declared < 0 {
				chunk = append(append(fmt.Appendf(chunk[:0], "%x\r\n", len(p)), p...), "\r\n"...)
				p = chunk
			}
			_, err := conn.Write(p)
			return err == nil
		}
		next := req.prefix
		for sent.Load() < req.send {
			select {
			case <-answered:
				return
			default:
			}
			if len(next) == 0 {
				next = filler
			}
			p := next[:min(int64(len(next)), req.send-sent.Load())]
			if !write(p) {
				return // the server closed the connection
			}
			sent.Add(int64(len(p)))
			next = next[len(p):]
		}
		if req.hold {
			<-answered
			return
		}
		if req.declared < 0 {
			_, _ = io.WriteString(conn, "0\r\n\r\n")
		}
	}()

	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: req.method})
	close(answered)
	require.NoError(t, err, "no answer to %s %s", req.method, req.path)
	defer resp.Body.Close()
	out := wireAnswer{status: resp.StatusCode, close: resp.Close, sent: sent.Load(), after: time.Since(start)}
	out.body, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"), "%s %s: %s", req.method, req.path, out.body)
	_ = conn.Close()
	<-writer
	return out
}

// multipartImageHead begins a form whose one image part is as long as the
// body: a PNG signature, then whatever follows.
func multipartImageHead() (contentType string, prefix []byte) {
	return "Content-Type: multipart/form-data; boundary=xyz",
		[]byte("--xyz\r\nContent-Disposition: form-data; name=\"images\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n\x89PNG\r\n\x1a\n")
}

// socketSlack is what the kernel's socket buffers on loopback take in before
// a writer notices that the reader stopped: bytes sent, never read.
const socketSlack = 16 << 20

// TestOversizedBodiesAreRefusedAtTheLimit: bodies over a route's bound, chunked
// or declared, get 413 with the contract's error body as soon as the bound is
// passed (declared: from the headers alone), and the connection is closed.
// Routes that take no body refuse any (a POST ignores up to maxIgnoredBody);
// the 512 MiB each client would send are never read.
func TestOversizedBodiesAreRefusedAtTheLimit(t *testing.T) {
	a := newTestApp(t)
	addr := a.listen(t)
	user := "Authorization: Bearer " + a.token(t, 501)
	admin := "Authorization: Bearer " + a.adminToken(t)
	jsonCT := "Content-Type: application/json"
	formCT, imageHead := multipartImageHead()
	const endless = 512 << 20

	for _, tt := range []struct {
		name   string
		req    wireRequest
		bound  int64 // the most body bytes the server may read
		status int   // 0: 413
	}{
		{"post, chunked image", wireRequest{method: "POST", path: "/posts", header: []string{user, formCT}, declared: -1, prefix: imageHead}, domain.MaxImageBytes, 0},
		{"post, declared", wireRequest{method: "POST", path: "/posts", header: []string{user, formCT}, declared: endless, prefix: imageHead}, 0, 0},
		{"post, endless preamble line", wireRequest{method: "POST", path: "/posts", header: []string{user, formCT}, declared: -1}, maxPartHead, http.StatusBadRequest},
		{"post, endless preamble", wireRequest{method: "POST", path: "/posts", header: []string{user, formCT}, declared: -1,
			prefix: bytes.Repeat([]byte("a\r\n"), 200<<10)}, maxPartHead, 0},
		{"post, endless part headers", wireRequest{method: "POST", path: "/posts", header: []string{user, formCT}, declared: -1,
			prefix: []byte("--xyz\r\nX-Pad: ")}, maxPartHead, 0},
		{"edit, chunked", wireRequest{method: "PATCH", path: "/posts/1", header: []string{user, jsonCT}, declared: -1, prefix: []byte(`{"caption":"`)}, maxJSONBody, 0},
		{"edit, declared", wireRequest{method: "PATCH", path: "/posts/1", header: []string{user, jsonCT}, declared: maxJSONBody + 1}, 0, 0},
		{"comment, chunked", wireRequest{method: "POST", path: "/posts/1/comments", header: []string{user, jsonCT}, declared: -1, prefix: []byte(`{"text":"`)}, maxJSONBody, 0},
		{"follow, chunked", wireRequest{method: "POST", path: "/users/2/follow", header: []string{user}, declared: -1}, maxIgnoredBody, 0},
		{"like, declared", wireRequest{method: "POST", path: "/posts/1/like", header: []string{user}, declared: maxIgnoredBody + 1}, 0, 0},
		{"delete, chunked", wireRequest{method: "DELETE", path: "/posts/1", header: []string{user}, declared: -1}, 0, 0},
		{"read, chunked", wireRequest{method: "GET", path: "/posts/1", declared: -1}, 0, 0},
		{"read, declared", wireRequest{method: "GET", path: "/users/1/followers", declared: endless}, 0, 0},
		{"media, chunked", wireRequest{method: "GET", path: "/media/x.png", declared: -1}, 0, 0},
		{"metrics, chunked", wireRequest{method: "GET", path: "/metrics", declared: -1}, 0, 0},
		{"metrics, declared", wireRequest{method: "GET", path: "/metrics", declared: endless}, 0, 0},
		{"health, chunked", wireRequest{method: "GET", path: "/healthz", declared: -1}, 0, 0},
		{"openapi, declared", wireRequest{method: "GET", path: "/openapi.yaml", declared: 1}, 0, 0},
		{"admin rebuild, chunked", wireRequest{method: "POST", path: "/admin/rebuild/all", header: []string{admin}, declared: -1}, maxIgnoredBody, 0},
		{"admin status, chunked", wireRequest{method: "GET", path: "/admin/rebuild/all", header: []string{admin}, declared: -1}, 0, 0},
		{"unknown route, chunked", wireRequest{method: "POST", path: "/no/such/route", declared: -1}, 0, http.StatusNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.send = endless
			if tt.req.declared >= 0 {
				tt.req.send = min(tt.req.declared, endless)
			}
			r := sendWire(t, addr, tt.req)
			t.Logf("%s %s: %d %s after %s and %d bytes sent", tt.req.method, tt.req.path, r.status, r.body, r.after.Round(time.Millisecond), r.sent)
			if tt.status == 0 {
				tt.status = http.StatusRequestEntityTooLarge
			}
			if !assert.Equal(t, tt.status, r.status, "%s", r.body) {
				return
			}
			assert.Equal(t, errorCodes[tt.status], r.errorCode(), "%s", r.body)
			if r.sent > lingerMax {
				// A body read to its end (what lingers after a refusal)
				// leaves the connection usable.
				assert.True(t, r.close, "the connection is closed after a refused body")
			}
			assert.Less(t, r.sent, tt.bound+socketSlack, "the body was read past its bound")
			assert.Less(t, r.after, 5*time.Second)
		})
	}
}

// TestBodylessRoutesTakeNoBody: every route that takes no body, however its
// method, refuses one with 413 from the headers, before authentication.
func TestBodylessRoutesTakeNoBody(t *testing.T) {
	a := newTestApp(t)
	for _, route := range []string{"GET /healthz", "GET /metrics", "DELETE /posts/1"} {
		method, path, _ := strings.Cut(route, " ")
		r := a.command(t, method, path, 0, `{}`)
		assert.Equal(t, http.StatusRequestEntityTooLarge, r.status, route)
		assert.Equal(t, "too_large", r.errorCode(), route)
		assert.Contains(t, r.body["error"].(map[string]any)["message"], "takes no request body", route)
	}
	// A POST that takes no body ignores a small one (clients that send an
	// empty JSON object with every POST) and refuses more.
	r := a.command(t, http.MethodPost, "/users/2/follow", 501, `{}`)
	assert.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
	for _, route := range []string{"POST /users/2/follow", "POST /posts/1/like", "POST /admin/rebuild/all"} {
		method, path, _ := strings.Cut(route, " ")
		r := a.command(t, method, path, 501, `{"pad":"`+strings.Repeat("x", maxIgnoredBody)+`"}`)
		assert.Equal(t, http.StatusRequestEntityTooLarge, r.status, route)
		assert.Contains(t, r.body["error"].(map[string]any)["message"], "takes no request body", route)
	}
}

// TestStalledBodiesAreCut: a body that stops arriving, or arrives slower than
// minBodyRate, is answered 408 within the read timeout and the connection is
// closed; the default timeout holds a connection for seconds, not a minute.
func TestStalledBodiesAreCut(t *testing.T) {
	assert.LessOrEqual(t, newTestApp(t).srv.App().Server().ReadTimeout, 10*time.Second, "the default read timeout")

	const timeout = 400 * time.Millisecond
	a := newTestAppConfig(t, Config{ReadTimeout: timeout})
	addr := a.listen(t)
	user := "Authorization: Bearer " + a.token(t, 501)
	formCT, imageHead := multipartImageHead()
	for _, tt := range []struct {
		name string
		req  wireRequest
	}{
		{"post, declared 7 MiB, 4 MiB of an image sent", wireRequest{method: "POST", path: "/posts", header: []string{user, formCT}, declared: 7 << 20,
			prefix: imageHead, send: 4 << 20}},
		{"post, chunked image", wireRequest{method: "POST", path: "/posts", header: []string{user, formCT}, declared: -1, prefix: imageHead, send: 1 << 20}},
		{"edit, declared", wireRequest{method: "PATCH", path: "/posts/1", header: []string{user, "Content-Type: application/json"}, declared: 100,
			prefix: []byte(`{"caption":`), send: 11}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.hold = true
			r := sendWire(t, addr, tt.req)
			t.Logf("%d %s after %s", r.status, r.body, r.after.Round(time.Millisecond))
			assert.Equal(t, http.StatusRequestTimeout, r.status, "%s", r.body)
			assert.Equal(t, "request_timeout", r.errorCode())
			assert.True(t, r.close, "the connection is closed")
			assert.Less(t, r.after, timeout+2*time.Second)
		})
	}

	t.Run("trickled", func(t *testing.T) {
		// A byte every tenth of a second never waits out the read timeout,
		// but is far below minBodyRate.
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = fmt.Fprintf(conn, "PATCH /posts/1 HTTP/1.1\r\nHost: feed\r\n%s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n", user)
		require.NoError(t, err)
		start := time.Now()
		answered := make(chan struct{})
		go func() {
			for {
				select {
				case <-answered:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}()
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		close(answered)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
		assert.Less(t, time.Since(start), 2*timeout+time.Second)
	})
}

// TestNotHTTPGetsTheErrorBody: bytes that are not an HTTP request get a 400
// with the contract's JSON error body, never a plain-text answer.
func TestNotHTTPGetsTheErrorBody(t *testing.T) {
	addr := newTestApp(t).listen(t)
	for _, garbage := range []string{"GARBAGE\r\n\r\n", "GARBAGE / HTTP/1.1\r\nHost: feed\r\n\r\n", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"} {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
		_, err = io.WriteString(conn, garbage)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, "%q", garbage)
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		_ = conn.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%q: %s", garbage, raw)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), "%q: %s", garbage, raw)
		var body errorBody
		require.NoError(t, json.Unmarshal(raw, &body), "%q: %s", garbage, raw)
		assert.Equal(t, "invalid_input", body.Error.Code)
		assert.NotEmpty(t, body.Error.Message)
	}
}

// residentBytes is the process's resident memory (VmRSS).
func residentBytes() (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS in /proc/self/status")
}

// TestHostileBodiesKeepMemoryBounded: 20 clients each send a 512 MiB chunked
// body to every route of the app, at once; the process serving them (this
// test's) grows its resident memory by less than 64 MiB, and every body is
// refused at its route's bound.
func TestHostileBodiesKeepMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("sends about 100 MiB over loopback")
	}
	const (
		clients   = 20
		endless   = 512 << 20
		maxGrowth = 64 << 20
	)
	a := newTestApp(t)
	addr := a.listen(t)
	admin := "Authorization: Bearer " + a.adminToken(t)
	formCT, imageHead := multipartImageHead()
	params := strings.NewReplacer(":id", "1", ":key", strings.Repeat("a", 64)+".png", ":projector", "all", ":profile", "heap")
	var requests []wireRequest
	for _, r := range a.srv.App().GetRoutes(true) {
		req := wireRequest{method: r.Method, path: params.Replace(r.Path), header: []string{admin, "Content-Type: application/json"}, declared: -1, send: endless}
		if r.Method == http.MethodPost && r.Path == "/posts" {
			req.header, req.prefix = []string{admin, formCT}, imageHead
		}
		requests = append(requests, req)
	}
	require.Greater(t, len(requests), 15, "every route of the app")

	// One round first, so that what the first requests of any kind set up
	// (pools, buffers, code) is in the baseline.
	cold, err := residentBytes()
	require.NoError(t, err)
	for _, req := range requests {
		sendWire(t, addr, req)
	}
	before, err := residentBytes()
	require.NoError(t, err)
	var peak atomic.Int64
	peak.Store(before)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if rss, err := residentBytes(); err == nil && rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()

	start := time.Now()
	var wg sync.WaitGroup
	var sent atomic.Int64
	for range clients {
		wg.Go(func() {
			for _, req := range requests {
				r := sendWire(t, addr, req)
				sent.Add(r.sent)
				assert.Equal(t, http.StatusRequestEntityTooLarge, r.status, "%s %s: %s", req.method, req.path, r.body)
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	growth := peak.Load() - before
	t.Logf("%d clients × %d routes, %d MiB sent of %d GiB offered in %s: resident memory %d MiB (%d before the first round), peak +%d MiB",
		clients, len(requests), sent.Load()>>20, int64(clients*len(requests))*endless>>30, time.Since(start).Round(time.Millisecond),
		before>>20, cold>>20, growth>>20)
	assert.Less(t, growth, int64(maxGrowth), "resident memory grew by %d MiB", growth>>20)
	assert.Less(t, time.Since(start), 45*time.Second)
}

// TestBodiesReadToTheEndKeepTheConnection: a body read to its end, chunked or
// declared, leaves the connection open for the next request; its last chunk
// and the form's epilogue are never taken for one.
func TestBodiesReadToTheEndKeepTheConnection(t *testing.T) {
	a := newTestApp(t)
	addr := a.listen(t)
	ct, form := multipartBody(t, append(images(pngImage(t, 2, 2)), part{name: "caption", data: []byte("hi")})...)
	form = append(form, "\r\nan epilogue"...)
	auth := "Authorization: Bearer " + a.token(t, 501)
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(conn)
	for _, req := range []string{
		fmt.Sprintf("POST /posts HTTP/1.1\r\nHost: feed\r\n%s\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", auth, ct, len(form), form),
		fmt.Sprintf("POST /posts HTTP/1.1\r\nHost: feed\r\n%s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", auth, ct, len(form), form),
		fmt.Sprintf("POST /users/2/follow HTTP/1.1\r\nHost: feed\r\n%s\r\n\r\n", auth),
		"GET /healthz HTTP/1.1\r\nHost: feed\r\n\r\n",
	} {
		_, err := io.WriteString(conn, req)
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "%.40q", req)
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Less(t, resp.StatusCode, 300, "%.40q: %s", req, raw)
		assert.False(t, resp.Close, "%.40q: the connection is kept", req)
	}
}

// TestAnAnswerBeforeTheBodysEndReachesTheClient: a client that sends its
// whole request before it reads (as browsers may) gets the 413 for an image
// a little over its bound, not a reset connection: what the server left
// unread is read and dropped before the answer goes.
func TestAnAnswerBeforeTheBodysEndReachesTheClient(t *testing.T) {
	a := newTestApp(t)
	addr := a.listen(t)
	formCT, imageHead := multipartImageHead()
	var body bytes.Buffer
	body.Write(imageHead)
	body.Write(bytes.Repeat([]byte{0}, domain.MaxImageBytes+512<<10))
	body.WriteString("\r\n--xyz--\r\n")
	for range 5 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		_, err = fmt.Fprintf(conn, "POST /posts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n%s\r\nContent-Length: %d\r\n\r\n", a.token(t, 501), formCT, body.Len())
		require.NoError(t, err)
		_, err = conn.Write(body.Bytes())
		require.NoError(t, err, "the server took the whole request")
		resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodPost})
		require.NoError(t, err, "an answer, not a reset")
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		_ = resp.Body.Close()
		_ = conn.Close()
	}
}
