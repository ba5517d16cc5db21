package main

import (
	"go/ast"
	"go/parser"
	"go/token"
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
	t.Parallel()
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

// TestArchitectureNamesInFiles: every "`name` (file.go)" in
// docs/ARCHITECTURE.md names something that file defines: a function, a
// type, a variable or a constant, or, written `Type.Method`, a method of
// that type. The prose drifted before (a writer placed in the file it had
// left, an engine's methods "file for file" where four were not).
func TestArchitectureNamesInFiles(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	// A line break may fall between the name and its file.
	text := strings.Join(strings.Fields(string(doc)), " ")
	refs := regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)?)` \\(([a-z_0-9]+\\.go)[,)]").FindAllStringSubmatch(text, -1)
	if len(refs) < 10 {
		t.Fatalf("only %d names with their files found in docs/ARCHITECTURE.md: the pattern no longer matches the prose", len(refs))
	}
	for _, m := range refs {
		name, file := m[1], m[2]
		src, err := os.ReadFile(file)
		if err != nil {
			t.Errorf("%s (%s): %v", name, file, err)
			continue
		}
		var def *regexp.Regexp
		if typ, meth, ok := strings.Cut(name, "."); ok {
			def = regexp.MustCompile(`(?m)^func \(\w+ \*?` + typ + `\) ` + meth + `[\[(]`)
		} else {
			def = regexp.MustCompile(`(?m)^(?:func|type|var|const) ` + name + `\b|^\t` + name + `\s+(?:=|[A-Za-z*\[])`)
		}
		if !def.Match(src) {
			t.Errorf("docs/ARCHITECTURE.md says %s is in %s, which does not define it", name, file)
		}
	}
}

// tableFuncs are the functions allowed past maxFuncLines: each is a table
// (the command table, the MCP tools, the server's flags, the help text),
// whose length is its rows.
var tableFuncs = map[string]bool{
	"commands.go:init": true, "mcp_flows.go:mcpFlowTools": true, "mcp_tools.go:mcpJobTools": true,
	"mcp_tools.go:mcpConsumeTools": true, "mcp_admin.go:mcpMonitorTools": true, "mcp_admin.go:mcpQueueTools": true,
	"config.go:serverFlags": true, "cli_help.go:mainHelp": true,
}

const (
	maxFileLines = 1000
	maxFuncLines = 80
)

// TestSizes: no server file over 1,000 lines, and no function over 80
// but the tables of tableFuncs: past that a reader loses the thread
// (sqlite.go was 1,033 lines, loadJobs 152, a pipeline in two inline
// goroutines).
func TestSizes(t *testing.T) {
	t.Parallel()
	fset, files := parseSources(t, "*.go")
	for _, sf := range files {
		f, af := sf.path, sf.f
		if n := fset.File(af.Pos()).LineCount(); n > maxFileLines {
			t.Errorf("%s has %d lines, over %d: split it by what its parts do", f, n, maxFileLines)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if key := f + ":" + fd.Name.Name; n > maxFuncLines && !tableFuncs[key] {
				t.Errorf("%s is %d lines, over %d, and not a table: split it into named steps", key, n, maxFuncLines)
			}
		}
	}
}

// TestTestsRunInParallel: every test runs beside the others (t.Parallel)
// or says in its comment why it cannot ("Serial: ..."). The serial tests
// run first, one at a time, while the machine is otherwise idle: 450 of
// them took 254 of the suite's 528 s on two cores, mostly waiting.
func TestTestsRunInParallel(t *testing.T) {
	t.Parallel()
	fs, files := parseTestFiles(t)
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || fd.Body == nil || !strings.HasPrefix(fd.Name.Name, "Test") || fd.Name.Name == "TestMain" {
				continue
			}
			if strings.Contains(fd.Doc.Text(), "Serial: ") || callsParallel(fd.Body) {
				continue
			}
			t.Errorf("%s: %s neither calls t.Parallel() nor says why not in a \"Serial: \" line of its comment", fs.Position(fd.Pos()), fd.Name.Name)
		}
	}
}

// parseTestFiles parses the package's test files, with their comments.
func parseTestFiles(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	paths, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	var files []*ast.File
	for _, path := range paths {
		f, err := parser.ParseFile(fs, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return fs, files
}

// callsParallel reports a statement of body that is a call of t.Parallel.
func callsParallel(body *ast.BlockStmt) bool {
	for _, s := range body.List {
		if e, ok := s.(*ast.ExprStmt); ok {
			if c, ok := e.X.(*ast.CallExpr); ok {
				if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Parallel" {
					return true
				}
			}
		}
	}
	return false
}

// TestNoTestSignalsItself: no test sends a signal to the test process.
// The tests run side by side in it, and a signal reaches all of them: a
// SIGHUP meant for one test's in-process server ended another test's
// bench (which stops on SIGHUP) in a CI run. A test signals a server
// process of its own instead (startBinary).
func TestNoTestSignalsItself(t *testing.T) {
	t.Parallel()
	fs, files := parseTestFiles(t)
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok || len(c.Args) == 0 {
				return true
			}
			sel, ok := c.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Kill" && sel.Sel.Name != "Tgkill") {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || (pkg.Name != "syscall" && pkg.Name != "unix") {
				return true
			}
			if target, ok := c.Args[0].(*ast.CallExpr); ok {
				if f, ok := target.Fun.(*ast.SelectorExpr); ok && f.Sel.Name == "Getpid" {
					t.Errorf("%s: a test signals its own process", fs.Position(c.Pos()))
				}
			}
			return true
		})
	}
}
