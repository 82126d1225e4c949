// Package inbox keeps the home-feed inboxes in Redis: the work items that
// change an inbox (Item), applied by the apply script in batches of
// recipients, and the page script that reads one, with big accounts'
// outboxes merged in at read time. Both scripts share the inbox's segmented
// layout, described in lua/apply.lua and docs/segmented-inboxes.md.
package inbox
