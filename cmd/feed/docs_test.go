package main

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocsLinksResolveInsideTheRepository keeps the README and docs/ whole for
// a clone: every link names a file of the repository (and, into Markdown, a
// heading of it), and none leads outside it.
func TestDocsLinksResolveInsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, "go.mod"), "the repository's root")
	problems, checked := checkDocLinks(t, root)
	assert.Empty(t, problems)
	assert.Greater(t, checked, 50, "links checked: the README and docs link to each other")
}

// TestDocsLinkCheckFindsWhatIsBroken runs the check over a small tree with one
// link of each kind it must refuse, and one of each it must accept.
func TestDocsLinkCheckFindsWhatIsBroken(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		p := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	}
	write("README.md", "# Top\n\n[ok](docs/a.md) [ok](docs/a.md#a-heading-2-more) [ok](#top) [ok](go.mod)\n"+
		"[gone](docs/missing.md) [anchor](docs/a.md#no-such-heading) [own](#nowhere)\n"+
		"`[in code](nowhere.md)`\n\n```\n[in a block](nowhere.md)\n```\n")
	write("go.mod", "module x\n")
	write("docs/a.md", "# A heading: 2 `more`\n\n[up](../README.md) [out](../../outside/API.md) "+
		"[abs](/etc/passwd) [web](https://example.com/) [dir](decisions/)\n")
	write("docs/decisions/README.md", "# Decisions\n")

	problems, checked := checkDocLinks(t, root)
	assert.Equal(t, 12, checked)
	want := []string{
		"README.md: docs/missing.md: no such file",
		"README.md: docs/a.md#no-such-heading: no heading no-such-heading",
		"README.md: #nowhere: no heading nowhere",
		"docs/a.md: ../../outside/API.md: outside the repository",
		"docs/a.md: /etc/passwd: an absolute path",
		"docs/a.md: https://example.com/: outside the repository",
	}
	assert.ElementsMatch(t, want, problems)
}

var (
	mdLink     = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	mdHeading  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	linkScheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// checkDocLinks checks every inline link of README.md and docs/**/*.md under
// root, outside code, and says what is wrong with each that fails.
func checkDocLinks(t *testing.T, root string) (problems []string, checked int) {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return err
	})
	require.NoError(t, err)
	for _, f := range files {
		text, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		for _, target := range docLinks(string(text)) {
			checked++
			if why := checkDocLink(root, f, target); why != "" {
				problems = append(problems, fmt.Sprintf("%s: %s: %s", filepath.ToSlash(f), target, why))
			}
		}
	}
	return problems, checked
}

// docLinks are the targets of the inline links of a Markdown text, leaving out
// fenced code blocks and code spans.
func docLinks(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// checkDocLink says why the link target of the file from (relative to root)
// does not resolve inside the repository, or "" if it does.
func checkDocLink(root, from, target string) string {
	if linkScheme.MatchString(target) {
		return "outside the repository"
	}
	if strings.HasPrefix(target, "/") {
		return "an absolute path"
	}
	path, anchor, _ := strings.Cut(target, "#")
	if path, err := url.PathUnescape(path); err == nil && path != "" {
		target = filepath.Join(filepath.Dir(filepath.Join(root, from)), filepath.FromSlash(path))
	} else {
		target = filepath.Join(root, from)
	}
	if rel, err := filepath.Rel(root, target); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "outside the repository"
	}
	if _, err := os.Stat(target); err != nil {
		return "no such file"
	}
	if anchor == "" || !strings.HasSuffix(target, ".md") {
		return ""
	}
	text, err := os.ReadFile(target)
	if err != nil {
		return err.Error()
	}
	if !docAnchors(string(text))[anchor] {
		return "no heading " + anchor
	}
	return ""
}

// docAnchors are the anchors GitHub gives a Markdown text's headings: lower
// case, code marks and punctuation dropped, spaces made hyphens, a repeated
// one numbered.
func docAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		m := mdHeading.FindStringSubmatch(line)
		if fenced || m == nil {
			continue
		}
		slug := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return unicode.ToLower(r)
			}
			return -1
		}, m[1])
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}
