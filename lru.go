package main

// LRU is a bounded map that evicts the least recently used entry. Not safe
// for concurrent use; owners guard it with their own lock.
type LRU[K comparable, V any] struct {
	max     int
	m       map[K]*lruNode[K, V]
	head    lruNode[K, V] // sentinel: head.next is most recent, head.prev least
	onEvict func(K, V)
	// With a byte budget, entries are weighed by sizeOf and the least
	// recently used go while the total is over maxBytes.
	sizeOf   func(V) int64
	maxBytes int64
	bytes    int64
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

// SetBudget gives the cache a byte budget besides its count limit.
func (l *LRU[K, V]) SetBudget(maxBytes int64, sizeOf func(V) int64) {
	l.maxBytes, l.sizeOf = maxBytes, sizeOf
}

// Bytes is the weight of what the cache holds (0 without a budget).
func (l *LRU[K, V]) Bytes() int64 { return l.bytes }

func (l *LRU[K, V]) weigh(v V) int64 {
	if l.sizeOf == nil {
		return 0
	}
	return l.sizeOf(v)
}

// trim evicts the least recently used entries, never keep, while the cache
// is over its count limit or byte budget.
func (l *LRU[K, V]) trim(keep *lruNode[K, V]) {
	for len(l.m) > 0 && (l.max > 0 && len(l.m) > l.max || l.maxBytes > 0 && l.bytes > l.maxBytes) {
		old := l.head.prev
		if old == keep {
			return
		}
		l.unlink(old)
		delete(l.m, old.key)
		l.bytes -= l.weigh(old.val)
		if l.onEvict != nil {
			l.onEvict(old.key, old.val)
		}
	}
}

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
		l.bytes += l.weigh(v) - l.weigh(n.val)
		n.val = v
		l.unlink(n)
		l.pushFront(n)
		l.trim(n)
		return
	}
	n := &lruNode[K, V]{key: k, val: v}
	l.m[k] = n
	l.bytes += l.weigh(v)
	l.pushFront(n)
	l.trim(n)
}

// Delete removes k and reports whether it was there.
func (l *LRU[K, V]) Delete(k K) bool {
	n, ok := l.m[k]
	if !ok {
		return false
	}
	l.unlink(n)
	delete(l.m, k)
	l.bytes -= l.weigh(n.val)
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
