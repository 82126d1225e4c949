package feeds

import (
	"context"
	"crypto/sha256"
	_ "embed" // the Lua libraries
	"encoding/hex"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// The Lua code that changes and reads feeds atomically, each file a function
// library of its own. The outbox function touches one key and the page
// function one inbox (one hash slot); the apply function touches the inboxes
// of the recipients it is given, which Store.ApplyItems makes one (one hash
// slot) on Redis Cluster and many on a single Redis.
var (
	//go:embed lua/apply.lua
	stApplyLua string
	//go:embed lua/page.lua
	stPageLua string
	//go:embed lua/outbox_add.lua
	stOutboxAddLua string
)

// stFunction is one of the files above as Redis runs it: a library of its
// own (FUNCTION LOAD) registering one function, both named by a prefix and a
// hash of the code, so that services of two versions sharing a Redis each
// call their own, as EVALSHA would. A library's code runs once, when it is
// loaded; a call runs only the function (see apply.lua for why that
// matters). Libraries are kept by Redis (in its RDB and AOF, and copied to
// replicas) until FUNCTION DELETE or FUNCTION FLUSH; those of older versions
// stay until deleted.
type stFunction struct {
	name string // the library's and the function's
	code string // the library's, with its header
}

// The libraries, made once: a library's name is a hash of its code.
var (
	stApply     = newStFunction("feed_apply", stApplyLua)
	stPage      = newStFunction("feed_page", stPageLua)
	stOutboxAdd = newStFunction("feed_outbox_add", stOutboxAddLua)
)

func newStFunction(prefix, lua string) *stFunction {
	sum := sha256.Sum256([]byte(lua))
	name := prefix + "_" + hex.EncodeToString(sum[:8])
	// NAME is the file's name for its function. The header is two lines:
	// Redis's line numbers in errors are the file's plus two.
	return &stFunction{name: name, code: "#!lua name=" + name + "\nlocal NAME = '" + name + "'\n" + lua}
}

// FCall queues or runs a call of the function on c.
func (f *stFunction) FCall(ctx context.Context, c redis.Cmdable, keys []string, args ...any) *redis.Cmd {
	return c.FCall(ctx, f.name, keys, args...)
}

// Load loads the library into rdb, replacing one of the same name (the same
// code): on every master of a cluster or every shard of a ring, which a key's
// call may reach.
func (f *stFunction) Load(ctx context.Context, rdb redis.UniversalClient) error {
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
func (f *stFunction) Run(ctx context.Context, rdb redis.UniversalClient, keys []string, args ...any) *redis.Cmd {
	cmd := f.FCall(ctx, rdb, keys, args...)
	if !stMissingFunction(cmd.Err()) {
		return cmd
	}
	if err := f.Load(ctx, rdb); err != nil {
		cmd.SetErr(err)
		return cmd
	}
	return f.FCall(ctx, rdb, keys, args...)
}

// stMissingFunction reports whether err is Redis refusing a call of a
// function it does not have.
func stMissingFunction(err error) bool {
	return redis.HasErrorPrefix(err, "Function not found")
}
