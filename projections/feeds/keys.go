package feeds

import (
	"strconv"
	"strings"

	"github.com/feedproject/feed/domain"
)

// Keyspace names the Redis keys of the home feeds. This is the one place the
// key schema is written down; every key name is persisted: never rename one.
//
// Keys live in a keyspace version, prefixed feed:v<N>: (written <p> below),
// so that a rebuild can build version N+1 beside the live one and then switch
// readers and the planner to it by setting feed:version. Every per-user key
// carries the user id as its hash tag, so all of one user's keys share a
// Redis Cluster slot and on a Cluster every script run touches one slot.
//
//	key                    type    written by          holds
//	feed:version           string  repair.Rebuild      the keyspace version in use (absent: 1)
//	feed:rebuild           hash    repair.Rebuild      the rebuild in progress: its version, the old
//	feed:rebuild:lock      string  repair.Rebuild      held by the running rebuild, with a lease
//	<p>{<uid>}:iy          zset    inbox.Apply         the inbox's meta (below); expires unless read
//	<p>{<uid>}:iy:<g>:<k>  zset    inbox.Apply         inbox segment k of generation g (below)
//	<p>{<uid>}:out         zset    fanout.Planner      the outbox: the author's post ids, and "f"
//	<p>{<uid>}:fol         set     fanout.Planner      the user's followers
//	<p>{<uid>}:fng         set     fanout.Planner      the users the user follows
//	<p>{<uid>}:warming     string  readers             marks a materialisation request (30 s)
//	<p>big                 set     fanout.Planner      accounts with more followers than the threshold
//	<p>warm                list    readers             materialisation requests (LPUSH; the planner RPOPs)
//	<p>planner:pos         string  fanout.Planner      the planner's log position
//	<p>planner:epoch{<p>planner:pos}  string  fanout.Planner  the lease epoch that last moved it (in its slot)
//	rq:{inboxes}:*         3 keys  repair.Maintenance  the round of inboxes to reconcile (roundqueue)
//	stream:{<uid>}         zset    presence.Registry   the user's open live streams, by expiry
//	stream:online          zset    presence.Registry   users with an open live stream, by expiry
//
// The inbox meta holds "f" scored -(floor+1): the inbox is exactly the feed's
// posts with id >= floor; "s" scored 2seq-2^54: a log sequence, at least that
// of the last work item that took anything out, at most that of the last
// applied; "b" scored -(b+1): the head's lower bound; the layout
// "<g>:<h>/<r>/<t>" scored 0; in a small inbox "m" and its posts. A segment
// holds post ids scored by 2^53 minus themselves, newest first, each segment
// newer than those below it (t <= k <= h), and expires a second after the
// meta (see inbox/lua/apply.lua). Inboxes of earlier builds, no longer read,
// expire: <p>{<uid>}:in, oldest first; <p>{<uid>}:ix, with "s" scored
// -(seq+1), with its segments or without.
//
// The outbox's "f" is scored -(floor+1): the outbox is exactly the author's
// live posts with id >= floor. Post ids are 53-bit and time-ordered, so a
// post's id (in an inbox, 2^53 minus it) is its exact score and ordering by
// score is ordering by time; a special's negative score keeps it before every
// post.
type Keyspace struct{ prefix string }

// Keys outside every keyspace version.
const (
	// VersionKey holds the keyspace version readers and the live planner use
	// (absent: 1). A rebuild builds the next version beside it and then
	// moves it.
	VersionKey = "feed:version"
	// RebuildKey holds the rebuild in progress.
	RebuildKey = "feed:rebuild"
	// RebuildLockKey is held by the running rebuild.
	RebuildLockKey = "feed:rebuild:lock"
	// OnlineKey holds the users with an open live stream, each scored by
	// when its entry expires (Unix milliseconds).
	OnlineKey = "stream:online"
)

