package domain_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
)

func TestIDsAreTimeOrderedUniqueAndExact(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	g, err := domain.NewIDGenerator(3)
	require.NoError(t, err)

	var last int64
	var lastAt time.Time
	// Many ids within one millisecond, then a clock that goes back.
	clock := []time.Time{now, now, now}
	for range 40 {
		clock = append(clock, now.Add(500*time.Microsecond))
	}
	clock = append(clock, now.Add(-time.Second), now.Add(time.Second))
	for _, at := range clock {
		id, created := g.Next(at)
		assert.Greater(t, id, last, "ids increase")
		assert.False(t, created.Before(lastAt), "created_at never goes back")
		assert.Less(t, id, int64(domain.MaxID))
		assert.Equal(t, id, int64(float64(id)), "exact as a float64")
		assert.Equal(t, created, domain.IDTime(id))
		last, lastAt = id, created
	}
	id, created := g.Next(now.Add(time.Hour))
	assert.Equal(t, now.Add(time.Hour), created)
	assert.Equal(t, created, domain.IDTime(id))
}

func TestIDsOfDifferentNodesNeverCollide(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	seen := sync.Map{}
	var wg sync.WaitGroup
	for node := range 4 {
		g, err := domain.NewIDGenerator(node * 85)
		require.NoError(t, err)
		for range 2 {
			wg.Go(func() {
				for range 500 {
					id, _ := g.Next(now)
					_, dup := seen.LoadOrStore(id, true)
					assert.False(t, dup, "id %d made twice", id)
				}
			})
		}
	}
	wg.Wait()
	_, err := domain.NewIDGenerator(domain.MaxNode + 1)
	require.ErrorIs(t, err, domain.ErrInvalid)
}

func TestLimits(t *testing.T) {
	long := func(n int) string {
		b := make([]rune, n)
		for i := range b {
			b[i] = 'é' // two bytes: limits count characters, not bytes
		}
		return string(b)
	}
	tests := []struct {
		name string
		err  error
	}{
		{"caption empty", domain.ValidateCaption("")},
		{"caption at limit", domain.ValidateCaption(long(2200))},
		{"comment one char", domain.ValidateComment("x")},
		{"comment at limit", domain.ValidateComment(long(2200))},
		{"one image", domain.ValidateImageCount(1)},
		{"ten images", domain.ValidateImageCount(10)},
	}
	for _, tt := range tests {
		assert.NoError(t, tt.err, tt.name)
	}
	bad := map[string]error{
		"caption over":     domain.ValidateCaption(long(2201)),
		"caption bad utf8": domain.ValidateCaption("\xff"),
		"caption with NUL": domain.ValidateCaption("a\x00b"),
		"comment with NUL": domain.ValidateComment("a\x00b"),
		"comment empty":    domain.ValidateComment(""),
		"comment blank":    domain.ValidateComment("  \n"),
		"comment over":     domain.ValidateComment(long(2201)),
		"no image":         domain.ValidateImageCount(0),
		"eleven images":    domain.ValidateImageCount(11),
	}
	for name, err := range bad {
		assert.ErrorIs(t, err, domain.ErrInvalid, name)
	}
}
