package media_test

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/natscluster"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/http/media"
)

// An image saved in a three-replica bucket through one node is read whole
// through another after the bucket's leader is killed: every acknowledged
// image survives the loss of a node, as every acknowledged event does.
func TestObjectStoreKeepsImagesAcrossALeaderLoss(t *testing.T) {
	c := natscluster.Start(t, natscluster.Config{SyncAlways: true})
	open := func(url string) *media.ObjectStore {
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		o, err := media.NewObjectStore(t.Context(), js, media.ObjectStoreConfig{Replicas: 3, TempDir: t.TempDir()})
		require.NoError(t, err)
		return o
	}
	writer := open(c.URLs())
	want := pngBytes(t, 300, 300) // several chunks
	img, err := writer.Save(t.Context(), bytes.NewReader(want), 5<<20)
	require.NoError(t, err)
	require.NoError(t, writer.Sync(t.Context()))

	leader := c.WaitForStreamLeader("OBJ_"+media.DefaultBucket, 10*time.Second)
	reader := open(c.URL((leader + 1) % c.Size()))
	c.Kill(leader)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		r, got, err := reader.Open(ctx, img.Key)
		if err != nil {
			return false
		}
		defer r.Close()
		data, err := io.ReadAll(r)
		return err == nil && bytes.Equal(want, data) && got.Size == int64(len(want))
	}, 30*time.Second, 100*time.Millisecond, "the image is not read whole after its bucket's leader was killed")
}

// A save while the bucket has no leader waits for the next one, or answers
// unavailable if the election outlasts its wait, never another error; the
// upload is stored once a leader is elected.
func TestObjectStoreSaveWaitsOutALeaderElection(t *testing.T) {
	c := natscluster.Start(t, natscluster.Config{})
	connect := func(url string) *media.ObjectStore {
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		o, err := media.NewObjectStore(t.Context(), js, media.ObjectStoreConfig{Replicas: 3, TempDir: t.TempDir()})
		require.NoError(t, err)
		return o
	}
	connect(c.URLs())
	// Connected to the bucket's leader, the saves meet both the lost
	// connection and the election.
	leader := c.WaitForStreamLeader("OBJ_"+media.DefaultBucket, 10*time.Second)
	o := connect(c.URL(leader) + "," + c.URLs())
	_, err := o.Save(t.Context(), bytes.NewReader(pngBytes(t, 20, 20)), 5<<20)
	require.NoError(t, err)
	c.Kill(leader)
	for i := range 5 {
		want := pngBytes(t, 40+i, 40)
		var img media.Image
		for deadline := time.Now().Add(time.Minute); ; {
			img, err = o.Save(t.Context(), bytes.NewReader(want), 5<<20)
			if err == nil {
				break
			}
			// An election that outlasts a save's wait is unavailable (503),
			// never another error.
			require.ErrorIs(t, err, domain.ErrUnavailable, "save %d while the bucket's leader is gone", i)
			require.True(t, time.Now().Before(deadline), "no save for a minute after the leader's loss: %v", err)
		}
		r, _, err := o.Open(t.Context(), img.Key)
		require.NoError(t, err)
		got, err := io.ReadAll(r)
		require.NoError(t, err)
		require.NoError(t, r.Close())
		require.Equal(t, want, got)
	}
}
