package localstack

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNATSChildLinesAreOneRecordEach: what the NATS child logs (its JSON
// records, as RunNATS with --log json writes them) is logged here as one
// record each, with its message and attributes as they were, not wrapped
// whole in another record's message; its warnings and errors at their level,
// the rest at debug. A line that is no record is logged whole.
func TestNATSChildLinesAreOneRecordEach(t *testing.T) {
	var child bytes.Buffer
	childLog := childLogger(&child, slog.New(slog.NewTextHandler(&bytes.Buffer{}, &slog.HandlerOptions{Level: slog.LevelInfo}))).With("component", "nats")
	childLog.Warn("JetStream resource limits", "max_mem", 1<<30, "dir", `/tmp/a "b"`)
	childLog.Error("write failed", "err", "disk full")
	childLog.Info("server ready")
	childLog.Debug("not logged: the child's level follows its parent's")

	var out bytes.Buffer
	parent := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := &lineLogger{log: parent, component: "nats", record: childRecord}
	_, _ = l.Write(child.Bytes())
	_, _ = l.Write([]byte("time=x level=WARN msg=\"a text line\"\npanic: runtime error\n"))

	var records []map[string]any
	for line := range strings.Lines(out.String()) {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		delete(r, "time")
		records = append(records, r)
	}
	assert.Equal(t, []map[string]any{
		{"level": "WARN", "msg": "JetStream resource limits", "max_mem": float64(1 << 30), "dir": `/tmp/a "b"`, "component": "nats"},
		{"level": "ERROR", "msg": "write failed", "err": "disk full", "component": "nats"},
		{"level": "DEBUG", "msg": "server ready", "component": "nats"},
		{"level": "WARN", "msg": `time=x level=WARN msg="a text line"`, "component": "nats"},
		{"level": "DEBUG", "msg": "panic: runtime error", "component": "nats"},
	}, records)
}
