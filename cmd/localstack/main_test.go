package localstack_test

import (
	"os"
	"testing"

	"github.com/feedproject/feed/cmd/localstack"
)

func TestMain(m *testing.M) { os.Exit(localstack.RunTests(m)) }
