package main

import (
	"context"
	"debug/buildinfo"
	"debug/elf"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBinaryHoldsOnlyTheService builds the feed binary and checks that it
// links neither the load bench's plotting library nor the test framework's
// code. Fiber v2's utils package imports testing for its assertion helpers,
// so the package's initialisation is linked: nothing of it runs but that, and
// no other package of the binary imports it.
func TestBinaryHoldsOnlyTheService(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "feed")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)

	info, err := buildinfo.ReadFile(bin)
	require.NoError(t, err)
	require.NotEmpty(t, info.Deps, "the binary lists its modules")
	for _, m := range info.Deps {
		assert.NotContains(t, m.Path, "gonum", "the feed binary links a module of the bench")
	}

	f, err := elf.Open(bin)
	require.NoError(t, err)
	defer f.Close()
	syms, err := f.Symbols()
	require.NoError(t, err)
	var funcs int
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		funcs++
		if strings.HasPrefix(s.Name, "testing.") && s.Name != "testing.init" {
			t.Errorf("the feed binary links %s", s.Name)
		}
	}
	require.Greater(t, funcs, 1000, "the symbol table lists the binary's functions")

	out, err = exec.CommandContext(ctx, "go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, ".").CombinedOutput()
	require.NoError(t, err, "go list:\n%s", out)
	var importers []string
	for line := range strings.Lines(string(out)) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), " ")
		for imp := range strings.FieldsSeq(imports) {
			if imp == "testing" || strings.HasPrefix(imp, "testing/") {
				importers = append(importers, pkg)
			}
		}
	}
	assert.Equal(t, []string{"github.com/gofiber/fiber/v2/utils"}, importers, "the packages of the feed binary that import testing")
}
