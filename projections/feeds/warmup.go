package feeds

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
)

// warmingTTL is how long a materialisation request suppresses repeats.
const warmingTTL = 30 * time.Second

// RequestMaterialise asks for user's inbox to be built, at most once per 30
// seconds per user.
func (s *Store) RequestMaterialise(ctx context.Context, user domain.UserID) error {
	what := fmt.Sprintf("request materialisation of user %d", user)
	marker := s.keys.Warming(user)
	set, err := s.rdb.SetNX(ctx, marker, "1", warmingTTL).Result()
	if err != nil {
		return Fail(what, err)
	}
	if !set {
		return nil
	}
	if err := s.rdb.LPush(ctx, s.keys.Warm(), int64(user)).Err(); err != nil {
		// Let the next read ask again rather than wait for the marker to expire;
		// if this fails too, the marker expires on its own.
		_ = s.rdb.Del(context.WithoutCancel(ctx), marker).Err()
		return Fail(what, err)
	}
	return nil
}

// PopMaterialiseRequests takes up to n materialisation requests, oldest first.
func (s *Store) PopMaterialiseRequests(ctx context.Context, n int) ([]domain.UserID, error) {
	if n < 1 {
		return nil, fmt.Errorf("pop materialisation requests: n=%d: %w", n, domain.ErrInvalid)
	}
	ms, err := s.rdb.RPopCount(ctx, s.keys.Warm(), n).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, Fail("pop materialisation requests", err)
	}
	users := make([]domain.UserID, 0, len(ms))
	for _, m := range ms {
		u, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("pop materialisation requests: %q is not a user id", m)
		}
		users = append(users, domain.UserID(u))
	}
	return users, nil
}

// ClearWarming lets users ask for their inbox again once their request is
// taken (an inbox that expires again soon must be rebuildable at once).
func (s *Store) ClearWarming(ctx context.Context, users []domain.UserID) error {
	keys := make([]string, len(users))
	for i, u := range users {
		keys[i] = s.keys.Warming(u)
	}
	// One DEL per key: in a Redis Cluster the users' keys live in other slots.
	pipe := s.rdb.Pipeline()
	for _, k := range keys {
		pipe.Del(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return Fail("clear materialisation requests", err)
	}
	return nil
}

// PendingMaterialise is how many materialisation requests wait.
func (s *Store) PendingMaterialise(ctx context.Context) (int64, error) {
	n, err := s.rdb.LLen(ctx, s.keys.Warm()).Result()
	if err != nil {
		return 0, Fail("count materialisation requests", err)
	}
	return n, nil
}

// RequestMaterialiseAll asks for the inboxes of users to be built, without
// the markers RequestMaterialise sets (a rebuild asks for every inbox once).
func (s *Store) RequestMaterialiseAll(ctx context.Context, users []domain.UserID) error {
	for len(users) > 0 {
		n := min(len(users), 1000)
		ids := make([]any, n)
		for i, u := range users[:n] {
			ids[i] = int64(u)
		}
		if err := s.rdb.LPush(ctx, s.keys.Warm(), ids...).Err(); err != nil {
			return Fail("request the inboxes", err)
		}
		users = users[n:]
	}
	return nil
}
