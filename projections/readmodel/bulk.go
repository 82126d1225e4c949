package readmodel

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
)

// A batch is applied in two round trips inside its transaction. The first
// locks the checkpoint and reads the rows the batch is about (state); the
// batch is then played against that state in memory, event by event, with
// exactly the rules of the one-event statements (queue), and what changed is
// written by a few set-based statements (plan). Nothing else writes the read
// model, and every writer holds the checkpoint lock, so the state read is the
// state the writes meet.
//
// The statements are keyed lookups and writes that need no table statistics
// to be planned well: a replay into new tables has none, and a plan that scans
// a table per batch makes a replay quadratic.

// likeKey is one (post, user) like.
type likeKey struct {
	post domain.PostID
	user domain.UserID
}

// keys are the rows whose state a batch needs and does not know (see
// known): the posts it names but does not create, their likes, its follow
// pairs. What a batch creates (posts, comments) is taken to be new, and
// inserted without ON CONFLICT: were one there already, a duplicate of an
// earlier event, the insert fails and the batch is applied event by event
// (see Apply).
type keys struct {
	posts                []int64
	likePosts, likeUsers []int64
	followers, followees []int64
}

// keysOf lists the rows batch needs the state of, each once: into st those
// kn knows (kn may be off), into the keys returned those to read.
func keysOf(batch []events.Record, kn *known, st *state) keys {
	var k keys
	created := make(map[domain.PostID]bool, len(batch)/4)
	for _, rec := range batch {
		if e, ok := rec.Event.(events.PostCreated); ok {
			created[e.PostID] = true
		}
	}
	posts := make(map[domain.PostID]struct{}, len(batch))
	likes := make(map[likeKey]struct{}, len(batch)/2)
	follows := make(map[projections.FollowPair]struct{}, len(batch)/2)
	post := func(id domain.PostID) bool {
		if created[id] {
			return false
		}
		if _, ok := posts[id]; ok {
			return true
		}
		posts[id] = struct{}{}
		switch row, ok := kn.post(id); {
		case !ok:
			k.posts = append(k.posts, int64(id))
		case row != noPost:
			st.posts[id] = row == deletedPost
		}
		return true
	}
	like := func(l likeKey) {
		if !post(l.post) {
			return
		}
		if _, ok := likes[l]; ok {
			return
		}
		likes[l] = struct{}{}
		switch liked, ok := kn.like(l); {
		case !ok:
			k.likePosts, k.likeUsers = append(k.likePosts, int64(l.post)), append(k.likeUsers, int64(l.user))
		case liked:
			st.likes.add(l)
		}
	}
	follow := func(f projections.FollowPair) {
		if _, ok := follows[f]; ok {
			return
		}
		follows[f] = struct{}{}
		switch following, ok := kn.follow(f); {
		case !ok:
			k.followers, k.followees = append(k.followers, int64(f.Follower)), append(k.followees, int64(f.Followee))
		case following:
			st.follows.add(f)
		}
	}
	for _, rec := range batch {
		switch e := rec.Event.(type) {
		case events.PostEdited:
			post(e.PostID)
		case events.PostDeleted:
			post(e.PostID)
		case events.PostLiked:
			like(likeKey{e.PostID, e.UserID})
		case events.PostUnliked:
			like(likeKey{e.PostID, e.UserID})
		case events.CommentAdded:
			post(e.PostID)
		case events.UserFollowed:
			follow(projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID})
		case events.UserUnfollowed:
			follow(projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID})
		}
	}
	return k
}

