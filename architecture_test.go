package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestArchitectureFileMap: docs/ARCHITECTURE.md's file map names every Go
// file of the server (by name, or by a pattern such as cmd_*.go), and
// every file it names exists: the map stays true as files come and go.
func TestArchitectureFileMap(t *testing.T) {
	doc, err := os.ReadFile("docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "## File map")
	if !ok {
		t.Fatal("docs/ARCHITECTURE.md has no File map section")
	}
	section, _, _ := strings.Cut(after, "\n## ")
	var patterns []string
	for _, m := range regexp.MustCompile("`([a-z_*]+\\.go)`").FindAllStringSubmatch(section, -1) {
		patterns = append(patterns, m[1])
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		found := false
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, f); ok {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, f)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/ARCHITECTURE.md's file map does not name %s", strings.Join(missing, ", "))
	}
	for _, p := range patterns {
		if m, _ := filepath.Glob(p); len(m) == 0 {
			t.Errorf("docs/ARCHITECTURE.md's file map names %s, which matches no file", p)
		}
	}
}
