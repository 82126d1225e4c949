package feeds

import (
	_ "embed" // the Lua scripts
)

// The Lua scripts that change feeds atomically. The outbox script touches one
// key; the apply script touches the inboxes of the recipients it is given,
// which Store.ApplyItems makes one (one hash slot) on Redis Cluster and many on
// a single Redis.
var (
	//go:embed lua/apply.lua
	stApplyLua string
	//go:embed lua/outbox_add.lua
	stOutboxAddLua string
)
