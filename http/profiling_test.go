package http

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProfilesAreServedToAdminsOnly: an admin reads the running process's
// profiles and execution trace; anyone else is refused before any is taken.
func TestProfilesAreServedToAdminsOnly(t *testing.T) {
	a := newTestApp(t)
	admin, err := a.auth.Mint(1, true, time.Now(), time.Hour)
	require.NoError(t, err)
	get := func(path, token string) response {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		return a.do(t, req)
	}

	assert.Equal(t, http.StatusUnauthorized, get("/admin/pprof/heap", "").status)
	assert.Equal(t, http.StatusForbidden, get("/admin/pprof/heap", a.token(t, 7)).status)
	assert.Equal(t, http.StatusForbidden, get("/admin/pprof/profile?seconds=1", a.token(t, 7)).status)

	gzipped := []byte{0x1f, 0x8b}
	heap := get("/admin/pprof/heap?gc=1", admin)
	require.Equal(t, http.StatusOK, heap.status)
	assert.True(t, bytes.HasPrefix(heap.raw, gzipped), "a heap profile is gzipped protocol buffers")

	text := get("/admin/pprof/goroutine?debug=1", admin)
	require.Equal(t, http.StatusOK, text.status)
	assert.Contains(t, string(text.raw), "goroutine profile: total")

	cpu := get("/admin/pprof/profile?seconds=1", admin)
	require.Equal(t, http.StatusOK, cpu.status)
	assert.True(t, bytes.HasPrefix(cpu.raw, gzipped), "a CPU profile is gzipped protocol buffers")

	trace := get("/admin/pprof/trace?seconds=1", admin)
	require.Equal(t, http.StatusOK, trace.status)
	assert.True(t, bytes.HasPrefix(trace.raw, []byte("go 1.")), "an execution trace starts with its version: %.16q", trace.raw)

	unknown := get("/admin/pprof/cmdline", admin)
	assert.Equal(t, http.StatusNotFound, unknown.status)
	assert.Equal(t, "not_found", unknown.errorCode())
	assert.Contains(t, string(unknown.raw), "known: allocs, block, goroutine, heap, mutex, profile, threadcreate, trace")
}
