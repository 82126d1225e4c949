package events_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// legacyDecode is how the registry decoded before it read bodies in one pass
// (encoding/json, the payload unmarshalled a second time): the reference
// for which bodies decode, and to what.
func legacyDecode(data []byte) (events.Envelope, events.Event, error) {
	var env events.Envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return events.Envelope{}, nil, err
	}
	var ev events.Event
	var err error
	switch env.Type {
	case events.TypePostCreated:
		ev, err = legacyPayload[events.PostCreated](env.Payload)
	case events.TypePostEdited:
		ev, err = legacyPayload[events.PostEdited](env.Payload)
	case events.TypePostDeleted:
		ev, err = legacyPayload[events.PostDeleted](env.Payload)
	case events.TypeUserFollowed:
		ev, err = legacyPayload[events.UserFollowed](env.Payload)
	case events.TypeUserUnfollowed:
		ev, err = legacyPayload[events.UserUnfollowed](env.Payload)
	case events.TypePostLiked:
		ev, err = legacyPayload[events.PostLiked](env.Payload)
	case events.TypePostUnliked:
		ev, err = legacyPayload[events.PostUnliked](env.Payload)
	case events.TypeCommentAdded:
		ev, err = legacyPayload[events.CommentAdded](env.Payload)
	default:
		return env, nil, events.ErrUnknownType
	}
	return env, ev, err
}

func legacyPayload[T events.Event](raw json.RawMessage) (events.Event, error) {
	var ev T
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, err
	}
	return ev, nil
}

// everyType is one event of each registered type.
func everyType() []events.Event {
	at := time.Date(2026, 11, 22, 10, 0, 0, 123e6, time.UTC)
	return []events.Event{
		events.PostCreated{PostID: 1 << 40, UserID: 2, Caption: "first light", CreatedAt: at, Media: []events.Media{
			{Key: "a.png", ContentType: "image/png", Width: 10, Height: 20, Size: 100},
			{Key: "b.jpg", ContentType: "image/jpeg", Width: 30, Height: 40, Size: 200},
		}},
		events.PostEdited{PostID: 1 << 40, UserID: 2, Caption: "edited", EditedAt: at},
		events.PostDeleted{PostID: 1 << 40, UserID: 2, DeletedAt: at},
		events.UserFollowed{FollowerID: 2, FolloweeID: 3},
		events.UserUnfollowed{FollowerID: 2, FolloweeID: 3},
		events.PostLiked{UserID: 2, PostID: 1 << 40},
		events.PostUnliked{UserID: 2, PostID: 1 << 40},
		events.CommentAdded{CommentID: 9, PostID: 1 << 40, UserID: 2, Text: "nice one", CreatedAt: at},
	}
}

// stored is ev as the log stores it.
func stored(t testing.TB, ev events.Event) []byte {
	env, err := events.NewEnvelope("id-1", time.Date(2026, 11, 22, 10, 0, 1, 0, time.UTC), ev)
	require.NoError(t, err)
	data, err := json.Marshal(env)
	require.NoError(t, err)
	return data
}

// TestDecodeAsBefore proves the one-pass decoder decodes every body the
// encoding/json one did, to the same envelope and event, and refuses what it
// refused: stored events keep decoding, poison stays poison.
func TestDecodeAsBefore(t *testing.T) {
	reg := events.NewRegistry()
	require.Len(t, reg.Types(), len(everyType()), "a type is missing from this test")
	bodies := map[string]string{
		"not json":         `not json`,
		"truncated":        `{"id":"x","type":"post.liked.v1","payload":{"user_id":"2"`,
		"trailing data":    `{"id":"x","type":"post.liked.v1","payload":{"user_id":"2","post_id":"1"}} {}`,
		"not an object":    `["post.liked.v1"]`,
		"unknown type":     `{"id":"x","type":"post.boosted.v9","actor":"2","payload":{"x":[1,{"y":2}]}}`,
		"no type":          `{"id":"x","payload":{"user_id":"2","post_id":"1"}}`,
		"payload first":    `{"payload":{"user_id":"2","post_id":"1"},"id":"x","type":"post.liked.v1","actor":"2"}`,
		"no payload":       `{"id":"x","type":"post.liked.v1","actor":"2"}`,
		"null payload":     `{"id":"x","type":"post.liked.v1","actor":"2","payload":null}`,
		"retyped":          `{"id":"x","type":"post.liked.v1","payload":{"user_id":"2","post_id":"1"},"type":"post.unliked.v1"}`,
		"retyped unknown":  `{"id":"x","type":"post.liked.v1","payload":{"user_id":"2","post_id":"1"},"type":"post.boosted.v9"}`,
		"id not a string":  `{"id":"x","type":"post.liked.v1","payload":{"user_id":2,"post_id":"1"}}`,
		"payload an array": `{"id":"x","type":"post.liked.v1","payload":[1]}`,
		"bad time":         `{"id":"x","type":"post.edited.v1","payload":{"post_id":"1","user_id":"2","edited_at":"yesterday"}}`,
		"bad envelope":     `{"id":7,"type":"post.liked.v1","payload":{"user_id":"2","post_id":"1"}}`,
		"other case":       `{"ID":"x","Type":"post.liked.v1","Actor":"2","Payload":{"User_ID":"2","POST_ID":"1"}}`,
		"repeated names":   `{"id":"x","id":"y","type":"post.liked.v1","payload":{"user_id":"2","user_id":"3","post_id":"1"}}`,
		"invalid utf-8":    "{\"id\":\"x\",\"type\":\"post.edited.v1\",\"payload\":{\"post_id\":\"1\",\"user_id\":\"2\",\"caption\":\"\xff\"}}",
		"unknown fields":   `{"id":"x","v":2,"type":"post.liked.v1","payload":{"user_id":"2","post_id":"1","why":{"a":[]}}}`,
		"spaces":           "{ \"id\" : \"x\" ,\n\t\"type\" : \"post.liked.v1\" , \"payload\" :\n {\"user_id\" : \"2\", \"post_id\":\"1\"} }",
	}
	for _, ev := range everyType() {
		bodies[ev.Type()] = string(stored(t, ev))
		indented, err := json.MarshalIndent(json.RawMessage(stored(t, ev)), "", "  ")
		require.NoError(t, err)
		bodies[ev.Type()+" indented"] = string(indented)
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			wantEnv, want, wantErr := legacyDecode([]byte(body))
			gotEnv, got, err := reg.Decode([]byte(body))
			if wantErr != nil {
				require.Error(t, err)
				assert.Equal(t, errors.Is(wantErr, events.ErrUnknownType), errors.Is(err, events.ErrUnknownType), "%v", err)
				if errors.Is(err, events.ErrUnknownType) {
					assert.Equal(t, wantEnv, gotEnv)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, wantEnv, gotEnv)
			assert.Equal(t, want, got)
		})
	}
}

