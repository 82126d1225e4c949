package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/feedproject/feed/cmd/localstack"
)

func TestMain(m *testing.M) {
	code := localstack.RunTests(m)
	if feedDir != "" {
		os.RemoveAll(feedDir)
	}
	os.Exit(code)
}

var (
	feedOnce sync.Once
	feedDir  string
	feedPath string
	feedErr  error
)

// feedBin is the feed binary the bench starts, built once for the tests.
func feedBin(t *testing.T) string {
	t.Helper()
	feedOnce.Do(func() {
		if feedDir, feedErr = os.MkdirTemp("", "feedbench-test-"); feedErr != nil {
			return
		}
		feedPath = filepath.Join(feedDir, "feed")
		cmd := exec.Command("go", "build", "-o", feedPath, "github.com/feedproject/feed/cmd/feed")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			feedErr = fmt.Errorf("%w\n%s", err, out.String())
		}
	})
	if feedErr != nil {
		t.Fatalf("build the feed binary: %v", feedErr)
	}
	return feedPath
}

func envMap(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// stackEnv is the environment of a service on stack's servers, with extra.
func stackEnv(stack *localstack.Stack, extra map[string]string) func(string) string {
	kv := map[string]string{
		"NATS_URL":     stack.NATS.ClientURL(),
		"REDIS_URL":    stack.Redis.URL(),
		"DATABASE_URL": stack.Postgres.URL(),
	}
	maps.Copy(kv, extra)
	return envMap(kv)
}

// syncBuffer is a bytes.Buffer safe to read while run writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
