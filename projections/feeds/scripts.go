package feeds

import (
	_ "embed" // the Lua scripts
)

// The Lua scripts that change feeds atomically. Each touches one key (one
// hash slot), so they run unchanged on Redis Cluster.
var (
	//go:embed lua/apply.lua
	stApplyLua string
	//go:embed lua/outbox_add.lua
	stOutboxAddLua string
)
