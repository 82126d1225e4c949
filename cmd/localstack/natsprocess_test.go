package localstack_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// natsArgv runs this test binary as the child, which TestMain turns into
// RunNATS (as `feed nats` does in the service's binary).
func natsArgv() []string { return []string{os.Args[0], "nats"} }

// TestNATSProcessServesAndKeepsItsStore: the child serves JetStream on its
// own port, in a process of its own, and a stop (SIGTERM) followed by a
// start on the same store keeps what was acknowledged.
func TestNATSProcessServesAndKeepsItsStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	n, err := localstack.StartNATSProcess(ctx, natsArgv(), localstack.NATSConfig{Dir: dir, SyncAlways: true}, testLogger(t))
	require.NoError(t, err)
	assert.NotEqual(t, os.Getpid(), n.PID())
	publishKept(ctx, t, n.ClientURL())
	require.NoError(t, n.Stop(), "a clean stop")
	require.NoError(t, n.Stop(), "idempotent")
	assert.True(t, processGone(n.PID()))

	n, err = localstack.StartNATSProcess(ctx, natsArgv(), localstack.NATSConfig{Dir: dir}, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop() })
	requireKept(ctx, t, n.ClientURL())
}

// TestRunNATSRejectsBadFlags: `feed nats` explains a bad flag instead of
// starting a server.
func TestRunNATSRejectsBadFlags(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no store", []string{"--port", "0"}, "--dir is required"},
		{"sync", []string{"--dir", t.TempDir(), "--sync", "sometimes"}, `--sync "sometimes"`},
		{"negative sync", []string{"--dir", t.TempDir(), "--sync", "-1s"}, `--sync "-1s"`},
		{"payload", []string{"--dir", t.TempDir(), "--max-payload", "-1"}, "--max-payload -1"},
		{"stray argument", []string{"--dir", t.TempDir(), "extra"}, "unexpected arguments"},
		{"unknown flag", []string{"--dir", t.TempDir(), "--nope"}, "not defined"},
		{"log format", []string{"--dir", t.TempDir(), "--log", "xml"}, `--log "xml"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := localstack.RunNATS(context.Background(), tc.args, localstack.NATSConfig{}, io.Discard, quiet)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestNATSProcessWaitsForItsFixedPort: a restart on a fixed port that the
// server of a process just killed still holds waits for the port.
func TestNATSProcessWaitsForItsFixedPort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	released := time.AfterFunc(500*time.Millisecond, func() { _ = l.Close() })
	defer released.Stop()

	n, err := localstack.StartNATSProcess(context.Background(), natsArgv(), localstack.NATSConfig{Dir: t.TempDir(), Port: port}, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop() })
	assert.Equal(t, "nats://127.0.0.1:"+strconv.Itoa(port), n.ClientURL())
}

// TestNATSProcessLogsOneRecordALine: the child's log lines reach this
// process's log as records of their own, not wrapped whole in the message of
// another.
func TestNATSProcessLogsOneRecordALine(t *testing.T) {
	t.Parallel()
	var out localstacktest.SyncBuffer
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n, err := localstack.StartNATSProcess(t.Context(), natsArgv(), localstack.NATSConfig{Dir: t.TempDir()}, log)
	require.NoError(t, err)
	require.NoError(t, n.Stop())

	var ready bool
	for line := range strings.Lines(out.String()) {
		var r struct{ Level, Msg, Component string }
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		assert.NotContains(t, r.Msg, "level=", "a record wrapped in another: %s", line)
		assert.False(t, strings.HasPrefix(r.Msg, "{"), "a record wrapped in another: %s", line)
		if r.Msg == "Server is ready" {
			ready = true
			assert.Equal(t, "DEBUG", r.Level, "the child's notices are at debug here")
			assert.Equal(t, "nats", r.Component)
		}
	}
	assert.True(t, ready, "the child's notice that it is ready is logged:\n%s", out.String())
}
