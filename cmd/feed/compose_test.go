package main

import (
	"context"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// composeFile is the part of compose.yaml the checks read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Configs  map[string]struct {
		Content string `yaml:"content"`
	} `yaml:"configs"`
	Volumes map[string]any `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Profiles    []string          `yaml:"profiles"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Configs []struct {
		Source string `yaml:"source"`
		Target string `yaml:"target"`
	} `yaml:"configs"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile("../../compose.yaml")
	require.NoError(t, err)
	var c composeFile
	require.NoError(t, yaml.Unmarshal(raw, &c))
	require.NotEmpty(t, c.Services)
	return c
}

// goMod is the version go.mod requires of module, or its go directive's
// for "go".
func goMod(t *testing.T, module string) string {
	t.Helper()
	raw, err := os.ReadFile("../../go.mod")
	require.NoError(t, err)
	re := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(module) + ` v?(\S+)`)
	m := re.FindSubmatch(raw)
	require.NotNil(t, m, "go.mod requires no %s", module)
	return string(m[1])
}

// TestComposeFileIsConsistent checks compose.yaml without Docker: the
// images' versions are those the code is built and tested with, every
// feed process's environment is a configuration feed accepts, its servers
// are services of the file, the cluster profile runs two API replicas and
// one process per projector role, and no two services publish a port.
func TestComposeFileIsConsistent(t *testing.T) {
	c := readCompose(t)
	natsVersion := goMod(t, "github.com/nats-io/nats-server/v2")
	published := map[string]string{}
	roles := map[string][]string{} // role -> the cluster processes running it
	var nodeIDs []string
	for name, s := range c.Services {
		image, tag, _ := strings.Cut(s.Image, ":")
		switch image {
		case "nats":
			assert.Equal(t, natsVersion, strings.SplitN(tag, "-", 2)[0], "%s: the nats image is the nats-server version of go.mod", name)
		case "redis":
			assert.Equal(t, "7", tag, "%s: Redis 7 (the feeds' Lua code is function libraries)", name)
		case "postgres":
			assert.Equal(t, "15", tag, "%s: the Postgres the tests run against", name)
		case "feed":
			assert.Equal(t, ".", s.Build, "%s: feed's image is built from the Dockerfile", name)
		default:
			t.Errorf("%s: image %q is none of nats, redis, postgres, feed", name, s.Image)
		}
		for _, p := range s.Ports {
			host := strings.Split(p, ":")[0]
			assert.Empty(t, published[host], "%s and %s both publish port %s", published[host], name, host)
			published[host] = name
		}
		for dep := range s.DependsOn {
			assert.Contains(t, c.Services, dep, "%s depends on an unknown service", name)
		}
		for _, v := range s.Volumes {
			assert.Contains(t, c.Volumes, strings.Split(v, ":")[0], "%s: volume %s is not declared", name, v)
		}
		for _, cf := range s.Configs {
			assert.Contains(t, c.Configs, cf.Source, "%s: config %s is not declared", name, cf.Source)
		}
		assert.NotContains(t, strings.Join(s.Command, " "), "go run", "%s runs the built binary", name)
		if image != "feed" {
			for k := range s.Environment {
				assert.False(t, strings.HasPrefix(k, "FEED_"), "%s: %s is feed's setting on another server", name, k)
			}
			continue
		}

		// A feed process: its settings are known and valid.
		assert.Equal(t, []string{"serve"}, s.Command, name)
		for k := range s.Environment {
			if strings.HasPrefix(k, "FEED_") {
				assert.True(t, slices.ContainsFunc(stack.Variables, func(v stack.Variable) bool { return v.Name == k }), "%s: unknown setting %s", name, k)
			}
		}
		cfg, err := stack.Parse(func(k string) string { return s.Environment[k] })
		require.NoError(t, err, name)
		_, err = cfg.TokenSecret(false)
		require.NoError(t, err, "%s: serve needs FEED_JWT_SECRET", name)
		target, err := stack.ParseRedisURL(cfg.RedisURL)
		require.NoError(t, err, name)
		natsHosts := urlHosts(t, strings.Split(cfg.NATSURL, ","))
		redisHosts := []string{target.String()}
		if target.IsCluster() {
			redisHosts = target.Cluster.Addrs
		}
		for _, h := range slices.Concat(natsHosts, redisHosts, urlHosts(t, []string{cfg.DatabaseURL})) {
			host := strings.Split(h, ":")[0]
			assert.Contains(t, c.Services, host, "%s: %s is no service", name, h)
			assert.True(t, c.waitsFor(name, host), "%s waits for %s", name, host)
		}
		if !slices.Contains(s.Profiles, "cluster") {
			continue
		}
		assert.Equal(t, "service_completed_successfully", s.DependsOn["redis-cluster-create"].Condition, "%s waits for the Redis Cluster", name)
		assert.Len(t, natsHosts, 3, "%s: NATS_URL names the three nodes", name)
		assert.Len(t, redisHosts, 6, "%s: REDIS_URL names the six nodes of a cluster", name)
		assert.Equal(t, 3, cfg.Replicas, "%s: FEED_STREAM_REPLICAS", name)
		assert.Equal(t, stack.MediaObjectStore, cfg.MediaStore, "%s: the API replicas share the images", name)
		for _, r := range cfg.Roles {
			roles[r] = append(roles[r], name)
		}
		if slices.Contains(cfg.Roles, stack.RoleAPI) {
			nodeIDs = append(nodeIDs, strconv.Itoa(cfg.NodeID))
		}
	}
	assert.Len(t, roles[stack.RoleAPI], 2, "two API replicas")
	for _, r := range []string{stack.RoleReadModel, stack.RolePlanner, stack.RoleAppliers} {
		assert.Len(t, roles[r], 1, "one process runs %s: %v", r, roles[r])
	}
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(nodeIDs))), len(nodeIDs), "each API replica has a FEED_NODE_ID of its own: %v", nodeIDs)
}

// waitsFor reports whether service a depends on service b, directly or not.
func (c composeFile) waitsFor(a, b string) bool {
	for dep := range c.Services[a].DependsOn {
		if dep == b || c.waitsFor(dep, b) {
			return true
		}
	}
	return false
}

func urlHosts(t *testing.T, urls []string) []string {
	t.Helper()
	var hosts []string
	for _, u := range urls {
		m := regexp.MustCompile(`^[a-z]+://(?:[^@/]*@)?([^/?,]+)`).FindStringSubmatch(u)
		require.NotNil(t, m, "URL %q", u)
		hosts = append(hosts, m[1])
	}
	return hosts
}

