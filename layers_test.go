package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestHandlersHoldNoStorage keeps the seam between the protocol and
// storage (engine.go): the cmd_*.go files hold handlers, which read their
// arguments, call the engine and write the answer. None takes a shard
// lock, reaches into shards, queues or the PostgreSQL pool, or holds SQL;
// nothing there is a method of an engine.
func TestHandlersHoldNoStorage(t *testing.T) {
	files, _ := filepath.Glob("cmd_*.go")
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
	fs := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil {
				if recv := recvName(fd); recv == "Broker" || recv == "Shard" || recv == "PG" || recv == "Queue" {
					t.Errorf("%s: %s.%s is engine code in a handler file", fs.Position(fd.Pos()), recv, fd.Name.Name)
				}
			}
		}
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
