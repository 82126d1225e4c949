package fanout

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// A fan-out message's body is its work items in order, in a binary form built
// for the planner to encode and the appliers to decode quickly: some 50 000
// items a second under load, on the planner's serial path, where the JSON
// forms before it took a large share of the service's CPU. The planner
// publishes each recipient's items together (see publish), so the body is
// groups of consecutive items with the same recipient:
//
//	body   = workBinaryV1 uvarint(items) uvarint(posts) group…
//	group  = uvarint(recipient) uvarint(n ≥ 1) item×n
//	item   = head varint(Δseq) [uvarint(len(Posts))] varint(Δpost)…
//	         [varint(Floor)] [uvarint(len(Allowed)) varint(Δpost)…]
//	head   = Op | workOnePost if len(Posts) == 1 (and then no count) |
//	         workHasFloor if Floor != 0 | workHasAllowed if Allowed is not empty
//
// items counts the body's items and posts the ids of all their Posts and
// Allowed, so that the decoder makes one slice of items and one of posts for
// the whole body, whatever its size. Sequences and post ids are differences
// from the body's previous one (zigzag varints): a recipient's items are of
// nearby events and its posts nearby in time, so a 49-bit post id takes some
// three bytes rather than seven, and a push some five bytes in all. Uvarints
// and varints are encoding/binary's; differences wrap around, so every value
// round-trips exactly.
//
// The items a body decodes to are exactly those encoded, in the same order, so
// each recipient's work keeps the log's order; an empty Posts or Allowed
// decodes as nil, as it did from JSON. Items share one backing array of posts:
// they are read only.
//
// The first byte tells the forms apart: workBinaryV1 is a UTF-8 continuation
// byte, which begins no JSON text (nor any text). A fan-out stream may hold
// work an earlier version published when the service is upgraded, so the JSON
// forms still decode: the runs object (workBody), and before it a JSON array
// of items.
const workBinaryV1 = 0xB1

// An item's head holds its Op in the low bits and flags above them.
// Persisted: never change them.
const (
	workOpMask     = 0x07
	workHasFloor   = 0x08
	workHasAllowed = 0x10
	workOnePost    = 0x20
	workHeadBits   = workOpMask | workHasFloor | workHasAllowed | workOnePost
)

// An item takes at least its head, its sequence's difference, and its count
// of posts or its one post; a post at least one byte. So a body of n bytes
// holds at most n/workMinItemBytes items, and with them at most
// n-workItemBytesBesidePosts·items posts: bounds on the counts its header may
// claim, so that a malformed one cannot make the decoder allocate more than a
// few dozen times its size.
const (
	workMinItemBytes         = 3
	workItemBytesBesidePosts = 2
)

// workBody is the second form of a body, JSON:
//
//	{"runs":[{"to":[recipients…],"seq":…,"op":…,"posts":[…],"floor":…,"allowed":[…]}]}
//
// still decoded for work published before the binary form.
type workBody struct {
	Runs []workRun `json:"runs"`
}

// workRun is a run of consecutive items that differ only in the recipient.
type workRun struct {
	To      []domain.UserID `json:"to"`
	Seq     uint64          `json:"seq"`
	Op      inbox.Op        `json:"op"`
	Posts   []domain.PostID `json:"posts,omitempty"`
	Floor   int64           `json:"floor,omitempty"`
	Allowed []domain.PostID `json:"allowed,omitempty"`
}

// encodeWork encodes items, in order, as a fan-out message's body. It refuses
// an item of an unknown op, which no applier could decode.
func encodeWork(items []inbox.Item) ([]byte, error) {
	posts := 0
	for _, it := range items {
		if it.Op < inbox.OpPush || it.Op > inbox.OpReconcile {
			return nil, fmt.Errorf("encode work: unknown op %d for user %d: %w", it.Op, it.Recipient, domain.ErrInvalid)
		}
		posts += len(it.Posts) + len(it.Allowed)
	}
	// Room for pushes grouped by recipient (some five bytes each) and lists of
	// nearby posts, so that the body is seldom copied as it grows.
	data := make([]byte, 0, 16+3*len(items)+4*posts)
	data = append(data, workBinaryV1)
	data = binary.AppendUvarint(data, uint64(len(items)))
	data = binary.AppendUvarint(data, uint64(posts))
	var seq uint64
	var post domain.PostID
	for len(items) > 0 {
		n := 1
		for n < len(items) && items[n].Recipient == items[0].Recipient {
			n++
		}
		data = binary.AppendUvarint(data, uint64(items[0].Recipient))
		data = binary.AppendUvarint(data, uint64(n))
		for _, it := range items[:n] {
			head := byte(it.Op)
			if len(it.Posts) == 1 {
				head |= workOnePost
			}
			if it.Floor != 0 {
				head |= workHasFloor
			}
			if len(it.Allowed) > 0 {
				head |= workHasAllowed
			}
			data = append(data, head)
			data = binary.AppendVarint(data, int64(it.Seq-seq))
			seq = it.Seq
			if len(it.Posts) == 1 {
				data = binary.AppendVarint(data, int64(it.Posts[0]-post))
				post = it.Posts[0]
			} else {
				data, post = appendPosts(data, it.Posts, post)
			}
			if it.Floor != 0 {
				data = binary.AppendVarint(data, it.Floor)
			}
			if len(it.Allowed) > 0 {
				data, post = appendPosts(data, it.Allowed, post)
			}
		}
		items = items[n:]
	}
	return data, nil
}

