package feeds

import (
	_ "embed" // the Lua scripts
)

// The Lua scripts that change and read feeds atomically. The outbox script
// touches one key and the page script one inbox (one hash slot); the apply
// script touches the inboxes of the recipients it is given, which
// Store.ApplyItems makes one (one hash slot) on Redis Cluster and many on a
// single Redis.
var (
	//go:embed lua/apply.lua
	stApplyLua string
	//go:embed lua/page.lua
	stPageLua string
	//go:embed lua/outbox_add.lua
	stOutboxAddLua string
)
