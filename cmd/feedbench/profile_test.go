package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/feedbench/internal/loadbench"
)

// TestPhaseProfilesWaitForTheLastCPUProfile: the runtime takes one CPU
// profile at a time, and a phase's profile outlasts the phase (whole
// seconds); the next phase's, asked for at once, must wait for it rather
// than be refused. Served by net/http/pprof in this process, which answers
// a second profile at once with an error.
func TestPhaseProfilesWaitForTheLastCPUProfile(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/admin/pprof/profile", pprof.Profile)
	mux.Handle("/admin/pprof/heap", pprof.Handler("heap"))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	wl := loadbench.DefaultConfig()
	wl.Duration, wl.ReadDuration = 1200*time.Millisecond, 100*time.Millisecond
	prof, err := benchProfiler(t.Context(), benchOptions{out: dir, cpuProfile: true}, wl, srv.URL, "test-secret-of-at-least-16-bytes", io.Discard)
	require.NoError(t, err)
	prof.onPhase("mixed", true)
	time.Sleep(wl.Duration)
	prof.onPhase("mixed", false)
	prof.onPhase("reads", true) // the mixed phase's two seconds are not over
	prof.onPhase("reads", false)
	prof.wait()
	for _, name := range []string{"cpu-mixed.pprof", "cpu-reads.pprof", "heap-mixed-start.pprof", "heap-mixed.pprof", "heap-reads-start.pprof", "heap-reads.pprof"} {
		info, err := os.Stat(filepath.Join(dir, name))
		if assert.NoError(t, err, name) {
			assert.Positive(t, info.Size(), name)
		}
	}
}
