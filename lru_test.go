package main

import "testing"

func TestLRU(t *testing.T) {
	t.Parallel()
	var evicted []string
	l := NewLRU[string, int](3, func(k string, _ int) { evicted = append(evicted, k) })
	l.Put("a", 1)
	l.Put("b", 2)
	l.Put("c", 3)
	if v, ok := l.Get("a"); !ok || v != 1 { // a is now the most recent
		t.Fatal("get a")
	}
	l.Put("d", 4) // evicts b, the least recently used
	if _, ok := l.Peek("b"); ok || len(evicted) != 1 || evicted[0] != "b" {
		t.Fatalf("evicted %v", evicted)
	}
	l.Put("c", 30) // update moves c to the front, no eviction
	if l.Len() != 3 || len(evicted) != 1 {
		t.Fatal("update evicted")
	}
	l.Put("e", 5) // evicts a (d, c, and a: a oldest after the c update? order is c, d, a)
	if _, ok := l.Peek("a"); ok {
		t.Fatal("a should be evicted")
	}
	var order []string
	l.Each(func(k string, _ int) bool { order = append(order, k); return true })
	if len(order) != 3 || order[0] != "e" || order[1] != "c" || order[2] != "d" {
		t.Fatalf("recency order %v", order)
	}
	if !l.Delete("c") || l.Delete("c") || l.Len() != 2 {
		t.Fatal("delete")
	}
	// Peek does not refresh: d stays the oldest.
	l.Peek("d")
	l.Put("f", 6)
	l.Put("g", 7)
	if _, ok := l.Peek("d"); ok {
		t.Fatal("peek refreshed recency")
	}
}