// The reads of a batch's state: one primary-key lookup per row, as scalar
// subqueries, which the planner keeps per row. Left to plan a join or a scan
// itself, it goes by the tables' statistics, and a replay's new tables have
// none: it would plan to scan a whole table per batch (and, the statements
// being prepared, keep that plan as the table grows), making a replay
// quadratic.
const (
	readPosts = `SELECT u.id, (SELECT p.deleted_at IS NOT NULL FROM posts p WHERE p.id = u.id)
		FROM unnest($1::bigint[]) AS u(id)`
	readLikes = `SELECT u.post_id, u.user_id FROM unnest($1::bigint[], $2::bigint[]) AS u(post_id, user_id)
		WHERE (SELECT true FROM likes l WHERE l.post_id = u.post_id AND l.user_id = u.user_id)`
	readFollows = `SELECT u.follower_id, u.followee_id FROM unnest($1::bigint[], $2::bigint[]) AS u(follower_id, followee_id)
		WHERE (SELECT true FROM follows f WHERE f.follower_id = u.follower_id AND f.followee_id = u.followee_id)`
)

// set is a set of keys. (A map to struct{} takes a third less memory per key
// than a map to bool.)
type set[K comparable] map[K]struct{}

func (s set[K]) has(k K) bool {
	_, ok := s[k]
	return ok
}

func (s set[K]) add(k K) { s[k] = struct{}{} }

// state is the read model as a batch finds it, for the rows the batch names.
type state struct {
	// posts holds the posts that exist, true for those deleted.
	posts   map[domain.PostID]bool
	likes   set[likeKey]
	follows set[projections.FollowPair]
}

// queueReads adds the reads of k's rows to b, those with rows to read, in
// the order readState takes their results.
func (k keys) queueReads(b *pgx.Batch) {
	if len(k.posts) > 0 {
		b.Queue(readPosts, k.posts)
	}
	if len(k.likePosts) > 0 {
		b.Queue(readLikes, k.likePosts, k.likeUsers)
	}
	if len(k.followers) > 0 {
		b.Queue(readFollows, k.followers, k.followees)
	}
}

func newState() *state {
	return &state{posts: map[domain.PostID]bool{}, likes: set[likeKey]{}, follows: set[projections.FollowPair]{}}
}

