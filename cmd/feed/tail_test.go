package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/events"
)

// envMap is an environment for run.
func envMap(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// openTestLog connects to url and opens the event log there.
func openTestLog(t *testing.T, url string) (*events.Log, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	log, err := events.OpenLog(t.Context(), js, events.Config{}, events.NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	t.Cleanup(log.Close)
	return log, js
}

// seqsOf parses tail's JSON lines and returns their sequences, checking each
// line has every field.
func seqsOf(t *testing.T, out string) []uint64 {
	t.Helper()
	seqs := []uint64{}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var l map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		for _, k := range []string{"seq", "subject", "id", "type", "occurred_at", "actor", "payload"} {
			require.Contains(t, l, k, line)
		}
		var seq uint64
		require.NoError(t, json.Unmarshal(l["seq"], &seq))
		seqs = append(seqs, seq)
	}
	return seqs
}

func runTail(t *testing.T, env func(string) string, args ...string) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	require.NoError(t, run(ctx, append([]string{"tail"}, args...), env, &out, &errOut), errOut.String())
	require.NoError(t, ctx.Err(), "tail did not stop by itself")
	return seqsOf(t, out.String())
}

func TestTail(t *testing.T) {
	url := localstacktest.NATSForTest(t).ClientURL()
	env := envMap(map[string]string{"NATS_URL": url})
	log, js := openTestLog(t, url)
	ctx := t.Context()

	base := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	mix := []events.Event{
		events.PostCreated{PostID: 100, UserID: 1, Caption: "one", CreatedAt: base}, // 1
		events.UserFollowed{FollowerID: 2, FolloweeID: 1},                           // 2
		events.PostLiked{UserID: 2, PostID: 100},                                    // 3
		events.PostCreated{PostID: 200, UserID: 2, Caption: "two", CreatedAt: base}, // 4
		events.UserFollowed{FollowerID: 1, FolloweeID: 2},                           // 5
		events.PostLiked{UserID: 1, PostID: 200},                                    // 6
	}
	for i, ev := range mix {
		res, err := log.AppendEvent(ctx, fmt.Sprintf("ev-%d", i+1), base.Add(time.Duration(i)*time.Minute), ev)
		require.NoError(t, err)
		require.Equal(t, uint64(i+1), res.Seq)
	}
	past := base.Add(10 * time.Minute).Format(time.RFC3339)

	for _, tc := range []struct {
		name string
		args []string
		want []uint64
	}{
		{"everything", []string{"--from", "1", "--until", past}, []uint64{1, 2, 3, 4, 5, 6}},
		{"from a sequence", []string{"--from", "3", "--until", past}, []uint64{3, 4, 5, 6}},
		{"until ends at the first later event", []string{"--from", "1", "--until", base.Add(150 * time.Second).Format(time.RFC3339)}, []uint64{1, 2, 3}},
		{"one type", []string{"--from", "1", "--until", past, "--type", "post.created.v1"}, []uint64{1, 4}},
		{"a type list", []string{"--from", "1", "--until", past, "--type", "post.created.v1,user.followed.v1"}, []uint64{1, 2, 4, 5}},
		{"repeated types", []string{"--from", "1", "--until", past, "--type", "post.liked.v1", "--type", "user.followed.v1"}, []uint64{2, 3, 5, 6}},
		{"user", []string{"--from", "1", "--until", past, "--user", "2"}, []uint64{2, 3, 4}},
		{"subject", []string{"--from", "1", "--until", past, "--subject", "ev.*.follow.>"}, []uint64{2, 5}},
		{"user and subject", []string{"--from", "1", "--until", past, "--user", "1", "--subject", "ev.*.like.>"}, []uint64{6}},
		{"user, subject and type", []string{"--from", "2", "--until", past, "--user", "1", "--subject", "ev.1.*.*", "--type", "post.created.v1"}, []uint64{}},
		{"limit", []string{"--from", "1", "--limit", "2"}, []uint64{1, 2}},
		{"until by a timer", []string{"--from", "4", "--until", "300ms"}, []uint64{4, 5, 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, runTail(t, env, tc.args...))
		})
	}

	t.Run("a line is the envelope with its place in the log", func(t *testing.T) {
		var out bytes.Buffer
		require.NoError(t, run(ctx, []string{"tail", "--from", "1", "--limit", "1"}, env, &out, io.Discard))
		var got map[string]any
		require.NoError(t, json.Unmarshal(out.Bytes(), &got))
		assert.Equal(t, map[string]any{
			"seq": 1.0, "subject": "ev.1.post.100", "id": "ev-1", "type": "post.created.v1",
			"occurred_at": base.Format(time.RFC3339), "actor": "1",
			"payload": map[string]any{
				"post_id": "100", "user_id": "1", "caption": "one",
				"created_at": base.Format(time.RFC3339), "media": nil,
			},
		}, got)
	})

	t.Run("since is by stored time", func(t *testing.T) {
		time.Sleep(1100 * time.Millisecond)
		for i, ev := range []events.Event{
			events.PostCreated{PostID: 300, UserID: 3, CreatedAt: base},
			events.PostLiked{UserID: 3, PostID: 300},
		} {
			_, err := log.AppendEvent(ctx, fmt.Sprintf("late-%d", i), base, ev) // occurred long ago, stored now
			require.NoError(t, err)
		}
		assert.Equal(t, []uint64{7, 8}, runTail(t, env, "--since", "1s", "--until", "500ms"))
	})

	t.Run("new follows appends until cancelled", func(t *testing.T) {
		tctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var out localstacktest.SyncBuffer
		done := make(chan error, 1)
		go func() { done <- run(tctx, []string{"tail", "--user", "4"}, env, &out, io.Discard) }()
		stream, err := js.Stream(ctx, "FEED_EVENTS")
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			list := stream.ListConsumers(ctx)
			found := false
			for c := range list.Info() {
				found = found || slices.Contains(c.Config.FilterSubjects, "ev.4.>") || c.Config.FilterSubject == "ev.4.>"
			}
			return list.Err() == nil && found
		}, 5*time.Second, 10*time.Millisecond, "tail never subscribed")
		_, err = log.AppendEvent(ctx, "new-1", time.Now(), events.UserFollowed{FollowerID: 4, FolloweeID: 1})
		require.NoError(t, err)
		_, err = log.AppendEvent(ctx, "new-2", time.Now(), events.PostLiked{UserID: 5, PostID: 100})
		require.NoError(t, err)
		_, err = log.AppendEvent(ctx, "new-3", time.Now(), events.PostLiked{UserID: 4, PostID: 100})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return strings.Count(out.String(), "\n") >= 2 },
			5*time.Second, 10*time.Millisecond, "tail printed %q", out.String())
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("tail did not stop on cancel")
		}
		assert.Equal(t, []uint64{9, 11}, seqsOf(t, out.String()))
	})

	t.Run("unknown types are printed unless --type excludes them", func(t *testing.T) {
		env12 := events.Envelope{ID: "future-1", Type: "post.boosted.v9", OccurredAt: base, Actor: 9, Payload: json.RawMessage(`{"x":1}`)}
		res, err := log.Append(ctx, env12, "ev.9.post.1")
		require.NoError(t, err)
		require.Equal(t, uint64(12), res.Seq)
		assert.Equal(t, []uint64{12}, runTail(t, env, "--from", "12", "--until", past))
		assert.Equal(t, []uint64{12}, runTail(t, env, "--from", "12", "--until", past, "--type", "post.boosted.v9,post.created.v1"))
		assert.Equal(t, []uint64{}, runTail(t, env, "--from", "12", "--until", past, "--type", "post.created.v1"))
	})

	t.Run("no durable state is left", func(t *testing.T) {
		stream, err := js.Stream(ctx, "FEED_EVENTS")
		require.NoError(t, err)
		names := stream.ListConsumers(ctx)
		for c := range names.Info() {
			assert.Empty(t, c.Config.Durable, "durable consumer %s", c.Name)
		}
		require.NoError(t, names.Err())
	})
}

func TestTailRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--since", "-1h"},
		{"--since", "0s"},
		{"--from", "0"},
		{"--since", "1h", "--from", "2"},
		{"--new", "--from", "2"},
		{"--until", "tomorrow"},
		{"--until", "-5m"},
		{"--limit", "-1"},
		{"--user", "bob"},
		{"--user", "0"},
		{"--subject", "ev..x"},
		{"--subject", "ev.>.x"},
		{"--type", ""},
		{"extra"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			err := run(t.Context(), append([]string{"tail"}, args...), envMap(nil), io.Discard, io.Discard)
			require.ErrorIs(t, err, errUsage)
			assert.Equal(t, 2, exitCode(err))
		})
	}
}

func TestSubjectMatches(t *testing.T) {
	for _, tc := range []struct {
		filter, subject string
		want            bool
	}{
		{"ev.>", "ev.1.post.2", true},
		{"ev.*.follow.>", "ev.1.follow.2", true},
		{"ev.*.follow.>", "ev.1.post.2", false},
		{"ev.1.*.*", "ev.1.like.2", true},
		{"ev.1.*", "ev.1.like.2", false},
		{"ev.1.like.2.>", "ev.1.like.2", false},
		{"ev.1.like.2", "ev.1.like.2", true},
	} {
		assert.Equal(t, tc.want, subjectMatches(tc.filter, tc.subject), "%s ~ %s", tc.filter, tc.subject)
	}
}
