package inbox

import (
	"fmt"
	"strconv"

	"github.com/feedproject/feed/domain"
)

// Op is what a work item does to an inbox. Its values are sent to the apply
// script: never reorder them.
type Op uint8

// The work item operations.
const (
	// OpPush adds a new post (if it is not below the inbox floor).
	OpPush Op = iota + 1
	// OpRemove removes a deleted post.
	OpRemove
	// OpMerge merges a newly followed author's outbox: raises the floor to the
	// item's and adds the posts at or above it.
	OpMerge
	// OpUnmerge removes an unfollowed author's posts and raises the floor to the
	// item's.
	OpUnmerge
	// OpMaterialise creates a missing inbox from the given posts and floor.
	OpMaterialise
	// OpReconcile makes an existing inbox exactly the given posts above the
	// higher of its floor and the item's, tolerating Allowed posts, and counts
	// the entries it had to repair (see feeds.Store.Repairs).
	OpReconcile
)

func (o Op) String() string {
	switch o {
	case OpPush:
		return "push"
	case OpRemove:
		return "remove"
	case OpMerge:
		return "merge"
	case OpUnmerge:
		return "unmerge"
	case OpMaterialise:
		return "materialise"
	case OpReconcile:
		return "reconcile"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Item is one change to one recipient's inbox.
type Item struct {
	Recipient domain.UserID
	// Seq is the log sequence the item comes from (for materialise, the
	// planner's position when it read the outboxes). An inbox skips items at or
	// below the last sequence it applied, which makes redelivery harmless.
	Seq uint64
	Op  Op
	// Posts: exactly one for push and remove; the author's outbox posts for
	// merge and unmerge; the followees' posts for materialise.
	Posts []domain.PostID
	// Floor is, for merge and unmerge, the author's outbox floor and, for
	// materialise and reconcile, the lowest id from which Posts are complete.
	Floor int64
	// Allowed, for reconcile, are posts the inbox may hold or not (big accounts'
	// posts pushed before they grew big: reads merge them anyway).
	Allowed []domain.PostID `json:",omitempty"`
}

// check refuses an item the apply script cannot take.
func (it Item) check() error {
	switch {
	case it.Recipient <= 0:
		return fmt.Errorf("recipient %d is not a user id: %w", it.Recipient, domain.ErrInvalid)
	case it.Op < OpPush || it.Op > OpReconcile:
		return fmt.Errorf("unknown op %d: %w", it.Op, domain.ErrInvalid)
	case (it.Op == OpPush || it.Op == OpRemove) && len(it.Posts) != 1:
		return fmt.Errorf("%s carries %d posts, not one: %w", it.Op, len(it.Posts), domain.ErrInvalid)
	case it.Seq > maxSeq:
		return fmt.Errorf("seq %d is above 2^52-2: %w", it.Seq, domain.ErrInvalid)
	case it.Floor < 0 || it.Floor >= domain.MaxID:
		return fmt.Errorf("floor %d outside [0, 2^53): %w", it.Floor, domain.ErrInvalid)
	}
	for _, p := range it.Posts {
		if p <= 0 || p >= domain.MaxID {
			return fmt.Errorf("post %d outside [1, 2^53): %w", p, domain.ErrInvalid)
		}
	}
	return nil
}
