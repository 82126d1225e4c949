package localstack

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestNATSChildWarningsKeepTheirLevel: a warning or an error of the NATS
// child, in either of log/slog's forms, is logged here at its level; the rest
// of its output at debug.
func TestNATSChildWarningsKeepTheirLevel(t *testing.T) {
	for line, want := range map[string]slog.Level{
		`time=2026-11-22T23:25:08.906Z level=WARN msg="JetStream resource limits" component=nats`: slog.LevelWarn,
		`time=2026-11-22T23:25:08.906Z level=ERROR msg="write failed" component=nats`:             slog.LevelError,
		`{"time":"2026-11-22T23:25:08.906Z","level":"WARN","msg":"slow consumer"}`:                slog.LevelWarn,
		`{"time":"2026-11-22T23:25:08.906Z","level":"ERROR","msg":"store failed"}`:                slog.LevelError,
		`time=2026-11-22T23:25:08.906Z level=INFO msg="nats started" component=nats`:              slog.LevelDebug,
		`a line of no form msg="level=WARNING"`:                                                   slog.LevelDebug,
	} {
		assert.Equal(t, want, childLogLevel(line), line)
	}

	var out bytes.Buffer
	l := &lineLogger{log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})), component: "nats", level: childLogLevel}
	_, _ = l.Write([]byte("time=x level=INFO msg=ready\ntime=x level=WARN msg=careful\n"))
	assert.NotContains(t, out.String(), "msg=ready", "info lines stay at debug")
	assert.Contains(t, out.String(), `level=WARN msg="time=x level=WARN msg=careful" component=nats`)
}