// FuzzDecode holds the one-pass decoder to the encoding/json one: whatever
// that decoded, or found to be of an unknown type, it decodes the same. (It
// accepts a few bodies encoding/json refused, such as "+1" for an id; no
// writer ever stored those.)
func FuzzDecode(f *testing.F) {
	for _, ev := range everyType() {
		f.Add(stored(f, ev))
	}
	f.Add([]byte(`{"payload":{"user_id":"2","post_id":"1"},"id":"x","type":"post.liked.v1","actor":"2"}`))
	f.Add([]byte(`{"id":"x","type":"post.boosted.v9","actor":"2","payload":{"x":[1,{"y":2}]}}`))
	reg := events.NewRegistry()
	f.Fuzz(func(t *testing.T, body []byte) {
		wantEnv, want, wantErr := legacyDecode(body)
		if wantErr != nil && !errors.Is(wantErr, events.ErrUnknownType) {
			return
		}
		gotEnv, got, err := reg.Decode(body)
		if !errors.Is(err, wantErr) {
			t.Fatalf("encoding/json: %v; one pass: %v", wantErr, err)
		}
		if fmt.Sprint(wantEnv) != fmt.Sprint(gotEnv) || fmt.Sprint(want) != fmt.Sprint(got) {
			t.Fatalf("encoding/json: %v %v; one pass: %v %v", wantEnv, want, gotEnv, got)
		}
	})
}

// BenchmarkDecode is the decoding of a projector's hot path, a mix of bodies.
//
//	go test -run '^$' -bench BenchmarkDecode -benchmem ./events
func BenchmarkDecode(b *testing.B) {
	reg := events.NewRegistry()
	var bodies [][]byte
	for _, ev := range everyType() {
		bodies = append(bodies, stored(b, ev))
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, body := range bodies {
			if _, _, err := reg.Decode(body); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(bodies)), "ns/event")
}

func TestDecodeKeepsThePayloadAsStored(t *testing.T) {
	reg := events.NewRegistry()
	for _, ev := range everyType() {
		body := stored(t, ev)
		env, _, err := reg.Decode(body)
		require.NoError(t, err)
		assert.Contains(t, string(body), `"payload":`+string(env.Payload)+"}")
	}
}

