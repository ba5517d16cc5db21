package main

// LRU is a bounded map that evicts the least recently used entry. Not safe
// for concurrent use; owners guard it with their own lock.
type LRU[K comparable, V any] struct {
	max     int
	m       map[K]*lruNode[K, V]
	head    lruNode[K, V] // sentinel: head.next is most recent, head.prev least
	onEvict func(K, V)
}

type lruNode[K comparable, V any] struct {
	key        K
	val        V
	prev, next *lruNode[K, V]
}

func NewLRU[K comparable, V any](max int, onEvict func(K, V)) *LRU[K, V] {
	l := &LRU[K, V]{max: max, m: make(map[K]*lruNode[K, V]), onEvict: onEvict}
	l.head.next = &l.head
	l.head.prev = &l.head
	return l
}

func (l *LRU[K, V]) Len() int { return len(l.m) }

func (l *LRU[K, V]) unlink(n *lruNode[K, V]) {
	n.prev.next = n.next
	n.next.prev = n.prev
}

func (l *LRU[K, V]) pushFront(n *lruNode[K, V]) {
	n.prev = &l.head
	n.next = l.head.next
	l.head.next.prev = n
	l.head.next = n
}

// Get returns the value and marks it most recently used.
func (l *LRU[K, V]) Get(k K) (V, bool) {
	n, ok := l.m[k]
	if !ok {
		var zero V
		return zero, false
	}
	l.unlink(n)
	l.pushFront(n)
	return n.val, true
}

// Peek returns the value without touching recency.
func (l *LRU[K, V]) Peek(k K) (V, bool) {
	n, ok := l.m[k]
	if !ok {
		var zero V
		return zero, false
	}
	return n.val, true
}

// Put inserts or replaces k, evicting the oldest entry when full.
func (l *LRU[K, V]) Put(k K, v V) {
	if n, ok := l.m[k]; ok {
		n.val = v
		l.unlink(n)
		l.pushFront(n)
		return
	}
	n := &lruNode[K, V]{key: k, val: v}
	l.m[k] = n
	l.pushFront(n)
	for l.max > 0 && len(l.m) > l.max {
		old := l.head.prev
		l.unlink(old)
		delete(l.m, old.key)
		if l.onEvict != nil {
			l.onEvict(old.key, old.val)
		}
	}
}

// Delete removes k and reports whether it was there.
func (l *LRU[K, V]) Delete(k K) bool {
	n, ok := l.m[k]
	if !ok {
		return false
	}
	l.unlink(n)
	delete(l.m, k)
	return true
}

// Each visits entries from most to least recent until fn returns false.
func (l *LRU[K, V]) Each(fn func(K, V) bool) {
	for n := l.head.next; n != &l.head; n = n.next {
		if !fn(n.key, n.val) {
			return
		}
	}
}
