package projections

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Given the sequences a fetcher expects, when records arrive, then each is
// taken only as the next one, a repeat is dropped, a gap is refused unless the
// stream reports every sequence in it gone, and a reported gap is named.
func TestOrderTakesOnlyTheNextSequence(t *testing.T) {
	tests := []struct {
		name    string
		holes   holes
		seqs    []uint64
		taken   []uint64
		gapAt   int // index of the record refused as a gap; -1: none
		skipped *knownGap
	}{
		{name: "contiguous", seqs: []uint64{5, 6, 7}, taken: []uint64{5, 6, 7}, gapAt: -1},
		{name: "repeat dropped", seqs: []uint64{5, 5, 6, 4, 7}, taken: []uint64{5, 6, 7}, gapAt: -1},
		{name: "lost in flight", seqs: []uint64{5, 6, 9}, taken: []uint64{5, 6}, gapAt: 2},
		{name: "first lost", seqs: []uint64{6}, gapAt: 0},
		{name: "below the stream's first", holes: holes{first: 8}, seqs: []uint64{8, 9}, taken: []uint64{8, 9}, gapAt: -1,
			skipped: &knownGap{from: 5, to: 7}},
		{name: "deleted", holes: holes{deleted: map[uint64]bool{6: true, 7: true}}, seqs: []uint64{5, 8}, taken: []uint64{5, 8}, gapAt: -1,
			skipped: &knownGap{from: 6, to: 7}},
		{name: "deleted and lost", holes: holes{deleted: map[uint64]bool{6: true}}, seqs: []uint64{5, 8}, taken: []uint64{5}, gapAt: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &order{next: 5, holes: tt.holes}
			var taken []uint64
			gapAt := -1
			var skipped *knownGap
			for i, seq := range tt.seqs {
				take, err := o.take(seq)
				if errors.As(err, &skipped) {
					err = nil
				}
				if err != nil {
					require.ErrorIs(t, err, ErrGap)
					gapAt = i
					break
				}
				if take {
					taken = append(taken, seq)
				}
			}
			assert.Equal(t, tt.taken, taken)
			assert.Equal(t, tt.gapAt, gapAt)
			assert.Equal(t, tt.skipped, skipped)
		})
	}
}

func TestRewindCause(t *testing.T) {
	assert.Equal(t, "gap", RewindCause(ErrGap))
	assert.Equal(t, "event", RewindCause(&EventError{Seq: 1, Err: errors.New("bad")}))
	assert.Equal(t, "verify", RewindCause(errVerify))
	assert.Equal(t, "store", RewindCause(errors.New("disk")))
}
