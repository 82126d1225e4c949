package localstack_test

import (
	"os"
	"testing"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// TestMain runs the tests; StartNATSProcess runs this binary as its NATS
// server in the tests, as `feed nats` is run by the service.
func TestMain(m *testing.M) { os.Exit(localstacktest.RunTestsOrNATS(m)) }
