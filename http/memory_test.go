package http

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOpenConnectionsDoNotKeepLargeAnswers: fasthttp gives each connection a
// response buffer that it keeps, by default, at the size of the largest
// answer the connection sent, for as long as it lives and then in its pool.
// A scrape of /metrics (tens of kilobytes under load) left such a buffer with
// every connection that ever carried one, and the service's live heap grew
// with them over a soak. Answers larger than keptAnswer now give their buffer
// back.
func TestOpenConnectionsDoNotKeepLargeAnswers(t *testing.T) {
	a := newTestApp(t)
	metrics := prometheus.NewRegistry()
	series := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_series", Help: "Enough series for an answer of about a megabyte."}, []string{"n"})
	metrics.MustRegister(series)
	for i := range 25_000 {
		series.WithLabelValues(strconv.Itoa(i)).Set(float64(i))
	}
	srv := a.operationsServer(metrics)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(t.Context()) })

	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	before := heap()
	const conns = 30
	var size int
	for range conns {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		// Each connection stays open, as a client's keep-alive ones do.
		_, err = fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: feed\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode)
		size = len(body)
	}
	require.Greater(t, size, 4*keptAnswer, "the answer must be far above what a connection keeps")
	kept := heap() - before
	t.Logf("%d connections, each sent an answer of %d bytes: the heap grew %d bytes", conns, size, kept)
	assert.Less(t, kept, int64(conns*size/4), "the open connections keep their large answers' buffers")
}
