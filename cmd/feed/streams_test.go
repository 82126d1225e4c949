package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/cmd/localstack/natscluster"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// streamConfigs is the configuration of every stream on js, by name.
func streamConfigs(t *testing.T, js jetstream.JetStream) map[string]jetstream.StreamConfig {
	t.Helper()
	configs := map[string]jetstream.StreamConfig{}
	streams := js.ListStreams(t.Context())
	for info := range streams.Info() {
		configs[info.Config.Name] = info.Config
	}
	require.NoError(t, streams.Err())
	return configs
}

// TestToolsLeaveTheStreamsAsTheServiceMadeThem: on a three-node cluster, the
// service started with FEED_STREAM_REPLICAS=3 makes its streams; then `feed
// tail`, `status` and `replay`, run as an operator runs them, with the
// defaults (no FEED_STREAM_REPLICAS), leave every stream's configuration as
// it was: only the service creates or changes streams.
func TestToolsLeaveTheStreamsAsTheServiceMadeThem(t *testing.T) {
	c := natscluster.Start(t, natscluster.Config{})
	pg, rd := localstacktest.PostgresForTest(t), localstacktest.RedisForTest(t)
	tools := map[string]string{
		"NATS_URL":       c.URLs(),
		"REDIS_URL":      rd.URL(),
		"DATABASE_URL":   pg.URL(),
		"FEED_LOG_LEVEL": "warn",
		"FEED_DATA_DIR":  t.TempDir(),
	}
	service := maps.Clone(tools)
	maps.Copy(service, map[string]string{
		"FEED_STREAM_REPLICAS": "3",
		"FEED_JWT_SECRET":      "0123456789abcdef0123456789abcdef",
		"FEED_HTTP_ADDR":       fmt.Sprintf("127.0.0.1:%d", freePort(t)),
	})
	base, stop := startRun(t, "serve", envMap(service))
	waitReady(t, base)

	nc, err := nats.Connect(c.URLs())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	// Events for the tools to read, appended as the service appends them.
	log, err := events.OpenLog(t.Context(), js, events.Config{Replicas: 3}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)
	for i := range 20 {
		_, err := log.AppendEvent(t.Context(), fmt.Sprintf("ev-%d", i), time.Now(),
			events.UserFollowed{FollowerID: domain.UserID(i%4 + 1), FolloweeID: domain.UserID(i%3 + 10)})
		require.NoError(t, err)
	}
	require.NoError(t, stop())

	made := streamConfigs(t, js)
	require.Contains(t, made, "FEED_EVENTS")
	for _, name := range slices.Sorted(maps.Keys(made)) {
		assert.Equal(t, 3, made[name].Replicas, "the service made stream %s with FEED_STREAM_REPLICAS", name)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"tail", "--from", "1", "--until", time.Now().Format(time.RFC3339)},
		{"status", "--json"},
		{"replay", "all", "--quiet"},
	} {
		var out, errOut bytes.Buffer
		require.NoError(t, run(ctx, args, envMap(tools), &out, &errOut), "feed %v: %s", args, errOut.String())
		after := streamConfigs(t, js)
		for _, name := range slices.Sorted(maps.Keys(made)) {
			cfg, ok := after[name]
			if !ok {
				t.Errorf("feed %v removed stream %s", args, name)
				continue
			}
			if changed := configChanges(made[name], cfg); changed != "" {
				t.Errorf("feed %v changed stream %s: %s", args, name, changed)
				// Put back as the service made it, so the next tool is judged
				// on its own.
				_, err := js.UpdateStream(ctx, made[name])
				require.NoError(t, err)
			}
		}
		for name, cfg := range after {
			if _, ok := made[name]; !ok {
				t.Logf("feed %v made stream %s with %d replicas", args, name, cfg.Replicas)
			}
		}
	}
}

// configChanges lists the fields that differ between two stream
// configurations, "" if none does.
func configChanges(before, after jetstream.StreamConfig) string {
	var changes []string
	b, a := reflect.ValueOf(before), reflect.ValueOf(after)
	for i := range b.NumField() {
		if !reflect.DeepEqual(b.Field(i).Interface(), a.Field(i).Interface()) {
			changes = append(changes, fmt.Sprintf("%s %v → %v", b.Type().Field(i).Name, b.Field(i).Interface(), a.Field(i).Interface()))
		}
	}
	return strings.Join(changes, ", ")
}
