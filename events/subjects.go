package events

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/feedproject/feed/domain"
)

// Subjects are ev.<actor>.<kind>.<target>: the second token lets a reader filter
// by user (ev.501.>), the third by kind (ev.*.follow.>), and the whole subject names
// one aggregate so optimistic concurrency is one expected-last-subject-sequence.
const (
	// SubjectPrefix is the first token of every event subject.
	SubjectPrefix = "ev"
	// AllSubjects matches every event subject.
	AllSubjects = SubjectPrefix + ".>"
)

// The kinds, the third subject token. Persisted: never rename or reuse.
const (
	KindPost    = "post"    // ev.<owner>.post.<post_id>: a post's whole life
	KindFollow  = "follow"  // ev.<follower>.follow.<followee>
	KindLike    = "like"    // ev.<user>.like.<post_id>
	KindComment = "comment" // ev.<user>.comment.<post_id>
)

// Subject builds an event subject.
func Subject(actor domain.UserID, kind string, target int64) string {
	return fmt.Sprintf("%s.%d.%s.%d", SubjectPrefix, actor, kind, target)
}

// PostSubjectAnyOwner matches the events of one post whoever owns it, for
// finding a post's owner from its own events.
func PostSubjectAnyOwner(id domain.PostID) string {
	return fmt.Sprintf("%s.*.%s.%d", SubjectPrefix, KindPost, id)
}

// ParseSubject splits an event subject into its actor, kind and target; ok is
// false for anything not of the form ev.<actor>.<kind>.<target>.
func ParseSubject(subject string) (actor domain.UserID, kind string, target int64, ok bool) {
	rest, found := strings.CutPrefix(subject, SubjectPrefix+".")
	if !found {
		return 0, "", 0, false
	}
	a, rest, found := strings.Cut(rest, ".")
	if !found {
		return 0, "", 0, false
	}
	kind, t, found := strings.Cut(rest, ".")
	if !found {
		return 0, "", 0, false
	}
	ai, err1 := strconv.ParseInt(a, 10, 64)
	ti, err2 := strconv.ParseInt(t, 10, 64)
	if err1 != nil || err2 != nil || kind == "" {
		return 0, "", 0, false
	}
	return domain.UserID(ai), kind, ti, true
}
