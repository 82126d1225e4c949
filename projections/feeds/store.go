package feeds

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// VersionCheck is how often readers and appliers look up the keyspace
// version: a rebuild's switch reaches them within it, and the rebuild keeps
// the old version readable for longer (repair.RebuildConfig.Grace).
const VersionCheck = time.Second

// Store is the feeds of one keyspace version in Redis: its client, its key
// names and its configuration, and the state every stage shares (the follow
// graph, the outboxes, the materialisation requests). It is safe for
// concurrent use.
type Store struct {
	rdb     redis.UniversalClient
	cfg     Config
	version int64
	keys    Keyspace
	// single is whether the client is one Redis, where one script call or
	// transaction may carry keys of different slots.
	single bool
	// repairs counts the inbox entries reconciliation had to fix: in a correct
	// system it stays at zero. Shared by the stores of every version.
	repairs *atomic.Int64
}

// NewStore returns a store of keyspace version 1 over rdb (a client, a
// cluster client or a ring); At gives the other versions.
func NewStore(rdb redis.UniversalClient, cfg Config) *Store {
	s := &Store{rdb: rdb, cfg: cfg.withDefaults(), repairs: new(atomic.Int64)}
	// A failover (Sentinel) client is a *redis.Client too: one master.
	_, s.single = rdb.(*redis.Client)
	return s.At(1)
}

// At returns the store of keyspace version v, sharing s's client and
// configuration.
func (s *Store) At(v int64) *Store {
	if v == s.version {
		return s
	}
	c := *s
	c.version, c.keys = v, KeyspaceAt(v)
	return &c
}

// WithClient returns s reading and writing through rdb, a client of the same
// single Redis (the page cache's tracked connections).
func (s *Store) WithClient(rdb *redis.Client) *Store {
	c := *s
	c.rdb = rdb
	return &c
}

// Version is the store's keyspace version.
func (s *Store) Version() int64 { return s.version }

// Keys names the keys of the store's keyspace version.
func (s *Store) Keys() Keyspace { return s.keys }

// Client is the store's Redis client.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// SingleRedis reports whether the store's client is one Redis, not a Cluster
// or a Ring: one script call or transaction may then carry keys of different
// hash slots.
func (s *Store) SingleRedis() bool { return s.single }

// Config returns the store's configuration with the defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Repairs is the number of inbox entries reconciliation had to fix so far.
func (s *Store) Repairs() int64 { return s.repairs.Load() }

// CountRepairs adds n inbox entries reconciliation had to fix.
func (s *Store) CountRepairs(n int64) { s.repairs.Add(n) }

// ActiveVersion reads the keyspace version in use.
func (s *Store) ActiveVersion(ctx context.Context) (int64, error) {
	v, err := s.rdb.Get(ctx, VersionKey).Int64()
	if errors.Is(err, redis.Nil) {
		return 1, nil
	}
	if err != nil {
		return 0, Fail("read the feeds' keyspace version", err)
	}
	return v, nil
}

// Active returns the store of the keyspace version in use.
func (s *Store) Active(ctx context.Context) (*Store, error) {
	v, err := s.ActiveVersion(ctx)
	if err != nil {
		return nil, err
	}
	return s.At(v), nil
}
