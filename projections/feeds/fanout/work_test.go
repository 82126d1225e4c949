package fanout

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// TestWorkBodyKeepsEveryItemInOrder encodes random work, with runs of pushes
// and removals to many recipients between single items of every kind, and
// decodes exactly the items given, in the order given; the body is much
// smaller than the items spelled out.
func TestWorkBodyKeepsEveryItemInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	var items []inbox.Item
	seq := uint64(100)
	for len(items) < 5_000 {
		seq++
		switch rng.IntN(4) {
		case 0, 1: // a post's push or removal to its author's followers
			op := inbox.OpPush
			if rng.IntN(2) == 0 {
				op = inbox.OpRemove
			}
			post := domain.PostID(rng.Int64N(1 << 50))
			for range 1 + rng.IntN(80) {
				items = append(items, inbox.Item{Recipient: domain.UserID(1 + rng.IntN(1000)), Seq: seq, Op: op, Posts: []domain.PostID{post}})
			}
		case 2: // a merge of an outbox into one follower's inbox
			items = append(items, inbox.Item{Recipient: domain.UserID(1 + rng.IntN(1000)), Seq: seq, Op: inbox.OpMerge,
				Posts: []domain.PostID{9, 7, 5}, Floor: int64(rng.IntN(5))})
		default: // a reconcile with allowed posts
			items = append(items, inbox.Item{Recipient: domain.UserID(1 + rng.IntN(1000)), Seq: seq, Op: inbox.OpReconcile,
				Posts: []domain.PostID{8, 6}, Floor: 2, Allowed: []domain.PostID{4}})
		}
	}
	data, err := encodeWork(items)
	require.NoError(t, err)
	got, err := decodeWork(data)
	require.NoError(t, err)
	require.Equal(t, items, got)

	spelled, err := json.Marshal(items)
	require.NoError(t, err)
	t.Logf("%d items: %d bytes, %d spelled out", len(items), len(data), len(spelled))
	// The ids here are random, of 50 bits, so each push's post differs much
	// from the one before: about 6 bytes an item, against 70 spelled out.
	assert.Less(t, 8*len(data), len(spelled), "the binary body should be much smaller than JSON")

	// Work published in the first form, a JSON array of items, still decodes.
	old, err := decodeWork(spelled)
	require.NoError(t, err)
	assert.Equal(t, items, old)
}

// TestWorkBodyGroupsARecipientsItems: items grouped by recipient, as the
// planner publishes them, decode exactly, with the extreme values of every
// field and empty lists; the recipient is written once per group, so the
// body is smaller than that of the same items interleaved.
func TestWorkBodyGroupsARecipientsItems(t *testing.T) {
	items := []inbox.Item{
		{Recipient: 7, Seq: 10, Op: inbox.OpPush, Posts: []domain.PostID{domain.MaxID - 1}},
		{Recipient: 7, Seq: 12, Op: inbox.OpRemove, Posts: []domain.PostID{1}},
		{Recipient: 7, Seq: 12, Op: inbox.OpMerge, Floor: 0}, // an empty outbox: no posts
		{Recipient: 1 << 40, Seq: 3, Op: inbox.OpUnmerge, Posts: []domain.PostID{50, 40, 30}, Floor: 30},
		{Recipient: 1 << 40, Seq: math.MaxUint64, Op: inbox.OpMaterialise, Posts: []domain.PostID{1 << 52, 5}, Floor: math.MinInt64},
		{Recipient: 1 << 40, Seq: 0, Op: inbox.OpReconcile, Posts: []domain.PostID{-3}, Floor: math.MaxInt64, Allowed: []domain.PostID{math.MaxInt64, math.MinInt64}},
		{Recipient: -5, Seq: 1, Op: inbox.OpReconcile, Allowed: []domain.PostID{2}},
		{Recipient: 7, Seq: 13, Op: inbox.OpPush, Posts: []domain.PostID{domain.MaxID - 2}},
	}
	data, err := encodeWork(items)
	require.NoError(t, err)
	got, err := decodeWork(data)
	require.NoError(t, err)
	require.Equal(t, items, got)

	// The tightest body: each item three bytes, a post its last.
	var tight []inbox.Item
	for i := range 100 {
		tight = append(tight, inbox.Item{Recipient: 1, Seq: uint64(i), Op: inbox.OpPush, Posts: []domain.PostID{domain.PostID(i)}})
	}
	data, err = encodeWork(tight)
	require.NoError(t, err)
	got, err = decodeWork(data)
	require.NoError(t, err)
	require.Equal(t, tight, got)

	// A hundred recipients' pushes of the same twenty posts.
	var grouped, interleaved []inbox.Item
	for r := range domain.UserID(100) {
		for i := range 20 {
			grouped = append(grouped, inbox.Item{Recipient: 1_000_000 + r, Seq: uint64(500 + i), Op: inbox.OpPush, Posts: []domain.PostID{domain.PostID(1<<48 + i<<13)}})
		}
	}
	for i := range 20 {
		for r := range 100 {
			interleaved = append(interleaved, grouped[r*20+i])
		}
	}
	g, err := encodeWork(grouped)
	require.NoError(t, err)
	got, err = decodeWork(g)
	require.NoError(t, err)
	require.Equal(t, grouped, got)
	i, err := encodeWork(interleaved)
	require.NoError(t, err)
	got, err = decodeWork(i)
	require.NoError(t, err)
	require.Equal(t, interleaved, got)
	t.Logf("%d pushes: %d bytes grouped by recipient, %d interleaved", len(grouped), len(g), len(i))
	// Interleaved, each push takes its recipient's id and a count of one, and
	// its post is the one before it: about 7 bytes against 5.
	assert.Less(t, 6*len(g), 5*len(i), "a recipient's group should hold its id once")
	assert.Less(t, len(g), 6*len(grouped), "a grouped push should take about five bytes")

	_, err = encodeWork([]inbox.Item{{Recipient: 1, Op: 0}})
	require.ErrorIs(t, err, domain.ErrInvalid, "an unknown op cannot be encoded")
}

