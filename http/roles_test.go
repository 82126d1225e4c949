package http

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
)

// TestOperationsOnlyServesNoContractRoute: a process without the api role (no
// media store, which one process at a time may open) answers the operations'
// routes and none of the contract's.
func TestOperationsOnlyServesNoContractRoute(t *testing.T) {
	a := newTestApp(t)
	a.srv = a.operationsServer(prometheus.NewRegistry())
	bearer := "Bearer " + a.token(t, 7)
	for _, tt := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/healthz", http.StatusOK},
		{http.MethodGet, "/metrics", http.StatusOK},
		{http.MethodGet, "/openapi.yaml", http.StatusOK},
		{http.MethodGet, "/admin/rebuild/feeds", http.StatusForbidden}, // there, for an admin
		{http.MethodGet, "/admin/pprof/heap", http.StatusForbidden},
		{http.MethodPost, "/posts", http.StatusNotFound},
		{http.MethodGet, "/media/" + strings.Repeat("0", 64) + ".png", http.StatusNotFound},
		{http.MethodGet, "/feed", http.StatusNotFound},
		{http.MethodPost, "/users/8/follow", http.StatusNotFound},
	} {
		req := httptest.NewRequest(tt.method, tt.path, nil)
		req.Header.Set("Authorization", bearer)
		assert.Equal(t, tt.want, a.do(t, req).status, "%s %s", tt.method, tt.path)
	}
}
