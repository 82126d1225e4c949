package feeds

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// CheckListpack returns Redis's zset-max-listpack-entries (zset-max-ziplist-
// entries before Redis 7). Every inbox stays compact if it is at least
// InboxCap+5 (no zset of an inbox holds more than the cap, and a small
// inbox's meta its posts and five members more); the caller warns if not.
func (s *Store) CheckListpack(ctx context.Context) (entries int64, err error) {
	for _, name := range []string{"zset-max-listpack-entries", "zset-max-ziplist-entries"} {
		kv, err := s.rdb.ConfigGet(ctx, name).Result()
		if err != nil {
			return 0, Fail("read "+name, err)
		}
		if v, ok := kv[name]; ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read %s: %q is not a number", name, v)
			}
			return n, nil
		}
	}
	return 0, errors.New("read zset-max-listpack-entries: the server reports neither it nor zset-max-ziplist-entries")
}

// CheckEviction reports whether Redis may evict keys: it has a maxmemory
// and a maxmemory-policy other than noeviction. An inbox is several keys
// (see apply.lua), and one of its segments evicted would leave a gap in a
// home feed that nothing notices; the caller warns.
func (s *Store) CheckEviction(ctx context.Context) (evicts bool, policy string, err error) {
	kv, err := s.rdb.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return false, "", Fail("read maxmemory", err)
	}
	policy = kv["maxmemory-policy"]
	return kv["maxmemory"] != "0" && policy != "noeviction", policy, nil
}