// encodeWorkRuns encodes items in the second form, JSON runs (workBody),
// which the planner published before the binary form.
func encodeWorkRuns(items []inbox.Item) ([]byte, error) {
	var body workBody
	for _, it := range items {
		if n := len(body.Runs); n > 0 {
			r := &body.Runs[n-1]
			if r.Seq == it.Seq && r.Op == it.Op && r.Floor == it.Floor &&
				slices.Equal(r.Posts, it.Posts) && slices.Equal(r.Allowed, it.Allowed) {
				r.To = append(r.To, it.Recipient)
				continue
			}
		}
		body.Runs = append(body.Runs, workRun{
			To: []domain.UserID{it.Recipient}, Seq: it.Seq, Op: it.Op, Posts: it.Posts, Floor: it.Floor, Allowed: it.Allowed,
		})
	}
	return json.Marshal(body)
}

// TestWorkBodyDecodesEarlierForms: a fan-out stream may still hold work of
// an earlier version after an upgrade, in the JSON runs form or, before it,
// a JSON array of items; both decode, and a run without recipients is
// refused.
func TestWorkBodyDecodesEarlierForms(t *testing.T) {
	var items []inbox.Item
	for r := range domain.UserID(30) {
		items = append(items, inbox.Item{Recipient: 100 + r, Seq: 9, Op: inbox.OpPush, Posts: []domain.PostID{1 << 48}})
	}
	items = append(items,
		inbox.Item{Recipient: 3, Seq: 10, Op: inbox.OpMerge, Posts: []domain.PostID{90, 80}, Floor: 80},
		inbox.Item{Recipient: 3, Seq: 11, Op: inbox.OpReconcile, Posts: []domain.PostID{90}, Floor: 5, Allowed: []domain.PostID{70}},
		inbox.Item{Recipient: 4, Seq: 11, Op: inbox.OpUnmerge, Floor: 12})

	runs, err := encodeWorkRuns(items)
	require.NoError(t, err)
	require.Contains(t, string(runs), `{"runs":[{"to":[100,101,`, "the test encodes the runs form")
	got, err := decodeWork(runs)
	require.NoError(t, err)
	require.Equal(t, items, got)

	spelled, err := json.Marshal(items)
	require.NoError(t, err)
	got, err = decodeWork(append([]byte("\n "), spelled...))
	require.NoError(t, err)
	// Spelled out, an empty list of posts is JSON null: it decodes as nil.
	require.Equal(t, items, got)

	_, err = decodeWork([]byte(`{"runs":[{"to":[],"seq":1,"op":1}]}`))
	require.ErrorIs(t, err, domain.ErrInvalid)
	for _, bad := range []string{`{"runs":`, ``, `[{"Recipient":"x"}]`} {
		_, err = decodeWork([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
}

// TestWorkBodyRefusesMalformedBinary: a binary body cut short anywhere, with
// a byte more, or whose counts claim more than it holds, is refused with an
// error; none makes the decoder panic or allocate what its counts claim.
func TestWorkBodyRefusesMalformedBinary(t *testing.T) {
	items := []inbox.Item{
		{Recipient: 7, Seq: 1 << 30, Op: inbox.OpPush, Posts: []domain.PostID{1 << 48}},
		{Recipient: 7, Seq: 1<<30 + 4, Op: inbox.OpRemove, Posts: []domain.PostID{1<<48 + 9}},
		{Recipient: 9, Seq: 1<<30 + 4, Op: inbox.OpReconcile, Posts: []domain.PostID{5, 3}, Floor: 3, Allowed: []domain.PostID{2}},
		{Recipient: 1 << 45, Seq: 1<<30 + 5, Op: inbox.OpMerge, Posts: []domain.PostID{300, 200, 100}, Floor: 100},
	}
	data, err := encodeWork(items)
	require.NoError(t, err)
	refused := func(body []byte, why string) {
		t.Helper()
		var got []inbox.Item
		require.NotPanics(t, func() { got, err = decodeWork(body) }, why)
		require.ErrorIs(t, err, domain.ErrInvalid, "%s: % x decoded to %v", why, body, got)
	}
	for n := 1; n < len(data); n++ {
		refused(data[:n], "cut to "+strconv.Itoa(n)+" bytes")
	}
	refused(append(slices.Clip(data), 0), "a byte more")
	refused(append(slices.Clip(data), data[3:]...), "a group more")

	// body builds a binary body from its numbers: uvarints but for the byte
	// values given as bytes.
	body := func(parts ...any) []byte {
		b := []byte{workBinaryV1}
		for _, p := range parts {
			switch v := p.(type) {
			case byte:
				b = append(b, v)
			case int64:
				b = binary.AppendVarint(b, v)
			case uint64:
				b = binary.AppendUvarint(b, v)
			}
		}
		return b
	}
	push := func(post int64) []any { return []any{byte(inbox.OpPush), int64(1), uint64(1), post} }
	valid := body(append([]any{uint64(1), uint64(1), uint64(7), uint64(1)}, push(1<<48)...)...)
	got, err := decodeWork(valid)
	require.NoError(t, err, "the well-formed body the cases below spoil")
	require.Equal(t, []inbox.Item{{Recipient: 7, Seq: 1, Op: inbox.OpPush, Posts: []domain.PostID{1 << 48}}}, got)

	for why, b := range map[string][]byte{
		"items beyond the body":   body(append([]any{uint64(1 << 40), uint64(1), uint64(7), uint64(1)}, push(1)...)...),
		"posts beyond the body":   body(append([]any{uint64(1), uint64(1 << 40), uint64(7), uint64(1)}, push(1)...)...),
		"counts overflowing":      body(append([]any{uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(7), uint64(1)}, push(1)...)...),
		"a varint of 11 bytes":    append(body(uint64(1), uint64(1)), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"fewer items than said":   body(append([]any{uint64(2), uint64(2), uint64(7), uint64(1)}, push(1)...)...),
		"more items than said":    body(append(append([]any{uint64(1), uint64(2), uint64(7), uint64(2)}, push(1)...), push(2)...)...),
		"fewer posts than said":   body(append([]any{uint64(1), uint64(2), uint64(7), uint64(1)}, push(1)...)...),
		"more posts than said":    body(uint64(1), uint64(1), uint64(7), uint64(1), byte(inbox.OpMerge), int64(1), uint64(2), int64(5), int64(-1)),
		"a group of no items":     body(append([]any{uint64(1), uint64(1), uint64(7), uint64(0), uint64(7), uint64(1)}, push(1)...)...),
		"a group beyond the body": body(append([]any{uint64(1), uint64(1), uint64(7), uint64(1 << 40)}, push(1)...)...),
		"posts beyond the list":   body(uint64(1), uint64(1), uint64(7), uint64(1), byte(inbox.OpPush), int64(1), uint64(1<<40), int64(1)),
		"op zero":                 body(uint64(1), uint64(1), uint64(7), uint64(1), byte(0), int64(1), uint64(1), int64(1)),
		"an unknown op":           body(uint64(1), uint64(1), uint64(7), uint64(1), byte(inbox.OpReconcile+1), int64(1), uint64(1), int64(1)),
		"unknown head bits":       body(uint64(1), uint64(1), uint64(7), uint64(1), byte(inbox.OpPush|0x80), int64(1), uint64(1), int64(1)),
		"no floor after its flag": body(uint64(1), uint64(1), uint64(7), uint64(1), byte(inbox.OpMerge|workHasFloor), int64(1), uint64(1), int64(1)),
		"allowed beyond the body": body(uint64(1), uint64(2), uint64(7), uint64(1), byte(inbox.OpReconcile|workHasAllowed), int64(1), uint64(1), int64(1), uint64(1<<40)),
	} {
		refused(b, why)
	}
}

// TestPartitionIsFNV1aOfTheDecimalID: partitions are persisted (a
// recipient's work must stay in one partition's stream across versions), so
// Partition is exactly what it was, hash/fnv's New32a over the decimal id,
// and allocates nothing.
func TestPartitionIsFNV1aOfTheDecimalID(t *testing.T) {
	reference := func(user domain.UserID, partitions int) int {
		h := fnv.New32a()
		_, _ = h.Write([]byte(strconv.FormatInt(int64(user), 10)))
		return int(h.Sum32() % uint32(partitions))
	}
	users := []domain.UserID{0, 1, 9, 10, 99, 100, 1<<49 - 1, 1 << 49, domain.MaxID - 1, math.MaxInt64, -1, math.MinInt64}
	rng := rand.New(rand.NewPCG(7, 11))
	for range 20_000 {
		users = append(users, domain.UserID(rng.Int64N(1_000_000)), domain.UserID(rng.Int64N(1<<49)), domain.UserID(rng.Int64()))
	}
	counts := map[int]int{}
	for _, partitions := range []int{1, 2, 3, 4, 7, 16, 64, 1000} {
		for _, u := range users {
			p := Partition(u, partitions)
			require.Equal(t, reference(u, partitions), p, "user %d, %d partitions", u, partitions)
			if partitions == 4 {
				counts[p]++
			}
		}
	}
	assert.Len(t, counts, 4, "the users fall in every one of four partitions")
	allocs := testing.AllocsPerRun(100, func() { _ = Partition(1<<49-1, 4) })
	assert.Zero(t, allocs, "Partition allocates")
}

// TestRecipientGroupsKeepEachRecipientsOrder: arranged, random work holds
// each recipient's items together and in their order, recipients in the
// order they first appear; work grouped already comes back as it is.
func TestRecipientGroupsKeepEachRecipientsOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var g recipientGroups
	for round := range 50 {
		items := make([]inbox.Item, rng.IntN(3000))
		for i := range items {
			items[i] = inbox.Item{Recipient: domain.UserID(1 + rng.IntN(1+round*10)), Seq: uint64(i), Op: inbox.OpPush}
		}
		var first []domain.UserID
		want := map[domain.UserID][]inbox.Item{}
		for _, it := range items {
			if _, ok := want[it.Recipient]; !ok {
				first = append(first, it.Recipient)
			}
			want[it.Recipient] = append(want[it.Recipient], it)
		}
		var expected []inbox.Item
		for _, u := range first {
			expected = append(expected, want[u]...)
		}
		got := g.arrange(items)
		require.Equal(t, expected, got, "round %d", round)
		again := g.arrange(slices.Clone(got))
		require.Equal(t, expected, again, "round %d: grouped already", round)
	}
	grouped := []inbox.Item{{Recipient: 1}, {Recipient: 1}, {Recipient: 2}}
	assert.Same(t, &grouped[0], &g.arrange(grouped)[0], "work grouped already is not copied")
}

// BenchmarkWorkEncoding encodes and decodes a partition's pushes of about a
// second under load, grouped by recipient as the planner publishes them:
// 1 000 recipients, 25 posts each of a batch's 500, in the JSON runs form
// before and the binary form now. It reports the time and the body's bytes
// per item.
func BenchmarkWorkEncoding(b *testing.B) {
	rng := rand.New(rand.NewPCG(4, 2))
	// Ids as IDGenerator makes them some four years after its epoch (49
	// bits), a post every two milliseconds or so.
	posts := make([]domain.PostID, 500)
	ms := int64(1) << 37
	for i := range posts {
		ms += 1 + rng.Int64N(3)
		posts[i] = domain.PostID(ms<<12 | rng.Int64N(256)<<4)
	}
	var items []inbox.Item
	for range 1000 {
		recipient := domain.UserID(1_000_000 + rng.Int64N(50_000_000))
		for _, i := range rng.Perm(len(posts))[:25] {
			items = append(items, inbox.Item{Recipient: recipient, Seq: 40_000_000 + uint64(i), Op: inbox.OpPush, Posts: []domain.PostID{posts[i]}})
		}
		slices.SortFunc(items[len(items)-25:], func(a, b inbox.Item) int { return cmp.Compare(a.Seq, b.Seq) })
	}
	for _, form := range []struct {
		name   string
		encode func([]inbox.Item) ([]byte, error)
	}{{"json-runs", encodeWorkRuns}, {"binary", encodeWork}} {
		data, err := form.encode(items)
		require.NoError(b, err)
		got, err := decodeWork(data)
		require.NoError(b, err)
		require.Equal(b, items, got)
		perItem := func(b *testing.B) {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/item")
			b.ReportMetric(float64(len(data))/float64(len(items)), "bytes/item")
		}
		b.Run(form.name+"/encode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := form.encode(items); err != nil {
					b.Fatal(err)
				}
			}
			perItem(b)
		})
		b.Run(form.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodeWork(data); err != nil {
					b.Fatal(err)
				}
			}
			perItem(b)
		})
	}
}
