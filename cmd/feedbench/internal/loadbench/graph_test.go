package loadbench

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
)

func TestNewGraphKeepsItsBounds(t *testing.T) {
	cases := []GraphConfig{
		{Users: 1000, AvgFollowers: 100, Big: 5, BigThreshold: 500},
		{Users: 200, AvgFollowers: 20, Big: 3, BigThreshold: 100},
		{Users: 50, AvgFollowers: 5, Big: 0, BigThreshold: 10_000},
		{Users: 2, AvgFollowers: 1, Big: 0, BigThreshold: 1},
		{Users: 300, AvgFollowers: 250, Big: 2, BigThreshold: 280, Exponent: 1.5},
	}
	for _, cfg := range cases {
		g, err := NewGraph(cfg, rand.New(rand.NewPCG(1, 2)))
		require.NoError(t, err, "%+v", cfg)
		require.Equal(t, cfg.Users, g.Users())

		big, edges, followingTotal := 0, 0, 0
		for i := range cfg.Users {
			u := domain.UserID(i + 1)
			fs := g.Followers(u)
			edges += len(fs)
			followingTotal += len(g.Following(u))
			assert.NotContains(t, fs, u, "%+v: user %d follows itself", cfg, u)
			sorted := slices.Clone(fs)
			slices.Sort(sorted)
			assert.Len(t, slices.Compact(sorted), len(fs), "%+v: duplicate follower of %d", cfg, u)
			assert.GreaterOrEqual(t, len(fs), 1, "%+v: %d has no follower", cfg, u)
			assert.LessOrEqual(t, len(fs), cfg.Users-1)
			if g.IsBig(u) {
				big++
				assert.Greater(t, len(fs), cfg.BigThreshold, "%+v: big account %d", cfg, u)
			} else {
				// Room for the workload's follows below the threshold.
				assert.LessOrEqual(t, len(fs), cfg.BigThreshold-cfg.BigThreshold/10, "%+v: ordinary account %d", cfg, u)
			}
			for _, f := range fs {
				assert.True(t, g.Follows(f, u))
			}
		}
		assert.Equal(t, cfg.Big, big, "%+v", cfg)
		assert.Len(t, g.BigAccounts(), cfg.Big)
		assert.Equal(t, cfg.Users*cfg.AvgFollowers, edges, "%+v: the mean is exact", cfg)
		assert.Equal(t, edges, g.Edges())
		assert.Equal(t, edges, followingTotal)
		assert.Len(t, g.Shuffled(rand.New(rand.NewPCG(3, 4))), edges)
	}
}

func TestNewGraphIsHeavyTailed(t *testing.T) {
	g, err := NewGraph(GraphConfig{Users: 1000, AvgFollowers: 100, Big: 5, BigThreshold: 500}, rand.New(rand.NewPCG(5, 6)))
	require.NoError(t, err)
	counts := make([]int, g.Users())
	for i := range counts {
		counts[i] = len(g.Followers(domain.UserID(i + 1)))
	}
	slices.Sort(counts)
	median, top := counts[len(counts)/2], counts[len(counts)-len(counts)/100]
	// A power law, not a uniform draw: the top percentile has several times
	// the median, and the median is below the mean.
	assert.Greater(t, top, 4*median, "median %d, 99th percentile %d", median, top)
	assert.Less(t, median, 100)
}

func TestNewGraphIsDeterministic(t *testing.T) {
	cfg := GraphConfig{Users: 100, AvgFollowers: 10, Big: 1, BigThreshold: 50}
	a, err := NewGraph(cfg, rand.New(rand.NewPCG(7, 8)))
	require.NoError(t, err)
	b, err := NewGraph(cfg, rand.New(rand.NewPCG(7, 8)))
	require.NoError(t, err)
	for i := range 100 {
		assert.Equal(t, a.Followers(domain.UserID(i+1)), b.Followers(domain.UserID(i+1)))
	}
}

func TestNewGraphRefusesImpossibleShapes(t *testing.T) {
	for _, cfg := range []GraphConfig{
		{Users: 1, AvgFollowers: 1, BigThreshold: 10},
		{Users: 100, AvgFollowers: 0, BigThreshold: 10},
		{Users: 100, AvgFollowers: 100, BigThreshold: 1000},
		{Users: 100, AvgFollowers: 10, Big: 1, BigThreshold: 99},  // no room above the threshold
		{Users: 100, AvgFollowers: 50, Big: 0, BigThreshold: 20},  // the mean cannot be reached below it
		{Users: 100, AvgFollowers: 10, Big: 60, BigThreshold: 20}, // more than half big
	} {
		_, err := NewGraph(cfg, rand.New(rand.NewPCG(1, 1)))
		assert.Error(t, err, "%+v", cfg)
	}
}
