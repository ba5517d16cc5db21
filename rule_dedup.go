package main

import "errors"

// Rules both engines follow for deduplication: what a push does about a
// key another job holds.

// dedupAct is what a push does about a key another job holds.
type dedupAct int

const (
	dedupDuplicate dedupAct = iota // answer the holder's id, told as "duplicated"
	dedupReplace                   // the new job takes the key
	dedupExtend                    // the key's ttl restarts; the holder's id is answered
)

// dedupPolicy decides, from the new job's options and the holder's state,
// what a push does with a held key. removeHolder: a replaced holder that
// has not started goes (one already running goes on). err: the push is
// refused.
func dedupPolicy(j *Job, holder State) (act dedupAct, removeHolder bool, err error) {
	switch {
	case j.cold().DedupReplace:
		return dedupReplace, isQueued(holder) && holder != StateWaitingChildren, nil
	case j.cold().DedupExtend && j.cold().DedupTTL != none && j.cold().DedupTTL > 0:
		if isQueued(holder) {
			return dedupExtend, false, nil
		}
		return dedupExtend, false, errDupExtended
	}
	return dedupDuplicate, false, nil
}

// The refusals of a push whose deduplication key is held, in the
// reference's words.
var errDupExtended = errors.New("Duplicate unique_key (extended TTL)")

// errDependedOn refuses to replace the job holding a key, id, while live
// jobs wait for it.
func errDependedOn(id string) error {
	return errors.New("Cannot replace deduplicated job " + id + " because live jobs depend on it")
}
