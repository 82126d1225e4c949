package http

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The metrics' labels must not change when later requests reuse a
// connection's buffers: /metrics then failed with "collected before with the
// same name and label values" once a POST was followed by a GET.
func TestMetricsLabelsSurviveLaterRequests(t *testing.T) {
	a := newTestApp(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = a.srv.Serve(ln) }()
	t.Cleanup(func() { _ = a.srv.Shutdown(context.Background()) })
	base := "http://" + ln.Addr().String()

	client := &http.Client{} // one keep-alive connection for every request
	do := func(method, path, token string) (int, string) {
		req, err := http.NewRequest(method, base+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	tok := a.token(t, 501)
	for range 3 {
		status, _ := do(http.MethodPost, "/users/404/follow", tok)
		require.Equal(t, http.StatusAccepted, status)
		status, _ = do(http.MethodGet, "/healthz", "")
		require.Equal(t, http.StatusOK, status)
	}
	status, body := do(http.MethodGet, "/metrics", "")
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `feed_http_requests_total{method="POST",route="/users/:id/follow",status="202"} 3`)
	assert.Contains(t, body, `feed_http_requests_total{method="GET",route="/healthz",status="200"} 3`)
	assert.NotContains(t, body, `method="GETT"`)
}
