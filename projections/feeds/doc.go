// Package feeds keeps the home feeds in Redis: an outbox of recent posts per
// author, an inbox per recently active reader, and the follower and following
// sets that fan-out needs, written by a planner that follows the event log and
// by appliers that change each inbox with an idempotent Lua script (one run per
// batch of recipients), and read a page at a time with big accounts merged in at
// read time.
//
// Keys (persisted names: never rename them) live in a keyspace version,
// prefixed feed:v<N>: (written <p> below), so that a rebuild can build version
// N+1 beside the live one and then switch readers and the planner to it by
// setting feed:version (see Rebuild). Every per-user key carries the user id as
// its hash tag, so all of one user's keys share a Redis Cluster slot and on a
// Cluster every script run touches one slot:
//
//	feed:version          string: the keyspace version in use (absent: 1).
//	feed:rebuild          hash: the rebuild in progress (its version, the old).
//	feed:rebuild:lock     string: held by the running rebuild, with a lease.
//	<p>{<uid>}:iy         inbox meta zset: "f" scored -(floor+1): the inbox is
//	                      exactly the feed's posts with id >= floor; "s" scored
//	                      2seq-2^54: a log sequence, at least that of the last
//	                      work item that took anything out, at most that of
//	                      the last applied; "b" scored -(b+1): the head's lower
//	                      bound; the layout "<g>:<h>/<r>/<t>" scored 0; in a
//	                      small inbox "m" and its posts. Expires unless read.
//	                      (Inboxes of earlier builds, no longer read, expire:
//	                      <p>{<uid>}:in, oldest first; <p>{<uid>}:ix, with
//	                      "s" scored -(seq+1), with its segments or without.)
//	<p>{<uid>}:iy:<g>:<k> inbox segment k (t <= k <= h) of generation g: post ids
//	                      scored by 2^53 minus themselves, newest first, each
//	                      segment newer than those below it (see apply.lua).
//	                      Expires a second after the meta.
//	<p>{<uid>}:out        outbox zset: the author's post ids; "f" scored -(floor+1):
//	                      exactly the author's live posts with id >= floor.
//	<p>{<uid>}:fol        set: the user's followers.
//	<p>{<uid>}:fng        set: the users the user follows.
//	<p>{<uid>}:warming    marker deduplicating materialisation requests.
//	<p>big                set: accounts with more followers than the threshold.
//	<p>warm               list: materialisation requests (LPUSH, RPOP).
//	<p>planner:pos        string: the planner's log position.
//
// Post ids are 53-bit and time-ordered, so a post's id (in an inbox, 2^53
// minus it) is its exact score and ordering by score is ordering by time; the
// outbox's special's negative score keeps it before every post. An inbox
// segment is newest first because a listpack finds where a new entry goes by
// walking from its head: a push lands at the head, and trimming takes from
// the tail. It is segmented because a listpack also looks every added member
// up by walking it whole (docs/segmented-inboxes.md).
package feeds
