package stack_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/internal/stack"
)

// TestParseRedisURL: a URL with addr parameters names a Redis Cluster by its
// seeds, any other one server; the tuning is the same for both.
func TestParseRedisURL(t *testing.T) {
	tune := stack.RedisTuning{DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, MaxRetries: -1}

	one, err := stack.ParseRedisURL("redis://127.0.0.1:6379/2?read_timeout=5s")
	require.NoError(t, err)
	require.False(t, one.IsCluster())
	assert.Equal(t, "127.0.0.1:6379", one.String())
	o := one.NodeOptions(tune)
	assert.Equal(t, 2, o.DB)
	assert.Equal(t, time.Second, o.ReadTimeout, "the tuning's")
	assert.Equal(t, -1, o.MaxRetries)
	assert.Equal(t, 5*time.Second, one.Node.ReadTimeout, "the parsed options stay the URL's")

	cluster, err := stack.ParseRedisURL("redis://:secret@10.0.0.1:7000/0?addr=10.0.0.2:7000&addr=10.0.0.3:7000&dial_timeout=2s")
	require.NoError(t, err)
	require.True(t, cluster.IsCluster())
	assert.Equal(t, []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"}, cluster.Cluster.Addrs)
	assert.Equal(t, "secret", cluster.Cluster.Password)
	assert.Equal(t, "cluster 10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000", cluster.String())
	assert.Nil(t, cluster.NodeOptions(tune), "a cluster has no one node's options")
	rdb := cluster.Client(tune)
	t.Cleanup(func() { _ = rdb.Close() })
	opts := rdb.(interface{ Options() *redis.ClusterOptions }).Options()
	assert.Equal(t, 500*time.Millisecond, opts.DialTimeout)
	assert.Equal(t, time.Second, opts.ReadTimeout)
	assert.Equal(t, -1, opts.MaxRetries)

	for url, why := range map[string]string{
		"redis://10.0.0.1:7000/3?addr=10.0.0.2:7000":    "only database 0",
		"redis://10.0.0.1:7000?addr=10.0.0.2":           "unable to parse addr param",
		"redis://10.0.0.1:7000?addr=10.0.0.2:7000&db=1": "unexpected option: db",
		"unix:///tmp/redis.sock?addr=10.0.0.2:7000":     "redis:// or rediss://",
		"redis://10.0.0.1?addr=10.0.0.2:7000":           "host:port",
		"redis://10.0.0.1:6379?colour=blue":             "unexpected option: colour",
		"http://10.0.0.1:6379":                          "invalid URL scheme",
		"redis://10.0.0.1:6379/x":                       "invalid database number",
		"redis://10.0.0.1:7000, redis://10.0.0.2:7000":  "REDIS_URL",
	} {
		_, err := stack.ParseRedisURL(url)
		assert.ErrorContains(t, err, why, url)
		assert.ErrorContains(t, err, "REDIS_URL", url)
	}
}
