package loadbench

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/feedproject/feed/domain"
)

// GraphConfig describes a synthetic social graph.
type GraphConfig struct {
	// Users is the number of users, with ids 1..Users; at least 2.
	Users int
	// AvgFollowers is the mean follower count; at least 1.
	AvgFollowers int
	// Big is how many accounts get more than BigThreshold followers.
	Big int
	// BigThreshold is the service's FEED_BIG_ACCOUNT: every other account gets
	// at most ordinaryCeiling of it.
	BigThreshold int
	// Exponent is the power law of ordinary accounts' follower counts by rank
	// (count ∝ rank^-Exponent); 0 means 0.8.
	Exponent float64
}

// Edge is one follow: Follower follows Followee.
type Edge struct {
	Follower, Followee domain.UserID
}

// Graph is a social graph of users 1..Users.
type Graph struct {
	followers [][]domain.UserID // by followee-1
	following [][]domain.UserID // by follower-1
	big       []bool            // by user-1
	edges     int
}

// NewGraph draws a graph: follower counts follow a power law by rank, the Big
// most followed accounts above BigThreshold and every other at or below
// ordinaryCeiling of it, with the mean AvgFollowers (within one follow per
// account); each account's followers are drawn uniformly from the other users.
func NewGraph(cfg GraphConfig, rng *rand.Rand) (*Graph, error) {
	counts, err := followerCounts(cfg)
	if err != nil {
		return nil, err
	}
	// Ranks are handed to users at random, so ids say nothing about fame.
	order := rng.Perm(cfg.Users)
	g := &Graph{
		followers: make([][]domain.UserID, cfg.Users),
		following: make([][]domain.UserID, cfg.Users),
		big:       make([]bool, cfg.Users),
	}
	// pool stays a permutation of all users; a partial Fisher–Yates shuffle
	// of any permutation draws a uniform subset, so it is never reset and each
	// account costs only its follower count.
	pool := make([]int, cfg.Users)
	for i := range pool {
		pool[i] = i
	}
	for rank, c := range counts {
		account := order[rank]
		g.big[account] = rank < cfg.Big
		fs := make([]domain.UserID, 0, c)
		for i := 0; len(fs) < c; i++ {
			j := i + rng.IntN(cfg.Users-i)
			pool[i], pool[j] = pool[j], pool[i]
			if pool[i] == account {
				continue // nobody follows themselves; c < Users leaves room
			}
			fs = append(fs, domain.UserID(pool[i]+1))
			g.following[pool[i]] = append(g.following[pool[i]], domain.UserID(account+1))
		}
		g.followers[account] = fs
		g.edges += c
	}
	return g, nil
}

// followerCounts is the follower count of each rank, most followed first.
func followerCounts(cfg GraphConfig) ([]int, error) {
	if cfg.Exponent == 0 {
		cfg.Exponent = 0.8
	}
	n, most := cfg.Users, cfg.Users-1
	switch {
	case n < 2:
		return nil, fmt.Errorf("graph: %d users: at least 2 are needed", n)
	case cfg.AvgFollowers < 1 || cfg.AvgFollowers > most:
		return nil, fmt.Errorf("graph: %d followers on average among %d users: it must be 1 to %d", cfg.AvgFollowers, n, most)
	case cfg.Big < 0 || cfg.Big > n/2:
		return nil, fmt.Errorf("graph: %d big accounts among %d users: at most half may be big", cfg.Big, n)
	case cfg.BigThreshold < 1:
		return nil, fmt.Errorf("graph: big-account threshold %d must be positive", cfg.BigThreshold)
	case cfg.Big > 0 && cfg.BigThreshold+1 > most:
		return nil, fmt.Errorf("graph: a big account needs more than %d followers but %d users give at most %d: add users or lower the threshold",
			cfg.BigThreshold, n, most)
	}
	counts := make([]int, n)
	total := n * cfg.AvgFollowers
	// Big accounts: from the most possible down towards the threshold.
	lo := cfg.BigThreshold + 1
	for k := range cfg.Big {
		counts[k] = lo + (most-lo)/(k+1)
		total -= counts[k]
	}
	ceiling := min(ordinaryCeiling(cfg.BigThreshold), most)
	ordinary := counts[cfg.Big:]
	if total < len(ordinary) || total > len(ordinary)*ceiling {
		return nil, fmt.Errorf("graph: %d followers on average cannot be reached with %d big accounts and at most %d followers for the others",
			cfg.AvgFollowers, cfg.Big, ceiling)
	}
	fillPowerLaw(ordinary, total, ceiling, cfg.Exponent)
	return counts, nil
}

// ordinaryCeiling is the most followers an ordinary account starts with: a
// tenth below the threshold, so that the workload's follows, a few dozen an
// account in a run, never make one big. At the threshold itself, the power
// law's clamp put 33 of the default graph's accounts, and each follow of one
// made it big and the unfollow after it small again, which merged its whole
// outbox into its 500 followers' inboxes. With the service's margin
// (decision 36) such an account stays big once across, which would add to
// the run's big accounts; a run's big accounts are the Big it asks for.
func ordinaryCeiling(threshold int) int { return threshold - threshold/10 }

// fillPowerLaw sets counts[r] = clamp(s·(r+1)^-exp, 1, ceiling), the scale s
// found by bisection so that they add up to total, then spreads the rounding
// remainder one follower at a time over the ranks that have room, from the
// most followed.
func fillPowerLaw(counts []int, total, ceiling int, exp float64) {
	fill := func(s float64) int {
		sum := 0
		for r := range counts {
			c := int(math.Round(s * math.Pow(float64(r+1), -exp)))
			counts[r] = min(max(c, 1), ceiling)
			sum += counts[r]
		}
		return sum
	}
	lo, hi := 0.0, float64(ceiling)*math.Pow(float64(len(counts)), exp)
	for range 100 {
		mid := (lo + hi) / 2
		if fill(mid) < total {
			lo = mid
		} else {
			hi = mid
		}
	}
	sum := fill(lo)
	for r := 0; sum != total; r = (r + 1) % len(counts) {
		switch {
		case sum < total && counts[r] < ceiling:
			counts[r]++
			sum++
		case sum > total && counts[r] > 1:
			counts[r]--
			sum--
		}
	}
}

// Users is the number of users; their ids are 1..Users.
func (g *Graph) Users() int { return len(g.followers) }

// Edges is the number of follows.
func (g *Graph) Edges() int { return g.edges }

// Followers are the users following u.
func (g *Graph) Followers(u domain.UserID) []domain.UserID { return g.followers[u-1] }

// Following are the users u follows.
func (g *Graph) Following(u domain.UserID) []domain.UserID { return g.following[u-1] }

// IsBig reports whether u has more followers than the threshold.
func (g *Graph) IsBig(u domain.UserID) bool { return g.big[u-1] }

// Follows reports whether follower follows followee.
func (g *Graph) Follows(follower, followee domain.UserID) bool {
	for _, f := range g.following[follower-1] {
		if f == followee {
			return true
		}
	}
	return false
}

// BigAccounts are the accounts above the threshold.
func (g *Graph) BigAccounts() []domain.UserID {
	var out []domain.UserID
	for i, b := range g.big {
		if b {
			out = append(out, domain.UserID(i+1))
		}
	}
	return out
}

// Shuffled is every follow, in random order: the order the bench creates them.
func (g *Graph) Shuffled(rng *rand.Rand) []Edge {
	out := make([]Edge, 0, g.edges)
	for i, fs := range g.followers {
		for _, f := range fs {
			out = append(out, Edge{Follower: f, Followee: domain.UserID(i + 1)})
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
