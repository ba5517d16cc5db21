package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestHandlersHoldNoStorage keeps the seam between the protocol and
// storage (engine.go): the cmd_*.go files hold handlers, which read their
// arguments, call the engine and write the answer. None takes a shard
// lock, reaches into shards, queues or the PostgreSQL pool, or holds SQL;
// nothing there is a method of an engine.
func TestHandlersHoldNoStorage(t *testing.T) {
	t.Parallel()
	fs, files := parseSources(t, "cmd_*.go")
	if len(files) < 8 {
		t.Fatalf("only %d cmd_*.go files", len(files))
	}
	// Selectors a handler has no business with: the shards and their
	// locks, the memory engine's insides, the PostgreSQL engine.
	banned := map[string]string{
		"mu": "a lock", "shards": "the shards", "shardOf": "a shard", "withQueue": "a shard lock",
		"with": "a shard lock", "queues": "a shard's queues", "pool": "the PostgreSQL pool",
		"pg": "the PostgreSQL engine", "sql": "SQL", "begin": "a transaction", "inTx": "a transaction",
	}
	sqlWords := []string{"SELECT ", "INSERT INTO", "UPDATE {s}", "DELETE FROM"}
	for _, sf := range files {
		f := sf.f
		noEngineMethods(t, fs, f, "a handler file")
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if why, bad := banned[n.Sel.Name]; bad {
					t.Errorf("%s: .%s: a handler touches %s", fs.Position(n.Pos()), n.Sel.Name, why)
				}
			case *ast.BasicLit:
				for _, w := range sqlWords {
					if n.Kind == token.STRING && strings.Contains(n.Value, w) {
						t.Errorf("%s: a handler holds SQL", fs.Position(n.Pos()))
					}
				}
			}
			return true
		})
	}
}

// sourceFile is one of the server's files (not a test), parsed.
type sourceFile struct {
	path string
	f    *ast.File
}

// parseSources parses the server's files that match pattern.
func parseSources(t *testing.T, pattern string) (*token.FileSet, []sourceFile) {
	t.Helper()
	paths, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	var out []sourceFile
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, sourceFile{path, f})
	}
	return fs, out
}

func recvName(fd *ast.FuncDecl) string {
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// TestEngineLayers: the storage seam holds from both sides.
//   - Only the PostgreSQL engine (pg_*.go, postgres.go) and the two
//     migrations that write to or read from PostgreSQL import pgx.
//   - The shared rules (rule_*.go) and the engine's values
//     (engine_types.go) are plain functions of plain values: no engine
//     receiver, no lock, no shard, no storage.
//   - The PostgreSQL engine names no memory shard and no memory engine:
//     its jobs are not in them; what both share is the Broker.
//   - The Broker, which every engine is given, is not an Engine.
//   - The engines' files hold no refusal text of the reference's (a
//     message that starts with a capital): those are written once, in
//     the rule files (or read from the request, in the handlers).
func TestEngineLayers(t *testing.T) {
	t.Parallel()
	if _, isEngine := any((*Broker)(nil)).(Engine); isEngine {
		t.Error("the Broker implements Engine: jobs belong in an engine, the Broker is the process")
	}
	fs, files := parseSources(t, "*.go")
	pgxAllowed := func(f string) bool {
		return strings.HasPrefix(f, "pg_") || f == "postgres.go" || f == "migrate_to_pg.go" || f == "bunqueue_pg.go"
	}
	shardWords := map[string]bool{"shardOf": true, "withJob": true, "shards": true, "lockJob": true}
	ruleBanned := map[string]bool{"mu": true, "shards": true, "shardOf": true, "with": true, "withJob": true,
		"lockJob": true, "pool": true, "db": true, "store": true, "persist": true}
	for _, sf := range files {
		path, f := sf.path, sf.f
		for _, im := range f.Imports {
			if strings.Contains(im.Path.Value, "jackc/pgx") && !pgxAllowed(path) {
				t.Errorf("%s imports pgx: only the PostgreSQL engine and its migrations may", path)
			}
		}
		rule := strings.HasPrefix(path, "rule_") || path == "engine_types.go"
		if rule {
			for _, im := range f.Imports {
				if strings.Contains(im.Path.Value, "database/sql") || strings.Contains(im.Path.Value, "sqlite") {
					t.Errorf("%s imports %s: a rule holds no storage", path, im.Path.Value)
				}
			}
			noEngineMethods(t, fs, f, "a rule file")
		}
		shardUses := 0
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if rule && ruleBanned[n.Sel.Name] {
					t.Errorf("%s: .%s in a rule file: rules take plain values", fs.Position(n.Pos()), n.Sel.Name)
				}
				if shardWords[n.Sel.Name] {
					shardUses++
				}
			case *ast.Ident:
				if n.Name == "Shard" || n.Name == "MemEngine" {
					shardUses++
				}
			}
			return true
		})
		if engineFile(path) {
			refusalsInRules(t, fs, f)
		}
		if (strings.HasPrefix(path, "pg_") || path == "postgres.go") && shardUses > 0 {
			t.Errorf("%s names the memory engine or its shards %d times: the PostgreSQL engine's jobs are not in them",
				path, shardUses)
		}
	}
}

// noEngineMethods fails on each method of an engine or broker type
// (MemEngine, Broker, Shard, PG, Queue) that f declares: engine code in
// what names where.
func noEngineMethods(t *testing.T, fs *token.FileSet, f *ast.File, where string) {
	t.Helper()
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil {
			if recv := recvName(fd); recv == "MemEngine" || recv == "Broker" || recv == "Shard" || recv == "PG" || recv == "Queue" {
				t.Errorf("%s: %s.%s is engine code in %s", fs.Position(fd.Pos()), recv, fd.Name.Name, where)
			}
		}
	}
}

// memEngineFiles are the memory engine's files (docs/ARCHITECTURE.md).
var memEngineFiles = []string{"memengine.go", "shard.go", "index.go", "job.go", "record.go", "lifecycle.go",
	"flows.go", "query.go", "control.go", "queue.go", "limits.go", "dlq.go", "groups.go", "dedup.go",
	"dashboard.go", "cron.go", "history.go", "store.go"}

// engineFile says whether path is one of an engine's files.
func engineFile(path string) bool {
	return strings.HasPrefix(path, "pg_") || path == "postgres.go" || slices.Contains(memEngineFiles, path)
}

// refusalsInRules fails on each errors.New or fmt.Errorf in f whose text
// starts with a capital (the reference's refusals do), but for an error
// wrapped with %w, which says what failed rather than refusing.
func refusalsInRules(t *testing.T, fs *token.FileSet, f *ast.File) {
	t.Helper()
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		pkg, ok := sel.X.(*ast.Ident)
		if !ok || !(pkg.Name == "errors" && sel.Sel.Name == "New" || pkg.Name == "fmt" && sel.Sel.Name == "Errorf") {
			return true
		}
		lit, ok := call.Args[0].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING || len(lit.Value) < 2 {
			return true
		}
		text := lit.Value[1:]
		if text[0] >= 'A' && text[0] <= 'Z' && !strings.Contains(text, "%w") {
			t.Errorf("%s: a refusal text in an engine's file: %s (write it once, in a rule file)", fs.Position(lit.Pos()), lit.Value)
		}
		return true
	})
}