// readState adds the results of k.queueReads to s.
func (k keys) readState(results pgx.BatchResults, s *state) error {
	var a, b int64
	var deleted pgtype.Bool
	if len(k.posts) > 0 {
		if err := scanEach(results, "posts", func(r pgx.Rows) error {
			if err := r.Scan(&a, &deleted); err != nil {
				return err
			}
			if deleted.Valid { // NULL: no such post
				s.posts[domain.PostID(a)] = deleted.Bool
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if len(k.likePosts) > 0 {
		if err := scanEach(results, "likes", func(r pgx.Rows) error {
			if err := r.Scan(&a, &b); err != nil {
				return err
			}
			s.likes.add(likeKey{domain.PostID(a), domain.UserID(b)})
			return nil
		}); err != nil {
			return err
		}
	}
	if len(k.followers) > 0 {
		if err := scanEach(results, "follows", func(r pgx.Rows) error {
			if err := r.Scan(&a, &b); err != nil {
				return err
			}
			s.follows.add(projections.FollowPair{Follower: domain.UserID(a), Followee: domain.UserID(b)})
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// scanEach calls fn for each row of the next result of results.
func scanEach(results pgx.BatchResults, what string, fn func(pgx.Rows) error) error {
	rows, err := results.Query()
	if err != nil {
		return fmt.Errorf("current %s: %w", what, pgFailure(err))
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return fmt.Errorf("current %s: %w", what, pgFailure(err))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("current %s: %w", what, pgFailure(err))
	}
	return nil
}

// post is one post as the batch leaves it.
type post struct {
	exists, deleted bool
	// created: the batch inserts the post (with its final values below).
	created   bool
	user      domain.UserID
	createdAt time.Time
	media     []events.Media
	// Changes by the batch: the caption and edit time of the last edit (or the
	// creation's caption), the deletion, the likes and comments it added.
	caption         string
	edited          bool
	editedAt        time.Time
	deletedNow      bool
	deletedAt       time.Time
	likes, comments int32
}

func (p *post) live() bool { return p.exists && !p.deleted }

// plan is what a batch changes, as the columns of the statements that write
// it.
type plan struct {
	posts struct { // new posts, final
		ids, users      []int64
		captions        []string
		created         []time.Time
		edited, deleted []pgtype.Timestamptz
		likes, comments []int32
	}
	media struct {
		posts           []int64
		positions       []int16
		keys, types     []string
		widths, heights []int32
		sizes           []int64
	}
	changes struct { // posts that existed and stay live or are deleted now
		ids             []int64
		captions        []pgtype.Text
		edited, deleted []pgtype.Timestamptz
		likes, comments []int32
	}
	likes, unlikes struct{ posts, users []int64 }
	comments       struct {
		ids, posts, users []int64
		texts             []string
		at                []time.Time
	}
	follows, refollows struct {
		followers, followees []int64
		since                []time.Time
	}
	unfollows struct{ followers, followees []int64 }
}

// reset empties pl, keeping its memory. A column it missed would carry one
// batch's rows into the next: TestPlanReset checks them all.
func (pl *plan) reset() {
	n, m, c, cm := &pl.posts, &pl.media, &pl.changes, &pl.comments
	n.ids, n.users, n.captions, n.created = n.ids[:0], n.users[:0], n.captions[:0], n.created[:0]
	n.edited, n.deleted, n.likes, n.comments = n.edited[:0], n.deleted[:0], n.likes[:0], n.comments[:0]
	m.posts, m.positions, m.keys, m.types = m.posts[:0], m.positions[:0], m.keys[:0], m.types[:0]
	m.widths, m.heights, m.sizes = m.widths[:0], m.heights[:0], m.sizes[:0]
	c.ids, c.captions, c.edited, c.deleted, c.likes, c.comments = c.ids[:0], c.captions[:0], c.edited[:0], c.deleted[:0], c.likes[:0], c.comments[:0]
	for _, l := range []*struct{ posts, users []int64 }{&pl.likes, &pl.unlikes} {
		l.posts, l.users = l.posts[:0], l.users[:0]
	}
	cm.ids, cm.posts, cm.users, cm.texts, cm.at = cm.ids[:0], cm.posts[:0], cm.users[:0], cm.texts[:0], cm.at[:0]
	for _, f := range []*struct {
		followers, followees []int64
		since                []time.Time
	}{&pl.follows, &pl.refollows} {
		f.followers, f.followees, f.since = f.followers[:0], f.followees[:0], f.since[:0]
	}
	pl.unfollows.followers, pl.unfollows.followees = pl.unfollows.followers[:0], pl.unfollows.followees[:0]
}

// planner plans batch after batch in the same memory: its plan and the
// scratch space of planning. That spares a replay about a tenth of what its
// process allocates (BenchmarkReplay).
type planner struct {
	plan
	// The posts in the order the batch names them, found by id.
	order []post
	ids   []domain.PostID
	index map[domain.PostID]int
	// The comments the batch adds; the likes it changes, found by key.
	comments  map[domain.CommentID]bool
	likes     []likeChange
	likeIndex map[likeKey]int
	// after is the outcome for the posts, and likes for the likes, the
	// batch names, until the next batch (see known.learn).
	after []postAfter
}

// postAfter is a post as a batch leaves it.
type postAfter struct {
	id  domain.PostID
	row postRow
}

// likeChange is a like a batch changes: before it and after the events so
// far.
type likeChange struct {
	key         likeKey
	before, now bool
}

// planOf plays records (merged, no-op follows dropped) against the state
// before them. Each rule is that of the event's statement in queue: a post is
// created once; edits, deletions, likes, unlikes and comments change a live
// post only (so a deleted post stays deleted, whatever comes after); a like
// is added once, an unlike removes one that is there; a comment is added once.
// The plan is pr's, valid until the next call.
func (pr *planner) planOf(records []events.Record, merged projections.Merged, s *state) *plan {
	pl := &pr.plan
	pl.reset()
	if pr.index == nil {
		pr.index, pr.comments, pr.likeIndex = map[domain.PostID]int{}, map[domain.CommentID]bool{}, map[likeKey]int{}
	}
	clear(pr.index)
	clear(pr.comments)
	clear(pr.likeIndex)
	// Each event names one post at most, so order never grows past this
	// capacity and the pointers get returns stay valid.
	if cap(pr.order) < len(records) {
		pr.order = make([]post, 0, len(records))
	}
	order, ids, index := pr.order[:0], pr.ids[:0], pr.index
	after := pr.after[:0]
	get := func(id domain.PostID) *post {
		if i, ok := index[id]; ok {
			return &order[i]
		}
		deleted, exists := s.posts[id]
		index[id] = len(order)
		order, ids = append(order, post{exists: exists, deleted: deleted}), append(ids, id)
		return &order[len(order)-1]
	}
	comments := pr.comments // added by the batch
	likes, likeIndex := pr.likes[:0], pr.likeIndex
	setLike := func(k likeKey, liked bool) bool {
		i, ok := likeIndex[k]
		if !ok {
			i = len(likes)
			likeIndex[k] = i
			liked := s.likes.has(k)
			likes = append(likes, likeChange{key: k, before: liked, now: liked})
		}
		l := &likes[i]
		if l.now == liked {
			return false
		}
		l.now = liked
		return true
	}
	for _, rec := range records {
		switch e := rec.Event.(type) {
		case events.PostCreated:
			p := get(e.PostID)
			if p.exists {
				continue
			}
			p.exists, p.created = true, true
			p.user, p.caption, p.createdAt, p.media = e.UserID, e.Caption, e.CreatedAt, e.Media
		case events.PostEdited:
			if p := get(e.PostID); p.live() {
				p.caption, p.edited, p.editedAt = e.Caption, true, e.EditedAt
			}
		case events.PostDeleted:
			if p := get(e.PostID); p.live() {
				p.deleted, p.deletedNow, p.deletedAt = true, true, e.DeletedAt
			}
		case events.PostLiked:
			if p := get(e.PostID); p.live() && setLike(likeKey{e.PostID, e.UserID}, true) {
				p.likes++
			}
		case events.PostUnliked:
			if p := get(e.PostID); p.live() && setLike(likeKey{e.PostID, e.UserID}, false) {
				p.likes--
			}
		case events.CommentAdded:
			p := get(e.PostID)
			if !p.live() || comments[e.CommentID] {
				continue
			}
			comments[e.CommentID] = true
			p.comments++
			c := &pl.comments
			c.ids, c.posts, c.users = append(c.ids, int64(e.CommentID)), append(c.posts, int64(e.PostID)), append(c.users, int64(e.UserID))
			c.texts, c.at = append(c.texts, e.Text), append(c.at, e.CreatedAt)
		case events.UserFollowed:
			pair := projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID}
			f := &pl.follows
			if s.follows.has(pair) {
				// Left by dropNoops only when the batch ended the relation and
				// began it again: it begins anew.
				f = &pl.refollows
			}
			f.followers, f.followees = append(f.followers, int64(e.FollowerID)), append(f.followees, int64(e.FolloweeID))
			f.since = append(f.since, merged.Since[rec.Seq].Truncate(time.Second))
		case events.UserUnfollowed:
			u := &pl.unfollows
			u.followers, u.followees = append(u.followers, int64(e.FollowerID)), append(u.followees, int64(e.FolloweeID))
		}
	}
	for i := range order {
		p := &order[i]
		id := int64(ids[i])
		row := noPost
		switch {
		case p.deleted:
			row = deletedPost
		case p.exists:
			row = livePost
		}
		after = append(after, postAfter{ids[i], row})
		switch {
		case p.created:
			n := &pl.posts
			n.ids, n.users = append(n.ids, id), append(n.users, int64(p.user))
			n.captions, n.created = append(n.captions, p.caption), append(n.created, p.createdAt)
			n.edited = append(n.edited, pgtype.Timestamptz{Time: p.editedAt, Valid: p.edited})
			n.deleted = append(n.deleted, pgtype.Timestamptz{Time: p.deletedAt, Valid: p.deletedNow})
			n.likes, n.comments = append(n.likes, p.likes), append(n.comments, p.comments)
			m := &pl.media
			for pos, md := range p.media {
				m.posts, m.positions = append(m.posts, id), append(m.positions, int16(pos))
				m.keys, m.types = append(m.keys, md.Key), append(m.types, md.ContentType)
				m.widths, m.heights, m.sizes = append(m.widths, int32(md.Width)), append(m.heights, int32(md.Height)), append(m.sizes, md.Size)
			}
		case p.edited || p.deletedNow || p.likes != 0 || p.comments != 0:
			c := &pl.changes
			c.ids = append(c.ids, id)
			c.captions = append(c.captions, pgtype.Text{String: p.caption, Valid: p.edited})
			c.edited = append(c.edited, pgtype.Timestamptz{Time: p.editedAt, Valid: p.edited})
			c.deleted = append(c.deleted, pgtype.Timestamptz{Time: p.deletedAt, Valid: p.deletedNow})
			c.likes, c.comments = append(c.likes, p.likes), append(c.comments, p.comments)
		}
	}
	// New rows go into their indexes in key order: each insertion then
	// descends to the leaf next to the last one's. For follows (three
	// indexes, two of them led by the follower) that makes the insert a
	// quarter cheaper than in the order of the log. Posts and comments come
	// in id order already.
	slices.SortFunc(likes, func(a, b likeChange) int {
		return cmp.Or(cmp.Compare(a.key.post, b.key.post), cmp.Compare(a.key.user, b.key.user))
	})
	sort.Sort(byPair(pl.follows))
	for _, l := range likes {
		switch {
		case l.now && !l.before:
			pl.likes.posts, pl.likes.users = append(pl.likes.posts, int64(l.key.post)), append(pl.likes.users, int64(l.key.user))
		case !l.now && l.before:
			pl.unlikes.posts, pl.unlikes.users = append(pl.unlikes.posts, int64(l.key.post)), append(pl.unlikes.users, int64(l.key.user))
		}
	}
	// Keep what grew, for the next batch; the posts' media are not kept alive
	// by it.
	clear(order)
	pr.order, pr.ids, pr.likes, pr.after = order[:0], ids[:0], likes, after
	return pl
}

// byPair sorts follows by (follower, followee).
type byPair struct {
	followers, followees []int64
	since                []time.Time
}

func (f byPair) Len() int { return len(f.followers) }

func (f byPair) Less(i, j int) bool {
	return f.followers[i] < f.followers[j] || f.followers[i] == f.followers[j] && f.followees[i] < f.followees[j]
}

func (f byPair) Swap(i, j int) {
	f.followers[i], f.followers[j] = f.followers[j], f.followers[i]
	f.followees[i], f.followees[j] = f.followees[j], f.followees[i]
	f.since[i], f.since[j] = f.since[j], f.since[i]
}

// planWrites comes first among a batch's writes. They join a few hundred
// keys of the batch to a table, which only an index nested loop does well;
// but a replay's new tables have no statistics, and on a table of a few
// thousand rows the planner picks a hash join over a scan of it, which the
// prepared statement keeps as the table grows. The settings are local to the
// transaction.
const planWrites = `SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
	set_config('enable_seqscan', 'off', true)`

// The set-based statements. They insert rows the state says are missing, so
// they have no ON CONFLICT: a conflict would mean the state was wrong, and
// the batch is then applied again by the one-event statements (see Apply).
//
// Their arrays are unnested in the select list, side by side, rather than
// by unnest(a, b, ...) in FROM: a function in FROM has its rows stored
// before they are read, which cost Postgres a quarter of an insert of
// 25 000 rows into a table without indexes.
const (
	bulkPosts = `INSERT INTO posts (id, user_id, caption, created_at, edited_at, deleted_at, like_count, comment_count)
		SELECT unnest($1::bigint[]), unnest($2::bigint[]), unnest($3::text[]), unnest($4::timestamptz[]),
			unnest($5::timestamptz[]), unnest($6::timestamptz[]), unnest($7::int[]), unnest($8::int[])`
	bulkMedia = `INSERT INTO post_media (post_id, position, media_key, content_type, width, height, size)
		SELECT unnest($1::bigint[]), unnest($2::smallint[]), unnest($3::text[]), unnest($4::text[]),
			unnest($5::int[]), unnest($6::int[]), unnest($7::bigint[])`
	// Only posts the state found live are changed; a NULL leaves a column as
	// it is.
	bulkChanges = `UPDATE posts p SET
			caption = coalesce(u.caption, p.caption),
			edited_at = coalesce(u.edited_at, p.edited_at),
			deleted_at = coalesce(u.deleted_at, p.deleted_at),
			like_count = p.like_count + u.likes,
			comment_count = p.comment_count + u.comments
		FROM (SELECT unnest($1::bigint[]) AS id, unnest($2::text[]) AS caption, unnest($3::timestamptz[]) AS edited_at,
			unnest($4::timestamptz[]) AS deleted_at, unnest($5::int[]) AS likes, unnest($6::int[]) AS comments) AS u
		WHERE p.id = u.id`
	bulkLikes   = `INSERT INTO likes (post_id, user_id) SELECT unnest($1::bigint[]), unnest($2::bigint[])`
	bulkUnlikes = `DELETE FROM likes l USING (SELECT unnest($1::bigint[]) AS post_id, unnest($2::bigint[]) AS user_id) AS u
		WHERE l.post_id = u.post_id AND l.user_id = u.user_id`
	bulkComments = `INSERT INTO comments (id, post_id, user_id, text, created_at)
		SELECT unnest($1::bigint[]), unnest($2::bigint[]), unnest($3::bigint[]), unnest($4::text[]), unnest($5::timestamptz[])`
	bulkFollows = `INSERT INTO follows (follower_id, followee_id, created_at)
		SELECT unnest($1::bigint[]), unnest($2::bigint[]), unnest($3::timestamptz[])`
	bulkRefollows = `UPDATE follows f SET created_at = u.since
		FROM (SELECT unnest($1::bigint[]) AS follower_id, unnest($2::bigint[]) AS followee_id, unnest($3::timestamptz[]) AS since) AS u
		WHERE f.follower_id = u.follower_id AND f.followee_id = u.followee_id`
	bulkUnfollows = `DELETE FROM follows f USING (SELECT unnest($1::bigint[]) AS follower_id, unnest($2::bigint[]) AS followee_id) AS u
		WHERE f.follower_id = u.follower_id AND f.followee_id = u.followee_id`
)

// queueWrites adds the plan's statements to b, skipping empty ones.
func (pl *plan) queueWrites(b *pgx.Batch) {
	if n := &pl.posts; len(n.ids) > 0 {
		b.Queue(bulkPosts, n.ids, n.users, n.captions, n.created, n.edited, n.deleted, n.likes, n.comments)
	}
	if m := &pl.media; len(m.posts) > 0 {
		b.Queue(bulkMedia, m.posts, m.positions, m.keys, m.types, m.widths, m.heights, m.sizes)
	}
	if c := &pl.changes; len(c.ids) > 0 {
		b.Queue(bulkChanges, c.ids, c.captions, c.edited, c.deleted, c.likes, c.comments)
	}
	if len(pl.likes.posts) > 0 {
		b.Queue(bulkLikes, pl.likes.posts, pl.likes.users)
	}
	if len(pl.unlikes.posts) > 0 {
		b.Queue(bulkUnlikes, pl.unlikes.posts, pl.unlikes.users)
	}
	if c := &pl.comments; len(c.ids) > 0 {
		b.Queue(bulkComments, c.ids, c.posts, c.users, c.texts, c.at)
	}
	if f := &pl.follows; len(f.followers) > 0 {
		b.Queue(bulkFollows, f.followers, f.followees, f.since)
	}
	if f := &pl.refollows; len(f.followers) > 0 {
		b.Queue(bulkRefollows, f.followers, f.followees, f.since)
	}
	if u := &pl.unfollows; len(u.followers) > 0 {
		b.Queue(bulkUnfollows, u.followers, u.followees)
	}
}
