package feeds

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
)

// TestWorkBodyKeepsEveryItemInOrder encodes random work, with runs of pushes
// and removals to many recipients between single items of every kind, and
// decodes exactly the items given, in the order given; the body is much
// smaller than the items spelled out.
func TestWorkBodyKeepsEveryItemInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	var items []Item
	seq := uint64(100)
	for len(items) < 5_000 {
		seq++
		switch rng.IntN(4) {
		case 0, 1: // a post's push or removal to its author's followers
			op := OpPush
			if rng.IntN(2) == 0 {
				op = OpRemove
			}
			post := domain.PostID(rng.Int64N(1 << 50))
			for range 1 + rng.IntN(80) {
				items = append(items, Item{Recipient: domain.UserID(1 + rng.IntN(1000)), Seq: seq, Op: op, Posts: []domain.PostID{post}})
			}
		case 2: // a merge of an outbox into one follower's inbox
			items = append(items, Item{Recipient: domain.UserID(1 + rng.IntN(1000)), Seq: seq, Op: OpMerge,
				Posts: []domain.PostID{9, 7, 5}, Floor: int64(rng.IntN(5))})
		default: // a reconcile with allowed posts
			items = append(items, Item{Recipient: domain.UserID(1 + rng.IntN(1000)), Seq: seq, Op: OpReconcile,
				Posts: []domain.PostID{8, 6}, Floor: 2, Allowed: []domain.PostID{4}})
		}
	}
	data, err := encodeWork(items)
	require.NoError(t, err)
	got, err := decodeWork(data)
	require.NoError(t, err)
	require.Equal(t, items, got)

	spelled, err := json.Marshal(items)
	require.NoError(t, err)
	t.Logf("%d items: %d bytes, %d spelled out", len(items), len(data), len(spelled))
	assert.Less(t, 4*len(data), len(spelled), "runs should make the body much smaller")

	// Work published in the first form, a JSON array of items, still decodes.
	old, err := decodeWork(spelled)
	require.NoError(t, err)
	assert.Equal(t, items, old)

	_, err = decodeWork([]byte(`{"runs":[{"to":[],"seq":1,"op":1}]}`))
	require.ErrorIs(t, err, domain.ErrInvalid)
	_, err = decodeWork([]byte(`{"runs":`))
	require.Error(t, err)
}
