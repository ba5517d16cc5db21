package main

// Handlers of the commands on deduplication keys. The work is the
// engine's (DedupEngine: dedup.go, pg_dedup.go).

// readDedupKey reads the queue and key of the commands on a dedup key.
func readDedupKey(r *Req) (queue, key string, err error) {
	if queue, err = queueArg(r.m); err != nil {
		return "", "", err
	}
	key, _, err = r.m.Str("deduplicationId")
	return queue, key, err
}

func cmdGetDeduplicationJobID(r *Req) error {
	queue, key, err := readDedupKey(r)
	if err != nil {
		return err
	}
	id, err := r.eng.DedupJobID(r.ctx(), queue, key)
	if err != nil {
		return err
	}
	e := r.field("data")
	e.MapHead(1)
	e.Str("jobId")
	optStr(e, id, id != "")
	return nil
}

func cmdRemoveDeduplicationKey(r *Req) error {
	queue, key, err := readDedupKey(r)
	if err != nil {
		return err
	}
	removed, err := r.eng.RemoveDedupKey(r.ctx(), queue, key)
	if err != nil {
		return err
	}
	return r.dataInt("count", int64(b2i(removed)))
}

func cmdRemoveJobDeduplicationKey(r *Req) error {
	id, _, err := r.m.Key("id")
	if err != nil {
		return err
	}
	removed, err := r.eng.RemoveJobDedupKey(r.ctx(), id)
	if err != nil {
		return err
	}
	return r.dataBool("removed", removed)
}
