package feeds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Function is a Lua file as Redis runs it: a library of its own (FUNCTION
// LOAD) registering one function, both named by a prefix and a hash of the
// code, so that services of two versions sharing a Redis each call their
// own, as EVALSHA would. A library's code runs once, when it is loaded; a
// call runs only the function (see inbox/lua/apply.lua for why that
// matters). Libraries are kept by Redis (in its RDB and AOF, and copied to
// replicas) until FUNCTION DELETE or FUNCTION FLUSH; those of older versions
// stay until deleted.
type Function struct {
	name string // the library's and the function's
	code string // the library's, with its header
}

// NewFunction makes the library of the Lua code lua, named prefix and a
// hash of the code. The code's local NAME is the function's name.
func NewFunction(prefix, lua string) *Function {
	sum := sha256.Sum256([]byte(lua))
	name := prefix + "_" + hex.EncodeToString(sum[:8])
	// The header is two lines: Redis's line numbers in errors are the file's
	// plus two.
	return &Function{name: name, code: "#!lua name=" + name + "\nlocal NAME = '" + name + "'\n" + lua}
}

// Name is the library's and the function's name.
func (f *Function) Name() string { return f.name }

// FCall queues or runs a call of the function on c.
func (f *Function) FCall(ctx context.Context, c redis.Cmdable, keys []string, args ...any) *redis.Cmd {
	return c.FCall(ctx, f.name, keys, args...)
}

// Load loads the library into rdb, replacing one of the same name (the same
// code): on every master of a cluster or every shard of a ring, which a key's
// call may reach.
func (f *Function) Load(ctx context.Context, rdb redis.UniversalClient) error {
	load := func(ctx context.Context, c *redis.Client) error {
		return c.FunctionLoadReplace(ctx, f.code).Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, load)
	case *redis.Ring:
		err = c.ForEachShard(ctx, load)
	default:
		err = rdb.FunctionLoadReplace(ctx, f.code).Err()
	}
	if err != nil {
		return fmt.Errorf("load Lua library %s: %w", f.name, err)
	}
	return nil
}

// Run calls the function, loading the library first if Redis did not have
// it (a new Redis, a restart without persistence, FUNCTION FLUSH). A call
// refused for that ran nothing.
func (f *Function) Run(ctx context.Context, rdb redis.UniversalClient, keys []string, args ...any) *redis.Cmd {
	cmd := f.FCall(ctx, rdb, keys, args...)
	if !MissingFunction(cmd.Err()) {
		return cmd
	}
	if err := f.Load(ctx, rdb); err != nil {
		cmd.SetErr(err)
		return cmd
	}
	return f.FCall(ctx, rdb, keys, args...)
}

// MissingFunction reports whether err is Redis refusing a call of a
// function it does not have.
func MissingFunction(err error) bool {
	return redis.HasErrorPrefix(err, "Function not found")
}

// LoadFunctions loads the Lua libraries fns into Redis, as a call that
// finds one missing does. It fails with ErrRedisTooOld if Redis has no
// functions (before 7.0).
func (s *Store) LoadFunctions(ctx context.Context, fns ...*Function) error {
	for _, f := range fns {
		if err := f.Load(ctx, s.rdb); err != nil {
			if redis.HasErrorPrefix(err, "unknown command") {
				return fmt.Errorf("%w: %w", ErrRedisTooOld, err)
			}
			return Fail("load the feeds' Lua functions", err)
		}
	}
	return nil
}
