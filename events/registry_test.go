package events_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
