package http

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
)

const testSecret = "test-secret-of-at-least-16-bytes"

// testApp is the real app against a real, embedded JetStream and a media
// directory, for one test.
type testApp struct {
	srv   *Server
	log   *events.Log
	js    jetstream.JetStream
	nats  *localstack.NATS
	auth  *Authenticator
	media *media.Pack
	now   time.Time
}

func newTestApp(t *testing.T, checks ...Check) *testApp {
	t.Helper()
	return newTestAppConfig(t, Config{}, checks...)
}

// newTestAppConfig is newTestApp with the server's knobs set.
func newTestAppConfig(t *testing.T, cfg Config, checks ...Check) *testApp {
	t.Helper()
	var pack *media.Pack
	a := newReplica(t, localstacktest.NATSForTest(t), 1, cfg, func(jetstream.JetStream, *events.Log) media.Store {
		var err error
		pack, err = media.NewPack(t.TempDir())
		require.NoError(t, err)
		t.Cleanup(func() { _ = pack.Close() })
		return pack
	}, checks...)
	a.media = pack
	return a
}

// newReplica is the app as one API process on ns runs it, with node as its
// FEED_NODE_ID and the media store that open returns.
func newReplica(t *testing.T, ns *localstack.NATS, node int, cfg Config, open func(jetstream.JetStream, *events.Log) media.Store, checks ...Check) *testApp {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	log, err := events.OpenLog(context.Background(), js, events.Config{}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)
	store := open(js, log)
	auth, err := NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	ids, err := domain.NewIDGenerator(node)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	a := &testApp{log: log, js: js, nats: ns, auth: auth, now: time.Now()}
	a.srv = NewServer(Deps{
		Logger:     slog.New(slog.DiscardHandler),
		Registerer: reg,
		Gatherer:   reg,
		Checks:     checks,
		Log:        log,
		Media:      store,
		Auth:       auth,
		IDs:        ids,
	}, cfg)
	return a
}

// listen serves the app on a loopback port, for tests that need the wire:
// streamed and stalled bodies, bytes that are not HTTP.
func (a *testApp) listen(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	go func() { _ = a.srv.Serve(ln) }()
	tb.Cleanup(func() { _ = a.srv.Shutdown(context.Background()) })
	return ln.Addr().String()
}

// operationsServer is a server of this app's log and tokens without the api
// role (OperationsOnly), exposing gatherer at /metrics.
func (a *testApp) operationsServer(gatherer prometheus.Gatherer) *Server {
	return NewServer(Deps{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(), Gatherer: gatherer, Log: a.log, Auth: a.auth},
		Config{OperationsOnly: true})
}

func (a *testApp) token(t *testing.T, user domain.UserID) string {
	t.Helper()
	tok, err := a.auth.Mint(user, false, time.Now(), time.Hour)
	require.NoError(t, err)
	return tok
}

// adminToken is a token of user 1 with the admin role.
func (a *testApp) adminToken(t *testing.T) string {
	t.Helper()
	tok, err := a.auth.Mint(1, true, time.Now(), time.Hour)
	require.NoError(t, err)
	return tok
}

// response is a decoded answer.
type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    []byte
}

func (r response) errorCode() string {
	e, _ := r.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func (r response) errorMessage() string {
	e, _ := r.body["error"].(map[string]any)
	msg, _ := e["message"].(string)
	return msg
}

// do sends req through the app (no network) and decodes a JSON answer.
func (a *testApp) do(t *testing.T, req *http.Request) response {
	t.Helper()
	resp, err := a.srv.App().Test(req, 30_000)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := response{status: resp.StatusCode, header: resp.Header, raw: raw}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(raw, &out.body), "body: %s", raw)
	}
	return out
}

// command sends a JSON command as user (0: no token).
func (a *testApp) command(t *testing.T, method, path string, user domain.UserID, body string, headers ...string) response {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if user != 0 {
		req.Header.Set("Authorization", "Bearer "+a.token(t, user))
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return a.do(t, req)
}

// records reads every event in the log.
func (a *testApp) records(t *testing.T) []events.Record {
	t.Helper()
	var out []events.Record
	require.NoError(t, a.log.Read(context.Background(), events.ReadOptions{StopAtEnd: true}, func(r events.Record) error {
		out = append(out, r)
		return nil
	}))
	return out
}