// TestComposeNATSNodesFormACluster reads each NATS service's command line
// and configuration as nats-server does: JetStream with every write synced,
// one cluster whose routes are the three nodes, each with a name of its own.
func TestComposeNATSNodesFormACluster(t *testing.T) {
	c := readCompose(t)
	names := map[string]bool{}
	for _, node := range []string{"nats-1", "nats-2", "nats-3"} {
		s := c.Services[node]
		require.Len(t, s.Configs, 1, node)
		conf := filepath.Join(t.TempDir(), "nats.conf")
		require.NoError(t, os.WriteFile(conf, []byte(c.Configs[s.Configs[0].Source].Content), 0o600))
		args := slices.Clone(s.Command)
		i := slices.Index(args, "-c")
		require.GreaterOrEqual(t, i, 0, "%s: %v", node, args)
		require.Equal(t, s.Configs[0].Target, args[i+1], node)
		args[i+1] = conf
		fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		opts, err := server.ConfigureOptions(fs, args, func() {}, func() {}, func() {})
		require.NoError(t, err, node)
		assert.True(t, opts.JetStream, node)
		assert.True(t, opts.SyncAlways, "%s: sync_interval always", node)
		assert.Equal(t, "/data", opts.StoreDir, node)
		assert.Equal(t, "feed", opts.Cluster.Name, node)
		var routes []string
		for _, r := range opts.Routes {
			routes = append(routes, r.Host)
		}
		assert.ElementsMatch(t, []string{"nats-1:6222", "nats-2:6222", "nats-3:6222"}, routes, node)
		assert.Equal(t, 8222, opts.HTTPPort, "%s: the healthcheck's port", node)
		assert.False(t, names[opts.ServerName], "%s: name %q taken", node, opts.ServerName)
		names[opts.ServerName] = true
	}
}

