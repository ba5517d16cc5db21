package main

// The job index: every job the broker holds, by id, in idxParts
// partitions with a lock each.
//
// A partition is an open-addressing table of job pointers rather than a
// map[string]*Job. The map keeps a 16-byte string header beside each
// pointer and, just after it doubles, is more than half empty: some 60
// bytes per job, an eighth of what a waiting job costs. Here a slot is a
// pointer and a 32-bit hash tag, 12 bytes, at a load between 3/8 and
// 3/4: about 20 bytes per job. The id itself is the job's own (jobid.go).
//
// The tag is the upper half of a seeded maphash of the id (so that ids
// chosen to collide, custom ids being the client's to pick, cannot be
// found without the seed), with 0 meaning an empty slot; a job's home
// slot is its tag masked to the table's size, so growing rehashes from
// the tags alone. Linear probing, and deletion by shifting the entries
// after a hole back into it: no tombstones to clean up.

import (
	"hash/maphash"
	"sync"
)

const idxParts = 64

// idxPart is 64 bytes: a cache line's worth, so that two partitions'
// locks seldom share one.
type idxPart struct {
	mu sync.Mutex
	t  jobTable
}

var idxSeed = maphash.MakeSeed()

// idxHash gives the id's partition (low bits) and tag (high half).
func idxHash(k idKey) (part uint32, tag uint32) {
	var h uint64
	if k.u != ([16]byte{}) {
		h = maphash.Bytes(idxSeed, k.u[:])
	} else {
		h = maphash.String(idxSeed, k.s)
	}
	tag = uint32(h >> 32)
	if tag == 0 {
		tag = 1
	}
	return uint32(h) & (idxParts - 1), tag
}

func (b *MemEngine) idxPart(k idKey) (*idxPart, uint32) {
	part, tag := idxHash(k)
	return &b.idx[part], tag
}

func (b *MemEngine) idxGet(id string) *Job {
	return b.idxGetKey(keyOf(id))
}

// idxHolder is the job the index holds under j's id: j itself, another
// job with its id, or nil.
func (b *MemEngine) idxHolder(j *Job) *Job {
	return b.idxGetKey(j.key())
}

func (b *MemEngine) idxGetKey(k idKey) *Job {
	p, tag := b.idxPart(k)
	p.mu.Lock()
	j := p.t.get(k, tag)
	p.mu.Unlock()
	return j
}

// idxPut stores j unless another job holds the id; it returns the holder.
func (b *MemEngine) idxPut(j *Job) *Job {
	k := j.key()
	p, tag := b.idxPart(k)
	p.mu.Lock()
	old := p.t.put(j, k, tag)
	p.mu.Unlock()
	return old
}

// idxReserve makes room in the index for n more jobs spread over its
// parts, before a recovery puts them back: a table that grows as it
// fills rehashes every entry at each doubling.
func (b *MemEngine) idxReserve(n int) {
	per := n/idxParts + n/idxParts/16 + 8
	for i := range b.idx {
		p := &b.idx[i]
		p.mu.Lock()
		p.t.reserve(p.t.n + per)
		p.mu.Unlock()
	}
}

// idxDel forgets j, if the id is still j's.
func (b *MemEngine) idxDel(j *Job) {
	p, tag := b.idxPart(j.key())
	p.mu.Lock()
	p.t.del(j, tag)
	p.mu.Unlock()
}

func (b *MemEngine) idxLen() int {
	n := 0
	for i := range b.idx {
		p := &b.idx[i]
		p.mu.Lock()
		n += p.t.n
		p.mu.Unlock()
	}
	return n
}

// jobTable is one partition's table. The zero value is an empty table.
type jobTable struct {
	tags []uint32 // 0: empty
	jobs []*Job
	n    int
}

const jobTableMin = 8

func (t *jobTable) get(k idKey, tag uint32) *Job {
	if t.n == 0 {
		return nil
	}
	mask := uint32(len(t.tags) - 1)
	for i := tag & mask; ; i = (i + 1) & mask {
		switch t.tags[i] {
		case 0:
			return nil
		case tag:
			if j := t.jobs[i]; j.idIs(k) {
				return j
			}
		}
	}
}

// put adds j unless a job with its id is there; it returns that job.
func (t *jobTable) put(j *Job, k idKey, tag uint32) *Job {
	if (t.n+1)*4 > len(t.tags)*3 {
		t.resize(max(2*len(t.tags), jobTableMin))
	}
	mask := uint32(len(t.tags) - 1)
	i := tag & mask
	for ; t.tags[i] != 0; i = (i + 1) & mask {
		if t.tags[i] == tag && t.jobs[i].idIs(k) {
			return t.jobs[i]
		}
	}
	t.tags[i], t.jobs[i] = tag, j
	t.n++
	return nil
}

// del removes j (the job itself, not another with its id).
func (t *jobTable) del(j *Job, tag uint32) {
	if t.n == 0 {
		return
	}
	mask := uint32(len(t.tags) - 1)
	i := tag & mask
	for ; t.jobs[i] != j; i = (i + 1) & mask {
		if t.tags[i] == 0 {
			return
		}
	}
	// Shift back each following entry of the run whose home slot does
	// not lie between the hole and it, so that every entry can still be
	// reached from its home slot without crossing an empty slot.
	for k := (i + 1) & mask; t.tags[k] != 0; k = (k + 1) & mask {
		home := t.tags[k] & mask
		if (k-home)&mask >= (k-i)&mask {
			t.tags[i], t.jobs[i] = t.tags[k], t.jobs[k]
			i = k
		}
	}
	t.tags[i], t.jobs[i] = 0, nil
	t.n--
	// Give the memory back after a large drain.
	if len(t.tags) > 1024 && t.n*8 < len(t.tags) {
		t.resize(len(t.tags) / 4)
	}
}

// reserve makes room for n entries without growing.
func (t *jobTable) reserve(n int) {
	size := jobTableMin
	for n*4 > size*3 {
		size *= 2
	}
	if size > len(t.tags) {
		t.resize(size)
	}
}

// resize moves every entry into a table of size slots (a power of two).
func (t *jobTable) resize(size int) {
	tags, jobs := t.tags, t.jobs
	t.tags, t.jobs = make([]uint32, size), make([]*Job, size)
	mask := uint32(size - 1)
	for k, tag := range tags {
		if tag == 0 {
			continue
		}
		i := tag & mask
		for t.tags[i] != 0 {
			i = (i + 1) & mask
		}
		t.tags[i], t.jobs[i] = tag, jobs[k]
	}
}
