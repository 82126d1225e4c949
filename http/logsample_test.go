package http

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSampledLogWritesALineAnInterval: of a burst one line is written, and
// the next line says how many were left out.
func TestSampledLogWritesALineAnInterval(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	s := newSampledLog()
	s.every.Interval = 500 * time.Millisecond
	ctx := context.Background()
	for i := range 100 {
		s.log(ctx, logger, slog.LevelWarn, "redis down", "i", i)
	}
	time.Sleep(s.every.Interval)
	s.log(ctx, logger, slog.LevelWarn, "redis down", "i", 100)

	type line struct {
		I       int `json:"i"`
		LeftOut int `json:"left_out"`
	}
	var lines []line
	for _, text := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l line
		require.NoError(t, json.Unmarshal([]byte(text), &l))
		lines = append(lines, l)
	}
	require.Len(t, lines, 2, buf.String())
	assert.Equal(t, 0, lines[0].I)
	assert.Equal(t, 0, lines[0].LeftOut)
	assert.Equal(t, 100, lines[1].I)
	assert.Equal(t, 99, lines[1].LeftOut, "the burst's other lines")
}
