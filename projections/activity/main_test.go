package activity_test

import (
	"os"
	"testing"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// TestMain runs the tests; BenchmarkReplay runs this binary as its NATS
// server, in a process of its own as the service runs it.
func TestMain(m *testing.M) { os.Exit(localstacktest.RunTestsOrNATS(m)) }
