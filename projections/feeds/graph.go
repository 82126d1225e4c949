package feeds

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
)

// Follow records that follower follows followee. The two sets live in
// different slots, so the writes are not atomic; both are idempotent and the
// planner replays them after a crash.
func (s *Store) Follow(ctx context.Context, follower, followee domain.UserID) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.SAdd(ctx, s.keys.Followers(followee), int64(follower))
		p.SAdd(ctx, s.keys.Following(follower), int64(followee))
		return nil
	})
	if err != nil {
		return Fail(fmt.Sprintf("record user %d follows %d", follower, followee), err)
	}
	return nil
}

// Unfollow records that follower no longer follows followee.
func (s *Store) Unfollow(ctx context.Context, follower, followee domain.UserID) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.SRem(ctx, s.keys.Followers(followee), int64(follower))
		p.SRem(ctx, s.keys.Following(follower), int64(followee))
		return nil
	})
	if err != nil {
		return Fail(fmt.Sprintf("record user %d unfollows %d", follower, followee), err)
	}
	return nil
}

// Followers returns the users who follow user, in no particular order.
func (s *Store) Followers(ctx context.Context, user domain.UserID) ([]domain.UserID, error) {
	return s.users(ctx, s.keys.Followers(user), fmt.Sprintf("read followers of user %d", user))
}

// FollowerCount returns how many users follow user.
func (s *Store) FollowerCount(ctx context.Context, user domain.UserID) (int64, error) {
	n, err := s.rdb.SCard(ctx, s.keys.Followers(user)).Result()
	if err != nil {
		return 0, Fail(fmt.Sprintf("count followers of user %d", user), err)
	}
	return n, nil
}

// Following returns the users user follows, in no particular order.
func (s *Store) Following(ctx context.Context, user domain.UserID) ([]domain.UserID, error) {
	return s.users(ctx, s.keys.Following(user), fmt.Sprintf("read followees of user %d", user))
}

// SetBig marks user as a big account (not pushed; merged at read time) or not.
func (s *Store) SetBig(ctx context.Context, user domain.UserID, big bool) error {
	var err error
	if big {
		err = s.rdb.SAdd(ctx, s.keys.Big(), int64(user)).Err()
	} else {
		err = s.rdb.SRem(ctx, s.keys.Big(), int64(user)).Err()
	}
	if err != nil {
		return Fail(fmt.Sprintf("mark user %d big=%t", user, big), err)
	}
	return nil
}

// BigAccounts returns the big accounts, in no particular order.
func (s *Store) BigAccounts(ctx context.Context) ([]domain.UserID, error) {
	return s.users(ctx, s.keys.Big(), "read big accounts")
}

// BigFollowees returns those of the big accounts big that user follows, in
// big's order: the authors whose outboxes Page merges in for user.
func (s *Store) BigFollowees(ctx context.Context, user domain.UserID, big []domain.UserID) ([]domain.UserID, error) {
	if len(big) == 0 {
		return nil, nil
	}
	members := make([]any, len(big))
	for i, b := range big {
		members[i] = int64(b)
	}
	is, err := s.rdb.SMIsMember(ctx, s.keys.Following(user), members...).Result()
	if err != nil {
		return nil, Fail(fmt.Sprintf("read big followees of user %d", user), err)
	}
	var followed []domain.UserID
	for i, yes := range is {
		if yes {
			followed = append(followed, big[i])
		}
	}
	return followed, nil
}

// users reads the set of users at key.
func (s *Store) users(ctx context.Context, key, what string) ([]domain.UserID, error) {
	ms, err := s.rdb.SMembers(ctx, key).Result()
	return ParseUsers(ms, what, err)
}

// ParseUsers turns a set's members (read with error err) into user ids.
func ParseUsers(ms []string, what string, err error) ([]domain.UserID, error) {
	if err != nil {
		return nil, Fail(what, err)
	}
	users := make([]domain.UserID, 0, len(ms))
	for _, m := range ms {
		u, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: member %q is not a user id", what, m)
		}
		users = append(users, domain.UserID(u))
	}
	return users, nil
}
