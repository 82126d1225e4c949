package http

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
)

// The fuzz targets send whatever a client could put on the wire through the
// real app (a real embedded JetStream and media directory, built once per
// target and process) and hold the contract's promises about the answer: never
// a panic, never a 5xx for bad input, always the error body for a 4xx.

// fuzzUser is the caller of every fuzzed command; fuzzOther owns a post the
// caller may not change.
const (
	fuzzUser  domain.UserID = 501
	fuzzOther domain.UserID = 502
)

// fuzzApp is the app a fuzz target sends its inputs to, with what the app
// logged, so a failure shows the error chain behind an "internal error".
type fuzzApp struct {
	*testApp
	logs *logBuffer
}

// logBuffer collects the app's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// take returns what was logged since the last take.
func (b *logBuffer) take() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.buf.Reset()
	return b.buf.String()
}

// newFuzzApp is newTestApp for a testing.TB (a fuzz target builds its app from
// its *testing.F), logging into a buffer.
func newFuzzApp(tb testing.TB) *fuzzApp {
	tb.Helper()
	ns := localstacktest.NATSForTest(tb)
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectBufSize(-1))
	require.NoError(tb, err)
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(tb, err)
	log, err := events.OpenLog(context.Background(), js, events.Config{}, nil)
	require.NoError(tb, err)
	tb.Cleanup(log.Close)
	store, err := media.NewPack(tb.TempDir())
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = store.Close() })
	auth, err := NewAuthenticator(testSecret, nil)
	require.NoError(tb, err)
	ids, err := domain.NewIDGenerator(1)
	require.NoError(tb, err)
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	a := &testApp{log: log, js: js, nats: ns, auth: auth, media: store, now: time.Now()}
	a.srv = NewServer(Deps{
		Logger:     slog.New(slog.NewTextHandler(logs, nil)),
		Registerer: reg,
		Gatherer:   reg,
		Log:        log,
		Media:      store,
		Auth:       auth,
		IDs:        ids,
	}, Config{})
	return &fuzzApp{testApp: a, logs: logs}
}

func (a *fuzzApp) token(tb testing.TB, user domain.UserID) string {
	tb.Helper()
	tok, err := a.auth.Mint(user, false, time.Now(), 24*time.Hour)
	require.NoError(tb, err)
	return tok
}

// fuzzResponse is a raw answer and what the app logged while giving it.
type fuzzResponse struct {
	response
	logged string
}

