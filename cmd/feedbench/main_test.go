package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

func TestMain(m *testing.M) {
	code := localstacktest.RunTests(m)
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