// appendPosts appends a list of posts, each as its difference from the one
// before (prev first), and returns the last.
func appendPosts(data []byte, posts []domain.PostID, prev domain.PostID) ([]byte, domain.PostID) {
	data = binary.AppendUvarint(data, uint64(len(posts)))
	for _, p := range posts {
		data = binary.AppendVarint(data, int64(p-prev))
		prev = p
	}
	return data, prev
}

// decodeWork decodes a fan-out message's body, of any form, into its items, in
// order. Items share their Posts and Allowed slices: they are read only.
func decodeWork(data []byte) ([]inbox.Item, error) {
	if len(data) > 0 && data[0] == workBinaryV1 {
		items, err := decodeBinaryWork(data[1:])
		if err != nil {
			return nil, fmt.Errorf("decode work: %w", err)
		}
		return items, nil
	}
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '[' {
		var items []inbox.Item
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
	items := make([]inbox.Item, 0, n)
	for _, r := range body.Runs {
		if len(r.To) == 0 {
			return nil, fmt.Errorf("decode work: a run of op %s at %d has no recipient: %w", r.Op, r.Seq, domain.ErrInvalid)
		}
		for _, to := range r.To {
			items = append(items, inbox.Item{Recipient: to, Seq: r.Seq, Op: r.Op, Posts: r.Posts, Floor: r.Floor, Allowed: r.Allowed})
		}
	}
	return items, nil
}

// errMalformedWork is a binary body that is not one encodeWork makes.
var errMalformedWork = fmt.Errorf("malformed binary work: %w", domain.ErrInvalid)

// decodeBinaryWork decodes a binary body after its first byte. Every count is
// checked against the bytes left before anything is made from it.
func decodeBinaryWork(data []byte) ([]inbox.Item, error) {
	d := workDecoder{data: data}
	nItems, nPosts := d.uvarint(), d.uvarint()
	if d.bad || nItems > uint64(len(d.data))/workMinItemBytes || nPosts > uint64(len(d.data))-nItems*workItemBytesBesidePosts {
		return nil, fmt.Errorf("header of %d bytes: %w", len(data), errMalformedWork)
	}
	items := make([]inbox.Item, 0, nItems)
	d.posts = make([]domain.PostID, nPosts)
	for len(d.data) > 0 {
		recipient, n := domain.UserID(d.uvarint()), d.uvarint()
		if n == 0 || n > nItems-uint64(len(items)) {
			return nil, fmt.Errorf("group of %d items for user %d after %d items: %w", n, recipient, len(items), errMalformedWork)
		}
		for range n {
			head := d.byte()
			it := inbox.Item{Recipient: recipient, Op: inbox.Op(head & workOpMask)}
			if it.Op < inbox.OpPush || it.Op > inbox.OpReconcile || head&^workHeadBits != 0 {
				return nil, fmt.Errorf("item %d for user %d has head %#x: %w", len(items), recipient, head, errMalformedWork)
			}
			d.seq += uint64(d.varint())
			it.Seq = d.seq
			if head&workOnePost != 0 {
				it.Posts = d.postsOf(1)
			} else {
				it.Posts = d.postsOf(d.uvarint())
			}
			if head&workHasFloor != 0 {
				it.Floor = d.varint()
			}
			if head&workHasAllowed != 0 {
				it.Allowed = d.postsOf(d.uvarint())
			}
			if d.bad {
				return nil, fmt.Errorf("item %d for user %d: %w", len(items), recipient, errMalformedWork)
			}
			items = append(items, it)
		}
	}
	if uint64(len(items)) != nItems || len(d.posts) != 0 {
		return nil, fmt.Errorf("%d items and %d posts, header says %d and %d: %w",
			len(items), int(nPosts)-len(d.posts), nItems, nPosts, errMalformedWork)
	}
	return items, nil
}

// workDecoder reads a binary body. A read past its end or of a malformed
// number sets bad and returns zero, so that a whole item is checked once.
type workDecoder struct {
	data []byte
	// posts are the body's posts not yet taken by an item's list.
	posts []domain.PostID
	// seq and post are the last sequence and post read: the next are
	// differences from them.
	seq  uint64
	post domain.PostID
	bad  bool
}

func (d *workDecoder) byte() byte {
	if len(d.data) == 0 {
		d.bad = true
		return 0
	}
	b := d.data[0]
	d.data = d.data[1:]
	return b
}

func (d *workDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.data)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.data = d.data[n:]
	return v
}

// varint reads a signed varint: the zig-zag encoding binary.AppendVarint
// writes, read as an unsigned one.
func (d *workDecoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

// postsOf reads a list of n posts into the next of the body's posts; an
// empty list is nil.
func (d *workDecoder) postsOf(n uint64) []domain.PostID {
	if n == 0 || d.bad {
		return nil
	}
	if n > uint64(len(d.posts)) || n > uint64(len(d.data)) {
		d.bad = true
		return nil
	}
	list := d.posts[:n:n]
	d.posts = d.posts[n:]
	for i := range list {
		d.post += domain.PostID(d.varint())
		list[i] = d.post
	}
	return list
}