// send sends req through the app and returns the raw answer. A request that
// fasthttp refuses while reading it (headers over its 4 KiB read buffer, a
// malformed header) never reaches the app: fiber answers it itself with a 4xx
// that app.Test does not return, so the input is skipped. Any other failure
// to answer (a hang, a panic that escaped the recover middleware) fails.
func (a *fuzzApp) send(tb testing.TB, req *http.Request) fuzzResponse {
	tb.Helper()
	a.logs.take()
	resp, err := a.srv.App().Test(req, 30_000)
	if err != nil && (errors.As(err, new(*fasthttp.ErrSmallBuffer)) || strings.HasPrefix(err.Error(), "error when reading request headers")) {
		tb.Skipf("fasthttp refuses the request before the app sees it: %v", err)
	}
	require.NoError(tb, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	return fuzzResponse{response: response{status: resp.StatusCode, header: resp.Header, raw: raw}, logged: a.logs.take()}
}

// post creates a post of user with one image and returns its id.
func (a *fuzzApp) post(tb testing.TB, user domain.UserID) string {
	tb.Helper()
	ct, body := multipartBody(tb, append(images(pngImage(tb, 4, 4)), part{name: "caption", data: []byte("hi")})...)
	req := httptest.NewRequest(http.MethodPost, "/posts", bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Authorization", "Bearer "+a.token(tb, user))
	r := a.send(tb, req)
	require.Equal(tb, http.StatusAccepted, r.status, "%s", r.raw)
	var out struct {
		ID string `json:"id"`
	}
	require.NoError(tb, json.Unmarshal(r.raw, &out))
	return out.ID
}

// validHeaderValue reports whether net/http would send v as a header value:
// no control characters but horizontal tab. A client cannot send anything
// else, so inputs with such headers are skipped rather than smuggled into the
// raw request app.Test writes.
func validHeaderValue(v string) bool {
	for i := range len(v) {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// errorCodes are the contract's error codes by status.
var errorCodes = map[int]string{
	http.StatusBadRequest:            "invalid_input",
	http.StatusUnauthorized:          "unauthenticated",
	http.StatusForbidden:             "forbidden",
	http.StatusNotFound:              "not_found",
	http.StatusMethodNotAllowed:      "method_not_allowed",
	http.StatusConflict:              "conflict",
	http.StatusRequestEntityTooLarge: "too_large",
	http.StatusUnsupportedMediaType:  "unsupported_media_type",
}

var snakeCase = regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`)

// requireContractAnswer checks the promises every answer to a fuzzed request
// keeps: its status is one of allowed (never a 5xx), an error has exactly the
// contract's body with the code of its status, and a success is 202 with a
// position.
func requireContractAnswer(t *testing.T, r fuzzResponse, what string, allowed ...int) {
	t.Helper()
	require.NotEqual(t, http.StatusInternalServerError, r.status, "%s: internal error (a bug or a panic): %s\nthe app logged: %s", what, r.raw, r.logged)
	require.Less(t, r.status, 500, "%s: %s\nthe app logged: %s", what, r.raw, r.logged)
	require.Contains(t, allowed, r.status, "%s: %s", what, r.raw)
	require.True(t, strings.HasPrefix(r.header.Get("Content-Type"), "application/json"),
		"%s: content type %q: %s", what, r.header.Get("Content-Type"), r.raw)
	dec := json.NewDecoder(bytes.NewReader(r.raw))
	dec.DisallowUnknownFields()
	if r.status >= 400 {
		var body errorBody
		require.NoError(t, dec.Decode(&body), "%s: not the contract's error body: %s", what, r.raw)
		require.False(t, dec.More(), "%s: data after the error body: %s", what, r.raw)
		require.Regexp(t, snakeCase, body.Error.Code, "%s", what)
		require.Equal(t, errorCodes[r.status], body.Error.Code, "%s: %s", what, r.raw)
		require.NotEmpty(t, body.Error.Message, "%s", what)
		require.NotContains(t, string(r.raw), "goroutine ", "%s: a stack trace", what)
		return
	}
	require.Equal(t, http.StatusAccepted, r.status, "%s: %s", what, r.raw)
	var body struct {
		Position  string `json:"position"`
		ID        string `json:"id"`
		CreatedAt string `json:"created_at"`
	}
	require.NoError(t, dec.Decode(&body), "%s: %s", what, r.raw)
	require.NotEmpty(t, body.Position, "%s: %s", what, r.raw)
}

// jsonRoutes are the JSON command routes; {id} is the fuzzed path id.
var jsonRoutes = []struct{ method, path string }{
	{http.MethodPatch, "/posts/{id}"},
	{http.MethodPost, "/posts/{id}/comments"},
	{http.MethodPost, "/users/{id}/follow"},
	{http.MethodDelete, "/users/{id}/follow"},
	{http.MethodPost, "/posts/{id}/like"},
	{http.MethodDelete, "/posts/{id}/like"},
	{http.MethodDelete, "/posts/{id}"},
}

// FuzzJSONCommands sends arbitrary path ids, bodies, content types and
// idempotency keys to the JSON commands. In the path id, "{post}" stands for a
// live post of the caller (replaced when the fuzzer deletes it), "{other}" for
// another user's post and "{me}" for the caller.
func FuzzJSONCommands(f *testing.F) {
	a := newFuzzApp(f)
	live := a.post(f, fuzzUser)
	other := a.post(f, fuzzOther)
	token := "Bearer " + a.token(f, fuzzUser)

	const jsonCT = "application/json"
	for _, s := range []struct {
		route       byte
		id, body    string
		contentType string
		key         string
	}{
		// Valid commands.
		{0, "{post}", `{"caption":"edited"}`, jsonCT, ""},
		{0, "{post}", `{"caption":""}`, "application/merge-patch+json; charset=utf-8", "edit-1"},
		{1, "{post}", `{"text":"lovely"}`, jsonCT, ""},
		{1, "{post}", `{"text":"again"}`, "", "comment-1"},
		{2, "777", "", "", ""},
		{3, "777", "", "", "follow-1"},
		{4, "{post}", "", "", ""},
		{5, "{post}", "", "", ""},
		{6, "{post}", "", "", ""},
		// Not the owner, yourself, unknown.
		{0, "{other}", `{"caption":"mine now"}`, jsonCT, ""},
		{6, "{other}", "", "", ""},
		{2, "{me}", "", "", ""},
		{4, "999999", "", "", ""},
		// Odd bodies.
		{0, "{post}", "", jsonCT, ""},
		{0, "{post}", "null", jsonCT, ""},
		{1, "{post}", "[]", jsonCT, ""},
		{1, "{post}", `{"text":null}`, jsonCT, ""},
		{0, "{post}", `{"caption":1e999999}`, jsonCT, ""},
		{0, "{post}", `{"caption":"\ud800"}`, jsonCT, ""},
		{1, "{post}", "{\"text\":\"\xff\xfe\"}", jsonCT, ""},
		{0, "{post}", `{"caption":"` + strings.Repeat("é", 2201) + `"}`, jsonCT, ""},
		{1, "{post}", `{"text":"   "}`, jsonCT, ""},
		{0, "{post}", `{"caption":"a"} {"caption":"b"}`, jsonCT, ""},
		{0, "{post}", `{"caption":"x","extra":1}`, jsonCT, ""},
		{0, "{post}", `{"CAPTION":"x"}`, jsonCT, ""},
		{0, "{post}", strings.Repeat("[", 10000), jsonCT, ""},
		{0, "{post}", `{"caption":"x"}`, "text/plain", ""},
		{0, "{post}", `{"caption":"x"}`, "application/json; charset", ""},
		{0, "{post}", `{"caption":"x"}`, `application/json; boundary="`, ""},
		// Odd ids.
		{0, "", `{"caption":"x"}`, jsonCT, ""},
		{6, "0", "", "", ""},
		{6, "-5", "", "", ""},
		{4, "1.5", "", "", ""},
		{4, "9007199254740992", "", "", ""},
		{4, "99999999999999999999999999", "", "", ""},
		{4, "+1", "", "", ""},
		{4, "0x10", "", "", ""},
		{2, "../../posts", "", "", ""},
		{2, "..", "", "", ""},
		{2, "a/b", "", "", ""},
		{2, "%00", "", "", ""},
		{2, "\xff\xfe", "", "", ""},
		{2, " 777", "", "", ""},
		// Odd idempotency keys.
		{2, "778", "", "", strings.Repeat("k", 256)},
		{2, "778", "", "", "key with spaces"},
		{2, "778", "", "", "ключ"},
		{4, "{post}", "", "", "follow-1"}, // a key used for another command
	} {
		f.Add(s.route, s.id, []byte(s.body), s.contentType, s.key)
	}

	f.Fuzz(func(t *testing.T, route byte, id string, body []byte, contentType, key string) {
		if !validHeaderValue(contentType) || !validHeaderValue(key) {
			t.Skip("a header net/http would not send")
		}
		rt := jsonRoutes[int(route)%len(jsonRoutes)]
		id = strings.NewReplacer("{post}", live, "{other}", other, "{me}", fuzzUser.String()).Replace(id)
		target := strings.Replace(rt.path, "{id}", url.PathEscape(id), 1)
		var r io.Reader = http.NoBody
		if len(body) > 0 {
			r = bytes.NewReader(body)
		}
		req, err := http.NewRequest(rt.method, target, r)
		if err != nil {
			t.Skipf("net/http cannot build %s %q: %v", rt.method, target, err)
		}
		req.Header.Set("Authorization", token)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res := a.send(t, req)
		what := rt.method + " " + target
		requireContractAnswer(t, res, what,
			http.StatusAccepted, http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound,
			http.StatusMethodNotAllowed, http.StatusConflict, http.StatusRequestEntityTooLarge,
			http.StatusUnsupportedMediaType)
		if rt.method == http.MethodDelete && rt.path == "/posts/{id}" && id == live && res.status == http.StatusAccepted {
			live = a.post(t, fuzzUser) // keep a live post for the next inputs
		}
	})
}

// pngWithSize is a PNG signature and a well-formed IHDR chunk declaring w×h
// pixels, and nothing else.
func pngWithSize(w, h uint32) []byte {
	ihdr := make([]byte, 4, 17)
	copy(ihdr, "IHDR")
	ihdr = binary.BigEndian.AppendUint32(ihdr, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	ihdr = append(ihdr, 8, 2, 0, 0, 0) // 8-bit RGB, deflate, no filter, no interlace
	out := []byte("\x89PNG\r\n\x1a\n")
	out = binary.BigEndian.AppendUint32(out, uint32(len(ihdr)-4))
	out = append(out, ihdr...)
	return binary.BigEndian.AppendUint32(out, crc32.ChecksumIEEE(ihdr))
}

// Modes of FuzzCreatePost, in the low two bits of the fuzzer's mode byte (3
// counts as postImage); bits 4 and 8 are options of postImage.
const (
	// postRaw sends the bytes as the whole body, with boundary pasted into the
	// Content-Type as is.
	postRaw = iota
	// postQuoted sends the bytes as the whole body, with boundary written into
	// the Content-Type by mime.FormatMediaType (quoted when it must be).
	postQuoted
	// postImage sends a well-formed form whose image part holds the bytes;
	// boundary is the caption (with bit 4 of the mode) and bit 8 adds a valid
	// image before it.
	postImage
)

// FuzzCreatePost sends arbitrary multipart bodies and boundaries to POST
// /posts, and arbitrary bytes as an image inside a well-formed form, so the
// streaming form reader, the content sniffing and the image header decoders
// all see fuzzed input.
func FuzzCreatePost(f *testing.F) {
	a := newFuzzApp(f)
	token := "Bearer " + a.token(f, fuzzUser)

	validPNG := pngImage(f, 1, 1)
	validJPEG := jpegImage(f, 2, 2)
	_, wellFormed := multipartBodyWithBoundary(f, "xyz", append(images(validPNG), part{name: "caption", data: []byte("hi")})...)
	_, spaced := multipartBodyWithBoundary(f, "a b'c", images(validPNG)...)
	for _, s := range []struct {
		mode     byte
		boundary string
		body     string
	}{
		// Whole bodies.
		{postRaw, "xyz", string(wellFormed)},
		{postQuoted, "xyz", string(wellFormed)},
		{postRaw, `"a b'c"`, string(spaced)},
		{postQuoted, "a b'c", string(spaced)},
		{postRaw, "xyz", ""},
		{postRaw, "", string(wellFormed)},
		{postRaw, `"xyz`, string(wellFormed)},
		{postRaw, "xyz; boundary=abc", string(wellFormed)},
		{postQuoted, "ключ", string(wellFormed)},
		{postRaw, "xyz", "--xyz\r\ngarbage"},
		{postRaw, "xyz", "--xyz--\r\n"},
		{postRaw, "xyz", string(wellFormed[:len(wellFormed)/2])}, // cut inside the image
		{postRaw, "xyz", string(wellFormed[:len(wellFormed)-8])}, // cut inside the closing boundary
		{postRaw, "xyz", "--xyz\r\nContent-Disposition: form-data; name=\"caption\"\r\n\r\n" + strings.Repeat("x", 9000) + "\r\n--xyz--\r\n"},
		{postRaw, "xyz", "--xyz\r\n" + strings.Repeat("X-A: b\r\n", 2000) + "\r\n\r\n--xyz--\r\n"},
		{postRaw, "xyz", "--xyz\r\n\r\nno disposition\r\n--xyz--\r\n"},
		// Image contents inside a well-formed form.
		{postImage, "", string(validPNG)},
		{postImage | 4, "sunset ☀", string(validJPEG)},
		{postImage | 4, strings.Repeat("é", 2201), string(validPNG)},
		{postImage | 4, "\xff\xfe", string(validPNG)},
		{postImage | 8, "", ""},
		{postImage, "", string(validPNG[:20])},
		{postImage, "", string(validPNG[:len(validPNG)-4])},
		{postImage, "", string(validJPEG[:4])},
		{postImage, "", string(pngWithSize(30000, 1))},
		{postImage, "", string(pngWithSize(0, 1))},
		{postImage, "", string(pngWithSize(1<<31, 1<<31))},
		{postImage, "", "GIF89a\x01\x00\x01\x00garbage"},
		{postImage, "", "GIF87a"},
		{postImage, "", "RIFF\x10\x00\x00\x00WEBPVP8 garbage-garbage"},
		{postImage, "", "RIFF\x10\x00\x00\x00WEBPVP8Lgarbage-garbage"},
		{postImage, "", "RIFF\xff\xff\xff\xffWEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff"},
		{postImage, "", "\xff\xd8\xff\xe0garbage"},
		{postImage, "", "this is not an image"},
	} {
		f.Add(s.mode, s.boundary, []byte(s.body))
	}

	f.Fuzz(func(t *testing.T, mode byte, boundary string, body []byte) {
		var contentType string
		switch min(mode&3, postImage) {
		case postRaw:
			contentType = "multipart/form-data; boundary=" + boundary
		case postQuoted:
			contentType = mime.FormatMediaType("multipart/form-data", map[string]string{"boundary": boundary})
			if contentType == "" {
				t.Skip("mime cannot write this boundary")
			}
		case postImage:
			var parts []part
			if mode&8 != 0 {
				parts = append(parts, images(validPNG)...)
			}
			parts = append(parts, part{name: "images", filename: "fuzz.jpg", contentType: "image/jpeg", data: body})
			if mode&4 != 0 {
				parts = append(parts, part{name: "caption", data: []byte(boundary)})
			}
			contentType, body = multipartBodyWithBoundary(t, "fuzzboundary", parts...)
		}
		if !validHeaderValue(contentType) {
			t.Skip("a header net/http would not send")
		}
		req := httptest.NewRequest(http.MethodPost, "/posts", bytes.NewReader(body))
		req.Header.Set("Authorization", token)
		req.Header.Set("Content-Type", contentType)
		res := a.send(t, req)
		requireContractAnswer(t, res, "POST /posts with "+contentType,
			http.StatusAccepted, http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType)
	})
}

// Framings of FuzzPostFraming, in the fuzzer's framing byte modulo 3.
const (
	// framingDeclared sends the body with a Content-Length of its length
	// plus delta: above it the body is cut short, below it the rest is
	// sent as the next request.
	framingDeclared = iota
	// framingChunked sends the body chunked, in chunks of the fuzzer's size
	// (0: one chunk).
	framingChunked
	// framingRaw declares a chunked body and sends the bytes as they are:
	// the fuzzer writes the chunk framing itself.
	framingRaw
)

// FuzzPostFraming sends POST /posts over the wire with arbitrary framings of
// the body: declared lengths that are short or long or far over the limit,
// chunks of any size and hand-written chunk framing. Whatever arrives, the
// answer is one of the contract's, with its error body, and it comes at once:
// the client half-closes the connection after its bytes, so nothing is left
// for the server to wait for.
func FuzzPostFraming(f *testing.F) {
	a := newFuzzApp(f)
	addr := a.listen(f)
	token := "Bearer " + a.token(f, fuzzUser)

	_, form := multipartBodyWithBoundary(f, "fuzzboundary", append(images(pngImage(f, 1, 1)), part{name: "caption", data: []byte("hi")})...)
	_, huge := multipartBodyWithBoundary(f, "fuzzboundary", images(pngWithSize(20000, 20000))...)
	for _, s := range []struct {
		framing byte
		chunk   uint16
		delta   int64
		body    string
	}{
		{framingDeclared, 0, 0, string(form)},
		{framingChunked, 0, 0, string(form)},
		{framingChunked, 1, 0, string(form)},
		{framingChunked, 7, 0, string(form)},
		{framingDeclared, 0, 0, string(huge)},
		// Truncated: declared longer than sent, or cut inside the form.
		{framingDeclared, 0, 100, string(form)},
		{framingDeclared, 0, 1 << 20, string(form)},
		{framingDeclared, 0, 0, string(form[:len(form)/2])},
		{framingChunked, 16, 0, string(form[:len(form)-10])},
		{framingRaw, 0, 0, fmt.Sprintf("%x\r\n%s", len(form), form)},
		{framingRaw, 0, 0, fmt.Sprintf("%x\r\n%s\r\n", len(form)+50, form)},
		// Declared shorter than sent: the rest is the next request.
		{framingDeclared, 0, -10, string(form)},
		{framingDeclared, 0, -int64(len(form)), string(form)},
		// Oversized: declared, or chunks that claim far more than is sent.
		{framingDeclared, 0, maxPostBody, string(form)},
		{framingDeclared, 0, 1 << 40, ""},
		{framingRaw, 0, 0, "7fffffffffffffff\r\n" + string(form)},
		{framingRaw, 0, 0, "ffffffffffffffffffff\r\n" + string(form)},
		{framingRaw, 0, 0, "3200001\r\n--fuzzboundary\r\n"},
		// Chunked-ish: malformed sizes, extensions, trailers, missing CRLFs.
		{framingRaw, 0, 0, "zz\r\n" + string(form)},
		{framingRaw, 0, 0, "-5\r\nhello\r\n0\r\n\r\n"},
		{framingRaw, 0, 0, fmt.Sprintf("%x;ext=1\r\n%s\r\n0\r\n\r\n", len(form), form)},
		{framingRaw, 0, 0, fmt.Sprintf("%x\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n", len(form), form)},
		{framingRaw, 0, 0, fmt.Sprintf("%x\r\n%sXX0\r\n\r\n", len(form), form)},
		{framingRaw, 0, 0, fmt.Sprintf("%x\n%s\n0\n\n", len(form), form)},
		{framingRaw, 0, 0, "0\r\n\r\n"},
		{framingRaw, 0, 0, ""},
	} {
		f.Add(s.framing, s.chunk, s.delta, []byte(s.body))
	}

	f.Fuzz(func(t *testing.T, framing byte, chunk uint16, delta int64, body []byte) {
		var head, wire bytes.Buffer
		fmt.Fprintf(&head, "POST /posts HTTP/1.1\r\nHost: feed\r\nAuthorization: %s\r\nContent-Type: multipart/form-data; boundary=fuzzboundary\r\n", token)
		switch framing % 3 {
		case framingDeclared:
			declared := min(max(int64(len(body))+delta, 0), 1<<40)
			fmt.Fprintf(&head, "Content-Length: %d\r\n\r\n", declared)
			wire.Write(body)
		case framingChunked:
			head.WriteString("Transfer-Encoding: chunked\r\n\r\n")
			size := int(chunk)
			if size == 0 {
				size = max(len(body), 1)
			}
			for rest := body; len(rest) > 0; {
				n := min(size, len(rest))
				fmt.Fprintf(&wire, "%x\r\n%s\r\n", n, rest[:n])
				rest = rest[n:]
			}
			wire.WriteString("0\r\n\r\n")
		case framingRaw:
			head.WriteString("Transfer-Encoding: chunked\r\n\r\n")
			wire.Write(body)
		}

		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
		a.logs.take()
		// The server may answer and close before it has read every byte.
		_, _ = conn.Write(append(head.Bytes(), wire.Bytes()...))
		_ = conn.(*net.TCPConn).CloseWrite()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, "no answer (framing %d)", framing%3)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		res := fuzzResponse{response: response{status: resp.StatusCode, header: resp.Header, raw: raw}, logged: a.logs.take()}
		requireContractAnswer(t, res, fmt.Sprintf("POST /posts, framing %d", framing%3),
			http.StatusAccepted, http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType)
	})
}

// multipartBodyWithBoundary is multipartBody with a chosen boundary, so the
// bodies of the seeds and of the image mode are the same on every run.
func multipartBodyWithBoundary(tb testing.TB, boundary string, parts ...part) (string, []byte) {
	tb.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	require.NoError(tb, w.SetBoundary(boundary))
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		if p.filename == "" {
			h.Set("Content-Disposition", `form-data; name="`+p.name+`"`)
		} else {
			h.Set("Content-Disposition", `form-data; name="`+p.name+`"; filename="`+p.filename+`"`)
			h.Set("Content-Type", p.contentType)
		}
		pw, err := w.CreatePart(h)
		require.NoError(tb, err)
		_, err = pw.Write(p.data)
		require.NoError(tb, err)
	}
	require.NoError(tb, w.Close())
	return w.FormDataContentType(), buf.Bytes()
}

// FuzzTokens sends arbitrary Authorization headers to a protected command.
// Only a token signed with the secret is accepted, and the fuzzer cannot sign
// one, so every mutation of the valid seed must be refused (or, where a
// mutation leaves the token's meaning intact, accepted), and nothing else may
// come back.
func FuzzTokens(f *testing.F) {
	a := newFuzzApp(f)
	now := time.Now()
	sign := func(secret string, method jwt.SigningMethod, c jwt.MapClaims) string {
		tok, err := jwt.NewWithClaims(method, c).SignedString([]byte(secret))
		require.NoError(f, err)
		return tok
	}
	valid := jwt.MapClaims{"sub": "501", "exp": now.Add(24 * time.Hour).Unix()}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, valid).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(f, err)
	for _, h := range []string{
		"Bearer " + a.token(f, fuzzUser),
		"bearer   " + a.token(f, fuzzUser) + "  ",
		"",
		"Bearer",
		"Bearer ",
		"Bearer  \t ",
		"Basic dXNlcjpwYXNz",
		"Bearer not.a.jwt",
		"Bearer ...",
		"Bearer e30.e30.",
		"Bearer " + none,
		"Bearer " + sign(testSecret, jwt.SigningMethodHS512, valid),
		"Bearer " + sign("another-secret-of-16-bytes!", jwt.SigningMethodHS256, valid),
		"Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "501", "exp": now.Add(-time.Hour).Unix()}),
		"Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "501"}),
		"Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "0", "exp": now.Add(time.Hour).Unix()}),
		"Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "9007199254740992", "exp": now.Add(time.Hour).Unix()}),
		"Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": 501, "exp": "tomorrow"}),
		"Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "501", "exp": 1e300, "nbf": -1e300}),
		"Bearer eyJhbGciOiJIUzI1NiJ9." + strings.Repeat("A", 3000) + ".sig",
		"Bearer \xff\xfe.\xff.\xff",
	} {
		f.Add(h)
	}

	f.Fuzz(func(t *testing.T, authorization string) {
		if !validHeaderValue(authorization) {
			t.Skip("a header net/http would not send")
		}
		req := httptest.NewRequest(http.MethodPost, "/users/777/follow", nil)
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		res := a.send(t, req)
		requireContractAnswer(t, res, "Authorization: "+authorization, http.StatusUnauthorized, http.StatusAccepted)
	})
}
