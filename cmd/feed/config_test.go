package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestREADMEDocumentsEveryVariable keeps the README's configuration table true.
func TestREADMEDocumentsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, v := range variables {
		def := " |"
		if v.def != "" {
			def = fmt.Sprintf(" `%s` |", v.def)
		}
		row := fmt.Sprintf("| `%s` |%s", v.name, def)
		assert.Contains(t, string(readme), row, "README lacks the row %q", row)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := parseConfig(func(string) string { return "" })
	require.NoError(t, err)
	assert.Equal(t, ":8080", cfg.HTTPAddr)
	assert.Equal(t, ".data", cfg.DataDir)
	assert.Equal(t, "always", cfg.NATSSync)
	assert.Equal(t, []string{"api"}, cfg.Roles)
	assert.Equal(t, 4222, cfg.NATSPort)
}
