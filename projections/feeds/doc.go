// Package feeds is the home feeds' Redis keyspace and the state every stage
// of them shares: the key schema (Keyspace), the store of a keyspace version
// with its configuration, the follow graph, the authors' outboxes, the
// materialisation requests and the loading of the Lua libraries. The stages
// are packages of their own: inbox (the inbox's scripts), fanout (planner and
// appliers), homefeed (reads) and repair (rebuild and maintenance).
package feeds
