package localstack_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
)

// Three `feed nats` servers given a cluster name, their own names and each
// other's routes form a JetStream cluster that holds a stream at three
// replicas.
func TestRunNATSFormsACluster(t *testing.T) {
	ports, err := localstack.FreePorts(6)
	require.NoError(t, err)
	route := func(i int) string { return "nats-route://127.0.0.1:" + strconv.Itoa(ports[3+i]) }
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make([]error, 3)
	dir := t.TempDir()
	for i := range 3 {
		var others []string
		for j := range 3 {
			if j != i {
				others = append(others, route(j))
			}
		}
		args := []string{"--dir", filepath.Join(dir, strconv.Itoa(i)), "--port", strconv.Itoa(ports[i]),
			"--name", fmt.Sprintf("n%d", i), "--cluster", "feed", "--cluster-listen", "127.0.0.1:" + strconv.Itoa(ports[3+i]),
			"--routes", strings.Join(others, ","), "--sync", "always"}
		wg.Go(func() {
			errs[i] = localstack.RunNATS(ctx, args, localstack.NATSConfig{}, io.Discard, slog.New(slog.DiscardHandler))
		})
	}
	defer func() {
		cancel()
		wg.Wait()
		for i, err := range errs {
			assert.NoError(t, err, "node %d", i)
		}
	}()

	var urls []string
	for i := range 3 {
		urls = append(urls, "nats://127.0.0.1:"+strconv.Itoa(ports[i]))
	}
	var nc *nats.Conn
	require.Eventually(t, func() bool {
		nc, err = nats.Connect(strings.Join(urls, ","))
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var info *jetstream.StreamInfo
	require.Eventually(t, func() bool {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		s, err := js.CreateOrUpdateStream(sctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
		if err != nil {
			return false
		}
		info, err = s.Info(sctx)
		return err == nil && info.Cluster != nil && len(info.Cluster.Replicas) == 2
	}, 30*time.Second, 200*time.Millisecond, "no three-replica stream on the cluster")
	assert.Equal(t, "feed", info.Cluster.Name)
}

func TestRunNATSRefusesAnIncompleteClusterNode(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster", "feed", "--cluster-listen", "127.0.0.1:6222", "--routes", "nats-route://127.0.0.1:6223"}, "--name"},
		{[]string{"--name", "n1", "--cluster", "feed", "--cluster-listen", "6222", "--routes", "nats-route://127.0.0.1:6223"}, "host:port"},
		{[]string{"--name", "n1", "--cluster", "feed", "--cluster-listen", "127.0.0.1:6222", "--routes", "nats://127.0.0.1:6223"}, "nats-route://"},
		{[]string{"--name", "n1", "--cluster", "feed", "--cluster-listen", "127.0.0.1:6222"}, "--routes"},
		{[]string{"--routes", "nats-route://127.0.0.1:6223"}, "need --cluster"},
	} {
		args := append([]string{"--dir", t.TempDir()}, tt.args...)
		err := localstack.RunNATS(context.Background(), args, localstack.NATSConfig{}, io.Discard, slog.New(slog.DiscardHandler))
		require.Error(t, err, "%v", tt.args)
		assert.Contains(t, err.Error(), tt.want, "%v", tt.args)
	}
}
