package feeds

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/feedproject/feed/domain"
)

// A fan-out message's body is its work items in order. Most of them come in
// runs that differ only in the recipient (a post pushed to each follower of
// its author, a deleted one removed from each), so the body is those runs:
//
//	{"runs":[{"to":[recipients…],"seq":…,"op":…,"posts":[…],"floor":…,"allowed":[…]}]}
//
// which is about a tenth of the items spelled out one by one: less for the
// planner to encode, for the log to write and sync, and for the appliers to
// decode. The items a body decodes to are exactly those encoded, in the same
// order, so each recipient's work keeps the log's order. Bodies of a JSON
// array of items (the first form) still decode, for work published before.
type workBody struct {
	Runs []workRun `json:"runs"`
}

// workRun is a run of consecutive items that differ only in the recipient.
type workRun struct {
	To      []domain.UserID `json:"to"`
	Seq     uint64          `json:"seq"`
	Op      Op              `json:"op"`
	Posts   []domain.PostID `json:"posts,omitempty"`
	Floor   int64           `json:"floor,omitempty"`
	Allowed []domain.PostID `json:"allowed,omitempty"`
}

func (r *workRun) holds(it Item) bool {
	return r.Seq == it.Seq && r.Op == it.Op && r.Floor == it.Floor &&
		slices.Equal(r.Posts, it.Posts) && slices.Equal(r.Allowed, it.Allowed)
}

// encodeWork encodes items, in order, as a fan-out message's body.
func encodeWork(items []Item) ([]byte, error) {
	var body workBody
	for _, it := range items {
		if n := len(body.Runs); n > 0 && body.Runs[n-1].holds(it) {
			body.Runs[n-1].To = append(body.Runs[n-1].To, it.Recipient)
			continue
		}
		body.Runs = append(body.Runs, workRun{
			To: []domain.UserID{it.Recipient}, Seq: it.Seq, Op: it.Op, Posts: it.Posts, Floor: it.Floor, Allowed: it.Allowed,
		})
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode work: %w", err)
	}
	return data, nil
}

// decodeWork decodes a fan-out message's body into its items, in order. The
// items of a run share their Posts and Allowed slices: they are read only.
func decodeWork(data []byte) ([]Item, error) {
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '[' {
		var items []Item
		if err := json.Unmarshal(data, &items); err != nil {
			return nil, fmt.Errorf("decode work: %w", err)
		}
		return items, nil
	}
	var body workBody
	if err := json.Unmarshal(data, &body); err != nil {
		return nil, fmt.Errorf("decode work: %w", err)
	}
	n := 0
	for _, r := range body.Runs {
		n += len(r.To)
	}
	items := make([]Item, 0, n)
	for _, r := range body.Runs {
		if len(r.To) == 0 {
			return nil, fmt.Errorf("decode work: a run of op %s at %d has no recipient: %w", r.Op, r.Seq, domain.ErrInvalid)
		}
		for _, to := range r.To {
			items = append(items, Item{Recipient: to, Seq: r.Seq, Op: r.Op, Posts: r.Posts, Floor: r.Floor, Allowed: r.Allowed})
		}
	}
	return items, nil
}