// StreamsKey is the key of user's open live streams, each scored by when its
// entry expires (Unix milliseconds): outside every keyspace version, since a
// rebuild has nothing to rebuild there, and tagged with the user as the
// user's feed keys are.
func StreamsKey(u domain.UserID) string {
	return "stream:{" + strconv.FormatInt(int64(u), 10) + "}"
}

// Key names below a keyspace version's prefix.
const (
	bigName         = "big"
	warmName        = "warm"
	plannerPosName  = "planner:pos"
	inboxSuffix     = "iy"
	outboxSuffix    = "out"
	followerSuffix  = "fol"
	followingSuffix = "fng"
	warmingSuffix   = "warming"
)

// KeyPrefix is the prefix of every key of keyspace version v.
func KeyPrefix(v int64) string { return "feed:v" + strconv.FormatInt(v, 10) + ":" }

// KeyspaceAt is the keyspace of version v.
func KeyspaceAt(v int64) Keyspace { return Keyspace{prefix: KeyPrefix(v)} }

// Prefix is the prefix of every key of the keyspace.
func (k Keyspace) Prefix() string { return k.prefix }

// user names one of a user's keys; the user id is the hash tag, so all of a
// user's keys live in one Redis Cluster slot.
func (k Keyspace) user(u domain.UserID, suffix string) string {
	return k.prefix + "{" + strconv.FormatInt(int64(u), 10) + "}:" + suffix
}

// Inbox is the key of user's inbox meta.
func (k Keyspace) Inbox(u domain.UserID) string { return k.user(u, inboxSuffix) }

// Outbox is the key of author's outbox.
func (k Keyspace) Outbox(u domain.UserID) string { return k.user(u, outboxSuffix) }

// Followers is the key of the set of user's followers.
func (k Keyspace) Followers(u domain.UserID) string { return k.user(u, followerSuffix) }

// Following is the key of the set of the users user follows.
func (k Keyspace) Following(u domain.UserID) string { return k.user(u, followingSuffix) }

// Warming is the key of user's materialisation request marker.
func (k Keyspace) Warming(u domain.UserID) string { return k.user(u, warmingSuffix) }

// Big is the key of the set of big accounts.
func (k Keyspace) Big() string { return k.prefix + bigName }

// Warm is the key of the list of materialisation requests.
func (k Keyspace) Warm() string { return k.prefix + warmName }

// PlannerPosition is the key of the planner's log position.
func (k Keyspace) PlannerPosition() string { return k.prefix + plannerPosName }

// PlannerEpoch is the key of the lease epoch under which the planner's
// position was last moved: hash-tagged with the position's name, so that
// one script reads and writes both on a Redis Cluster.
func (k Keyspace) PlannerEpoch() string {
	return k.prefix + "planner:epoch{" + k.PlannerPosition() + "}"
}

// InboxPattern matches the inbox metas of the keyspace (SCAN MATCH).
func (k Keyspace) InboxPattern() string { return k.prefix + "{*}:" + inboxSuffix }

// InboxUser is the user of an inbox meta's key, or false if key is not one.
func (k Keyspace) InboxUser(key string) (domain.UserID, bool) {
	tag, ok := strings.CutPrefix(key, k.prefix+"{")
	if !ok {
		return 0, false
	}
	tag, ok = strings.CutSuffix(tag, "}:"+inboxSuffix)
	if !ok {
		return 0, false
	}
	u, err := domain.ParseUserID(tag)
	return u, err == nil
}

// segmentInfix is what an inbox segment's key has after its user's hash tag
// (<p>{<uid>}:iy:<g>:<k>).
const segmentInfix = "}:" + inboxSuffix + ":"

// InboxOf is the inbox meta a segment's key belongs to, or key itself if it
// is not a segment's. The page cache records a change to a segment as its
// inbox's: the pages that read it name the inbox, and a head's key is new
// every segment's worth of posts, so recording the segments themselves would
// fill its changes with names never heard again.
func InboxOf(key string) string {
	if i := strings.Index(key, segmentInfix); i >= 0 {
		return key[:i+len(segmentInfix)-1]
	}
	return key
}