// written is every type's body as stored, with the variants a writer stores:
// no images, images, and text that json.Marshal escapes or leaves as UTF-8.
func written(t testing.TB) map[string][]byte {
	bodies := map[string][]byte{}
	for _, ev := range everyType() {
		bodies[ev.Type()] = stored(t, ev)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	variants := map[string]events.Event{
		"no images":     events.PostCreated{PostID: 1, UserID: 2, Caption: "", CreatedAt: at},
		"empty images":  events.PostCreated{PostID: 1, UserID: 2, CreatedAt: at, Media: []events.Media{}},
		"utf-8 text":    events.CommentAdded{CommentID: 3, PostID: 1, UserID: 2, Text: "schön 👍", CreatedAt: at},
		"escaped text":  events.CommentAdded{CommentID: 3, PostID: 1, UserID: 2, Text: `"quoted" <b>`, CreatedAt: at},
		"nanoseconds":   events.PostDeleted{PostID: 1, UserID: 2, DeletedAt: at.Add(123456789)},
		"negative id":   events.UserFollowed{FollowerID: -4, FolloweeID: 0},
		"largest id":    events.PostLiked{UserID: 2, PostID: 1<<53 - 1},
		"the first day": events.PostEdited{PostID: 1, UserID: 2, EditedAt: time.Time{}},
	}
	for name, ev := range variants {
		bodies[name] = stored(t, ev)
	}
	return bodies
}

// TestWrittenDecodesWhatWritersStore: the fast path reads the bodies writers
// store, to what the general decoder makes of them, and leaves to it what it
// does not know the layout of (escapes, times outside its years).
func TestWrittenDecodesWhatWritersStore(t *testing.T) {
	reg := events.NewRegistry()
	declined := map[string]bool{"escaped text": true, "the first day": true}
	for name, body := range written(t) {
		t.Run(name, func(t *testing.T) {
			env, ev, ok := events.DecodeWritten(body)
			if declined[name] {
				assert.False(t, ok)
				return
			}
			require.True(t, ok, "%s", body)
			wantEnv, want, err := reg.DecodeGeneral(body)
			require.NoError(t, err)
			assert.True(t, reflect.DeepEqual(wantEnv, env), "%#v\n%#v", wantEnv, env)
			assert.True(t, reflect.DeepEqual(want, ev), "%#v\n%#v", want, ev)
		})
	}
}

// FuzzWrittenAsGeneral holds the fast path to the general decoder on any
// body: what it decodes, the general decoder decodes the same (the same
// values, down to time.Time's representation).
func FuzzWrittenAsGeneral(f *testing.F) {
	for _, body := range written(f) {
		f.Add(body)
	}
	reg := events.NewRegistry()
	f.Fuzz(func(t *testing.T, body []byte) {
		env, ev, ok := events.DecodeWritten(body)
		if !ok {
			return
		}
		wantEnv, want, err := reg.DecodeGeneral(body)
		if err != nil {
			t.Fatalf("fast path decoded %q, the general decoder refused it: %v", body, err)
		}
		if !reflect.DeepEqual(wantEnv, env) || !reflect.DeepEqual(want, ev) {
			t.Fatalf("%q:\ngeneral %#v %#v\nfast    %#v %#v", body, wantEnv, want, env, ev)
		}
	})
}

// FuzzWrittenReadsWhatIsWritten builds events from the fuzzer's values, so
// that it explores ids, texts and times rather than bytes: every body the
// fast path takes decodes as the general decoder decodes it, and it takes
// every body whose strings need no escape and whose times are in its years.
func FuzzWrittenReadsWhatIsWritten(f *testing.F) {
	f.Add(uint8(0), int64(1)<<40, int64(2), "first light", int64(1763805600123456789), uint8(2))
	f.Add(uint8(7), int64(-1), int64(0), "ü\x00", int64(0), uint8(0))
	reg := events.NewRegistry()
	f.Fuzz(func(t *testing.T, kind uint8, a, b int64, text string, unixNano int64, images uint8) {
		at := time.Unix(0, unixNano).UTC()
		var media []events.Media
		if images > 0 {
			media = make([]events.Media, images%11)
			for i := range media {
				media[i] = events.Media{Key: text, ContentType: "image/png", Width: int(a % 5000), Height: int(b % 5000), Size: a}
			}
		}
		evs := []events.Event{
			events.PostCreated{PostID: domain.PostID(a), UserID: domain.UserID(b), Caption: text, CreatedAt: at, Media: media},
			events.PostEdited{PostID: domain.PostID(a), UserID: domain.UserID(b), Caption: text, EditedAt: at},
			events.PostDeleted{PostID: domain.PostID(a), UserID: domain.UserID(b), DeletedAt: at},
			events.UserFollowed{FollowerID: domain.UserID(a), FolloweeID: domain.UserID(b)},
			events.UserUnfollowed{FollowerID: domain.UserID(a), FolloweeID: domain.UserID(b)},
			events.PostLiked{UserID: domain.UserID(a), PostID: domain.PostID(b)},
			events.PostUnliked{UserID: domain.UserID(a), PostID: domain.PostID(b)},
			events.CommentAdded{CommentID: domain.CommentID(a), PostID: domain.PostID(b), UserID: domain.UserID(a), Text: text, CreatedAt: at},
		}
		body := stored(t, evs[int(kind)%len(evs)])
		env, ev, ok := events.DecodeWritten(body)
		wantEnv, want, err := reg.DecodeGeneral(body)
		require.NoError(t, err)
		if !ok {
			plain := !strings.ContainsAny(string(body), `\`)
			small := func(n int64) bool { return n > -1e18 && n < 1e18 }
			if plain && at.Year() >= 1000 && at.Year() <= 9999 && small(a) && small(b) {
				t.Fatalf("fast path declined %s", body)
			}
			return
		}
		if !reflect.DeepEqual(wantEnv, env) || !reflect.DeepEqual(want, ev) {
			t.Fatalf("%s:\ngeneral %#v %#v\nfast    %#v %#v", body, wantEnv, want, env, ev)
		}
	})
}