// TestComposeRedisNodesFormACluster runs the Redis services as compose
// would, on loopback ports instead of service names: six local
// redis-servers with their configuration and command lines, and the
// one-shot service's script. They become a cluster of three masters with a
// replica each, announcing their service names; the script run again (a
// second `up`) leaves the cluster as it is.
func TestComposeRedisNodesFormACluster(t *testing.T) {
	c := readCompose(t)
	ports := freePorts(t, 6)
	replace := []string{"-h redis-1", "-h 127.0.0.1 -p " + strconv.Itoa(ports[0])}
	for i, port := range ports {
		node := "redis-" + strconv.Itoa(i+1)
		replace = append(replace, node+":6379", "127.0.0.1:"+strconv.Itoa(port))
		s := c.Services[node]
		require.Len(t, s.Configs, 1, node)
		dir := t.TempDir()
		conf := filepath.Join(dir, "cluster.conf")
		require.NoError(t, os.WriteFile(conf, []byte(c.Configs[s.Configs[0].Source].Content), 0o600))
		require.Equal(t, []string{"redis-server", s.Configs[0].Target}, s.Command[:2], node)
		args := slices.Concat([]string{conf}, s.Command[2:], []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir})
		startProcess(t, exec.Command("redis-server", args...))
		assert.Equal(t, "service_healthy", c.Services["redis-cluster-create"].DependsOn[node].Condition, "made once %s is up", node)
	}
	create := c.Services["redis-cluster-create"]
	require.Equal(t, []string{"sh", "-c"}, create.Entrypoint)
	require.Len(t, create.Command, 1)
	script := strings.NewReplacer(replace...).Replace(create.Command[0])
	for range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		out, err := exec.CommandContext(ctx, "sh", "-c", script).CombinedOutput()
		cancel()
		require.NoError(t, err, "%s", out)
	}

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(ports[0])})
	defer rdb.Close()
	ctx := t.Context()
	for param, want := range map[string]string{
		"cluster-announce-hostname":       "redis-1",
		"cluster-preferred-endpoint-type": "hostname",
		"appendonly":                      "yes",
		"maxmemory-policy":                "noeviction",
		"zset-max-listpack-entries":       "1024",
	} {
		got, err := rdb.ConfigGet(ctx, param).Result()
		require.NoError(t, err)
		assert.Equal(t, want, got[param], param)
	}
	// The replicas are known as such once the nodes have gossiped.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		shards, err := rdb.ClusterShards(ctx).Result()
		require.NoError(c, err)
		require.Len(c, shards, 3, "three masters")
		for _, shard := range shards {
			require.Len(c, shard.Nodes, 2, "a master and its replica")
			for _, n := range shard.Nodes {
				assert.Regexp(c, `^redis-[1-6]$`, n.Hostname, "clients are sent to the service's name")
			}
		}
	}, 20*time.Second, 100*time.Millisecond)
}

// startProcess starts cmd, stopped at the test's end.
func startProcess(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	out := &localstacktest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start(), "%s: %s", cmd.Path, localstack.RedisInstallHint)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s's output:\n%s", cmd.Args, out)
		}
	})
}

// TestDockerfileBuildsTheBinary: the image is built with the Go of go.mod
// and runs the feed binary, not the toolchain.
func TestDockerfileBuildsTheBinary(t *testing.T) {
	raw, err := os.ReadFile("../../Dockerfile")
	require.NoError(t, err)
	text := string(raw)
	from := regexp.MustCompile(`(?m)^FROM (\S+)`).FindAllStringSubmatch(text, -1)
	require.Len(t, from, 2, "a build stage and a small final stage")
	goVersion := goMod(t, "go")
	assert.Equal(t, "golang:"+strings.Join(strings.SplitN(goVersion, ".", 3)[:2], "."), from[0][1], "built with go.mod's Go")
	assert.NotContains(t, from[1][1], "golang", "the final image holds no toolchain")
	assert.Contains(t, text, "go build")
	assert.Contains(t, text, "./cmd/feed")
	assert.Regexp(t, `(?m)^ENTRYPOINT \["/usr/local/bin/feed"\]`, text)
}
